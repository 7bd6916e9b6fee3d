"""Several movers on one I/O loop, and the durability lanes they share.

An executor task moves several queues at once on one thread (`run_movers`).
Intent-log appends and ledger-row appends are written by two durability threads per
loop (`MoverLoop`), so an fsync never stalls the loop; acks still wait for the
ledger row and publishes for the intent.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Protocol

from rmq_spark.model import MoveOutcome
from rmq_spark.transfer.ports import Connections, EventLoop

# The durability lanes: intent-log appends (which publishes wait for) and ledger rows
# (which acks wait for). Each lane is one thread, so its jobs finish in order; the two
# lanes' fsyncs overlap.
INTENTS, LEDGER = "intents", "ledger"


class _DurabilityJob:
    """One durable write handed to a durability lane, and what to do when it is done."""

    def __init__(
        self,
        work: Callable[[], None],
        then: Callable[[BaseException | None], None],
        run_completions: Callable[[], None],
    ) -> None:
        self.work = work
        self.then = then
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.applied = False
        self._run_completions = run_completions

    def wait(self) -> None:
        """Block until this job (and every job before it in its lane) is done, and
        apply completions."""
        self.done.wait()
        self._run_completions()


class MoverLoop:
    """One I/O loop and two durability threads, shared by the movers of a task.

    Intent appends and ledger writes (an Arrow append + fsync each) run on their
    lane's thread in the order they were submitted; completions run back on the loop,
    in the same order per lane. A mover that must be sure its rows are durable (a
    session ending) waits for its last jobs (`DurableJob.wait`), which blocks the
    loop only for those writes.
    """

    def __init__(self, ioloop: EventLoop) -> None:
        self._ioloop = ioloop
        self._completed: deque[_DurabilityJob] = deque()
        self._jobs: dict[str, queue.SimpleQueue[_DurabilityJob | None]] = {}
        self._threads: list[threading.Thread] = []
        for lane in (INTENTS, LEDGER):
            jobs: queue.SimpleQueue[_DurabilityJob | None] = queue.SimpleQueue()
            thread = threading.Thread(
                target=self._work, args=(jobs,), name=f"rmq-spark-{lane}", daemon=True
            )
            thread.start()
            self._jobs[lane] = jobs
            self._threads.append(thread)

    @property
    def ioloop(self) -> EventLoop:
        return self._ioloop

    def submit(
        self, lane: str, work: Callable[[], None], then: Callable[[BaseException | None], None]
    ) -> _DurabilityJob:
        """Run `work` on the lane's thread, then `then(error)` on the loop."""
        job = _DurabilityJob(work, then, self.run_completions)
        self._jobs[lane].put(job)
        return job

    def run_completions(self) -> None:
        """Apply finished jobs' completions, in submission order per lane (loop thread)."""
        while self._completed:
            job = self._completed.popleft()
            if not job.applied:
                job.applied = True
                job.then(job.error)

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
            self._completed.append(job)
            job.done.set()
            self._ioloop.add_callback_threadsafe(self.run_completions)


class Startable(Protocol):
    """A transfer that runs on a shared loop (`mover.QueueMover`)."""

    def start(
        self, loop: MoverLoop, on_finished: Callable[[MoveOutcome | BaseException], None]
    ) -> None: ...


def run_movers(
    movers: Sequence[Callable[[], Startable]],
    *,
    ioloop: EventLoop,
    concurrent: int = 1,
    connections: Connections | None = None,
) -> list[MoveOutcome]:
    """Run transfers on `ioloop`, at most `concurrent` at a time, in the given order.

    Each item makes its mover when its turn comes (so files open only then). Returns
    the outcomes in the same order. After an error (refused access, connections lost
    through every reconnect attempt) no further transfer starts; those running finish,
    then the first error is raised (Spark retries the task; drained queues are quick).
    `connections` (those the movers' links share) close once the last mover is done,
    before the loop stops.
    """
    if concurrent < 1:
        ioloop.close()
        raise ValueError(f"concurrent must be >= 1, got {concurrent}")
    loop = MoverLoop(ioloop)
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
                make().start(loop, partial(finished, index))

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
    if errors:
        raise errors[0]
    return [outcomes[index] for index in sorted(outcomes)]
