"""Pre-flight probes vhosts side by side, yet reports what they found as if one by
one: in plan order, an unreachable cluster once, the vhosts that opened with depths."""

from __future__ import annotations

import threading

import pytest

from rmq_spark.broker.counts import VhostProbe
from rmq_spark.config import ClusterConfig, parse_config
from rmq_spark.errors import AccessRefusedError, BrokerUnreachableError
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
