"""A park's destination: the parked table behind `ports.DestinationLink`, driven by a real
session and mover over a fake source link, with the rows written to a temp directory.

The link's writes run on an inline lane here (`InlineLane`), so a test decides when the
loop turns, as with every other fake of `tests/support/fakes.py`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from rmq_spark.errors import LedgerError
from rmq_spark.model import Delivery, MoveOutcome, TransferKey
from rmq_spark.transfer import parked_rows as parked_rows_module
from rmq_spark.transfer.mover import QueueMover
from rmq_spark.transfer.parked import ParkedTableLink, RouteBook
from rmq_spark.transfer.parked_completion import complete_groups
from rmq_spark.transfer.parked_rows import (
    DATA_SCHEMA,
    STAGED_SCHEMA,
    ParkedRowsWriter,
    RouteOf,
    run_partition,
    staged_partition,
)
from rmq_spark.transfer.ports import SessionEvents
from tests.support import amqp_encoding as amqp
from tests.support.fakes import (
    FakeClock,
    FakeConnections,
    FakeDestinationLink,
    FakeSourceLink,
    ManualLanes,
    ManualTimers,
    RecordingIntents,
    RecordingLedger,
)
from tests.support.imports import imported_after

KEY = TransferKey("dr", "/", "orders.dlq", "parked", "/", "orders.dlq")
# message_id "m-1": the flags word's bit 7 (message-id), then a short string.
MESSAGE_ID = b"\x00\x80\x03m-1"


class InlineLane(Executor):
    """Runs each write at once, in the caller's thread (the link's lane in tests)."""

    def __init__(self) -> None:
        self.fail_with: BaseException | None = None

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        if self.fail_with is not None:
            future.set_exception(self.fail_with)
        else:
            future.set_result(fn(*args, **kwargs))
        return future


class ParkingConnector:
    """A fake source link and the real parked table link, per session (`ports.Connector`)."""

    def __init__(self, timers: ManualTimers, writer: ParkedRowsWriter, lane: InlineLane) -> None:
        self._timers = timers
        self._writer = writer
        self._lane = lane
        self.connections = FakeConnections()
        self.links: list[tuple[FakeSourceLink, ParkedTableLink, RouteBook]] = []
        self.message_id_of: Callable[[bytes], str | None] = lambda _block: None
        self.delivery_count_of: Callable[[bytes], int] = lambda _block: 0
        self.carries_priority: Callable[[bytes], bool] = lambda _block: False
        self.digest_properties: Callable[[bytes], str] = lambda block: hashlib.sha256(
            block
        ).hexdigest()

    def connect(
        self, events: SessionEvents, ioloop: object, label: str
    ) -> tuple[FakeSourceLink, ParkedTableLink]:
        routes = RouteBook()
        source = FakeSourceLink(events, self._timers)
        parked = ParkedTableLink(self._writer, events, self._timers, routes, label, lane=self._lane)
        self.links.append((source, parked, routes))
        return source, parked

    def connect_kept(
        self, events: SessionEvents, ioloop: object, label: str
    ) -> FakeDestinationLink:
        raise AssertionError("a park without select has no kept link")

    def event_loop(self) -> ManualTimers:
        return self._timers


@dataclass
class ParkRig:
    timers: ManualTimers
    lanes: ManualLanes
    connector: ParkingConnector
    ledger: RecordingLedger
    lane: InlineLane
    ledger_path: Path
    results: list[MoveOutcome | BaseException] = field(default_factory=list)

    @property
    def source(self) -> FakeSourceLink:
        return self.connector.links[-1][0]

    def receive(self, *bodies: bytes, exchange: str = "orders-in") -> None:
        """Deliveries (each told its route first), logged and published as one batch."""
        routes = self.connector.links[-1][2]
        for tag, body in enumerate(bodies, start=1):
            routes.record(tag, exchange, f"key-{tag}")
            self.source.deliver(tag, body, properties=MESSAGE_ID)
        self.timers.run_due()
        self.lanes.finish("intents")

    @property
    def staged(self) -> Path:
        return Path(staged_partition(str(self.ledger_path), "run-1"))

    @property
    def partition(self) -> Path:
        return Path(run_partition(str(self.ledger_path), "run-1"))

    def parked(self) -> list[dict[str, Any]]:
        """The staged rows (what the confirm waited for)."""
        return _rows(self.staged)

    def completed(self) -> list[dict[str, Any]]:
        """The rows the commit makes of the staged files (the table's data files)."""
        names = sorted(file.name for file in self.staged.glob("*.parquet"))
        complete_groups(str(self.ledger_path), "run-1", [names])
        return _rows(self.partition)


def _rows(directory: Path) -> list[dict[str, Any]]:
    rows = []
    for file in sorted(directory.glob("*.parquet")):
        # The file's own columns: pq.read_table would add `run_id` from the directory's
        # name on some pyarrow versions (Databricks 17.3's).
        rows.extend(pq.ParquetFile(file).read().to_pylist())
    return sorted(rows, key=lambda row: row["position"])


def park_rig(tmp_path: Path, *, exclude_body: bool = False) -> ParkRig:
    clock = FakeClock()
    timers = ManualTimers(clock)
    lanes = ManualLanes(timers)
    writer = ParkedRowsWriter(str(tmp_path), "run-1", KEY, "0.0.0", exclude_body=exclude_body)
    lane = InlineLane()
    connector = ParkingConnector(timers, writer, lane)
    ledger = RecordingLedger()
    mover = QueueMover(
        KEY,
        connector,
        ledger,
        RecordingIntents(),
        window_messages=8,
        window_bytes=1 << 30,
        clock=clock.utc,
        monotonic=clock.monotonic,
    )
    rig = ParkRig(timers, lanes, connector, ledger, lane, tmp_path)
    mover.start(lanes, rig.results.append)
    rig.source.open()
    rig.source.events.on_prefetch_set()
    timers.run_due()  # the parked link is ready on the loop's next turn
    assert rig.source.consumes == 1
    return rig


def test_a_parked_batch_is_confirmed_once_its_rows_are_durable_and_acked_after_the_ledger(
    tmp_path: Path,
) -> None:
    rig = park_rig(tmp_path)
    rig.receive(b"one", b"two", b"three")
    # The batch's data file is written (inline); its confirm runs on the loop's next turn.
    assert [row["body"] for row in rig.parked()] == [b"one", b"two", b"three"]
    assert rig.source.acked_tags == []
    rig.timers.run_due()  # the confirm: the window writes the ledger rows ...
    assert rig.source.acked_tags == []
    rig.lanes.finish("ledger")  # ... and acks once they are durable
    assert rig.source.acked_tags == [1, 2, 3]
    assert [d.position for d in rig.ledger.rows] == [0, 1, 2]
    assert all(d.confirmed_at is not None for d in rig.ledger.rows)


def test_parked_rows_keep_the_bytes_the_route_and_the_decoded_columns(tmp_path: Path) -> None:
    rig = park_rig(tmp_path)
    rig.receive(b"one", b"two")
    # Staged (before the confirm): the bytes, no decoded column.
    assert pq.read_schema(next(rig.staged.glob("*.parquet"))).names == STAGED_SCHEMA.names
    assert "message_id" not in STAGED_SCHEMA.names
    staged = rig.parked()
    rows = rig.completed()
    assert [{k: row[k] for k in STAGED_SCHEMA.names} for row in rows] == staged
    assert [row["position"] for row in rows] == [0, 1]
    assert [(row["exchange"], row["routing_key"]) for row in rows] == [
        ("orders-in", "key-1"),
        ("orders-in", "key-2"),
    ]
    assert {row["properties"] for row in rows} == {MESSAGE_ID}
    assert {row["message_id"] for row in rows} == {"m-1"}
    assert rows[0]["body_sha256"] == hashlib.sha256(b"one").hexdigest()
    assert rows[0]["properties_sha256"] == hashlib.sha256(MESSAGE_ID).hexdigest()
    assert (rows[0]["source_queue"], rows[0]["body_excluded"]) == ("orders.dlq", False)
    assert pq.read_schema(next(rig.partition.glob("*.parquet"))).names == DATA_SCHEMA.names


def test_exclude_body_parks_checksums_and_no_body(tmp_path: Path) -> None:
    rig = park_rig(tmp_path, exclude_body=True)
    rig.receive(b"secret")
    (row,) = rig.parked()
    assert row["body"] is None
    assert row["body_excluded"] is True
    assert row["body_sha256"] == hashlib.sha256(b"secret").hexdigest()
    assert row["body_size"] == 6


def test_a_failed_park_write_ends_the_transfer_and_acks_nothing(tmp_path: Path) -> None:
    rig = park_rig(tmp_path)
    rig.lane.fail_with = LedgerError("disk full")
    rig.receive(b"one", b"two")
    rig.timers.run_due()
    rig.lanes.finish("ledger")
    rig.timers.advance(1.0)
    assert rig.source.acked_tags == []
    assert rig.parked() == []
    (error,) = rig.results
    assert isinstance(error, LedgerError)
    assert "disk full" in str(error)


def test_a_write_that_finishes_after_its_session_closed_confirms_nothing(tmp_path: Path) -> None:
    rig = park_rig(tmp_path)
    rig.receive(b"one")
    rig.source.lose()  # the session ends before the loop turns to the confirm
    rig.timers.run_due()
    rig.lanes.finish("ledger")
    assert rig.source.acked_tags == []
    # The row is durable, and the ledger names it uncertain: a copy the source redelivers.
    assert len(rig.parked()) == 1
    assert [d.confirmed_at for d in rig.ledger.rows] == [None]


def test_the_route_book_forgets_the_tags_a_selective_park_kept() -> None:
    book = RouteBook()
    for tag in range(1, 6):
        book.record(tag, "x", f"k{tag}")
    parked = [_delivery(2), _delivery(4)]
    assert book.take(parked) == {2: ("x", "k2"), 4: ("x", "k4")}
    assert len(book) == 1  # tag 5 is not yet parked or kept; 1 and 3 were kept


def _delivery(tag: int) -> Delivery:
    from datetime import UTC, datetime

    return Delivery(
        tag=tag,
        seq=tag,
        position=tag,
        redelivered=False,
        body_size=1,
        body_sha256="",
        properties_sha256="",
        message_id=None,
        consumed_at=datetime(2026, 1, 1, tzinfo=UTC),
    )


@pytest.mark.parametrize("route", [None, ("", "orders")])
def test_a_row_without_a_told_route_has_a_null_exchange(tmp_path: Path, route: Any) -> None:
    from rmq_spark.transfer.parked_rows import staged_rows

    delivery = _delivery(1)
    delivery.body, delivery.properties = b"b", b"\x00\x00"
    route_of: RouteOf = lambda _tag: route  # noqa: E731
    table = staged_rows(KEY, "0.0.0", [delivery], route_of, exclude_body=False)
    assert table.column("exchange").to_pylist() == [None if route is None else ""]


def test_a_batch_of_large_bodies_is_one_file_of_row_groups_bounded_by_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parked_rows_module, "ROW_GROUP_BYTES", 10)
    rig = park_rig(tmp_path)
    rig.receive(b"aaaa", b"bbbb", b"cccc", b"d" * 25, b"ee")
    bodies = [b"aaaa", b"bbbb", b"cccc", b"d" * 25, b"ee"]
    assert [row["body"] for row in rig.parked()] == bodies
    assert [row["body"] for row in rig.completed()] == bodies
    # 4 + 4 fit in 10 bytes, 4 starts the next group; a larger body is a group alone. The
    # commit completes a staged file a row group at a time: the data file's are the same.
    [staged] = rig.staged.glob("*.parquet")
    [file] = rig.partition.glob("*.parquet")
    for written in (staged, file):
        groups = pq.read_metadata(written)
        assert [groups.row_group(i).num_rows for i in range(groups.num_row_groups)] == [2, 1, 1, 1]
    metadata = pq.read_metadata(file)
    # Readers filter on positions and sources; no statistic holds copies of the bytes.
    columns = {
        metadata.schema.column(i).name: metadata.row_group(0).column(i).is_stats_set
        for i in range(metadata.num_columns)
    }
    assert columns["position"] is True
    assert columns["body"] is False
    assert columns["properties"] is False
    # Dictionary pages only where values repeat: none for a body or a digest.
    encodings = {
        metadata.schema.column(i).name: metadata.row_group(0).column(i).encodings
        for i in range(metadata.num_columns)
    }
    assert "RLE_DICTIONARY" in encodings["source_queue"]
    assert "RLE_DICTIONARY" not in encodings["body"]
    assert "RLE_DICTIONARY" not in encodings["body_sha256"]


