"""One task's queues of one vhost share a connection per side, a channel per queue.

Each check is the brokers' view or an independent consumer's: the management API
lists the task's connections while it runs, an independent consumer reads every
destination and source queue, and the ledger's data files name every copy.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rmq_spark.config import JobConfig, Limits, MoverConfig
from rmq_spark.ledger import tables
from rmq_spark.ledger.durable import read_stream
from rmq_spark.ledger.layout import STREAM_SUFFIX, run_partition_dir
from rmq_spark.model import MoveOutcome
from rmq_spark.transfer.executor import ExecutorSettings, move_queues
from tests.support.brokers import Brokers, declare, depth, drain_fingerprints, fresh_vhost, seed
from tests.support.faults import (
    close_mover_connections,
    expected_fingerprints,
    fault_config,
    mover_connections,
    wait_until,
)

WINDOW = 200
ROUTE = "shared"


def plan_row(vhost: str, queue: str, messages: int) -> dict[str, object]:
    return {
        "source_cluster": "dr",
        "source_vhost": vhost,
        "source_queue": queue,
        "destination_cluster": "main",
        "destination_vhost": vhost,
        "destination_queue": queue,
        "messages": messages,
        "message_bytes": messages * 1024,
        "route": ROUTE,
    }


def settings_for(
    config: JobConfig, run_id: str, *, at_once: int, limits: Limits | None = None
) -> ExecutorSettings:
    tables.ensure_tables(config.ledger.path)
    return ExecutorSettings(
        run_id=run_id,
        ledger_path=config.ledger.path,
        clusters=dict(config.clusters),
        window_messages=WINDOW,
        window_bytes=1 << 30,
        mover=MoverConfig(**(config.mover.model_dump() | {"queues_per_task": at_once})),
        max_active=at_once,
        rate_limits={ROUTE: limits} if limits is not None else {},
    )


class MoveInBackground(threading.Thread):
    """`move_queues` on a thread, so the test can watch the brokers meanwhile."""

    def __init__(self, rows: list[dict[str, object]], settings: ExecutorSettings) -> None:
        super().__init__(daemon=True)
        self._rows, self._settings = rows, settings
        self.outcomes: list[MoveOutcome] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.outcomes = move_queues(self._rows, self._settings, "local")
        except BaseException as exc:
            self.error = exc


def uncommitted_rows(ledger_path: str, run_id: str) -> list[dict[str, Any]]:
    """The run's rows as its executors left them: Parquet data files, and the finished
    streams of transfers that ended small (`writer.MessageLedgerWriter.close`)."""
    partition = run_partition_dir(ledger_path, run_id)
    read = [pq.read_table(path) for path in sorted(partition.glob("*.parquet"))]
    read += [read_stream(path) for path in sorted(partition.glob(f"*{STREAM_SUFFIX}"))]
    rows: list[dict[str, Any]] = pa.concat_tables(read).to_pylist()
    return rows


def test_queues_of_one_vhost_share_one_connection_per_side(
    brokers: Brokers, password_env: str, tmp_path: Path
) -> None:
    vhost = fresh_vhost(brokers, "shared-connections")
    queues = [f"q{index}" for index in range(6)]
    # Enough for a run of several seconds: the management API lists a connection once
    # its first statistics are in (every second on the harness's nodes).
    count = 15_000
    for queue in queues:
        seed(brokers.dr, vhost, queue, count)
        declare(brokers.main, vhost, queue)
    config = fault_config(tmp_path, brokers, vhost)
    move = MoveInBackground(
        [plan_row(vhost, q, count) for q in queues], settings_for(config, "shared", at_once=3)
    )
    seen: dict[str, set[str]] = {"consumer": set(), "publisher": set()}

    move.start()
    while move.is_alive():  # what the brokers list while the task runs
        for role, node in (("consumer", brokers.dr), ("publisher", brokers.main)):
            seen[role] |= {c["name"] for c in mover_connections(node, role, "shared")}
        move.join(0.1)

    assert move.error is None, repr(move.error)
    assert [(o.status, o.messages) for o in move.outcomes] == [("moved", count)] * len(queues)
    assert {role: len(names) for role, names in seen.items()} == {"consumer": 1, "publisher": 1}
    for queue in queues:
        found = drain_fingerprints(lambda: brokers.main.connect(vhost), queue)
        assert found == expected_fingerprints(vhost, queue, count), queue
        assert depth(brokers.dr, vhost, queue) == 0
    # The task closed its connections when its movers were done.
    wait_until(lambda: not mover_connections(brokers.dr, "consumer", "shared"), "closed")


def test_a_shared_connection_closed_mid_run_ends_every_session_on_it_without_loss(
    brokers: Brokers, password_env: str, tmp_path: Path
) -> None:
    vhost = fresh_vhost(brokers, "shared-lost")
    queues = [f"q{index}" for index in range(4)]
    count = 15_000
    for queue in queues:
        seed(brokers.dr, vhost, queue, count)
        declare(brokers.main, vhost, queue)
    config = fault_config(tmp_path, brokers, vhost)
    # Held to 1,500 msg/s a queue (10 s each), so no queue can finish before the
    # connection is closed, however fast or slow the machine is.
    limits = Limits(messages_per_second=1500.0)
    move = MoveInBackground(
        [plan_row(vhost, q, count) for q in queues],
        settings_for(config, "lost", at_once=4, limits=limits),
    )

    move.start()
    # Listed by the management API once its first statistics are in (about a second).
    wait_until(lambda: bool(mover_connections(brokers.dr, "consumer", "lost")), "listed")
    wait_until(
        lambda: all(depth(brokers.main, vhost, q) >= count // 10 for q in queues),
        "a tenth of every queue to arrive",
    )
    assert close_mover_connections(brokers.dr, "consumer", "lost") == 1  # one for all four
    move.join()

    assert move.error is None, repr(move.error)
    assert [o.status for o in move.outcomes] == ["moved"] * len(queues)
    assert all(o.sessions >= 2 for o in move.outcomes)  # every queue on it was lost, and resumed
    rows = uncommitted_rows(config.ledger.path, "lost")
    for queue in queues:
        found = drain_fingerprints(lambda: brokers.main.connect(vhost), queue)
        left = drain_fingerprints(lambda: brokers.dr.connect(vhost), queue)
        expected = expected_fingerprints(vhost, queue, count)
        assert left == Counter(), f"{queue} was not drained"
        assert expected - found == Counter(), f"{queue}: messages lost"
        named = Counter(
            (row["body_sha256"], row["properties_sha256"])
            for row in rows
            if row["source_queue"] == queue
        )
        assert found - named == Counter(), f"{queue}: a destination copy has no ledger row"
        assert sum((found - expected).values()) <= WINDOW, f"{queue}: more duplicates than a window"


def test_a_channel_the_broker_closes_fails_only_its_queue(
    brokers: Brokers, password_env: str, tmp_path: Path
) -> None:
    """A missing source queue: the broker closes that consumer's channel (404); the
    other queues on the same source connection carry on."""
    vhost = fresh_vhost(brokers, "shared-404")
    for queue in ("ok-a", "ok-b"):
        seed(brokers.dr, vhost, queue, 2000)
        declare(brokers.main, vhost, queue)
    declare(brokers.main, vhost, "missing")
    config = fault_config(tmp_path, brokers, vhost)
    rows = [
        plan_row(vhost, "ok-a", 2000),
        plan_row(vhost, "missing", 0),
        plan_row(vhost, "ok-b", 2000),
    ]

    outcomes = move_queues(rows, settings_for(config, "shared-404", at_once=3), "local")

    statuses = {o.key.source_queue: o.status for o in outcomes}
    assert statuses == {"ok-a": "moved", "missing": "failed", "ok-b": "moved"}
    failed = next(o for o in outcomes if o.status == "failed")
    assert "404" in (failed.error or "")
    assert "'missing'" in (failed.error or "")
    assert all(o.sessions == 1 for o in outcomes)  # no session of the others was lost
    for queue in ("ok-a", "ok-b"):
        found = drain_fingerprints(lambda: brokers.main.connect(vhost), queue)
        assert found == expected_fingerprints(vhost, queue, 2000), queue
