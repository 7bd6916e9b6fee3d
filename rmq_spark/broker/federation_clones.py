"""Upstreams paused the old way (before override policies): restored, never made again.

Earlier builds paused federation by cloning each upstream as
`rmq-spark-paused--<name>` and deleting the original (which could not work for a
policy on the upstream set `all`, which includes the clones). A crash of such a run
may have left clones behind; `restore-federation` and every run still undo them:
PUT the original from the clone's value (unless the original exists), then DELETE
the clone. An original defined again by hand meanwhile is kept as it is.

Definitions hold the upstream's URI with its password: they are never logged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from rmq_spark.broker.management import ManagementClient
from rmq_spark.errors import FederationError, RmqSparkError

log = logging.getLogger(__name__)

UPSTREAM_COMPONENT = "federation-upstream"
CLONE_PREFIX = "rmq-spark-paused--"


@dataclass(frozen=True)
class Upstream:
    """One `federation-upstream` runtime parameter, as GET /api/parameters lists it."""

    vhost: str
    name: str
    value: dict[str, Any]

    @classmethod
    def from_parameter(cls, row: Mapping[str, Any]) -> Upstream:
        return cls(vhost=str(row["vhost"]), name=str(row["name"]), value=dict(row["value"]))

    @property
    def is_clone(self) -> bool:
        """A paused upstream's saved definition."""
        return self.name.startswith(CLONE_PREFIX)

    @property
    def original_name(self) -> str:
        """The upstream this clone saves (its own name if it is not a clone)."""
        return self.name[len(CLONE_PREFIX) :] if self.is_clone else self.name

    def describe(self) -> str:
        return f"vhost {self.vhost!r} upstream {self.original_name!r}"


@dataclass(frozen=True)
class Step:
    """One management API call of a restore, in order."""

    action: Literal["put", "delete"]
    vhost: str
    name: str
    value: dict[str, Any] | None = None  # what to PUT; holds a password, never logged

    def describe(self) -> str:
        verb = "define" if self.action == "put" else "delete"
        return f"{verb} vhost {self.vhost!r} upstream {self.name!r}"


def restore_steps(upstreams: Iterable[Upstream]) -> list[Step]:
    """The calls that undo every clone: re-create the original (if missing), delete the clone."""
    originals: dict[tuple[str, str], Upstream] = {}
    clones: dict[tuple[str, str], Upstream] = {}
    for upstream in upstreams:
        target = clones if upstream.is_clone else originals
        target[(upstream.vhost, upstream.original_name)] = upstream
    steps: list[Step] = []
    for key, clone in sorted(clones.items()):
        original = originals.get(key)
        if original is None:
            steps.append(Step("put", clone.vhost, clone.original_name, clone.value))
        elif original.value != clone.value:
            log.warning(
                "%s: defined again since it was paused, with another definition; keeping it",
                original.describe(),
            )
        steps.append(Step("delete", clone.vhost, clone.name))
    return steps


def restore_clones(client: ManagementClient) -> list[tuple[str, str]]:
    """Undo every clone an earlier version left on the cluster: (vhost, upstream) of each."""
    found = [Upstream.from_parameter(r) for r in client.parameters(UPSTREAM_COMPONENT)]
    for step in restore_steps(found):
        try:
            if step.action == "put":
                assert step.value is not None
                client.put_parameter(UPSTREAM_COMPONENT, step.vhost, step.name, step.value)
            else:
                client.delete_parameter(UPSTREAM_COMPONENT, step.vhost, step.name)
        except RmqSparkError as exc:
            raise FederationError(
                f"cluster {client.cluster_name} {step.describe()}: could not restore "
                f"federation ({exc})"
            ) from exc
    return sorted((u.vhost, u.original_name) for u in found if u.is_clone)
