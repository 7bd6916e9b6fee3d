"""The README's first command, small: `rmq-spark demo` ends with a verified RESULT line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rmq_spark.report import RESULT_PREFIX
from tests.integration.support import job_environment

REPO = Path(__file__).resolve().parents[2]


def test_demo_moves_and_verifies_and_ends_with_the_result_line(tmp_path: Path) -> None:
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
        env=job_environment(),
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
    assert " INFO " not in completed.stderr.replace("INFO rmq_spark", "")  # Spark stays quiet
