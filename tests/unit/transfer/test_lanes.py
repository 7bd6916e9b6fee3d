"""run_movers: several transfers on one loop, at most `concurrent` at once, in order."""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable

import pytest

from rmq_spark.errors import TransferError
from rmq_spark.model import MoveOutcome
from rmq_spark.transfer.lanes import INTENTS, LEDGER, Lanes, MoverLoop, run_movers
from rmq_spark.transfer.ports import EngineLoop
from tests.support.fakes import KEY, FakeClock, ManualTimers


class TimedMover:
    """A transfer that ends `seconds` after it starts, with an outcome or an error."""

    def __init__(self, log: list[str], name: str, seconds: float, error: bool = False) -> None:
        self.log, self.name, self.seconds, self.error = log, name, seconds, error

    def start(
        self, loop: EngineLoop, on_finished: Callable[[MoveOutcome | BaseException], None]
    ) -> None:
        self.log.append(f"start {self.name}")

        def end() -> None:
            self.log.append(f"end {self.name}")
            if self.error:
                on_finished(TransferError(f"{self.name} gave up"))
            else:
                on_finished(MoveOutcome(KEY, "moved", None, 1, 1, 0, 1, self.seconds, sessions=1))

        loop.ioloop.call_later(self.seconds, end)


def maker(mover: TimedMover) -> Callable[[], TimedMover]:
    return lambda: mover


def test_movers_run_at_most_concurrent_at_once_and_outcomes_keep_their_order() -> None:
    log: list[str] = []
    movers = [TimedMover(log, "a", 3.0), TimedMover(log, "b", 1.0), TimedMover(log, "c", 1.0)]
    outcomes = run_movers(
        [maker(m) for m in movers], ioloop=ManualTimers(FakeClock()), concurrent=2
    )
    assert log == ["start a", "start b", "end b", "start c", "end c", "end a"]
    assert [o.seconds for o in outcomes] == [3.0, 1.0, 1.0]


def test_after_an_error_no_further_transfer_starts_and_the_error_is_raised() -> None:
    log: list[str] = []
    movers = [
        TimedMover(log, "a", 3.0),
        TimedMover(log, "b", 1.0, error=True),
        TimedMover(log, "c", 1.0),
    ]
    with pytest.raises(TransferError, match="b gave up"):
        run_movers([maker(m) for m in movers], ioloop=ManualTimers(FakeClock()), concurrent=2)
    assert log == ["start a", "start b", "end b", "end a"]  # a finishes, c never starts


def test_concurrency_must_be_positive() -> None:
    with pytest.raises(ValueError, match="concurrent must be >= 1"):
        run_movers([], ioloop=ManualTimers(FakeClock()), concurrent=0)


class CleaningMover(TimedMover):
    """A transfer that ends with a clean-up on its intents lane (as a mover removes its
    spent intent log), then reports at once."""

    def __init__(self, log: list[str], name: str, cleanup: Callable[[], None]) -> None:
        super().__init__(log, name, 1.0)
        self.cleanup = cleanup

    def start(
        self, loop: EngineLoop, on_finished: Callable[[MoveOutcome | BaseException], None]
    ) -> None:
        self.log.append(f"start {self.name}")

        def end() -> None:
            loop.clean_up(INTENTS, self.cleanup)
            on_finished(MoveOutcome(KEY, "moved", None, 1, 1, 0, 1, self.seconds, sessions=1))

        loop.ioloop.call_later(self.seconds, end)


def test_the_next_transfer_starts_while_a_finished_ones_clean_up_is_still_running() -> None:
    log: list[str] = []
    next_started = threading.Event()

    def slow_cleanup() -> None:
        # Waits for the next transfer to start: a run_movers that waited for it first
        # would leave it waiting here until the timeout.
        log.append("cleaned after b started" if next_started.wait(30) else "timed out")

    class Signalling(TimedMover):
        def start(self, loop: EngineLoop, on_finished: Callable[..., None]) -> None:
            next_started.set()
            super().start(loop, on_finished)

    movers = [CleaningMover(log, "a", slow_cleanup), Signalling(log, "b", 1.0)]
    outcomes = run_movers(
        [maker(m) for m in movers], ioloop=ManualTimers(FakeClock()), concurrent=1
    )
    assert len(outcomes) == 2
    assert "cleaned after b started" in log
    assert "timed out" not in log


