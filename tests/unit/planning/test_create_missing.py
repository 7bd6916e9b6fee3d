"""Missing destinations are declared for several vhosts at once, each on its own
connection, and what each vhost refused is reported in the plan's order."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from rmq_spark.broker import declare
from rmq_spark.config import ClusterConfig, parse_config
from rmq_spark.errors import BrokerUnreachableError, RmqSparkError
from rmq_spark.planning.preflight import _Candidate, _Destination, _Preflight
from tests.support.builders import TWO_CLUSTER_CONFIG, transfer


def test_vhosts_are_declared_into_at_once_and_refusals_keep_their_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started = threading.Barrier(3, timeout=10)
    threads: set[int] = set()
    declared: list[tuple[str, str]] = []

    def declare_queues(
        _cluster: str,
        _config: ClusterConfig,
        vhost: str,
        queues: Sequence[declare.QueueDeclaration],
    ) -> dict[str, RmqSparkError]:
        started.wait()
        threads.add(threading.get_ident())
        if vhost == "b":
            raise BrokerUnreachableError("vhost b: connection refused")
        declared.extend((vhost, queue.name) for queue in queues)
        return {"q1": RmqSparkError("q1 refused")} if vhost == "c" else {}

    monkeypatch.setattr(declare, "declare_queues", declare_queues)
    preflight = _Preflight(parse_config(TWO_CLUSTER_CONFIG, {"P": "p"}), {})
    problems: list[RmqSparkError] = []
    preflight.creation.problem = problems.append
    preflight.creation.raise_problems = lambda: None
    destinations = [
        _Destination(_Candidate(transfer(f"q{i}", 1, vhost=vhost), {}), None, create=True)
        for vhost in "abc"
        for i in range(2)
    ]

    preflight.creation.create_missing(destinations)

    assert len(threads) == 3
    assert sorted(declared) == [("a", "q0"), ("a", "q1"), ("c", "q0"), ("c", "q1")]
    assert [str(p) for p in problems] == ["vhost b: connection refused", "q1 refused"]
