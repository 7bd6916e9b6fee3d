"""Pre-flight probes vhosts side by side, yet reports what they found as if one by
one: in plan order, an unreachable cluster once, the vhosts that opened with depths."""

from __future__ import annotations

import threading

import pytest

from rmq_spark.broker.counts import VhostProbe
from rmq_spark.config import ClusterConfig, parse_config
from rmq_spark.errors import AccessRefusedError, BrokerUnreachableError, DiscoveryError
from rmq_spark.planning import probes
from rmq_spark.planning.preflight import _Preflight
from tests.support.builders import TWO_CLUSTER_CONFIG


def test_probes_run_at_once_and_are_reported_in_plan_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started = threading.Barrier(4, timeout=10)  # all four probes must be in flight at once

    def probe(cluster: str, _config: ClusterConfig, vhost: str, queues: list[str]) -> VhostProbe:
        started.wait()
        if cluster == "dr":
            raise BrokerUnreachableError(f"cluster dr: cannot reach it ({vhost})")
        if vhost == "refused":
            raise AccessRefusedError("cluster main vhost 'refused': access refused")
        return VhostProbe({name: 7 for name in queues}, {})

    monkeypatch.setattr(probes, "probe_vhost", probe)
    config = parse_config(TWO_CLUSTER_CONFIG, {"P": "p"})
    checks = _Preflight(config, {})

    probes.probe_vhosts(
        config,
        {
            ("dr", "a"): ["q1"],
            ("main", "refused"): ["q2"],
            ("dr", "c"): ["q4"],
            ("main", "b"): ["q3", "q3"],
        },
        role="source",
        facts=checks.facts,
        problem=checks.problem,
    )

    assert [str(problem) for problem in checks._problems] == [
        "cluster dr: cannot reach it (a)",  # once for the cluster, not again for vhost c
        "cluster main vhost 'refused': access refused",
    ]
    assert checks.facts.unreachable == {"dr"}
    assert checks.facts.opened == {("main", "b"): {"q3": 7}}


class _ListingClient:
    """A management client that answers vhost and queue listings (one queue per vhost)."""

    def __init__(self, name: str, vhosts: list[str], *, listed: threading.Barrier | None = None):
        self.cluster_name, self.username = name, "mover"
        self._vhosts, self._listed = vhosts, listed
        self.listings: list[str] = []

    def vhosts(self) -> list[str]:
        return self._vhosts

    def overview(self) -> dict[str, str]:
        return {"rabbitmq_version": "3.10.8"}

    def queues(self, vhost: str) -> list[dict[str, object]]:
        self.listings.append(vhost)
        if self._listed is not None:
            self._listed.wait()  # the source probe must be in flight meanwhile
        if vhost not in self._vhosts:
            raise DiscoveryError(f"cluster {self.cluster_name} vhost {vhost!r}: does not exist")
        return [queue_row("q1", vhost)]


def queue_row(name: str, vhost: str) -> dict[str, object]:
    return {
        "name": name,
        "vhost": vhost,
        "type": "classic",
        "durable": True,
        "auto_delete": False,
        "exclusive": False,
        "arguments": {},
        "messages": 5,
        "messages_ready": 5,
        "message_bytes": 50,
        "message_bytes_ready": 50,
        "consumers": 0,
    }


def test_destinations_are_listed_while_the_sources_are_probed_and_only_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    beside = threading.Barrier(2, timeout=10)  # the destination listing and the probe

    def probe(cluster: str, _config: ClusterConfig, vhost: str, queues: list[str]) -> VhostProbe:
        if cluster == "dr":
            beside.wait()
        return VhostProbe({name: 5 for name in queues}, {})

    monkeypatch.setattr(probes, "probe_vhost", probe)
    config = parse_config(TWO_CLUSTER_CONFIG, {"P": "p"})
    dr, main = _ListingClient("dr", ["a"]), _ListingClient("main", ["a"], listed=beside)
    checks = _Preflight(config, {"dr": dr, "main": main})  # type: ignore[dict-item]

    candidates = checks.source_candidates()
    destinations = checks.check_destinations(candidates)

    assert [d.candidate.transfer.destination_queue for d in destinations] == ["q1"]
    assert destinations[0].existing == queue_row("q1", "a")
    assert (dr.listings, main.listings) == (["a"], ["a"])  # listed ahead, taken later
    assert checks._problems == []


def test_a_destination_listing_made_ahead_reports_its_failure_only_where_it_is_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        probes, "probe_vhost", lambda _c, _cfg, _v, queues: VhostProbe({q: 5 for q in queues}, {})
    )
    config = parse_config(TWO_CLUSTER_CONFIG, {"P": "p"})
    # Vhost "b" is on the source only: its destination listing fails ahead of time.
    dr, main = _ListingClient("dr", ["a", "b"]), _ListingClient("main", ["a"])
    checks = _Preflight(config, {"dr": dr, "main": main})  # type: ignore[dict-item]

    checks.check_destinations(checks.source_candidates())

    assert main.listings == ["a", "b"]
    # One problem: vhost b is missing on the destination (not its failed listing too).
    assert len(checks._problems) == 1
    assert "destination vhost does not exist" in str(checks._problems[0])
    assert "vhost 'b': does not exist" not in str(checks._problems[0])  # the listing's
