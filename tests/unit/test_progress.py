"""Progress arithmetic (moved, rate, ETA) and where progress is shown: bars or log lines."""

from __future__ import annotations

import io
import logging
import re
import sys

import pytest

from rmq_spark.model import QueueTransfer, TransferKey
from rmq_spark.progress import (
    MAX_PAUSE_SECONDS,
    MAX_QUEUE_BARS,
    SAMPLE_SHARE,
    TERMINAL_ENV,
    MovingRates,
    ProgressReporter,
    human_bytes,
    pause_between_samples,
    progress_console,
    queues_to_show,
    rate_text,
    snapshot,
)
from tests.support import builders


def test_moved_is_the_drop_in_ready_messages() -> None:
    now = snapshot({"a": 100, "b": 50}, {"a": 40, "b": 50}, seconds=2.0)
    assert (now.moved, now.total) == (60, 150)
    assert now.per_queue == {"a": (60, 100), "b": (0, 50)}
    assert now.rate == 30.0
    assert now.eta_seconds == pytest.approx(3.0)


def test_moved_stays_within_zero_and_the_start_depth() -> None:
    # A producer added messages to "a"; "b" was already empty at plan time.
    now = snapshot({"a": 10, "b": 0}, {"a": 25, "b": 0}, seconds=1.0)
    assert now.per_queue == {"a": (0, 10), "b": (0, 0)}
    assert now.eta_seconds is None  # no progress, no estimate


def test_missing_sample_counts_as_not_moved() -> None:
    assert snapshot({"a": 10}, {}, seconds=1.0).moved == 0


def test_a_cheap_sample_is_taken_every_interval() -> None:
    assert pause_between_samples(10.0, 0.02) == 10.0
    assert pause_between_samples(1.0, 0.0) == 1.0  # before the first sample


def test_a_costly_sample_waits_until_sampling_is_its_share_of_the_time() -> None:
    # 10,000 queues' listing took ~2.6 s: every 10 s would be a fifth of the time.
    pause = pause_between_samples(10.0, 2.6)
    assert pause > 10.0
    assert 2.6 / (2.6 + pause) == pytest.approx(SAMPLE_SHARE)


def test_even_a_very_costly_sample_is_taken_again_within_the_longest_pause() -> None:
    # A broker that took 15 s to answer: a line a minute, not one every 5 minutes.
    assert pause_between_samples(10.0, 15.0) == MAX_PAUSE_SECONDS
    assert pause_between_samples(2 * MAX_PAUSE_SECONDS, 15.0) == 2 * MAX_PAUSE_SECONDS


def test_log_line_is_structured() -> None:
    line = snapshot({"a": 100, "b": 20}, {"a": 0, "b": 10}, seconds=10.0).log_line(1024)
    assert line == (
        "progress moved=110/120 queues_done=1/2 rate=11msg/s bytes_rate=11264B/s eta=1s"
    )


# -- where progress is shown -------------------------------------------------------------


def transfer(queue: str, messages: int, message_bytes: int) -> QueueTransfer:
    return builders.transfer(queue, messages, message_bytes, vhost="v")


