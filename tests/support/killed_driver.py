"""A real driver process that a test kills mid-run, with its output kept in a file.

Why a file and not a pipe: while the test waits for the run to get somewhere, nobody
reads the driver's pipes, and a driver whose stderr (Spark's log, a retried task's
traceback) fills a pipe's 64 KiB blocks on its next write: the run never gets there and
the test times out saying nothing of why. A file never fills, and its tail is what a
failing test prints.

Why its own process group: one SIGKILL reaches the driver, its JVM and its Python
workers at once, as a node's death would.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

from tests.support.faults import wait_until

TAIL_CHARS = 4000


class DriverProcess:
    """One driver, started by `started_driver`; `kill_once` is how the test ends it."""

    def __init__(self, process: subprocess.Popen[bytes], output: Path) -> None:
        self.process = process
        self.output = output
        self.killed = False

    def tail(self) -> str:
        text = self.output.read_text(encoding="utf-8", errors="replace")
        return text[-TAIL_CHARS:]

    def kill_once(self, condition: Callable[[], bool], what: str, *, timeout: float) -> None:
        """SIGKILL the driver's process group once `condition` holds; fail the test with
        the driver's last output if it ends first or the condition does not come."""

        def reached() -> bool:
            code = self.process.poll()
            if code is not None:
                raise AssertionError(
                    f"the driver ended by itself (exit {code}) before {what}:\n{self.tail()}"
                )
            return condition()

        try:
            wait_until(reached, what, timeout=timeout)
        except AssertionError as exc:
            if self.process.poll() is not None:
                raise
            raise AssertionError(f"{exc}; the driver's output ends:\n{self.tail()}") from None
        finally:
            self.kill()

    def kill(self) -> None:
        """SIGKILL the whole group, even when the driver itself has ended: its JVM or
        its Python workers may outlive it. Once: after that the group's id is free."""
        if self.killed:
            return
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)
        self.killed = True


@contextmanager
def started_driver(
    command: Sequence[str], output: Path, *, env: Mapping[str, str] | None = None
) -> Iterator[DriverProcess]:
    """Start `command` in its own process group, stdout and stderr to `output`; killed
    on the way out whatever happened, so a failed test leaves no driver moving."""
    with output.open("wb") as sink:
        process = subprocess.Popen(
            list(command),
            env=None if env is None else dict(env),
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    driver = DriverProcess(process, output)
    try:
        yield driver
    finally:
        driver.kill()
