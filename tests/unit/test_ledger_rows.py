"""Message rows: streamed and fsynced per flush, Parquet data files when a transfer
ends, every ROLL_ROWS rows, or at commit for a task that died."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest

from rmq_spark.ledger import layout, tables
from rmq_spark.ledger.durable import read_stream
from rmq_spark.ledger.layout import DATA_SCHEMA, run_partition_dir, run_rows_dir
from rmq_spark.ledger.resume import next_position
from rmq_spark.ledger.writer import MessageLedgerWriter, rows_table
from rmq_spark.model import Delivery, TransferKey
from rmq_spark.transfer.decisions import KEPT, MOVED, NOT_SELECTED, Decision
from tests.support.imports import imported_after

KEY = TransferKey("dr", "/", "orders", "main", "/", "orders")
OTHER = TransferKey("dr", "b", "billing", "main", "b", "billing")
T0 = datetime(2026, 1, 1, tzinfo=UTC)
T1 = datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC)


def delivery(position: int, *, confirmed: bool = True) -> Delivery:
    return Delivery(
        tag=position + 1,
        seq=position + 2,
        position=position,
        redelivered=position % 3 == 0,
        body_size=position * 10,
        body_sha256=f"body-{position}",
        properties_sha256=f"props-{position % 2}",
        message_id=None if position % 4 == 0 else f"m{position}",
        consumed_at=T0,
        confirmed_at=T1 if confirmed else None,
        session=position % 2,
        attempts=1 + position % 2,
        decision="kept" if position % 7 == 3 else "moved",
        detail=_details[position % 3],
    )


# No detail (a plain move), a routed move (a redrive's origin) and a kept one with its reason.
_details = (
    None,
    Decision(MOVED, routing_key="orders", exchange="", reason="rejected"),
    Decision(KEPT, reason=NOT_SELECTED),
)


def data_files(ledger: Path) -> list[Path]:
    return sorted(run_partition_dir(str(ledger), "r1").glob("*.parquet"))


def streams(ledger: Path) -> list[Path]:
    directory = run_rows_dir(str(ledger), "r1")
    return sorted(directory.glob("*.arrows")) if directory.is_dir() else []


def finished_streams(ledger: Path) -> list[Path]:
    """Streams of transfers that ended small, moved into the run partition by `close`."""
    return sorted(run_partition_dir(str(ledger), "r1").glob("*.arrows"))


def committed_positions(ledger: Path) -> list[int]:
    rows = tables.read_arrow(str(ledger), "messages", run_id="r1").to_pylist()
    return sorted(int(str(row["position"])) for row in rows)


@pytest.mark.parametrize("count", [1, 5000])
def test_rows_table_holds_every_field_of_every_delivery(count: int) -> None:
    deliveries = [delivery(p, confirmed=p % 5 != 0) for p in range(count)]
    table = rows_table(KEY, "3.1.0", deliveries)
    assert table.schema == DATA_SCHEMA
    rows = table.to_pylist()
    assert len(rows) == count
    for row, source in zip(rows, deliveries, strict=True):
        routed = source.detail is _details[1] and source.decision == "moved"
        assert row == {
            "source_cluster": "dr",
            "source_vhost": "/",
            "source_queue": "orders",
            "destination_cluster": "main",
            "destination_vhost": "/",
            "destination_queue": "orders",
            "position": source.position,
            "publish_seq": source.seq,
            "publish_attempts": source.attempts,
            "redelivered": source.redelivered,
            "body_size": source.body_size,
            "body_sha256": source.body_sha256,
            "properties_sha256": source.properties_sha256,
            "message_id": source.message_id,
            "consumed_at": source.consumed_at,
            "confirmed_at": source.confirmed_at,
            "task_attempt": "3.1.0",
            "session": source.session,
            "decision": source.decision,
            "publish_exchange": "" if routed else None,
            "publish_routing_key": "orders" if routed else None,
            "reason": None if source.detail is None else source.detail.reason,
        }


def test_rows_tables_of_two_transfers_keep_their_own_keys() -> None:
    first = rows_table(KEY, "a", [delivery(0)])
    second = rows_table(OTHER, "b", [delivery(1), delivery(2)])
    again = rows_table(KEY, "a", [delivery(3)] * 3)
    assert first.column("source_queue").to_pylist() == ["orders"]
    assert second.column("source_vhost").to_pylist() == ["b", "b"]
    assert second.column("task_attempt").to_pylist() == ["b", "b"]
    assert again.column("destination_queue").to_pylist() == ["orders"] * 3
    assert rows_table(KEY, "a", []).num_rows == 0


def test_a_transfers_key_columns_grow_with_its_batches() -> None:
    # The key columns are slices of a cached array, rebuilt longer when a batch outgrows it.
    for count in (3, 700, 5, 1500):
        table = rows_table(KEY, "a", [delivery(p) for p in range(count)])
        assert table.column("source_queue").to_pylist() == ["orders"] * count
        assert table.column("task_attempt").to_pylist() == ["a"] * count


def test_a_small_transfers_stream_moves_into_the_partition_and_the_commit_compacts_it(
    tmp_path: Path,
) -> None:
    tables.ensure_tables(str(tmp_path))
    ledger = MessageLedgerWriter(str(tmp_path), "r1", KEY, "0.0.0")
    ledger.write([delivery(p) for p in range(3)])
    ledger.write([delivery(p) for p in range(3, 5)])
    assert len(streams(tmp_path)) == 1
    assert data_files(tmp_path) == []

    ledger.close()

    assert streams(tmp_path) == []
    assert data_files(tmp_path) == []  # no Parquet written on the executor
    (finished,) = finished_streams(tmp_path)
    assert finished.name.startswith(KEY.file_prefix)
    assert next_position(str(tmp_path), "r1", KEY) == 5  # a retry numbers on after it
    # Alone in the run, it is still compacted: the log names only Parquet files.
    assert tables.commit_run(str(tmp_path), "r1") == 5
    assert committed_positions(tmp_path) == [0, 1, 2, 3, 4]
    assert finished_streams(tmp_path) == []
    assert [f.name.startswith("compacted-") for f in data_files(tmp_path)] == [True]


def test_a_large_transfers_stream_becomes_one_data_file_at_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(layout, "SMALL_FILE_BYTES", 64)  # any stream is "large"
    tables.ensure_tables(str(tmp_path))
    ledger = MessageLedgerWriter(str(tmp_path), "r1", KEY, "0.0.0")
    ledger.write([delivery(p) for p in range(5)])

    ledger.close()

    assert streams(tmp_path) == []
    assert finished_streams(tmp_path) == []
    (data_file,) = data_files(tmp_path)
    assert data_file.name.startswith(KEY.file_prefix)
    assert tables.commit_run(str(tmp_path), "r1") == 5
    assert committed_positions(tmp_path) == [0, 1, 2, 3, 4]


def test_a_long_transfer_rolls_its_stream_into_data_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(layout, "ROLL_ROWS", 4)
    tables.ensure_tables(str(tmp_path))
    ledger = MessageLedgerWriter(str(tmp_path), "r1", KEY, "0.0.0")
    for start in range(0, 10, 2):
        ledger.write([delivery(start), delivery(start + 1)])
    assert len(data_files(tmp_path)) == 2  # after rows 4 and 8
    ledger.close()
    assert len(data_files(tmp_path)) == 2
    assert len(finished_streams(tmp_path)) == 1  # rows 8 and 9
    assert streams(tmp_path) == []
    assert tables.commit_run(str(tmp_path), "r1") == 10
    assert committed_positions(tmp_path) == list(range(10))


def test_a_dead_tasks_stream_is_committed_once(tmp_path: Path) -> None:
    tables.ensure_tables(str(tmp_path))
    MessageLedgerWriter(str(tmp_path), "r1", KEY, "0.0.0").write([delivery(0), delivery(1)])
    finished = MessageLedgerWriter(str(tmp_path), "r1", OTHER, "0.1.0")
    finished.write([delivery(0)])
    finished.close()

    assert next_position(str(tmp_path), "r1", KEY) == 2
    assert tables.commit_run(str(tmp_path), "r1") == 3
    assert tables.commit_run(str(tmp_path), "r1") == 0
    assert streams(tmp_path) == []
    assert committed_positions(tmp_path) == [0, 0, 1]


def test_a_crash_between_data_file_and_stream_removal_adds_nothing_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(layout, "SMALL_FILE_BYTES", 64)  # converted at close
    tables.ensure_tables(str(tmp_path))
    ledger = MessageLedgerWriter(str(tmp_path), "r1", KEY, "0.0.0")
    ledger.write([delivery(0), delivery(1)])
    (stream,) = streams(tmp_path)
    kept = stream.read_bytes()
    ledger.close()
    stream.write_bytes(kept)  # as if the process died before removing it

    assert tables.commit_run(str(tmp_path), "r1") == 2
    assert committed_positions(tmp_path) == [0, 1]
    assert streams(tmp_path) == []


@pytest.mark.parametrize("torn", [False, True])
def test_a_finished_streams_move_left_half_done_adds_its_rows_once(
    tmp_path: Path, torn: bool
) -> None:
    # A file system that renames by copying (FUSE) left both copies when a crash came:
    # whole in rows/, and in the partition whole or torn (a prefix of it).
    tables.ensure_tables(str(tmp_path))
    ledger = MessageLedgerWriter(str(tmp_path), "r1", KEY, "0.0.0")
    ledger.write([delivery(p) for p in range(3)])
    ledger.write([delivery(p) for p in range(3, 6)])
    (stream,) = streams(tmp_path)
    ledger.close()
    (finished,) = finished_streams(tmp_path)
    whole = finished.read_bytes()
    stream.write_bytes(whole)
    if torn:
        finished.write_bytes(whole[: len(whole) * 2 // 3])
        assert read_stream(finished).num_rows < 6

    assert tables.commit_run(str(tmp_path), "r1") == 6
    assert committed_positions(tmp_path) == list(range(6))
    assert streams(tmp_path) == []
    assert finished_streams(tmp_path) == []


def test_building_rows_does_not_import_pandas() -> None:
    """pa.array would import pandas (a third of a second per Spark Python worker)."""
    script = (
        "from datetime import UTC, datetime\n"
        "from rmq_spark.ledger.writer import TransferKey, rows_table\n"
        "from rmq_spark.transfer.window import Delivery\n"
        "now = datetime.now(UTC)\n"
        "rows = [Delivery(1, 1, 0, False, 3, 'b', 'p', None, now, confirmed_at=now)]\n"
        "assert rows_table(TransferKey('a', 'b', 'c', 'd', 'e', 'f'), 'x', rows).num_rows == 1\n"
    )
    assert not imported_after(script, "pandas")


def test_a_ledger_from_before_rabbitmq_versions_gains_the_column(tmp_path: Path) -> None:
    from deltalake import write_deltalake

    from rmq_spark.ledger import schema

    old_columns = tuple(c for c in schema.RUNS if c.name != "rabbitmq_versions")
    now = datetime(2026, 11, 23, tzinfo=UTC)
    row = {
        "run_id": "old",
        "started_at": now,
        "finished_at": now,
        "config_digest": "d",
        "spark_app_id": "app",
        "queues": 1,
        "messages": 1,
        "bytes": 1,
        "lost": 0,
        "duplicates": 0,
        "unexpected": 0,
        "verified": True,
        "seconds": 1.0,
        "verification_path": "v",
    }
    path = tables.table_path(str(tmp_path), "runs")
    write_deltalake(path, pa.Table.from_pylist([row], schema=schema.arrow_schema(old_columns)))

    versions = '{"dr": "4.3.6", "main": "4.3.6"}'
    tables.append_rows(
        str(tmp_path), "runs", [{**row, "run_id": "new", "rabbitmq_versions": versions}]
    )

    rows = sorted(tables.read_arrow(str(tmp_path), "runs").to_pylist(), key=lambda r: r["run_id"])
    assert [(r["run_id"], r["rabbitmq_versions"]) for r in rows] == [
        ("new", versions),
        ("old", None),
    ]


def test_starting_a_fresh_transfer_does_not_import_pandas(tmp_path: Path) -> None:
    """Every executor task asks where its transfer resumes (`resume.next_position`). A
    resume that reads earlier Parquet files does import pandas: pyarrow's Parquet and
    dataset readers do, whatever is asked of them."""
    script = (
        "from rmq_spark.ledger.resume import compacted_positions, next_position\n"
        "from rmq_spark.model import TransferKey\n"
        f"key = TransferKey(*{dataclasses.astuple(KEY)!r})\n"
        f"assert next_position({str(tmp_path)!r}, 'r1', key) == 0\n"
        "assert compacted_positions([], key).num_rows == 0\n"
    )
    assert not imported_after(script, "pandas")
