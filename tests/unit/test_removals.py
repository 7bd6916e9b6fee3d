"""The consumer counters that prove what left a live source (broker/removals.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Collection

from rmq_spark.broker.removals import (
    Readings,
    read_removed,
    removed_during,
    removed_of,
    settle,
)
from rmq_spark.model import TransferKey

A = TransferKey("dr", "/", "a", "main", "/", "a")
B = TransferKey("dr", "/", "b", "main", "/", "b")


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


def test_settle_reads_again_until_the_counters_catch_up_with_the_movers() -> None:
    answers = iter([{A: 40, B: 7}, {A: 100}, {A: 100}])
    asked: list[set[TransferKey]] = []
    now = [0.0]

    def read(keys: Collection[TransferKey]) -> Readings:
        asked.append(set(keys))
        reading = next(answers)
        return {key: reading[key] for key in keys}

    removed = settle(
        read,
        {A: 0, B: 2},
        {A: 100, B: 5},
        monotonic=lambda: now[0],
        sleep=lambda seconds: now.__setitem__(0, now[0] + seconds),
    )
    assert removed == {A: 100, B: 5}
    assert asked == [{A, B}, {A}]  # B had caught up at once


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
