"""Federation-safe drain: pause the source clusters' federation upstreams while moving.

Why: a federated queue's link pulls messages from its upstream as soon as the
downstream queue has a consumer, and the movers are consumers. Draining a DR
cluster's orphans would pull fresh messages from the upstream cluster into the very
queues being drained. With `federation: pause`, every federation upstream of every
vhost of every source cluster is paused before the movers start and restored when
they are done, also after a failure.

How, keeping the state in RabbitMQ itself (a crashed job loses nothing, and any
machine can finish the job):

* pause an upstream = PUT a clone of its definition, unchanged, named
  `rmq-spark-paused--<name>`, then DELETE the original. Policies name upstreams,
  so no policy uses the clone, and a policy whose upstream is gone has no link.
* restore = PUT the original from the clone's value (unless the original exists),
  then DELETE the clone. The link comes back by itself.

Each step is idempotent and each crash window leaves a state the next pause or
restore finishes: a clone beside its original (either crash) is settled by deleting
the original (pause) or the clone (restore); a clone is never cloned again. Should
the two definitions differ, someone changed the original by hand since the pause,
and the live original wins. Policies and upstream sets are never touched; a policy
using the implicit upstream set `all` would federate with the clones too, so
pausing refuses to start then.

The planning (`pause_steps`, `restore_steps`, `set_all_hazards`, `linked`) is pure;
`pause`, `restore` and `paused_federation` run it through the management API.
Definitions hold the upstream's URI with its password: they are never logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from rmq_spark.broker.management import ManagementClient
from rmq_spark.config import JobConfig
from rmq_spark.errors import AccessRefusedError, FederationError, RmqSparkError

log = logging.getLogger(__name__)

UPSTREAM_COMPONENT = "federation-upstream"
PAUSED_PREFIX = "rmq-spark-paused--"
# The implicit upstream set holding every upstream of a vhost, clones included.
ALL_UPSTREAMS_SET = "all"
# Links stop within milliseconds of their upstream's deletion (RabbitMQ 3.10); this
# only bounds the wait when a broker is slow.
LINK_STOP_TIMEOUT_SECONDS = 30.0
_LINK_POLL_SECONDS = 0.1


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
        return self.name.startswith(PAUSED_PREFIX)

    @property
    def original_name(self) -> str:
        """The upstream this clone saves (its own name if it is not a clone)."""
        return self.name[len(PAUSED_PREFIX) :] if self.is_clone else self.name

    def describe(self) -> str:
        return f"vhost {self.vhost!r} upstream {self.original_name!r}"


@dataclass(frozen=True)
class Step:
    """One management API call of a pause or a restore, in order."""

    action: Literal["put", "delete"]
    vhost: str
    name: str
    value: dict[str, Any] | None = None  # what to PUT; holds a password, never logged

    def describe(self) -> str:
        verb = "define" if self.action == "put" else "delete"
        return f"{verb} vhost {self.vhost!r} upstream {self.name!r}"


def clone_name(name: str) -> str:
    """The name a paused upstream's definition is kept under."""
    return PAUSED_PREFIX + name


# -- planning (pure) -----------------------------------------------------------------


def pause_steps(upstreams: Iterable[Upstream]) -> list[Step]:
    """The calls that leave every upstream paused: clone (if not cloned yet), delete.

    An original whose clone already exists (a crash between the two calls, or a
    re-run) only loses the original; when the two differ the live original is
    cloned again first, since it is the newer definition. Clones are never cloned.
    """
    originals, clones = _split(upstreams)
    steps: list[Step] = []
    for key, original in sorted(originals.items()):
        clone = clones.get(key)
        if clone is None or clone.value != original.value:
            if clone is not None:
                log.warning(
                    "%s: changed since it was paused; keeping the live definition",
                    original.describe(),
                )
            steps.append(Step("put", original.vhost, clone_name(original.name), original.value))
        steps.append(Step("delete", original.vhost, original.name))
    return steps


def restore_steps(upstreams: Iterable[Upstream]) -> list[Step]:
    """The calls that undo every pause: re-create the original (if missing), delete the clone.

    An original that exists already (a crash between the two calls, or defined again
    by hand) is kept as it is.
    """
    originals, clones = _split(upstreams)
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


