"""The consumer counters that prove what left a live source (broker/removals.py)."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Collection
from concurrent.futures import Future
from typing import Any

import pytest

from rmq_spark.broker.removals import (
    POLL_SECONDS,
    READ_SHARE,
    Readings,
    depth_proven,
    pause_after,
    proven_by_depth,
    read_removed,
    removed_during,
    removed_of,
    settle,
)
from rmq_spark.model import MoveOutcome, QueueTransfer, TransferKey
from tests.support.builders import transfer

A = TransferKey("dr", "/", "a", "main", "/", "a")
B = TransferKey("dr", "/", "b", "main", "/", "b")


def moved(queue: QueueTransfer, messages: int, **changes: object) -> MoveOutcome:
    """A plain outcome: one session that moved positions 0..messages-1."""
    outcome = MoveOutcome(
        queue.key,
        "moved",
        None,
        messages,
        messages * 1024,
        first_position=0,
        next_position=messages,
        seconds=1.0,
        sessions=1,
    )
    return dataclasses.replace(outcome, **changes)  # type: ignore[arg-type]


def test_removals_are_acks_and_deliveries_without_acks() -> None:
    stats = {"ack": 5, "deliver_no_ack": 2, "get_no_ack": 1, "publish": 100, "deliver": 9}
    assert removed_of({"message_stats": stats}) == 8
    assert removed_of({"message_stats": {"publish": 3}}) == 0  # published, never consumed
    assert removed_of({"name": "q"}) is None  # no statistics
    assert removed_of(None) is None


def test_what_consumers_removed_during_the_run() -> None:
    assert removed_during(10, 25) == 15
    assert removed_during(None, 25) == 25  # no statistics yet before: none consumed
    assert removed_during(10, None) is None  # none after the movers consumed: not kept
    assert removed_during(10, 4) is None  # fell: reset by a restart


class FakeClient:
    def __init__(self, rows: list[list[dict[str, object]]]) -> None:
        self.rows = rows
        self.asked: list[tuple[str, str]] = []

    def queues(self, vhost: str, columns: str) -> list[dict[str, object]]:
        self.asked.append((vhost, columns))
        return self.rows.pop(0)


def test_read_lists_each_vhost_once() -> None:
    client = FakeClient([[{"name": "a", "message_stats": {"ack": 3}}, {"name": "b"}]])
    readings = read_removed({"dr": client}, [A, B])  # type: ignore[dict-item]
    assert readings == {A: 3, B: None}
    assert client.asked == [("/", "name,message_stats")]


class ScriptedCounters:
    """The counters' readings in turn, what each reading asked for, and a clock that
    moves only when settle sleeps."""

    def __init__(self, *answers: dict[TransferKey, int]) -> None:
        self._answers = iter(answers)
        self.asked: list[set[TransferKey]] = []
        self.now = 0.0

    def read(self, keys: Collection[TransferKey]) -> Readings:
        self.asked.append(set(keys))
        reading = next(self._answers)
        return {key: reading[key] for key in keys}

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def settle(
        self,
        before: dict[TransferKey, int | None],
        moved: dict[TransferKey, int],
        **options: Any,
    ) -> Readings:
        return settle(
            self.read, before, moved, monotonic=self.monotonic, sleep=self.sleep, **options
        )


def test_settle_reads_again_until_the_counters_catch_up_with_the_movers() -> None:
    counters = ScriptedCounters({A: 40, B: 7}, {A: 100}, {A: 100})
    removed = counters.settle({A: 0, B: 2}, {A: 100, B: 5})
    assert removed == {A: 100, B: 5}
    assert counters.asked == [{A, B}, {A}]  # B had caught up at once


def test_counters_that_never_catch_up_prove_nothing() -> None:
    now = [0.0]
    removed = settle(
        lambda keys: dict.fromkeys(keys, 30),
        {A: 0},
        {A: 100},
        monotonic=lambda: now[0],
        sleep=lambda seconds: now.__setitem__(0, now[0] + seconds),
        deadline_seconds=2.0,
    )
    assert removed == {A: None}


def test_read_once_when_asked_without_waiting() -> None:
    reads: list[int] = []

    def read(keys: Collection[TransferKey]) -> Readings:
        reads.append(1)
        return dict.fromkeys(keys, 3)

    assert settle(read, {A: 0}, {A: 5}, deadline_seconds=0.0) == {A: None}
    assert len(reads) == 1


def test_a_cancelled_settle_stops_waiting_at_once() -> None:
    cancelled = threading.Event()
    reads: list[int] = []

    def read(keys: Collection[TransferKey]) -> Readings:
        reads.append(1)
        cancelled.set()  # the run failed while the first reading was under way
        return dict.fromkeys(keys, 30)

    started = time.monotonic()
    removed = settle(read, {A: 0}, {A: 100}, deadline_seconds=60.0, cancelled=cancelled)
    assert removed == {A: None}  # still short of what moved: proves nothing
    assert len(reads) == 1
    assert time.monotonic() - started < 30.0  # not the 60 s deadline


def test_an_uncancelled_settle_waits_on_its_event_between_readings() -> None:
    cancelled = threading.Event()
    answers = iter([{A: 40}, {A: 100}])
    removed = settle(
        lambda keys: {key: next(answers)[key] for key in keys},
        {A: 0},
        {A: 100},
        deadline_seconds=60.0,
        cancelled=cancelled,
    )
    assert removed == {A: 100}


def test_settle_stops_waiting_for_a_transfer_its_depths_settle() -> None:
    """A's counters lag for good; once its depths are in and settle it, it is unknown
    at once (as at the deadline, without waiting for it); B still waits and catches up."""
    counters = ScriptedCounters({A: 30, B: 1}, {A: 30, B: 3}, {B: 5})
    depths_in = iter([frozenset(), frozenset({A})])
    removed = counters.settle(
        {A: 0, B: 0},
        {A: 100, B: 5},
        deadline_seconds=30.0,
        proven=lambda: next(depths_in, frozenset({A})),
    )
    assert removed == {A: None, B: 5}
    # The depths came in during the wait after the first reading: A is not read again.
    assert counters.asked == [{A, B}, {B}, {B}]
    assert counters.now < 30.0  # ended when B caught up, not at the deadline


def test_counters_that_caught_up_are_kept_even_where_the_depths_settle() -> None:
    removed = settle(
        lambda keys: dict.fromkeys(keys, 100),
        {A: 0},
        {A: 100},
        deadline_seconds=30.0,
        proven=lambda: frozenset({A}),
    )
    assert removed == {A: 100}


def test_a_plain_move_whose_depth_fell_by_what_it_moved_is_settled_by_depth() -> None:
    queue = transfer("a", 100)
    assert proven_by_depth(queue, moved(queue, 100), source_after=0)
    # Messages arrived meanwhile (a live source), or left otherwise: the counters decide.
    assert not proven_by_depth(queue, moved(queue, 100), source_after=3)
    assert not proven_by_depth(transfer("a", 103), moved(queue, 100), source_after=0)


@pytest.mark.parametrize(
    "changes",
    [
        {"status": "failed"},
        {"sessions": 2},  # a lost session: copies, recognised redeliveries
        {"first_position": 40, "next_position": 140},  # an earlier attempt's rows too
        {"next_position": 101},  # a delivered position not moved
        {"kept": 1},
        {"recognised": 1},
        {"fences": 1},
    ],
)
def test_an_outcome_that_is_not_all_of_the_ledger_waits_for_the_counters(
    changes: dict[str, object],
) -> None:
    queue = transfer("a", 100)
    assert not proven_by_depth(queue, moved(queue, 100, **changes), source_after=0)


def test_depth_proven_names_transfers_once_the_depths_are_in() -> None:
    plain, live, unmoved = transfer("a", 10), transfer("b", 10), transfer("c", 10)
    depths: Future[dict[QueueTransfer, tuple[int, int]]] = Future()
    proven = depth_proven([plain, live, unmoved], [moved(plain, 10), moved(live, 10)], depths)
    assert proven() == frozenset()  # still counting
    depths.set_result({plain: (0, 10), live: (2, 10), unmoved: (10, 0)})
    assert proven() == frozenset({plain.key})


def test_depth_proven_names_none_when_the_count_failed() -> None:
    queue = transfer("a", 10)
    depths: Future[dict[QueueTransfer, tuple[int, int]]] = Future()
    depths.set_exception(OSError("connection refused"))
    assert depth_proven([queue], [moved(queue, 10)], depths)() == frozenset()


def test_the_depths_coming_in_cut_the_wait_between_readings_short(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a poll interval of a minute, a settle woken by the depths (counted on
    another thread, in after the first reading) ends long before the next poll, and
    without reading again what the depths settle."""
    monkeypatch.setattr("rmq_spark.broker.removals.POLL_SECONDS", 60.0)
    queue = transfer("a", 100)
    depths: Future[dict[QueueTransfer, tuple[int, int]]] = Future()
    woken = threading.Event()
    depths.add_done_callback(lambda _depths: woken.set())
    counted = threading.Timer(0.2, lambda: depths.set_result({queue: (0, 100)}))

    readings: list[Collection[TransferKey]] = []

    def read(keys: Collection[TransferKey]) -> Readings:
        readings.append(keys)
        if not counted.is_alive() and not depths.done():
            counted.start()  # the depths come in while settle waits after this reading
        return dict.fromkeys(keys, 30)  # lagging for good

    started = time.monotonic()
    removed = settle(
        read,
        {queue.key: 0},
        {queue.key: 100},
        deadline_seconds=120.0,
        cancelled=threading.Event(),
        proven=depth_proven([queue], [moved(queue, 100)], depths),
        woken=woken,
    )
    assert removed == {queue.key: None}
    assert time.monotonic() - started < 30.0  # not the minute's poll
    assert len(readings) == 1


