"""bench.stages on real nodes: one sampled mover run says where its window sat."""

from __future__ import annotations

from pathlib import Path

from bench import stages
from bench.workload import Brokers as BenchBrokers
from bench.workload import Workload
from tests.support.brokers import Brokers


def test_a_sampled_move_accounts_for_the_whole_round_trip(brokers: Brokers, tmp_path: Path) -> None:
    for node in (brokers.dr, brokers.main):
        node.add_vhost(stages.VHOST)
    # measure() needs no CPU accounting, so the VM pids are not looked up.
    pair = BenchBrokers(src=brokers.dr, dst=brokers.main, src_pid=0, dst_pid=0)

    result = stages.measure(
        pair,
        Workload(messages=6_000, size=512),
        window=300,
        destination_type="classic",
        ledger=tmp_path / "ledger",
        queue="stages-test",
    )

    assert result["messages"] == 6_000
    assert result["rate"] > 0
    ms = result["milliseconds"]
    assert set(ms) == {"logging", "destination", "ledger", "source"}
    assert all(value >= 0 for value in ms.values())
    # Every delivery waits for a confirm: the destination's part cannot be nothing.
    assert ms["destination"] > 0
    # The stages add up to the round trip (the source's part is the remainder).
    assert abs(sum(ms.values()) - result["round_trip_ms"]) <= 0.5
    assert 0 <= result["destination_full_share"] <= 1
    # measure() removes the queue it seeded.
    for node in (brokers.dr, brokers.main):
        gone = node.management(
            "GET", f"/api/queues/{stages.VHOST}/stages-test", timeout=10, missing_ok=True
        )
        assert gone is None