def paused_after(upstreams: Iterable[Upstream]) -> list[tuple[str, str]]:
    """(vhost, original name) of every upstream that is paused once pause_steps ran."""
    originals, clones = _split(upstreams)
    return sorted(set(originals) | set(clones))


def set_all_hazards(
    upstreams: Iterable[Upstream], policies: Iterable[Mapping[str, Any]]
) -> list[tuple[str, str]]:
    """(vhost, policy) of policies federating with the set `all` where upstreams exist.

    The set `all` is every upstream of the vhost, so it would include the clones and
    keep federating through them.
    """
    vhosts = {upstream.vhost for upstream in upstreams}
    return sorted(
        (str(policy["vhost"]), str(policy["name"]))
        for policy in policies
        if policy.get("vhost") in vhosts
        and (policy.get("definition") or {}).get("federation-upstream-set") == ALL_UPSTREAMS_SET
    )


def linked(
    links: Iterable[Mapping[str, Any]], paused: Iterable[tuple[str, str]]
) -> list[tuple[str, str, str]]:
    """(vhost, upstream, status) of federation links still using a paused upstream."""
    wanted = set(paused)
    return sorted(
        (str(link.get("vhost")), str(link.get("upstream")), str(link.get("status")))
        for link in links
        if (link.get("vhost"), link.get("upstream")) in wanted
    )


def _split(
    upstreams: Iterable[Upstream],
) -> tuple[dict[tuple[str, str], Upstream], dict[tuple[str, str], Upstream]]:
    """Originals and clones, both keyed by (vhost, original name)."""
    originals: dict[tuple[str, str], Upstream] = {}
    clones: dict[tuple[str, str], Upstream] = {}
    for upstream in upstreams:
        target = clones if upstream.is_clone else originals
        target[(upstream.vhost, upstream.original_name)] = upstream
    return originals, clones


# -- running it against a cluster --------------------------------------------------------


def upstreams(client: ManagementClient) -> list[Upstream]:
    """Every federation upstream of every vhost of the cluster, clones included."""
    return [Upstream.from_parameter(row) for row in client.parameters(UPSTREAM_COMPONENT)]