def test_parking_rows_does_not_import_pandas(tmp_path: Path) -> None:
    """pa.array would import pandas: 55 MiB of a worker's RSS (arrow_columns.py)."""
    block = amqp.BasicProperties(
        content_type="text/plain",
        priority=3,
        timestamp=1_790_000_000,
        headers=amqp.table_bytes(
            ("tenant", amqp.long_string("t-1")),
            ("retries", amqp.short(2)),
            ("x-death", amqp.array(amqp.death_entry("orders", "rejected", "orders"))),
        ),
    ).encode()
    script = (
        "from datetime import UTC, datetime\n"
        "from rmq_spark.model import Delivery, TransferKey\n"
        "from rmq_spark.transfer.parked_rows import ParkedRowsWriter\n"
        "delivery = Delivery(1, 1, 0, False, 1, 'b', 'p', None, datetime.now(UTC),\n"
        f"    body=b'x', properties={block!r})\n"
        "key = TransferKey('dr', '/', 'q', 'parked', '/', 'q')\n"
        f"writer = ParkedRowsWriter({str(tmp_path)!r}, 'r1', key, '0')\n"
        "writer.write([delivery], lambda tag: ('', 'q'))\n"
        "assert writer.rows_written == 1\n"
        "from rmq_spark.transfer.parked_completion import complete_groups\n"
        "from rmq_spark.transfer.parked_rows import staged_partition\n"
        f"names = [p.name for p in staged_partition({str(tmp_path)!r}, 'r1').iterdir()]\n"
        f"assert complete_groups({str(tmp_path)!r}, 'r1', [names])[0]['rows'] == 1\n"
    )
    assert not imported_after(script, "pandas")
    [file] = run_partition(str(tmp_path), "r1").glob("*.parquet")
    [row] = pq.read_table(file).to_pylist()
    assert row["last_death"]["reason"] == "rejected"
    assert dict(row["header_ints"]) == {"retries": 2}
