"""Several movers on one I/O loop, and the durability lanes they share.

An executor task moves several queues at once on one thread (`run_movers`).
Intent-log appends and ledger-row appends are written on durability threads
(`MoverLoop`), so a slow write never stalls the loop; acks still wait for the
ledger row and publishes for the intent.

Each lane ("intents", "ledger") has `Lanes.threads` threads. A local-directory ledger
has one per lane: its writes are appends and fsyncs of one file per transfer, and a
disk gains nothing from more. On an object store every write is a PUT that costs a
round trip, so the lanes get several threads: each transfer is bound to one of them
(`MoverLoop.for_transfer`, round robin), so its jobs still run and finish in order
while other queues' PUTs overlap; and a caller may mark a job `overlap=True` (a
ledger flush: its own object, named at random) to let up to `Lanes.overlap` of a
transfer's jobs be under way at once. Completions always run on the loop in the
order the transfer submitted its jobs, whichever thread finished first.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from rmq_spark.model import MoveOutcome
from rmq_spark.transfer.ports import Connections, EngineLoop, EventLoop

# The durability lanes: intent-log appends (which publishes wait for) and ledger rows
# (which acks wait for). The two lanes' writes overlap.
INTENTS, LEDGER = "intents", "ledger"
_LANES = (INTENTS, LEDGER)

# An object-store ledger's lanes. Threads per lane: a task moves queues_per_task queues
# at once (2 by default), each with a transfer's overlapping flushes; 8 threads per lane
# keep that many PUTs in the air while a GIL-bound encoder still gets the CPU.
OBJECT_STORE_THREADS = 8
# Writes of one transfer under way at once on each lane. 1: one at a time, as on a local
# ledger. Overlapping a transfer's own flushes (4 were tried) gained nothing measurable
# for one queue (docs/OBJECT_STORE_LEDGER.md, "Throughput"), and a fresh-clone run saw a
# killed driver's resumed S3 run end unverified once at 4, unexplained; until that is
# understood, only different transfers' writes overlap (the threads above). Overlap
# stays available (`Lanes`, its unit tests) for that work.
OBJECT_STORE_OVERLAP = 1


@dataclass(frozen=True)
class Lanes:
    """How wide the durability lanes are: threads per lane, and how many of one
    transfer's `overlap=True` jobs may be under way at once (callers read it)."""

    threads: int = 1
    overlap: int = 1

    def __post_init__(self) -> None:
        if self.threads < 1 or self.overlap < 1:
            raise ValueError(
                f"lanes need >= 1 thread and overlap >= 1, got {self.threads}, {self.overlap}"
            )

    @classmethod
    def for_ledger(cls, object_store: bool) -> Lanes:
        """One thread per lane for a local directory, several for an object store."""
        if object_store:
            return cls(threads=OBJECT_STORE_THREADS, overlap=OBJECT_STORE_OVERLAP)
        return cls()


class _DurabilityJob:
    """One durable write handed to a durability lane, and what to do when it is done."""

    def __init__(
        self,
        work: Callable[[], None],
        then: Callable[[BaseException | None], None],
        sequence: _Sequence,
        *,
        overlap: bool,
    ) -> None:
        self.work = work
        self.then = then
        self.overlap = overlap
        self.sequence = sequence
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.thread: int | None = None  # the lane thread it was sent to; None while held
        self.applied = False

    def wait(self) -> None:
        """Block until this job, and every job its transfer submitted before it on the
        lane, is done, and apply their completions (loop thread)."""
        self.sequence.wait_for(self)


