"""Intents logged before publishing become uncertain rows when their task died."""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs
import pytest

from rmq_spark.ledger import store, tables
from rmq_spark.ledger.durable import read_stream
from rmq_spark.ledger.fences import record_fence
from rmq_spark.ledger.layout import run_fences_dir, run_intents_dir
from rmq_spark.ledger.resume import EarlierFiles, next_position
from rmq_spark.ledger.writer import IntentLog, MessageLedgerWriter
from rmq_spark.model import TransferKey
from tests.support.builders import delivery

KEY = TransferKey("dr", "/", "orders", "main", "/", "orders")


def committed_rows(ledger: Path, run_id: str) -> list[dict[str, object]]:
    rows = tables.read_arrow(str(ledger), "messages", run_id=run_id).to_pylist()
    return sorted(rows, key=lambda row: int(str(row["position"])))


def logged_intents(ledger: Path, positions: range) -> None:
    """The ledger's tables, and KEY's intents for `positions` left by a task that died."""
    tables.ensure_tables(str(ledger))
    intents = IntentLog(str(ledger), "r1", KEY, "0.0.0")
    intents.append([delivery(p, confirmed=False) for p in positions])
    intents.close(finished=False)


def test_intents_without_rows_become_uncertain_rows_once(tmp_path: Path) -> None:
    logged_intents(tmp_path, range(4))
    # Positions 0 and 1 were confirmed and written; the task died before 2 and 3.
    MessageLedgerWriter(str(tmp_path), "r1", KEY, "0.0.0").write(
        [delivery(p, confirmed=True) for p in range(2)]
    )

    assert tables.commit_run(str(tmp_path), "r1") == 4
    assert tables.commit_run(str(tmp_path), "r1") == 0  # idempotent

    rows = committed_rows(tmp_path, "r1")
    assert [(r["position"], r["confirmed_at"] is None) for r in rows] == [
        (0, False),
        (1, False),
        (2, True),
        (3, True),
    ]
    assert rows[3]["body_sha256"] == "body-3"


def test_intents_beside_a_finished_stream_add_no_uncertain_row(tmp_path: Path) -> None:
    # The transfer ended (its small stream moved into the partition, finished) and its
    # task died before removing the intent log: every intent has its row.
    logged_intents(tmp_path, range(3))
    writer = MessageLedgerWriter(str(tmp_path), "r1", KEY, "0.0.0")
    writer.write([delivery(p, confirmed=True) for p in range(3)])
    writer.close()

    assert tables.commit_run(str(tmp_path), "r1") == 3

    rows = committed_rows(tmp_path, "r1")
    assert [(r["position"], r["confirmed_at"] is None) for r in rows] == [
        (0, False),
        (1, False),
        (2, False),
    ]


def test_retried_task_numbers_after_logged_intents(tmp_path: Path) -> None:
    intents = IntentLog(str(tmp_path), "r1", KEY, "0.0.0")
    intents.append([delivery(p, confirmed=False) for p in range(7)])
    intents.close(finished=False)
    MessageLedgerWriter(str(tmp_path), "r1", KEY, "0.0.0").write([delivery(0, confirmed=True)])

    assert next_position(str(tmp_path), "r1", KEY) == 7
    other = TransferKey("dr", "/", "other", "main", "/", "other")
    assert next_position(str(tmp_path), "r1", other) == 0


def test_a_torn_last_batch_is_not_read(tmp_path: Path) -> None:
    intents = IntentLog(str(tmp_path), "r1", KEY, "0.0.0")
    intents.append([delivery(0, confirmed=False)])
    intents.append([delivery(1, confirmed=False)])
    intents.close(finished=False)
    (log_file,) = run_intents_dir(str(tmp_path), "r1").iterdir()
    data = log_file.read_bytes()
    log_file.write_bytes(data[: len(data) - 40])  # the crash cut the second batch short

    assert read_stream(log_file)["position"].to_pylist() == [0]


def as_written_by_an_earlier_build(ledger: Path, key: TransferKey) -> int:
    """Rename the key's files to the prefix earlier builds gave them; returns how many."""
    renamed = 0
    for path in list(ledger.glob(f"*/run_id=*/{key.file_prefix}*")):
        path.rename(path.with_name(key.legacy_file_prefix + path.name[len(key.file_prefix) :]))
        renamed += 1
    return renamed


