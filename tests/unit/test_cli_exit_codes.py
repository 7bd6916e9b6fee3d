"""Exit codes a scheduler can act on, log options, --version (no Spark, no broker)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

import rmq_spark
from rmq_spark import cli, logs

# The command runs in a child process, so its logging is set up as in a real run
# (pytest's own log handlers on the root logger would turn basicConfig into a no-op).
# The child replaces build_report with one that raises `error`.
CHILD = """
import sys
import rmq_spark.report.html
from rmq_spark import cli
from rmq_spark.errors import DiscoveryError

def fail(*_args, **_kwargs):
    raise {error}

rmq_spark.report.html.build_report = fail
sys.argv = ["rmq-spark", *sys.argv[1:]]
cli.script_main()
"""


def report_failing_with(error: str, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHILD.format(error=error), "report", "run-1", "--ledger", "/x",
         *options],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )  # fmt: skip


def test_an_unexpected_exception_exits_3_with_one_line_and_the_traceback_in_the_log() -> None:
    completed = report_failing_with('RuntimeError("row 7 unreadable\\nsecond line")')

    assert completed.returncode == cli.EXIT_INTERNAL == 3
    lines = [line for line in completed.stderr.splitlines() if line.startswith("rmq-spark: ")]
    assert lines == ["rmq-spark: internal error (exit 3): RuntimeError: row 7 unreadable"]
    assert "Traceback (most recent call last)" in completed.stderr
    assert "CRITICAL rmq_spark: internal error in rmq-spark report" in completed.stderr


def test_an_error_the_user_can_act_on_stays_exit_2() -> None:
    completed = report_failing_with("DiscoveryError(\"cluster dr vhost '/': no queue 'q1'\")")

    assert completed.returncode == cli.EXIT_ERROR == 2
    assert completed.stderr.strip() == "rmq-spark: error: cluster dr vhost '/': no queue 'q1'"


def test_json_log_lines_carry_the_traceback() -> None:
    completed = report_failing_with('RuntimeError("boom")', "--log-format", "json")

    err = completed.stderr.splitlines()
    assert completed.returncode == 3
    (entry,) = [json.loads(line) for line in err if line.startswith("{")]
    assert entry["level"] == "CRITICAL"
    assert entry["logger"] == "rmq_spark"
    assert entry["message"] == "internal error in rmq-spark report"
    assert "RuntimeError: boom" in entry["exception"]
    assert entry["time"].endswith("+00:00")
    assert err[-1] == "rmq-spark: internal error (exit 3): RuntimeError: boom"


def test_json_lines_are_masked_like_text_lines() -> None:
    record = logging.LogRecord("rmq_spark.t", logging.INFO, "f", 1, "with %s", ("s3cr3t",), None)
    assert logs.SecretMaskingFilter(["s3cr3t"]).filter(record)
    entry = json.loads(logs.JsonLogFormatter().format(record))
    assert entry["message"] == "with ***"
    assert set(entry) == {"time", "level", "logger", "message"}


@pytest.mark.parametrize("level", ["LOUD", "verbose", "5"])
def test_an_unknown_log_level_is_refused_by_argparse(
    level: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as raised:
        cli.main(["plan", "--config", "c.yaml", "--log-level", level])
    assert raised.value.code == 2
    assert "--log-level: invalid choice" in capsys.readouterr().err


def test_log_level_is_case_insensitive() -> None:
    parser = argparse.ArgumentParser()
    cli.add_logging_arguments(parser, "INFO")
    assert parser.parse_args(["--log-level", "debug"]).log_level == "DEBUG"


def test_version_is_printed_by_the_installed_command() -> None:
    script = Path(sys.executable).parent / "rmq-spark"
    completed = subprocess.run(
        [str(script), "--version"], capture_output=True, text=True, check=True, timeout=60
    )
    assert completed.stdout.strip() == f"rmq-spark {rmq_spark.__version__}"


# As in an installed wheel, which leaves the dev harness out (pyproject.toml).
CHILD_WITHOUT_DEV_HARNESS = """
import sys
sys.modules["rmq_spark.devtools"] = None
from rmq_spark import cli
sys.argv = ["rmq-spark", *sys.argv[1:]]
cli.script_main()
"""


def run_without_dev_harness(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHILD_WITHOUT_DEV_HARNESS, *arguments],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_without_the_dev_harness_the_demo_says_it_needs_a_source_checkout() -> None:
    completed = run_without_dev_harness("demo")

    assert completed.returncode == cli.EXIT_ERROR == 2
    assert completed.stderr.strip() == (
        "rmq-spark: error: rmq-spark demo runs from a source checkout (`make demo` in a clone "
        "of the repository): the dev harness (rmq_spark.devtools) is not in the installed package"
    )


def test_without_the_dev_harness_the_other_commands_still_parse() -> None:
    completed = run_without_dev_harness("--version")

    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip().endswith(rmq_spark.__version__)


@pytest.mark.parametrize("command", ["transfer", "migrate"])
def test_a_spark_command_without_pyspark_exits_2_naming_the_extra(
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "pyspark" else found(name)
    )

    exit_code = cli.main([command, "--config", str(tmp_path / "never-read.yaml")])

    assert exit_code == 2
    error = capsys.readouterr().err
    assert error.startswith(f"rmq-spark: error: rmq-spark {command} runs on Spark")
    assert "pip install 'rmq-spark[spark]'" in error