def test_a_failed_clean_up_fails_the_run_once_every_transfer_is_done() -> None:
    log: list[str] = []

    def failing_cleanup() -> None:
        raise OSError("DELETE refused")

    movers = [CleaningMover(log, "a", failing_cleanup), TimedMover(log, "b", 1.0)]
    with pytest.raises(OSError, match="DELETE refused"):
        run_movers([maker(m) for m in movers], ioloop=ManualTimers(FakeClock()), concurrent=1)
    assert log == ["start a", "start b", "end b"]  # b still ran to its end


class CallbackInbox:
    """An event loop that only collects the lanes' thread-safe callbacks; the test
    (the loop thread) runs them with `run`."""

    def __init__(self) -> None:
        self._callbacks: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()

    def add_callback_threadsafe(self, callback: Callable[[], None]) -> None:
        self._callbacks.put(callback)

    def call_later(self, delay: float, callback: Callable[[], None]) -> object:
        raise AssertionError("the lanes set no timers")

    def start(self) -> None:
        raise AssertionError("the test runs the callbacks")

    def stop(self) -> None:
        return None

    def close(self) -> None:
        return None

    def run(self) -> None:
        while True:
            try:
                callback = self._callbacks.get_nowait()
            except queue.Empty:
                return
            callback()


class Gate:
    """A job's work that records its start and blocks until the test opens it."""

    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name
        self.started, self.opened = threading.Event(), threading.Event()

    def __call__(self) -> None:
        self.started.set()
        self.opened.wait()
        self.log.append(f"ran {self.name}")


def recorder(log: list[str], name: str) -> Callable[[BaseException | None], None]:
    def then(error: BaseException | None) -> None:
        log.append(f"done {name}" if error is None else f"failed {name}: {error}")

    return then


@pytest.fixture
def inbox() -> CallbackInbox:
    return CallbackInbox()


def test_another_transfers_write_goes_ahead_while_one_transfers_write_is_slow(
    inbox: CallbackInbox,
) -> None:
    loop = MoverLoop(inbox, Lanes(threads=2))
    log: list[str] = []
    slow, fast = Gate(log, "a1"), Gate(log, "b1")
    fast.opened.set()
    a, b = loop.for_transfer(), loop.for_transfer()
    a.submit(LEDGER, slow, recorder(log, "a1"))
    b_job = b.submit(LEDGER, fast, recorder(log, "b1"))
    b_job.wait()
    assert log == ["ran b1", "done b1"]  # a1 still runs on its own thread
    slow.opened.set()
    loop.close()
    inbox.run()
    assert log == ["ran b1", "done b1", "ran a1", "done a1"]


def test_with_one_thread_per_lane_transfers_write_one_after_another(
    inbox: CallbackInbox,
) -> None:
    loop = MoverLoop(inbox, Lanes(threads=1))  # a local ledger's lanes, as before
    log: list[str] = []
    slow, queued = Gate(log, "a1"), Gate(log, "b1")
    queued.opened.set()
    loop.for_transfer().submit(LEDGER, slow, recorder(log, "a1"))
    b_job = loop.for_transfer().submit(LEDGER, queued, recorder(log, "b1"))
    slow.started.wait()
    assert not queued.started.is_set()  # behind a1 on the lane's only thread
    slow.opened.set()
    b_job.wait()
    loop.close()
    assert log == ["ran a1", "ran b1", "done a1", "done b1"]


def test_one_transfers_overlapping_writes_run_together_and_complete_in_submission_order(
    inbox: CallbackInbox,
) -> None:
    loop = MoverLoop(inbox, Lanes(threads=4, overlap=4))
    log: list[str] = []
    first, second = Gate(log, "w1"), Gate(log, "w2")
    second.opened.set()
    lanes = loop.for_transfer()
    lanes.submit(LEDGER, first, recorder(log, "w1"), overlap=True)
    second_job = lanes.submit(LEDGER, second, recorder(log, "w2"), overlap=True)
    second_job.done.wait()  # w2 ran while w1 is still under way
    inbox.run()
    assert log == ["ran w2"]  # its completion waits for w1's
    first.opened.set()
    second_job.wait()
    assert log == ["ran w2", "ran w1", "done w1", "done w2"]
    loop.close()