def test_a_slow_reading_is_followed_by_a_longer_pause_never_past_the_deadline() -> None:
    """A reading that took 2.6 s (a listing of 10,000 queues) is followed by a pause
    four times as long, so readings take a fifth of the wait; a quick one by the poll
    interval; the last pause ends at the deadline."""
    clock = [0.0]
    pauses: list[float] = []
    took = iter([2.6, 0.01, 2.6, 2.6])

    def read(keys: Collection[TransferKey]) -> Readings:
        clock[0] += next(took)
        return dict.fromkeys(keys, 30)  # lagging for good

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        clock[0] += seconds

    removed = settle(
        read, {A: 0}, {A: 100}, monotonic=lambda: clock[0], sleep=sleep, deadline_seconds=20.0
    )
    assert removed == {A: None}
    last = 20.0 - (2.6 + 4 * 2.6 + 0.01 + POLL_SECONDS + 2.6)
    assert pauses == pytest.approx([4 * 2.6, POLL_SECONDS, last])
    assert clock[0] == pytest.approx(20.0 + 2.6)  # one reading at the deadline, then done


def test_pause_after_keeps_the_poll_interval_for_quick_readings() -> None:
    assert pause_after(0.0) == POLL_SECONDS
    assert pause_after(0.1) == POLL_SECONDS
    assert pause_after(1.0) == pytest.approx(1.0 * (1 / READ_SHARE - 1))