class _Sequence:
    """One transfer's jobs on one lane, oldest first: completions run in this order.

    Jobs run on the transfer's home thread, in order, except `overlap` ones, which go
    to the lane's threads in turn and may run alongside the transfer's earlier jobs.
    A job without overlap is held while an earlier one runs on another thread, so it
    never runs before or alongside an earlier job (a ledger close after its flushes).
    Only the loop thread touches it; the lane threads only set `done`.
    """

    def __init__(self, loop: MoverLoop, lane: str, home: int) -> None:
        self._loop = loop
        self._lane = lane
        self._home = home
        self._turn = 0  # the next thread (after home) an overlapping job goes to
        self.jobs: deque[_DurabilityJob] = deque()

    def add(self, job: _DurabilityJob) -> None:
        self.jobs.append(job)
        self.dispatch()

    def dispatch(self) -> None:
        """Send every job that may start now to its thread, oldest first."""
        elsewhere = False  # an earlier job is still under way off the home thread
        for job in self.jobs:
            if job.thread is None:
                if elsewhere and not job.overlap:
                    return  # held, and everything behind it with it
                self._send(job)
            if job.thread != self._home and not job.done.is_set():
                elsewhere = True

    def _send(self, job: _DurabilityJob) -> None:
        thread = self._home
        if job.overlap:
            thread = (self._home + self._turn) % self._loop.lanes.threads
            self._turn += 1
        job.thread = thread
        self._loop.send(self._lane, thread, job)

    def apply_ready(self) -> None:
        """Loop: apply the completions of the oldest jobs that are done, in order."""
        jobs = self.jobs
        while jobs and jobs[0].done.is_set():
            job = jobs.popleft()
            if not job.applied:
                job.applied = True
                job.then(job.error)
        self.dispatch()

    def wait_for(self, target: _DurabilityJob) -> None:
        """Loop: block until `target` and the jobs before it are done; apply them."""
        if target.applied:
            return
        for job in list(self.jobs):
            if job.thread is None:
                self._send(job)  # the jobs before it are done: it may start now
            job.done.wait()
            if job is target:
                break
        self._loop.run_completions()
        self.apply_ready()


class TransferLanes:
    """One transfer's view of the loop and its lanes (`ports.EngineLoop`): its jobs on
    a lane finish, and their completions run, in the order it submitted them."""

    def __init__(self, loop: MoverLoop, home: int) -> None:
        self._loop = loop
        self._sequences = {lane: _Sequence(loop, lane, home) for lane in _LANES}

    @property
    def ioloop(self) -> EventLoop:
        return self._loop.ioloop

    @property
    def overlap(self) -> int:
        """How many `overlap=True` jobs of this transfer may be under way at once."""
        return self._loop.lanes.overlap

    def submit(
        self,
        lane: str,
        work: Callable[[], None],
        then: Callable[[BaseException | None], None],
        *,
        overlap: bool = False,
    ) -> _DurabilityJob:
        """Run `work` on a thread of `lane`, then `then(error)` on the loop.

        `overlap=True`: `work` may run alongside this transfer's earlier jobs of the
        lane (it must not depend on them); its completion still runs after theirs.
        """
        sequence = self._sequences[lane]
        job = _DurabilityJob(work, then, sequence, overlap=overlap)
        sequence.add(job)
        return job

    def clean_up(self, lane: str, work: Callable[[], None]) -> None:
        """Run `work` on `lane` after this transfer's earlier jobs there; nobody waits
        for it (`ports.EngineLoop.clean_up`). Its error is kept on the lane thread, not
        handed to the loop, which may have stopped by then (`MoverLoop.cleanup_errors`)."""
        self.submit(lane, partial(self._loop.keep_error, work), _nothing_to_do)


