"""The demo's part of live progress: telling the job about the terminal, relaying its output."""

from __future__ import annotations

import fcntl
import io
import os
import struct
import termios
from collections.abc import Iterator

import pytest

from rmq_spark.devtools.demo import (
    DEMO_CONFIG,
    REPO_ROOT,
    SPARK_SUBMIT,
    ResultHoldingRelay,
    terminal_environment,
)
from rmq_spark.progress import TERMINAL_ENV

RESULT = b'RESULT {"run_id": "r1", "verified": true}'


@pytest.fixture
def terminal() -> Iterator[io.TextIOWrapper]:
    """The writing end of a pseudo-terminal 132 columns wide."""
    leader, follower = os.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 132, 0, 0))
    try:
        with open(follower, "w") as stream:
            yield stream
    finally:
        os.close(leader)


def test_a_terminal_is_announced_with_its_width(terminal: io.TextIOWrapper) -> None:
    assert terminal_environment(terminal, {}) == {TERMINAL_ENV: "1", "COLUMNS": "132"}


def test_a_pipe_or_file_is_announced_as_no_terminal(tmp_path: os.PathLike[str]) -> None:
    with open(os.path.join(tmp_path, "out.txt"), "w") as file:
        assert terminal_environment(file, {}) == {TERMINAL_ENV: "0"}


@pytest.mark.parametrize("choice", ["0", "1"])
def test_the_users_choice_stands(terminal: io.TextIOWrapper, choice: str) -> None:
    assert terminal_environment(terminal, {TERMINAL_ENV: choice}) == {}


def relay(*chunks: bytes) -> tuple[bytes, str | None, list[bytes]]:
    """Feed the chunks; what was written in all, the result, and what each feed wrote."""
    out = io.BytesIO()
    relay = ResultHoldingRelay(out)
    written = []
    for chunk in chunks:
        before = out.tell()
        relay.feed(chunk)
        written.append(out.getvalue()[before:])
    relay.close()
    return out.getvalue(), relay.result, written


def test_result_line_is_kept_and_everything_else_passes() -> None:
    out, result, _ = relay(b"table\nfailed: none\n", RESULT + b"\n", b"bye\n")
    assert out == b"table\nfailed: none\nbye\n"
    assert result == RESULT.decode()


def test_a_redraw_without_newline_passes_at_once() -> None:
    frame = b"\r\x1b[2K\x1b[1A\x1b[2Ktotal  \x1b[32m125/150\x1b[0m"
    _, _, written = relay(b"bars\n", frame, frame)
    assert written == [b"bars\n", frame, frame]


def test_result_line_split_across_reads_is_still_kept() -> None:
    out, result, written = relay(b"line\nRES", b"ULT {", b'"run_id": "r1"}\nafter\n')
    assert out == b"line\nafter\n"
    assert result == 'RESULT {"run_id": "r1"}'
    assert written == [b"line\n", b"", b"after\n"]  # held only while it may be RESULT


def test_a_line_that_only_starts_like_result_is_passed_on() -> None:
    out, result, _ = relay(b"RESUL", b"TS are in\n", b"RES")
    assert (out, result) == (b"RESULTS are in\nRES", None)


def test_result_in_the_middle_of_a_line_is_not_the_result_line() -> None:
    out, result, _ = relay(b"bar 50/100 " + RESULT + b"\n")
    assert (out, result) == (b"bar 50/100 " + RESULT + b"\n", None)


def test_result_line_without_a_final_newline() -> None:
    out, result, _ = relay(b"x\n" + RESULT)
    assert (out, result) == (b"x\n", RESULT.decode())


def test_the_demo_finds_the_checkout_it_runs_from() -> None:
    """demo.py sits two packages deep; its paths are the repository's, not the package's."""
    assert (REPO_ROOT / "pyproject.toml").is_file()
    assert SPARK_SUBMIT == REPO_ROOT / "spark-submit.sh"
    assert SPARK_SUBMIT.is_file()
    assert DEMO_CONFIG.is_file()