@pytest.fixture
def rich_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No variable rich itself reads decides these tests."""
    for name in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.usefixtures("rich_environment")
def test_terminal_flag_forces_bars_on_a_pipe_at_the_terminal_width(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # what the driver has under spark-submit
    console = progress_console({TERMINAL_ENV: "1", "COLUMNS": "137"})
    assert (console.is_terminal, console.is_interactive, console.width) == (True, True, 137)


@pytest.mark.usefixtures("rich_environment")
def test_terminal_flag_without_a_usable_width_keeps_rich_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    console = progress_console({TERMINAL_ENV: "1", "COLUMNS": "wide"})
    assert console.is_interactive
    assert console.width == 80


@pytest.mark.usefixtures("rich_environment")
def test_terminal_flag_zero_means_log_lines_even_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "stderr", _Terminal())
    assert not progress_console({TERMINAL_ENV: "0"}).is_interactive


@pytest.mark.usefixtures("rich_environment")
@pytest.mark.parametrize("stream", [_Terminal(), io.StringIO()], ids=["tty", "pipe"])
def test_without_the_flag_the_stream_decides(
    monkeypatch: pytest.MonkeyPatch, stream: io.StringIO
) -> None:
    monkeypatch.setattr(sys, "stderr", stream)
    assert progress_console({}).is_interactive is stream.isatty()


@pytest.mark.usefixtures("rich_environment")
def test_dumb_terminal_gets_log_lines_not_bars(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "dumb")
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    reporter = ProgressReporter(
        [transfer("a", 10, 10)], lambda: {}, console=progress_console({TERMINAL_ENV: "1"})
    )
    assert not reporter.shows_bars


def test_rate_text_shows_messages_and_bytes_per_second() -> None:
    assert rate_text(1500.0, 1024) == "1,500 msg/s 1.5 MiB/s"
    assert rate_text(0.0, 1024) == "0 msg/s 0 B/s"
    assert [human_bytes(n) for n in (999, 1000, 1536, 1002.5 * 1024, 3 * 1024**3)] == [
        "999 B",
        "1.0 KiB",
        "1.5 KiB",
        "1.0 MiB",
        "3.0 GiB",
    ]


def test_rate_counts_only_the_time_a_queue_was_moving() -> None:
    rates = MovingRates(["waits", "first"])
    # "first" moves from the start and is done by t=2; "waits" starts after t=3.
    for at, waits, first in [(1, 0, 500), (2, 0, 1000), (3, 0, 1000), (5, 600, 1000)]:
        rates.observe("waits", waits, at)
        rates.observe("first", first, at)
    rates.observe("first", 1000, 60.0)  # long done: its rate stays what it was
    assert rates.rate("first") == 500.0  # 1000 messages from t=0 to t=2
    assert rates.rate("waits") == 300.0  # 600 messages from t=3 to t=5
    assert MovingRates(["never"]).rate("never") == 0.0


def test_moving_queues_get_bars_first_then_waiting_then_done() -> None:
    per_queue = {
        "done-1": (10, 10),
        "waiting-1": (0, 10),
        "moving-1": (3, 10),
        "done-2": (10, 10),
        "waiting-2": (0, 10),
        "moving-2": (9, 10),
    }
    assert queues_to_show(per_queue, 3) == ["moving-1", "moving-2", "waiting-1"]
    assert queues_to_show(per_queue, 10) == [
        "moving-1",
        "moving-2",
        "waiting-1",
        "waiting-2",
        "done-1",
        "done-2",
    ]


_CSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.mark.usefixtures("rich_environment")
def test_bars_redraw_in_place_through_a_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    pipe = io.StringIO()  # not a tty: only RMQ_SPARK_TERMINAL=1 makes bars here
    monkeypatch.setattr(sys, "stderr", pipe)
    console = progress_console({TERMINAL_ENV: "1", "COLUMNS": "120"})
    depths = {transfer("a", 100, 0).key: 0, transfer("b", 50, 0).key: 25}

    # interval=60: the only sample is the one taken when the reporter stops.
    with ProgressReporter(
        [transfer("a", 100, 100 * 1024), transfer("b", 50, 50 * 1024)],
        lambda: depths,
        console=console,
        interval=60,
    ) as reporter:
        assert reporter.shows_bars

    out = pipe.getvalue()
    assert "\x1b[1A" in out, "no cursor-up: the bars were not redrawn in place"
    *_, last_frame = _CSI.sub("", out).split("\r")
    lines = [line.split() for line in last_frame.strip().splitlines()]
    assert [(line[0], line[2]) for line in lines] == [
        ("total", "125/150"),
        ("dr/v/a", "100/100"),
        ("dr/v/b", "25/50"),
    ]
    assert all(len(line) <= 120 for line in _CSI.sub("", out).splitlines())


@pytest.mark.usefixtures("rich_environment")
def test_queues_beyond_the_bar_limit_share_one_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    pipe = io.StringIO()
    monkeypatch.setattr(sys, "stderr", pipe)
    names = [f"q{index:02d}" for index in range(MAX_QUEUE_BARS + 3)]
    left = {"q00": 0, "q01": 0, "q02": 4}  # q00 and q01 done, q02 moving, the rest untouched
    depths = {transfer(name, 10, 100).key: left.get(name, 10) for name in names}

    with ProgressReporter(
        [transfer(name, 10, 100) for name in names],
        lambda: depths,
        console=progress_console({TERMINAL_ENV: "1", "COLUMNS": "120"}),
        interval=60,
    ):
        pass

    *_, last_frame = _CSI.sub("", pipe.getvalue()).split("\r")
    lines = [line.split() for line in last_frame.strip().splitlines()]
    assert [line[0] for line in lines] == [
        "total",
        "dr/v/q02",  # moving first
        *(f"dr/v/q{index:02d}" for index in range(3, MAX_QUEUE_BARS + 2)),  # waiting
        "3",  # "3 more queues": q12 waiting, q00 and q01 done
    ]
    assert lines[0][2] == "26/130"
    assert lines[-1][:3] == ["3", "more", "queues"]
    assert lines[-1][4:7] == ["20/30", "2", "done"]


@pytest.mark.usefixtures("rich_environment")
def test_log_lines_are_printed_above_the_bars_not_into_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pipe = io.StringIO()
    monkeypatch.setattr(sys, "stderr", pipe)
    handler = logging.StreamHandler(pipe)  # as cli.setup_logging makes it
    handler.setFormatter(logging.Formatter("%(message)s"))
    logging.getLogger().addHandler(handler)
    marker = "a warning while the bars are up"

    def sampler() -> dict[TransferKey, int]:
        logging.getLogger("rmq_spark.test").warning(marker)
        return {transfer("a", 10, 10).key: 5}

    try:
        with ProgressReporter(
            [transfer("a", 10, 10)],
            sampler,
            console=progress_console({TERMINAL_ENV: "1", "COLUMNS": "100"}),
            interval=60,
        ):
            pass
    finally:
        logging.getLogger().removeHandler(handler)

    out = pipe.getvalue().replace("\x1b[?25h", "")  # the cursor shown again
    # On a line of its own (a cleared line or a new one), not after a bar's last character.
    starts = [match.start() for match in re.finditer(re.escape(marker), out)]
    assert len(starts) == 1, out  # one sample: the one the stop asks for
    assert out[: starts[0]].endswith(("\n", "\x1b[2K")), out
    assert handler.stream is pipe  # given back when the bars end


def test_log_lines_name_the_rate_limits_in_force(caplog: pytest.LogCaptureFixture) -> None:
    depths = {transfer("a", 100, 0).key: 40}
    with (
        caplog.at_level(logging.INFO, logger="rmq_spark.progress"),
        ProgressReporter(
            [transfer("a", 100, 0)],
            lambda: depths,
            console=progress_console({TERMINAL_ENV: "0"}),
            interval=60,
            limits="job 500 msg/s",
        ),
    ):
        pass

    (line,) = [r.getMessage() for r in caplog.records if r.name == "rmq_spark.progress"]
    assert line.startswith("progress moved=60/100 ")
    assert line.endswith(' limits="job 500 msg/s"')


@pytest.mark.usefixtures("rich_environment")
def test_the_total_bar_shows_the_rate_limits_beside_the_rate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pipe = io.StringIO()
    monkeypatch.setattr(sys, "stderr", pipe)
    depths = {transfer("a", 100, 0).key: 40}

    with ProgressReporter(
        [transfer("a", 100, 0)],
        lambda: depths,
        console=progress_console({TERMINAL_ENV: "1", "COLUMNS": "160"}),
        interval=60,
        limits="job 500 msg/s",
    ):
        pass

    *_, last_frame = _CSI.sub("", pipe.getvalue()).split("\r")
    total, queue = last_frame.strip().splitlines()
    assert "msg/s" in total
    assert "(limits: job 500 msg/s)" in total
    assert "limits" not in queue