def test_a_write_without_overlap_waits_for_the_overlapping_ones_before_it(
    inbox: CallbackInbox,
) -> None:
    loop = MoverLoop(inbox, Lanes(threads=2, overlap=2))
    log: list[str] = []
    first, second, close = Gate(log, "w1"), Gate(log, "w2"), Gate(log, "close")
    close.opened.set()
    lanes = loop.for_transfer()
    first_job = lanes.submit(LEDGER, first, recorder(log, "w1"), overlap=True)
    lanes.submit(LEDGER, second, recorder(log, "w2"), overlap=True)  # the other thread
    close_job = lanes.submit(LEDGER, close, recorder(log, "close"))
    first.opened.set()
    first_job.done.wait()
    inbox.run()
    # The home thread is free, but w2 still runs on the other one: close is held (it
    # would start at once otherwise; the bounded wait only proves it does not).
    assert not close.started.wait(timeout=0.2)
    second.opened.set()
    close_job.wait()
    assert log.index("ran close") > max(log.index("ran w1"), log.index("ran w2"))
    assert [entry for entry in log if entry.startswith("done")] == [
        "done w1",
        "done w2",
        "done close",
    ]
    loop.close()


def test_a_failed_write_reaches_its_completion_and_later_ones_still_complete_in_order(
    inbox: CallbackInbox,
) -> None:
    loop = MoverLoop(inbox, Lanes(threads=2, overlap=2))
    log: list[str] = []

    def broken() -> None:
        raise OSError("PUT refused")

    lanes = loop.for_transfer()
    lanes.submit(LEDGER, broken, recorder(log, "w1"), overlap=True)
    last = lanes.submit(LEDGER, lambda: None, recorder(log, "w2"), overlap=True)
    last.wait()
    loop.close()
    assert log == ["failed w1: PUT refused", "done w2"]


def test_a_clean_up_runs_after_the_transfers_earlier_jobs_on_its_lane(
    inbox: CallbackInbox,
) -> None:
    loop = MoverLoop(inbox, Lanes(threads=2))
    log: list[str] = []
    append = Gate(log, "a1")
    transfer = loop.for_transfer()
    transfer.submit(INTENTS, append, recorder(log, "a1"))
    transfer.clean_up(INTENTS, lambda: log.append("removed a's log"))
    append.started.wait()
    assert log == []  # the clean-up waits behind the append, on the same thread
    append.opened.set()
    loop.close()
    inbox.run()
    assert log == ["ran a1", "removed a's log", "done a1"]
    assert loop.cleanup_errors == []


def test_the_intents_and_ledger_lanes_of_a_transfer_keep_separate_orders(
    inbox: CallbackInbox,
) -> None:
    loop = MoverLoop(inbox, Lanes(threads=1))
    log: list[str] = []
    slow_row = Gate(log, "row")
    lanes = loop.for_transfer()
    lanes.submit(LEDGER, slow_row, recorder(log, "row"))
    intent = lanes.submit(INTENTS, lambda: None, recorder(log, "intent"))
    intent.wait()
    assert log == ["done intent"]  # not held behind the ledger lane's write
    slow_row.opened.set()
    loop.close()
    inbox.run()
    assert log == ["done intent", "ran row", "done row"]


class PausedNotes(deque[object]):
    """The loop's list of sequences with a finished job: a lane thread that notes one
    stops there until the test lets it go, so the loop (the test) can run completions
    at exactly that moment, as it does when another job's callback comes first."""

    def __init__(self) -> None:
        super().__init__()
        self.noted, self.go_on = threading.Event(), threading.Event()

    def append(self, sequence: object) -> None:
        super().append(sequence)
        if threading.current_thread() is not threading.main_thread():
            self.noted.set()
            self.go_on.wait()


def test_completions_run_just_after_a_job_is_noted_still_apply_it(
    inbox: CallbackInbox,
) -> None:
    # Seen in a real 100,000-message move: the loop took a sequence as a lane thread
    # noted it, before the job was marked done, found nothing ready, and the transfer
    # waited for its ledger row's completion forever (acks pending, loop idle).
    loop = MoverLoop(inbox, Lanes(threads=1))
    notes = PausedNotes()
    loop._touched = notes  # type: ignore[assignment]  # the moment under test
    log: list[str] = []
    job = loop.for_transfer().submit(LEDGER, lambda: None, recorder(log, "row"))
    assert notes.noted.wait(timeout=10), "the lane thread never noted its job"
    loop.run_completions()  # another job's callback, on the loop, right then
    notes.go_on.set()
    assert job.done.wait(timeout=10)
    loop.close()  # the lane thread has queued its own callback by now
    inbox.run()
    assert log == ["done row"]


def test_a_local_ledger_gets_one_thread_per_lane_and_an_object_store_several() -> None:
    assert Lanes.for_ledger(object_store=False) == Lanes(threads=1, overlap=1)
    wide = Lanes.for_ledger(object_store=True)
    assert wide.threads > 1
    assert wide.overlap == 1  # a transfer's own writes one at a time (lanes.py says why)
    with pytest.raises(ValueError, match="lanes need >= 1 thread"):
        Lanes(threads=0)
