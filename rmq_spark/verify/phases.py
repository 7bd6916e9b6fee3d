"""Where a verification's seconds went, phase by phase: `verification.json`'s `seconds`
and the log line, so a slow verification says which part was slow.

Example:
    phases = Phases()
    with phases.timed("summary"):
        rows = summary.collect()
    phases.seconds()  # (("summary", 1.234),)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator


class Phases:
    """Seconds per named phase, in the order the phases first ran; a name timed twice
    adds up. `clock` is injected so a test can drive it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Time the block under `name`, whether it returns or raises."""
        started = self._clock()
        try:
            yield
        finally:
            self._seconds[name] = self._seconds.get(name, 0.0) + self._clock() - started

    def seconds(self) -> tuple[tuple[str, float], ...]:
        """(phase, seconds) pairs, to the millisecond."""
        return tuple((name, round(value, 3)) for name, value in self._seconds.items())

    def describe(self) -> str:
        """ "summary 1.2s, expectations 3.4s" for the log line."""
        return ", ".join(f"{name} {value:.1f}s" for name, value in self._seconds.items())
