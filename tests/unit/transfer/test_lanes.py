"""run_movers: several transfers on one loop, at most `concurrent` at once, in order."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rmq_spark.errors import TransferError
from rmq_spark.model import MoveOutcome
from rmq_spark.transfer.lanes import MoverLoop, run_movers
from tests.support.fakes import KEY, FakeClock, ManualTimers


class TimedMover:
    """A transfer that ends `seconds` after it starts, with an outcome or an error."""

    def __init__(self, log: list[str], name: str, seconds: float, error: bool = False) -> None:
        self.log, self.name, self.seconds, self.error = log, name, seconds, error

    def start(
        self, loop: MoverLoop, on_finished: Callable[[MoveOutcome | BaseException], None]
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