# vhost "a/b" + queue "c" and vhost "a" + queue "b/c": one legacy prefix for both.
SLASHED = TransferKey("dr", "a/b", "c", "main", "a/b", "c")
COLLIDING = TransferKey("dr", "a", "b/c", "main", "a", "b/c")


def test_resumed_task_numbers_after_files_an_earlier_build_wrote(tmp_path: Path) -> None:
    intents = IntentLog(str(tmp_path), "r1", KEY, "0.0.0")
    intents.append([delivery(p, confirmed=False) for p in range(7)])
    intents.close(finished=False)
    rows = MessageLedgerWriter(str(tmp_path), "r1", KEY, "0.0.0")
    rows.write([delivery(p, confirmed=True) for p in range(3)])
    rows.close()
    assert as_written_by_an_earlier_build(tmp_path, KEY) == 2

    assert next_position(str(tmp_path), "r1", KEY) == 7


def test_old_prefix_files_of_a_colliding_transfer_are_not_counted(tmp_path: Path) -> None:
    assert SLASHED.legacy_file_prefix == COLLIDING.legacy_file_prefix
    rows = MessageLedgerWriter(str(tmp_path), "r1", SLASHED, "0.0.0")
    rows.write([delivery(p, confirmed=True) for p in range(5)])
    rows.close()
    as_written_by_an_earlier_build(tmp_path, SLASHED)

    assert next_position(str(tmp_path), "r1", SLASHED) == 5
    assert next_position(str(tmp_path), "r1", COLLIDING) == 0


def test_old_prefix_intents_become_uncertain_rows_once_beside_their_rows(tmp_path: Path) -> None:
    logged_intents(tmp_path, range(4))
    rows = MessageLedgerWriter(str(tmp_path), "r1", KEY, "0.0.0")
    rows.write([delivery(p, confirmed=True) for p in range(2)])
    rows.close()
    as_written_by_an_earlier_build(tmp_path, KEY)
    # The resumed run's own attempt, under the new prefix, numbers after them.
    resumed = MessageLedgerWriter(str(tmp_path), "r1", KEY, "1.0.1")
    resumed.write([delivery(next_position(str(tmp_path), "r1", KEY), confirmed=True)])
    resumed.close()

    assert tables.commit_run(str(tmp_path), "r1") == 5
    assert tables.commit_run(str(tmp_path), "r1") == 0

    committed = committed_rows(tmp_path, "r1")
    assert [(r["position"], r["confirmed_at"] is None) for r in committed] == [
        (0, False),
        (1, False),
        (2, True),
        (3, True),
        (4, False),
    ]


def test_an_intent_log_that_logs_nothing_leaves_no_file(tmp_path: Path) -> None:
    intents = IntentLog(str(tmp_path), "r1", KEY, "0.0.0")
    assert list(run_intents_dir(str(tmp_path), "r1").iterdir()) == []
    intents.close(finished=False)  # even a mover that died: nothing was published
    assert list(run_intents_dir(str(tmp_path), "r1").iterdir()) == []


def test_one_listing_gives_every_transfer_its_next_position(tmp_path: Path) -> None:
    other = TransferKey("dr", "/", "payments", "main", "/", "payments")
    MessageLedgerWriter(str(tmp_path), "r1", KEY, "0.0.0").write([delivery(p) for p in range(3)])
    writer = MessageLedgerWriter(str(tmp_path), "r1", other, "0.0.0")
    writer.write([delivery(p) for p in range(5)])
    writer.close()  # a data file
    IntentLog(str(tmp_path), "r1", KEY, "0.0.0").append([delivery(8, confirmed=False)])

    earlier = EarlierFiles(str(tmp_path), "r1")
    assert earlier.next_position(KEY) == next_position(str(tmp_path), "r1", KEY) == 9
    assert earlier.next_position(other) == 5
    unseen = TransferKey("dr", "/", "refunds", "main", "/", "refunds")
    assert earlier.next_position(unseen) == 0


