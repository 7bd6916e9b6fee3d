"""park/table.py: the parked Delta table on the driver (delta-rs, no Spark)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from rmq_spark.errors import LedgerError
from rmq_spark.model import Delivery, TransferKey
from rmq_spark.park.table import commit_parked, ensure_parked_table
from rmq_spark.transfer import parked_completion
from rmq_spark.transfer.parked_completion import complete_groups, data_file_name
from rmq_spark.transfer.parked_rows import ParkedRowsWriter, run_partition, staged_partition
from rmq_spark.transfer.parked_table import read_parked, table_path

KEY = TransferKey("dr", "a/b=c", "orders", "parked", "a/b=c", "orders")


def deliveries(*bodies: bytes, first: int = 0) -> list[Delivery]:
    found = []
    for offset, body in enumerate(bodies):
        delivery = Delivery(
            tag=offset + 1,
            seq=offset + 1,
            position=first + offset,
            redelivered=False,
            body_size=len(body),
            body_sha256="",
            properties_sha256="",
            message_id=None,
            consumed_at=datetime(2026, 1, 1, tzinfo=UTC),
        )
        delivery.body, delivery.properties = body, b"\x00\x00"
        found.append(delivery)
    return found


def park(ledger: Path, run_id: str, *bodies: bytes, first: int = 0) -> None:
    writer = ParkedRowsWriter(str(ledger), run_id, KEY, "0.0.0")
    writer.write(deliveries(*bodies, first=first), lambda _tag: ("ex", "rk"))


def test_a_runs_files_are_committed_once_and_read_back_by_run(tmp_path: Path) -> None:
    ensure_parked_table(str(tmp_path))
    park(tmp_path, "run-1", b"a", b"b")
    park(tmp_path, "run-1", b"c", first=2)
    park(tmp_path, "run-2", b"z")
    assert commit_parked(str(tmp_path), "run-1") == 3
    assert commit_parked(str(tmp_path), "run-1") == 0  # a re-run adds nothing twice
    assert commit_parked(str(tmp_path), "run-2") == 1
    rows = read_parked(str(tmp_path), "run-1").to_pylist()
    assert sorted((r["position"], r["body"], r["run_id"]) for r in rows) == [
        (0, b"a", "run-1"),
        (1, b"b", "run-1"),
        (2, b"c", "run-1"),
    ]
    assert {r["source_vhost"] for r in rows} == {"a/b=c"}  # any vhost name: not a partition
    assert DeltaTable(table_path(str(tmp_path))).metadata().partition_columns == ["run_id"]


def test_a_crashed_commit_is_finished_by_the_next_one(tmp_path: Path) -> None:
    ensure_parked_table(str(tmp_path))
    park(tmp_path, "run-1", b"a")
    commit_parked(str(tmp_path), "run-1")
    park(tmp_path, "run-1", b"b", first=1)  # a retried task's file, after the first commit
    assert commit_parked(str(tmp_path), "run-1") == 1
    assert len(read_parked(str(tmp_path), "run-1")) == 2


def staged(ledger: Path, run_id: str) -> list[Path]:
    return sorted(Path(staged_partition(str(ledger), run_id)).glob("*.parquet"))


def data_files(ledger: Path, run_id: str) -> list[str]:
    return sorted(p.name for p in Path(run_partition(str(ledger), run_id)).glob("*.parquet"))


def test_a_transfers_staged_files_become_one_data_file_in_position_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ensure_parked_table(str(tmp_path))
    park(tmp_path, "run-1", b"d", b"e", first=3)  # staged out of order: a later batch first
    park(tmp_path, "run-1", b"a", b"b", b"c")
    assert commit_parked(str(tmp_path), "run-1") == 5
    [name] = data_files(tmp_path, "run-1")
    file = Path(run_partition(str(tmp_path), "run-1")) / name
    assert pq.read_table(file).column("position").to_pylist() == [0, 1, 2, 3, 4]
    assert pq.read_table(file).column("body").to_pylist() == [b"a", b"b", b"c", b"d", b"e"]


def test_a_data_file_holds_at_most_group_bytes_of_staged_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ensure_parked_table(str(tmp_path))
    for first in range(3):
        park(tmp_path, "run-1", b"x", first=first)
    size = max(file.stat().st_size for file in staged(tmp_path, "run-1"))
    monkeypatch.setattr(parked_completion, "GROUP_BYTES", 2 * size)
    assert commit_parked(str(tmp_path), "run-1") == 3
    assert len(data_files(tmp_path, "run-1")) == 2  # two staged files, then one
    assert sorted(r["position"] for r in read_parked(str(tmp_path), "run-1").to_pylist()) == [
        0,
        1,
        2,
    ]


def test_the_commit_completes_the_staged_rows_and_then_removes_them(tmp_path: Path) -> None:
    ensure_parked_table(str(tmp_path))
    park(tmp_path, "run-1", b"a", b"b")
    [file] = staged(tmp_path, "run-1")
    assert read_parked(str(tmp_path), "run-1").num_rows == 0  # staged: not in the table
    assert commit_parked(str(tmp_path), "run-1") == 2
    rows = read_parked(str(tmp_path), "run-1").to_pylist()
    # The selection columns, decoded at the commit (an empty property block: no headers).
    assert [(r["body"], r["headers"], r["delivery_mode"]) for r in rows] == [
        (b"a", [], None),
        (b"b", [], None),
    ]
    assert staged(tmp_path, "run-1") == []
    assert data_files(tmp_path, "run-1") == [data_file_name([file.name])]


def test_a_commit_that_died_after_completing_a_file_adds_it_once(tmp_path: Path) -> None:
    ensure_parked_table(str(tmp_path))
    park(tmp_path, "run-1", b"a")
    park(tmp_path, "run-1", b"b", first=1)
    first = staged(tmp_path, "run-1")[0].name
    complete_groups(str(tmp_path), "run-1", [[first]])  # completed, then the driver died
    assert commit_parked(str(tmp_path), "run-1") == 2
    assert sorted(r["position"] for r in read_parked(str(tmp_path), "run-1").to_pylist()) == [0, 1]


def test_a_staged_file_back_after_its_commit_is_removed_not_added_again(tmp_path: Path) -> None:
    ensure_parked_table(str(tmp_path))
    park(tmp_path, "run-1", b"a")
    [file] = staged(tmp_path, "run-1")
    content = file.read_bytes()
    commit_parked(str(tmp_path), "run-1")
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_bytes(content)  # the removal was not durable: a crash brought it back
    assert commit_parked(str(tmp_path), "run-1") == 0
    assert staged(tmp_path, "run-1") == []
    assert read_parked(str(tmp_path), "run-1").num_rows == 1


def test_staged_files_no_data_file_holds_after_the_completion_are_kept(tmp_path: Path) -> None:
    ensure_parked_table(str(tmp_path))
    park(tmp_path, "run-1", b"a")
    with pytest.raises(LedgerError, match="left 1 staged file"):
        commit_parked(str(tmp_path), "run-1", lambda _groups: [])  # completed nothing
    assert len(staged(tmp_path, "run-1")) == 1
    assert commit_parked(str(tmp_path), "run-1") == 1  # the next commit completes it


def test_a_table_of_another_schema_is_refused(tmp_path: Path) -> None:
    write_deltalake(table_path(str(tmp_path)), pa.table({"run_id": ["x"], "body": [b"b"]}))
    with pytest.raises(LedgerError, match="expected the parked table's columns"):
        ensure_parked_table(str(tmp_path))
