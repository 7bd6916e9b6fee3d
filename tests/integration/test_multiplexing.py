"""One executor task, several queues at once on one I/O loop (executor.move_queues).

Each check is independent of the mover's bookkeeping: an independent consumer reads
every destination queue, and the ledger's own timestamps show which transfers were
active at the same time.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from pathlib import Path

import pyarrow as pa

from rmq_spark.config import JobConfig, MoverConfig
from rmq_spark.ledger import tables
from rmq_spark.transfer.executor import ExecutorSettings, move_queues
from tests.support.brokers import Brokers, declare, drain_fingerprints, fresh_vhost, seed
from tests.support.faults import expected_fingerprints, fault_config

QUEUES = ("q0", "q1", "q2", "q3", "q4")
MESSAGES = 4_000


def plan_row(vhost: str, queue: str, destination: str | None = None) -> dict[str, object]:
    return {
        "source_cluster": "dr",
        "source_vhost": vhost,
        "source_queue": queue,
        "destination_cluster": "main",
        "destination_vhost": vhost,
        "destination_queue": destination or queue,
        "messages": MESSAGES,
        "message_bytes": MESSAGES * 1024,
    }


def settings_for(
    config: JobConfig, run_id: str, *, max_active: int, per_task: int
) -> ExecutorSettings:
    tables.ensure_tables(config.ledger.path)
    return ExecutorSettings(
        run_id=run_id,
        ledger_path=config.ledger.path,
        clusters=dict(config.clusters),
        window_messages=200,
        window_bytes=1 << 30,
        mover=MoverConfig(**(config.mover.model_dump() | {"queues_per_task": per_task})),
        max_active=max_active,
    )


def active_spans(ledger: pa.Table) -> dict[str, tuple[datetime, datetime]]:
    """Per source queue: first consume to last confirm, as the ledger recorded them."""
    spans: dict[str, tuple[datetime, datetime]] = {}
    for row in ledger.select(["source_queue", "consumed_at", "confirmed_at"]).to_pylist():
        first, last = spans.get(row["source_queue"], (row["consumed_at"], row["confirmed_at"]))
        spans[row["source_queue"]] = (
            min(first, row["consumed_at"]),
            max(last, row["confirmed_at"]),
        )
    return spans


def most_at_once(spans: dict[str, tuple[datetime, datetime]]) -> int:
    """The largest number of spans covering one instant."""
    events = sorted(
        [(start, 1) for start, _ in spans.values()] + [(end, -1) for _, end in spans.values()],
        key=lambda event: (event[0], event[1]),  # an end before a start at the same instant
    )
    current = peak = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


def test_a_task_moves_its_queues_two_at_a_time_on_one_loop(
    brokers: Brokers, password_env: str, tmp_path: Path
) -> None:
    vhost = fresh_vhost(brokers, "multiplex")
    for queue in QUEUES:
        seed(brokers.dr, vhost, queue, MESSAGES)
        declare(brokers.main, vhost, queue)
    config = fault_config(tmp_path, brokers, vhost)
    settings = settings_for(config, "multiplex", max_active=2, per_task=4)

    outcomes = move_queues([plan_row(vhost, q) for q in QUEUES], settings, "local")

    assert [o.key.source_queue for o in outcomes] == list(QUEUES)  # plan order kept
    assert [(o.status, o.messages) for o in outcomes] == [("moved", MESSAGES)] * len(QUEUES)
    for queue in QUEUES:
        found = drain_fingerprints(lambda: brokers.main.connect(vhost), queue)
        assert found == expected_fingerprints(vhost, queue, MESSAGES), queue
        left = drain_fingerprints(lambda: brokers.dr.connect(vhost), queue)
        assert left == Counter(), f"{queue} was not drained"
    tables.commit_run(config.ledger.path, "multiplex")
    ledger = tables.read_arrow(config.ledger.path, "messages", run_id="multiplex")
    rows_per_queue = Counter(ledger.column("source_queue").to_pylist())
    assert rows_per_queue == dict.fromkeys(QUEUES, MESSAGES)
    # max_active=2 caps the task at two queues at once, and it does use both.
    assert most_at_once(active_spans(ledger)) == 2


def test_a_failing_queue_does_not_stop_the_others_on_its_loop(
    brokers: Brokers, password_env: str, tmp_path: Path
) -> None:
    vhost = fresh_vhost(brokers, "multiplex-fail")
    for queue in ("ok-a", "refused", "ok-b"):
        seed(brokers.dr, vhost, queue, MESSAGES)
    declare(brokers.main, vhost, "ok-a")
    declare(brokers.main, vhost, "ok-b")
    # "refused" publishes to a destination queue that does not exist: every publish
    # is returned, so that transfer fails while the other two share its loop.
    config = fault_config(tmp_path, brokers, vhost)
    settings = settings_for(config, "multiplex-fail", max_active=3, per_task=3)
    rows = [plan_row(vhost, "ok-a"), plan_row(vhost, "refused", "missing"), plan_row(vhost, "ok-b")]

    outcomes = move_queues(rows, settings, "local")

    statuses = {o.key.source_queue: o.status for o in outcomes}
    assert statuses == {"ok-a": "moved", "refused": "failed", "ok-b": "moved"}
    failed = next(o for o in outcomes if o.status == "failed")
    assert failed.error is not None
    assert "returned" in failed.error

    for queue in ("ok-a", "ok-b"):
        found = drain_fingerprints(lambda: brokers.main.connect(vhost), queue)
        assert found == expected_fingerprints(vhost, queue, MESSAGES), queue
    left = drain_fingerprints(lambda: brokers.dr.connect(vhost), "refused")
    assert left == expected_fingerprints(vhost, "refused", MESSAGES)  # nothing lost
