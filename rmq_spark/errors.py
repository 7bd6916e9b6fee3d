"""The exception hierarchy: one root, one class per failure a user can act on.

Every message names the cluster, vhost and queue (or the config key) it is about,
and says what was expected versus what was found. Secrets never appear in them.
"""

from __future__ import annotations


class RmqSparkError(Exception):
    """Root of every error rmq-spark raises on purpose.

    An error that sums up several problems (pre-flight) lists each on its own line
    of the message and keeps them in `problems`.
    """

    problems: tuple[RmqSparkError, ...] = ()


class ConfigError(RmqSparkError):
    """The config file is missing, unreadable, or has a bad or unknown key."""


class BrokerUnreachableError(RmqSparkError):
    """A broker's AMQP or management endpoint could not be reached."""


class AccessRefusedError(RmqSparkError):
    """The broker refused the credentials or the permissions for a vhost."""


class DiscoveryError(RmqSparkError):
    """Discovery could not build a plan (missing vhost or source queue, bad reply)."""


class DestinationIncompatibleError(RmqSparkError):
    """A destination queue is missing or its type/arguments do not fit the source."""


class DeliveryLimitError(RmqSparkError):
    """A quorum source's delivery limit is too small for the mover's reconnect budget:
    lost sessions could take a message past it, and the broker would drop it."""


class PreflightError(RmqSparkError):
    """Pre-flight found problems of more than one kind; nothing was moved.

    When all problems are of one kind, pre-flight raises that kind instead (for
    example DestinationIncompatibleError), with the same one-line-per-problem message.
    """


class ExecutorEnvironmentError(RmqSparkError):
    """An executor's Python lacks a module the movers import (nothing shipped it)."""


class TransferError(RmqSparkError):
    """A queue transfer stopped: the destination refused or returned a message."""


class FederationError(RmqSparkError):
    """Federation upstreams could not be paused or restored (names cluster/vhost/upstream)."""


class MigrationError(RmqSparkError):
    """A queue cannot be migrated, or a migration phase failed (names vhost and queue)."""


class LedgerError(RmqSparkError):
    """The ledger could not be written or read."""


class LedgerNotSharedError(LedgerError):
    """The ledger path is not one directory shared by the driver and every executor,
    or it is a URI (s3://, abfss://, dbfs:...) rather than a file system path."""


class UnsupportedDependencyError(RmqSparkError):
    """An installed library is a version whose internals rmq-spark does not support."""


class VerificationFailedError(RmqSparkError):
    """Verification found lost, unexpected or unconfirmed messages."""
