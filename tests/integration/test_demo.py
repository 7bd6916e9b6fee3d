"""The README's first command, small: `rmq-spark demo` on a terminal draws progress bars
and ends with the report path and a verified RESULT line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from rmq_spark.progress import TERMINAL_ENV
from rmq_spark.report.console import RESULT_PREFIX
from tests.support.brokers import job_environment

REPO = Path(__file__).resolve().parents[2]


def test_demo_shows_bars_moves_verifies_and_ends_with_report_and_result(tmp_path: Path) -> None:
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "rmq_spark.cli",
            "demo",
            "--messages-per-queue",
            "50",
            "--base-dir",
            str(tmp_path / "demo"),
        ],
        cwd=REPO,
        # What `rmq-spark demo` tells the job when its stdout is a terminal.
        env={**job_environment(), TERMINAL_ENV: "1", "COLUMNS": "120"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )

    assert completed.returncode == 0, completed.stderr[-4000:]
    *_, report_line, last_line = completed.stdout.rstrip("\n").splitlines()
    assert last_line.startswith(RESULT_PREFIX)
    assert report_line.startswith("report: ")
    assert Path(report_line.removeprefix("report: ")).is_file()
    result = json.loads(last_line[len(RESULT_PREFIX) :])
    assert result["queues"] == 20
    assert result["messages"] == 20 * 50
    assert (result["lost"], result["duplicates"], result["verified"]) == (0, 0, True)
    assert result["report"] == report_line.removeprefix("report: ")
    # The host's Debian package, read from each cluster's management API.
    assert {name: v[:5] for name, v in result["rabbitmq_versions"].items()} == {
        "dr": "3.10.",
        "main": "3.10.",
    }
    assert " INFO " not in completed.stderr.replace("INFO rmq_spark", "")  # Spark stays quiet
    # The bars came through spark-submit's JVM and the demo: redrawn in place, at the end
    # the total complete.
    assert "\x1b[1A" in completed.stdout
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", completed.stdout)
    assert re.search(r"^total +━+ 1000/1000 ", plain, re.MULTILINE), plain[-3000:]


def test_demo_with_an_s3_ledger_verifies_with_every_table_on_the_store(tmp_path: Path) -> None:
    """`make demo LEDGER=s3`: the local S3 server is started for the demo and every
    ledger table is read back from it before it stops."""
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "rmq_spark.cli",
            "demo",
            "--messages-per-queue",
            "20",
            "--base-dir",
            str(tmp_path / "demo"),
            "--ledger",
            "s3",
        ],
        cwd=REPO,
        env={**job_environment(), TERMINAL_ENV: "0"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )

    assert completed.returncode == 0, completed.stderr[-4000:]
    *_, report_line, tables_line, last_line = completed.stdout.rstrip("\n").splitlines()
    result = json.loads(last_line.removeprefix(RESULT_PREFIX))
    assert (result["messages"], result["lost"], result["verified"]) == (20 * 20, 0, True)
    assert report_line == f"report: {result['report']}"
    assert result["report"].startswith("s3://rmq-spark-demo/ledger/reports/")
    assert tables_line == (
        "ledger tables on s3://rmq-spark-demo/ledger (rows): "
        "runs 1, queues 20, messages 400, plans 20"
    )
    assert not (tmp_path / "demo" / "ledger").exists()  # nothing on local disk