def pause(
    client: ManagementClient,
    *,
    link_timeout: float = LINK_STOP_TIMEOUT_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> list[tuple[str, str]]:
    """Pause every upstream of the cluster; return (vhost, name) of all paused ones.

    Refuses (changing nothing) when a policy federates with the upstream set `all`.
    Returns once no federation link uses a paused upstream any more.
    """
    cluster = client.cluster_name
    found = upstreams(client)
    hazards = set_all_hazards(found, client.policies()) if found else []
    if hazards:
        lines = "\n  ".join(
            f"cluster {cluster} vhost {vhost!r} policy {policy!r}: federates with the "
            f"upstream set {ALL_UPSTREAMS_SET!r}, which would include the paused clones "
            f"({PAUSED_PREFIX}*) and keep pulling; expected policies naming their upstream "
            "(federation-upstream) or an explicit upstream set"
            for vhost, policy in hazards
        )
        raise FederationError(
            f"federation: pause cannot pause these upstreams; nothing was changed or moved "
            f"(or set federation: keep):\n  {lines}"
        )
    steps = pause_steps(found)
    _run_steps(client, steps, doing="pause")
    paused = paused_after(found)
    for vhost, name in paused:
        log.info("cluster %s vhost %r: federation upstream %r paused", cluster, vhost, name)
    _wait_for_links_to_stop(client, paused, link_timeout, sleep=sleep, clock=clock)
    return paused


def restore(client: ManagementClient) -> list[tuple[str, str]]:
    """Restore every paused upstream of the cluster; return (vhost, name) of each."""
    found = upstreams(client)
    steps = restore_steps(found)
    _run_steps(client, steps, doing="restore")
    restored = sorted((u.vhost, u.original_name) for u in found if u.is_clone)
    for vhost, name in restored:
        log.info(
            "cluster %s vhost %r: federation upstream %r restored",
            client.cluster_name,
            vhost,
            name,
        )
    return restored


def source_clusters(config: JobConfig) -> list[str]:
    """The clusters the routes drain, in config order: the ones whose upstreams pause."""
    return list(dict.fromkeys(route.source.cluster for route in config.routes))


def restore_federation(
    config: JobConfig, clients: Mapping[str, ManagementClient]
) -> list[tuple[str, str, str]]:
    """Restore every paused upstream of every source cluster: (cluster, vhost, name).

    Tries every cluster even when one fails, then raises one error naming each failure.
    """
    restored: list[tuple[str, str, str]] = []
    problems: list[RmqSparkError] = []
    for cluster in source_clusters(config):
        try:
            restored.extend((cluster, vhost, name) for vhost, name in restore(clients[cluster]))
        except RmqSparkError as exc:
            problems.append(exc)
    if problems:
        lines = "\n  ".join(str(p) for p in problems)
        error = FederationError(
            "could not restore the federation upstreams; a paused one keeps its definition "
            f"as {PAUSED_PREFIX}<name>: run `rmq-spark restore-federation --config FILE` "
            f"once this is fixed:\n  {lines}"
        )
        error.problems = tuple(problems)
        raise error from problems[0]
    return restored


@contextmanager
def paused_federation(
    config: JobConfig, clients: Mapping[str, ManagementClient]
) -> Iterator[list[tuple[str, str, str]]]:
    """With `federation: pause`, the source clusters' upstreams are paused inside the block.

    Yields (cluster, vhost, name) of the paused upstreams (nothing with `keep`).
    Restores them on the way out, also when the block or the pausing itself failed.
    When restoring fails after the block failed, the error names both.

    >>> with paused_federation(config, clients):  # doctest: +SKIP
    ...     outcomes = move(spark, plan, config, run_id)
    """
    if config.federation != "pause":
        yield []
        return
    paused: list[tuple[str, str, str]] = []
    try:
        for cluster in source_clusters(config):
            paused.extend((cluster, vhost, name) for vhost, name in pause(clients[cluster]))
        log.info("federation: %d upstream(s) paused while moving", len(paused))
        yield paused
    except Exception as exc:
        try:
            restore_federation(config, clients)
        except RmqSparkError as restore_error:
            raise FederationError(f"{restore_error}\n  (the run had failed first: {exc})") from exc
        raise
    except BaseException:
        # Interrupted (Ctrl-C, SystemExit): restore, but let the interruption win.
        try:
            restore_federation(config, clients)
        except RmqSparkError as restore_error:
            log.error("%s", restore_error)
        raise
    restored = restore_federation(config, clients)
    log.info("federation: %d upstream(s) restored", len(restored))


def _run_steps(client: ManagementClient, steps: Sequence[Step], *, doing: str) -> None:
    for step in steps:
        log.debug("cluster %s: %s", client.cluster_name, step.describe())
        try:
            if step.action == "put":
                assert step.value is not None
                client.put_parameter(UPSTREAM_COMPONENT, step.vhost, step.name, step.value)
            else:
                client.delete_parameter(UPSTREAM_COMPONENT, step.vhost, step.name)
        except RmqSparkError as exc:
            raise FederationError(
                f"cluster {client.cluster_name} {step.describe()}: could not {doing} "
                f"federation ({exc})"
            ) from exc


def _wait_for_links_to_stop(
    client: ManagementClient,
    paused: Sequence[tuple[str, str]],
    timeout: float,
    *,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
) -> None:
    """Links go away with their upstream; wait until the API shows none left."""
    if not paused:
        return
    deadline = clock() + timeout
    while True:
        try:
            links = client.federation_links()
        except AccessRefusedError as exc:
            # Listing links needs the monitoring tag, changing upstreams policymaker;
            # RabbitMQ stops a link as its upstream is deleted, so this only loses the check.
            log.info(
                "cluster %s: not waiting for the federation links to stop: %s",
                client.cluster_name,
                exc,
            )
            return
        if links is None:
            log.info(
                "cluster %s: the federation links are not shown (no "
                "rabbitmq_federation_management plugin); not waiting for them to stop",
                client.cluster_name,
            )
            return
        left = linked(links, paused)
        if not left:
            return
        if clock() >= deadline:
            names = ", ".join(f"vhost {v!r} upstream {u!r} ({s})" for v, u, s in left)
            raise FederationError(
                f"cluster {client.cluster_name}: federation links still up {timeout:.0f}s "
                f"after their upstreams were paused: {names}; expected none"
            )
        sleep(_LINK_POLL_SECONDS)