class MoverLoop:
    """One I/O loop and the durability threads, shared by the movers of a task.

    Intent appends and ledger writes (an Arrow append + fsync, or a PUT) run on their
    lane's threads; completions run back on the loop, in submission order per
    transfer and lane (`for_transfer`). A mover that must be sure its rows are durable
    (a session ending) waits for its last jobs (`DurableJob.wait`), which blocks the
    loop only for those writes.
    """

    def __init__(self, ioloop: EventLoop, lanes: Lanes | None = None) -> None:
        self._ioloop = ioloop
        self.lanes = lanes or Lanes()
        self._touched: deque[_Sequence] = deque()  # sequences with a job just done
        self._jobs: dict[tuple[str, int], queue.SimpleQueue[_DurabilityJob | None]] = {}
        self._threads: list[threading.Thread] = []
        for lane in _LANES:
            for index in range(self.lanes.threads):
                jobs: queue.SimpleQueue[_DurabilityJob | None] = queue.SimpleQueue()
                thread = threading.Thread(
                    target=self._work, args=(jobs,), name=f"rmq-spark-{lane}-{index}", daemon=True
                )
                thread.start()
                self._jobs[lane, index] = jobs
                self._threads.append(thread)
        self._next_home = 0
        self._own = TransferLanes(self, 0)  # for jobs submitted on the loop itself
        # Errors of clean-up jobs (`TransferLanes.clean_up`), appended by lane threads.
        self.cleanup_errors: list[BaseException] = []

    @property
    def ioloop(self) -> EventLoop:
        return self._ioloop

    @property
    def overlap(self) -> int:
        return self.lanes.overlap

    def for_transfer(self) -> TransferLanes:
        """A new transfer's lanes, on the next home thread (round robin)."""
        home = self._next_home
        self._next_home = (home + 1) % self.lanes.threads
        return TransferLanes(self, home)

    def submit(
        self,
        lane: str,
        work: Callable[[], None],
        then: Callable[[BaseException | None], None],
        *,
        overlap: bool = False,
    ) -> _DurabilityJob:
        """Run `work` on the lane, then `then(error)` on the loop; jobs submitted here
        (not through `for_transfer`) keep one order, as a transfer's do."""
        return self._own.submit(lane, work, then, overlap=overlap)

    def keep_error(self, work: Callable[[], None]) -> None:
        """Run a clean-up job's `work` (lane thread), keeping its error for `run_movers`."""
        try:
            work()
        except Exception as exc:
            self.cleanup_errors.append(exc)

    def run_completions(self) -> None:
        """Apply finished jobs' completions, in submission order per transfer and lane
        (loop thread)."""
        while self._touched:
            self._touched.popleft().apply_ready()

    def send(self, lane: str, thread: int, job: _DurabilityJob) -> None:
        """Queue `job` on one thread of `lane` (`_Sequence` decides which)."""
        self._jobs[lane, thread].put(job)

    def close(self) -> None:
        """Finish queued jobs, stop the threads, close the I/O loop."""
        for jobs in self._jobs.values():
            jobs.put(None)
        for thread in self._threads:
            thread.join()
        self._ioloop.close()

    def _work(self, jobs: queue.SimpleQueue[_DurabilityJob | None]) -> None:
        while (job := jobs.get()) is not None:
            try:
                job.work()
            except BaseException as exc:
                job.error = exc
            # `done` first, then noted: the loop may run completions at any moment (for
            # another job's callback) and takes every noted sequence as it goes, so a
            # sequence noted while its job was not yet done would be taken, found not
            # ready, and never applied; its transfer would wait for an ack forever. A
            # waiter that sees `done` before the note applies its own sequence itself
            # (`_Sequence.wait_for`).
            job.done.set()
            self._touched.append(job.sequence)
            self._ioloop.add_callback_threadsafe(self.run_completions)


def _nothing_to_do(error: BaseException | None) -> None:
    """The completion of a clean-up job: its error, if any, is kept by `keep_error`."""


class Startable(Protocol):
    """A transfer that runs on a shared loop (`mover.QueueMover`)."""

    def start(
        self, loop: EngineLoop, on_finished: Callable[[MoveOutcome | BaseException], None]
    ) -> None: ...


def run_movers(
    movers: Sequence[Callable[[], Startable]],
    *,
    ioloop: EventLoop,
    concurrent: int = 1,
    connections: Connections | None = None,
    lanes: Lanes | None = None,
) -> list[MoveOutcome]:
    """Run transfers on `ioloop`, at most `concurrent` at a time, in the given order.

    Each item makes its mover when its turn comes (so files open only then). Returns
    the outcomes in the same order. After an error (refused access, connections lost
    through every reconnect attempt) no further transfer starts; those running finish,
    then the first error is raised (Spark retries the task; drained queues are quick).
    `connections` (those the movers' links share) close once the last mover is done,
    before the loop stops. `lanes`: how wide the durability lanes are
    (`Lanes.for_ledger`; one thread each by default).
    """
    if concurrent < 1:
        ioloop.close()
        raise ValueError(f"concurrent must be >= 1, got {concurrent}")
    loop = MoverLoop(ioloop, lanes)
    waiting = deque(enumerate(movers))
    outcomes: dict[int, MoveOutcome] = {}
    errors: list[BaseException] = []
    stopping: list[bool] = []
    active = 0

    def start_next() -> None:
        nonlocal active
        while waiting and active < concurrent and not errors:
            index, make = waiting.popleft()
            active += 1
            try:
                make().start(loop.for_transfer(), partial(finished, index))

            except Exception as exc:
                finished(index, exc)
        if active == 0 and not stopping:
            stopping.append(True)
            if connections is not None:
                connections.close(ioloop.stop)
            else:
                ioloop.stop()

    def finished(index: int, result: MoveOutcome | BaseException) -> None:
        nonlocal active
        active -= 1
        if isinstance(result, BaseException):
            errors.append(result)
        else:
            outcomes[index] = result
        start_next()

    ioloop.add_callback_threadsafe(start_next)
    try:
        ioloop.start()
    finally:
        loop.close()
    # `close` ran every queued job, clean-ups included (`TransferLanes.clean_up`).
    if errors or loop.cleanup_errors:
        raise (errors or loop.cleanup_errors)[0]
    return [outcomes[index] for index in sorted(outcomes)]
