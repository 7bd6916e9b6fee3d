"""Compaction at commit time: many small executor files become a few large ones in
the run's commit, and a driver killed between any two of its durable steps (compacted
files, commit batch, Delta commit, removal of the executor files) neither loses a row
nor commits one twice. Real Parquet files and a real Delta table (delta-rs); a kill
is an exception raised between two steps."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rmq_spark.ledger import compaction, durable, tables
from rmq_spark.ledger.layout import (
    SMALL_FILE_BYTES,
    STREAM_SUFFIX,
    is_data_file,
    run_partition_dir,
    run_rows_dir,
)
from rmq_spark.ledger.resume import compacted_files, compacted_positions, next_position
from rmq_spark.ledger.writer import IntentLog, MessageLedgerWriter
from rmq_spark.model import TransferKey
from tests.support.builders import delivery
from tests.support.ledger_commits import Recording, recorded_version

KEYS = [TransferKey("dr", f"v{i % 3}", f"q{i}", "main", f"v{i % 3}", f"q{i}") for i in range(12)]
ROWS_EACH = 4


class DriverKilledError(RuntimeError):
    """The driver died here."""


def moved_all(ledger: Path, keys: list[TransferKey] = KEYS, first: int = 0) -> None:
    """Each transfer's rows as its executor leaves them: a finished stream (a small
    transfer's), or every other one a Parquet file, as a dead task's stream becomes one."""
    partition = run_partition_dir(str(ledger), "r1")
    for index, key in enumerate(keys):
        writer = MessageLedgerWriter(str(ledger), "r1", key, "0.0.0")
        writer.write([delivery(p) for p in range(first, first + ROWS_EACH)])
        writer.close()
        if index % 2:
            (finished,) = partition.glob(f"{key.file_prefix}*{STREAM_SUFFIX}")
            durable.stream_to_data_file(finished, partition)


def file_rows(path: Path) -> list[dict[str, Any]]:
    """An executor file's rows: Parquet, or a finished stream."""
    stream = path.name.endswith(STREAM_SUFFIX)
    table = durable.read_stream(path) if stream else parquet_rows(path)
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows


def parquet_rows(path: Path) -> pa.Table:
    """A Parquet file's own columns: no `run_id` found in its directory's name (older
    pyarrow, the Databricks lane's, reads a hive partition from the path)."""
    return pq.ParquetFile(path).read()


def committed(ledger: Path) -> list[tuple[str, int]]:
    rows = tables.read_arrow(str(ledger), "messages", run_id="r1").to_pylist()
    return sorted((str(row["source_queue"]), int(str(row["position"]))) for row in rows)


def expected(
    keys: list[TransferKey] = KEYS, positions: range = range(ROWS_EACH)
) -> list[tuple[str, int]]:
    return sorted((key.source_queue, p) for key in keys for p in positions)


def partition_files(ledger: Path) -> dict[str, list[str]]:
    names = sorted(p.name for p in run_partition_dir(str(ledger), "r1").iterdir())
    return {
        "executor": [n for n in names if is_data_file(n)],
        "compacted": [n for n in names if n.startswith("compacted-")],
        "other": [n for n in names if not is_data_file(n) and not n.startswith("compacted-")],
    }