def test_a_position_given_again_after_a_withdrawal_keeps_the_later_intent(tmp_path: Path) -> None:
    tables.ensure_tables(str(tmp_path))
    intents = IntentLog(str(tmp_path), "r1", KEY, "0.0.0")
    intents.append([delivery(p, confirmed=False) for p in range(3)])
    # A lost session withdrew position 2 unsent; the next one gave it to a redelivery
    # (another message here, to tell them apart), then the task died unconfirmed.
    again = delivery(2, confirmed=False)
    again.body_sha256 = "body-sent"
    intents.append([again])
    intents.close(finished=False)
    MessageLedgerWriter(str(tmp_path), "r1", KEY, "0.0.0").write(
        [delivery(p, confirmed=True) for p in range(2)]
    )

    assert tables.commit_run(str(tmp_path), "r1") == 3
    rows = committed_rows(tmp_path, "r1")
    assert [(r["position"], r["body_sha256"]) for r in rows][2:] == [(2, "body-sent")]


def test_a_recorded_fence_is_found_by_the_next_task_attempt_of_its_run(tmp_path: Path) -> None:
    """`ledger/fences.py`: one attempt records its transfer's fence, the next finds it;
    another transfer, or another run, has none."""
    other = TransferKey("dr", "/", "refunds", "main", "/", "refunds")
    assert not EarlierFiles(str(tmp_path), "r1").fence_recorded(KEY)  # no fences dir yet

    record_fence(str(tmp_path), "r1", KEY, "rmq-spark-fence:r1:orders")

    earlier = EarlierFiles(str(tmp_path), "r1")
    assert earlier.fence_recorded(KEY)
    assert not earlier.fence_recorded(other)
    assert not EarlierFiles(str(tmp_path), "r2").fence_recorded(KEY)
    (recorded,) = run_fences_dir(str(tmp_path), "r1").iterdir()
    assert recorded.read_bytes() == b"rmq-spark-fence:r1:orders"
    assert earlier.next_position(KEY) == 0  # a fence is not a row


def test_object_store_intent_batches_keep_the_order_they_were_handed_out_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A bucket served from a local directory: the same pyarrow calls as S3's, no server.
    bucket = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    monkeypatch.setitem(store._FILESYSTEMS, "s3://ledger-bucket", bucket)
    # A local directory, unlike a key prefix, must exist before an object is put in it.
    (tmp_path / "ledger-bucket" / "ledger" / "intents" / "run_id=r1").mkdir(parents=True)
    intents = IntentLog("s3://ledger-bucket/ledger", "r1", KEY, "0.0.0")
    first = intents.append_later([delivery(0, confirmed=False)])
    second = intents.append_later([delivery(1, confirmed=False)])
    second()  # a lane thread may write the later batch first
    first()
    objects = sorted((tmp_path / "ledger-bucket").rglob("*.arrows"))
    assert [read_stream(path)["position"].to_pylist() for path in objects] == [[0], [1]]


def test_a_transfers_earlier_rows_and_intents_are_read_for_recognition(tmp_path: Path) -> None:
    other = TransferKey("dr", "/", "payments", "main", "/", "payments")
    intents = IntentLog(str(tmp_path), "r1", KEY, "0.0.0")
    intents.append([delivery(p, confirmed=False) for p in range(4)])
    MessageLedgerWriter(str(tmp_path), "r1", KEY, "0.0.0").write(
        [delivery(p, confirmed=True) for p in range(2)]
    )
    finished = IntentLog(str(tmp_path), "r1", other, "0.0.0")
    finished.append([delivery(0, confirmed=False)])
    finished.close(finished=True)  # a mover that finished leaves no intent log
    writer = MessageLedgerWriter(str(tmp_path), "r1", other, "0.0.0")
    writer.write([delivery(0, confirmed=True)])
    writer.close()

    earlier = EarlierFiles(str(tmp_path), "r1")
    assert earlier.has_intents(KEY)
    assert not earlier.has_intents(other)
    rows = earlier.transfer_rows(KEY, ["position", "confirmed_at"]).to_pylist()
    assert sorted((r["position"], r["confirmed_at"] is not None) for r in rows) == [
        (0, False),
        (0, True),
        (1, False),
        (1, True),
        (2, False),
        (3, False),
    ]
    assert earlier.transfer_rows(other, ["position"]).to_pylist() == [{"position": 0}]
