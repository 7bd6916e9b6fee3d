"""Committing a run's message rows: the choice of committer, the idempotency key, and
the commit batches that make a re-run or resume commit nothing twice with either
committer (Spark's Delta writer copies rows, so the log cannot name the files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rmq_spark.errors import LedgerError
from rmq_spark.ledger import committers, layout, tables
from rmq_spark.ledger.committers import (
    DELTA_RS,
    CommitKey,
    SparkDeltaCommitter,
    commit_app_id,
    committer_for,
    messages_write,
)
from rmq_spark.ledger.layout import is_data_file, run_partition_dir
from rmq_spark.ledger.writer import MessageLedgerWriter
from rmq_spark.model import TransferKey
from tests.support.builders import delivery
from tests.support.ledger_commits import Recording, recorded_version

KEY = TransferKey("dr", "/", "orders", "main", "/", "orders")
OTHER = TransferKey("dr", "b", "billing", "main", "b", "billing")


def moved(ledger: Path, key: TransferKey, positions: range, attempt: str = "0.0.0") -> None:
    """A transfer's rows, written as an executor writes them (a small one: one finished
    stream, `MessageLedgerWriter.close`)."""
    writer = MessageLedgerWriter(str(ledger), "r1", key, attempt)
    writer.write([delivery(p) for p in positions])
    writer.close()


def committed(ledger: Path) -> list[tuple[str, int]]:
    rows = tables.read_arrow(str(ledger), "messages", run_id="r1").to_pylist()
    return sorted((str(row["source_queue"]), int(str(row["position"]))) for row in rows)


def test_without_a_session_or_delta_classes_delta_rs_commits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    session = object()
    monkeypatch.setattr(committers, "spark_has_delta", lambda spark: False)
    assert committer_for(None) is DELTA_RS
    assert committer_for(session) is DELTA_RS  # type: ignore[arg-type]

    monkeypatch.setattr(committers, "spark_has_delta", lambda spark: spark is session)
    assert isinstance(committer_for(session), SparkDeltaCommitter)  # type: ignore[arg-type]


def test_sparks_delta_write_is_an_idempotent_append_of_the_run_partition() -> None:
    write = messages_write(CommitKey(commit_app_id("r1"), 3))

    assert (write.format, write.mode, write.partition_by) == ("delta", "append", ("run_id",))
    assert dict(write.options) == {"txnAppId": "rmq-spark/messages/r1", "txnVersion": "3"}
    assert dict(committers.ROWS_WRITE.options) == {"mergeSchema": "true"}
    assert committers.ROWS_WRITE.mode == "append"
    assert commit_app_id("r1") != commit_app_id("r2")


def test_each_commit_of_a_run_records_the_next_version_of_its_key(tmp_path: Path) -> None:
    tables.ensure_tables(str(tmp_path))
    moved(tmp_path, KEY, range(3))
    assert tables.commit_run(str(tmp_path), "r1") == 3
    assert recorded_version(tmp_path) == 0

    moved(tmp_path, OTHER, range(2))  # a resumed run moved more
    assert tables.commit_run(str(tmp_path), "r1") == 2
    assert tables.commit_run(str(tmp_path), "r1") == 0
    assert recorded_version(tmp_path) == 1
    assert recorded_version(tmp_path, "r2") is None
    assert committed(tmp_path) == [("billing", 0), ("billing", 1)] + [
        ("orders", p) for p in range(3)
    ]


def test_the_committer_is_handed_one_compacted_file_of_the_executors_small_files(
    tmp_path: Path,
) -> None:
    tables.ensure_tables(str(tmp_path))
    moved(tmp_path, KEY, range(3))
    moved(tmp_path, OTHER, range(2))
    partition = run_partition_dir(str(tmp_path), "r1")
    # What a Spark write that failed half-way leaves: a file of Spark's, in no commit.
    spark_file = partition / "part-00000-6f1c0a52-0d9e-4a8e-9a55-3f6b8f8f1b1e.c000.snappy.parquet"
    spark_file.write_bytes(b"not ours")
    executor_files = sorted(p.name for p in partition.iterdir() if is_data_file(p.name))
    recording = Recording()

    assert tables.commit_run(str(tmp_path), "r1", recording) == 5

    ((files, key),) = recording.calls
    assert len(executor_files) == 2
    assert [name.startswith("compacted-0000000000-0000-") for name in files] == [True]
    assert key == CommitKey("rmq-spark/messages/r1", 0)
    (batch,) = tables.read_commit_batches(str(tmp_path), "r1")
    assert (batch.files, batch.replaced, batch.compacted) == (
        tuple(executor_files),
        tuple(executor_files),
        tuple(files),
    )
    # The executor files are copies once committed; Spark's stray file is not ours.
    assert sorted(p.name for p in partition.iterdir()) == sorted([*files, spark_file.name])
    assert committed(tmp_path) == [("billing", 0), ("billing", 1)] + [
        ("orders", p) for p in range(3)
    ]


def test_a_single_data_file_is_committed_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(layout, "SMALL_FILE_BYTES", 64)  # the writer leaves Parquet
    tables.ensure_tables(str(tmp_path))
    moved(tmp_path, KEY, range(3))
    recording = Recording()

    assert tables.commit_run(str(tmp_path), "r1", recording) == 3

    ((files, _key),) = recording.calls
    assert [is_data_file(name) for name in files] == [True]
    (batch,) = tables.read_commit_batches(str(tmp_path), "r1")
    assert (batch.compacted, batch.replaced) == ((), ())


def test_a_driver_that_died_before_committing_its_batch_commits_it_once_later(
    tmp_path: Path,
) -> None:
    tables.ensure_tables(str(tmp_path))
    moved(tmp_path, KEY, range(3))
    dying = Recording(fail_before=True)
    with pytest.raises(RuntimeError, match="before the commit"):
        tables.commit_run(str(tmp_path), "r1", dying)
    assert committed(tmp_path) == []
    moved(tmp_path, OTHER, range(2))  # the re-run moved more before committing

    resumed = Recording()
    assert tables.commit_run(str(tmp_path), "r1", resumed) == 5
    assert tables.commit_run(str(tmp_path), "r1", resumed) == 0

    # The written batch again under its own version, then the new file under the next.
    assert [(len(files), key.version) for files, key in resumed.calls] == [(1, 0), (1, 1)]
    assert resumed.calls[0][0] == dying.calls[0][0]
    assert committed(tmp_path) == [("billing", 0), ("billing", 1)] + [
        ("orders", p) for p in range(3)
    ]


def test_a_driver_that_died_after_committing_commits_nothing_twice(tmp_path: Path) -> None:
    tables.ensure_tables(str(tmp_path))
    moved(tmp_path, KEY, range(3))
    with pytest.raises(RuntimeError, match="after the commit"):
        tables.commit_run(str(tmp_path), "r1", Recording(fail_after=True))

    resumed = Recording()
    assert tables.commit_run(str(tmp_path), "r1", resumed) == 0
    assert resumed.calls == []
    assert committed(tmp_path) == [("orders", p) for p in range(3)]


def test_files_committed_by_reference_before_batches_existed_stay_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(layout, "SMALL_FILE_BYTES", 64)  # Parquet, as those builds wrote
    tables.ensure_tables(str(tmp_path))
    moved(tmp_path, KEY, range(3))
    assert tables.commit_run(str(tmp_path), "r1") == 3
    for batch in tables.commit_batches_dir(str(tmp_path), "r1").iterdir():
        batch.unlink()  # a ledger from before commit batches: only the log names them

    assert tables.commit_run(str(tmp_path), "r1") == 0
    assert committed(tmp_path) == [("orders", p) for p in range(3)]


def test_a_damaged_commit_batch_is_refused_naming_it(tmp_path: Path) -> None:
    tables.ensure_tables(str(tmp_path))
    moved(tmp_path, KEY, range(1))
    directory = tables.commit_batches_dir(str(tmp_path), "r1")
    directory.mkdir(parents=True)
    (directory / "batch-0000000000.json").write_text('{"version": 0}')

    with pytest.raises(LedgerError, match=r"batch-0000000000\.json: expected JSON"):
        tables.commit_run(str(tmp_path), "r1")
    assert committed(tmp_path) == []


@pytest.mark.parametrize(
    ("name", "ours"),
    [
        ("part-0123456789abcdef-3.1.0-5f0c1e2d3c4b5a69788796a5b4c3d2e1.parquet", True),
        ("part-0123456789abcdef-intents-5f0c1e2d3c4b5a69788796a5b4c3d2e1.parquet", True),
        ("part-0123456789abcdef-3.1.0-5f0c1e2d3c4b5a69788796a5b4c3d2e1.arrows", True),
        ("part-00000-6f1c0a52-0d9e-4a8e-9a55-3f6b8f8f1b1e.c000.snappy.parquet", False),
        ("part-00001-tid-4242-6f1c0a52-0d9e-4a8e-9a55-3f6b8f8f1b1e-7-1.c000.snappy.parquet", False),
        (".staging-part-0123456789abcdef-3.1.0-5f0c.parquet", False),
    ],
)
def test_only_rmq_sparks_own_data_files_are_chosen(name: str, ours: bool) -> None:
    assert is_data_file(name) is ours