def dying_after(
    monkeypatch: pytest.MonkeyPatch, name: str, *, calls: int = 1
) -> Callable[..., Any]:
    """Replace compaction.`name` with the real step that raises DriverKilledError after `calls`."""
    real: Callable[..., Any] = getattr(compaction, name)
    seen = {"calls": 0}

    def step(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        seen["calls"] += 1
        if seen["calls"] >= calls:
            raise DriverKilledError(f"driver died after {name}")
        return result

    monkeypatch.setattr(compaction, name, step)
    return real


def executor_file_names(partition: Path) -> list[str]:
    return [name for name, _ in tables.data_file_sizes(partition)]


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    tables.ensure_tables(str(tmp_path))
    moved_all(tmp_path)
    return tmp_path


def test_twelve_small_files_are_committed_as_one_compacted_file(ledger: Path) -> None:
    recording = Recording()

    assert tables.commit_run(str(ledger), "r1", recording) == len(KEYS) * ROWS_EACH

    ((files, key),) = recording.calls
    assert len(files) == 1
    assert key.version == 0
    assert partition_files(ledger) == {"executor": [], "compacted": files, "other": []}
    assert committed(ledger) == expected()


def test_compaction_cuts_the_rows_into_files_of_the_limit_in_order(ledger: Path) -> None:
    partition = run_partition_dir(str(ledger), "r1")
    names = executor_file_names(partition)

    written = compaction.compact(partition, names, 7, rows_per_file=10)

    counts = [pq.read_metadata(partition / name).num_rows for name in written]
    assert counts == [10, 10, 10, 10, 8]  # 48 rows of 4-row files, cut at 10
    assert all(name.startswith("compacted-0000000007-") for name in written)
    copied = [row for name in written for row in parquet_rows(partition / name).to_pylist()]
    sources = [row for name in names for row in file_rows(partition / name)]
    assert copied == sources


def test_a_group_read_a_few_files_per_scan_keeps_every_row_in_order(
    ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compaction, "FILES_PER_SCAN", 5)  # 12 files: scans of 5, 5 and 2
    partition = run_partition_dir(str(ledger), "r1")
    names = sorted(executor_file_names(partition))

    (written,) = compaction.compact(partition, names, 7)

    rows = parquet_rows(partition / written).to_pylist()
    read_in_order = [
        (str(row["source_queue"]), int(str(row["position"])))
        for name in names
        for row in file_rows(partition / name)
    ]
    assert [(str(r["source_queue"]), int(str(r["position"]))) for r in rows] == read_in_order
    assert len(rows) == len(KEYS) * ROWS_EACH


def test_a_scan_holds_at_most_its_files_and_bytes_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(compaction, "FILES_PER_SCAN", 3)
    monkeypatch.setattr(compaction, "SCAN_BYTES", 100)
    files = [("a", 10), ("b", 10), ("c", 10), ("d", 60), ("e", 50), ("f", 500), ("g", 1)]

    cut = [[name for name, _ in scan] for scan in compaction.scans(files)]

    # Three files at most; 60 + 50 would pass 100 bytes; a large file alone.
    assert cut == [["a", "b", "c"], ["d"], ["e"], ["f"], ["g"]]
    assert list(compaction.scans([])) == []


def test_file_sizes_come_from_the_listing_in_the_names_order(ledger: Path) -> None:
    partition = run_partition_dir(str(ledger), "r1")
    names = sorted(executor_file_names(partition), reverse=True)

    sizes = compaction.file_sizes(partition, names)

    assert list(sizes) == names
    assert sizes == {name: (partition / name).stat().st_size for name in names}
    assert compaction.small_files(sizes) == names  # 4 rows each: all worth compacting
    assert compaction.small_files({"rolled.parquet": SMALL_FILE_BYTES}) == []
    assert compaction.file_sizes(partition, []) == {}


def test_killed_while_compacting_leaves_an_orphan_that_the_next_commit_removes(
    ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = dying_after(monkeypatch, "compact")
    with pytest.raises(DriverKilledError):
        tables.commit_run(str(ledger), "r1")
    orphan = partition_files(ledger)["compacted"]
    assert len(orphan) == 1
    assert recorded_version(ledger) is None
    assert tables.read_commit_batches(str(ledger), "r1") == []
    monkeypatch.setattr(compaction, "compact", real)
    moved_all(ledger, KEYS[:2], first=ROWS_EACH)  # the re-run moved more before committing

    assert tables.commit_run(str(ledger), "r1") == len(KEYS) * ROWS_EACH + 2 * ROWS_EACH
    assert tables.commit_run(str(ledger), "r1") == 0

    files = partition_files(ledger)
    assert orphan[0] not in files["compacted"]
    assert files["executor"] == []
    assert committed(ledger) == sorted(
        expected() + expected(KEYS[:2], range(ROWS_EACH, 2 * ROWS_EACH))
    )


def test_killed_after_writing_the_batch_commits_its_compacted_files_once_later(
    ledger: Path,
) -> None:
    with pytest.raises(RuntimeError, match="before the commit"):
        tables.commit_run(str(ledger), "r1", Recording(fail_before=True))
    (batch,) = tables.read_commit_batches(str(ledger), "r1")
    assert len(batch.replaced) == len(KEYS)
    assert len(batch.compacted) == 1
    # Not committed yet: the executor files stay until it is.
    assert len(partition_files(ledger)["executor"]) == len(KEYS)

    resumed = Recording()
    assert tables.commit_run(str(ledger), "r1", resumed) == len(KEYS) * ROWS_EACH
    assert tables.commit_run(str(ledger), "r1", resumed) == 0

    assert [(files, key.version) for files, key in resumed.calls] == [(list(batch.compacted), 0)]
    assert partition_files(ledger) == {
        "executor": [],
        "compacted": list(batch.compacted),
        "other": [],
    }
    assert committed(ledger) == expected()


def test_killed_after_the_commit_commits_nothing_twice_and_removes_the_copies(
    ledger: Path,
) -> None:
    with pytest.raises(RuntimeError, match="after the commit"):
        tables.commit_run(str(ledger), "r1", Recording(fail_after=True))
    assert len(partition_files(ledger)["executor"]) == len(KEYS)

    resumed = Recording()
    assert tables.commit_run(str(ledger), "r1", resumed) == 0
    assert resumed.calls == []
    assert partition_files(ledger)["executor"] == []
    assert committed(ledger) == expected()


def test_killed_while_removing_the_copies_removes_the_rest_next_time(
    ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = run_partition_dir(str(ledger), "r1")

    def remove_one_then_die(where: Path, names: Any) -> int:
        names = sorted(names)
        if where == partition and len(names) > 1:
            (where / names[0]).unlink()
            raise DriverKilledError("driver died while removing")
        return 0

    real = compaction.remove
    monkeypatch.setattr(compaction, "remove", remove_one_then_die)
    with pytest.raises(DriverKilledError):
        tables.commit_run(str(ledger), "r1")
    assert len(partition_files(ledger)["executor"]) == len(KEYS) - 1
    monkeypatch.setattr(compaction, "remove", real)

    assert tables.commit_run(str(ledger), "r1") == 0
    assert partition_files(ledger)["executor"] == []
    assert committed(ledger) == expected()


def test_a_left_stream_of_a_compacted_file_does_not_come_back(ledger: Path) -> None:
    """A stream whose data file was written (then compacted and removed) but which
    a crash left behind is only removed: converting it again would add its rows twice."""
    key = TransferKey("dr", "v0", "late", "main", "v0", "late")
    writer = MessageLedgerWriter(str(ledger), "r1", key, "0.0.0")
    writer.write([delivery(p) for p in range(3)])
    streams = list(run_rows_dir(str(ledger), "r1").iterdir())
    assert len(streams) == 1
    kept = streams[0].read_bytes()
    writer.close()  # the stream moves into the partition, finished
    assert tables.commit_run(str(ledger), "r1") == len(KEYS) * ROWS_EACH + 3
    streams[0].write_bytes(kept)  # as if the removal had never happened

    assert tables.commit_run(str(ledger), "r1") == 0
    assert not streams[0].exists()
    assert committed(ledger) == sorted(expected() + [("late", p) for p in range(3)])


def test_a_resumed_task_numbers_after_its_rows_in_compacted_files(ledger: Path) -> None:
    assert tables.commit_run(str(ledger), "r1") == len(KEYS) * ROWS_EACH
    assert partition_files(ledger)["executor"] == []

    assert next_position(str(ledger), "r1", KEYS[5]) == ROWS_EACH
    partition = run_partition_dir(str(ledger), "r1")
    positions = compacted_positions(compacted_files(partition), KEYS[5])["position"]
    assert positions.to_pylist() == list(range(ROWS_EACH))
    unknown = TransferKey("dr", "v0", "never", "main", "v0", "never")
    assert next_position(str(ledger), "r1", unknown) == 0


def test_intents_whose_rows_were_compacted_do_not_become_uncertain_rows(ledger: Path) -> None:
    # A task logged intents for positions 0..5 of one transfer; 0..3 have rows (now
    # compacted and committed); it died before 4 and 5.
    intents = IntentLog(str(ledger), "r1", KEYS[3], "0.0.0")
    intents.append([delivery(p, confirmed=False) for p in range(ROWS_EACH + 2)])
    intents.close(finished=False)
    assert tables.commit_run(str(ledger), "r1") == len(KEYS) * ROWS_EACH + 2
    assert tables.commit_run(str(ledger), "r1") == 0

    mine = [row for row in committed(ledger) if row[0] == KEYS[3].source_queue]
    assert mine == [(KEYS[3].source_queue, p) for p in range(ROWS_EACH + 2)]
    assert len(committed(ledger)) == len(KEYS) * ROWS_EACH + 2
