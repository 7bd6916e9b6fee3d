"""spark-submit.sh tells the job whether a terminal shows its output (no Spark: a stub
spark-submit records what it was given)."""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import termios
from pathlib import Path

import pytest

from rmq_spark.progress import TERMINAL_ENV

SCRIPT = Path(__file__).resolve().parents[2] / "spark-submit.sh"


@pytest.fixture
def stub_spark_home(tmp_path: Path) -> Path:
    """A SPARK_HOME whose bin/spark-submit writes the two variables to $STUB_OUT."""
    bin_dir = tmp_path / "spark" / "bin"
    bin_dir.mkdir(parents=True)
    stub = bin_dir / "spark-submit"
    stub.write_text(
        "#!/bin/sh\n"
        f'printf "%s %s" "${{{TERMINAL_ENV}-unset}}" "${{COLUMNS-unset}}" > "$STUB_OUT"\n'
    )
    stub.chmod(0o755)
    return tmp_path / "spark"


def submit(spark_home: Path, tmp_path: Path, stdout: int, **env: str) -> str:
    """Run spark-submit.sh with `stdout`; what the stub saw: '<terminal flag> <columns>'."""
    out = tmp_path / "seen.txt"
    environ = {
        key: value
        for key, value in os.environ.items()
        if key not in (TERMINAL_ENV, "COLUMNS", "SPARK_HOME")
    }
    subprocess.run(
        [str(SCRIPT), "--config", "conf/demo.yaml"],
        env={**environ, "SPARK_HOME": str(spark_home), "STUB_OUT": str(out), **env},
        stdout=stdout,
        stderr=subprocess.PIPE,
        check=True,
        timeout=60,
    )
    return out.read_text()


def test_a_terminal_on_stdout_is_announced_with_its_width(
    stub_spark_home: Path, tmp_path: Path
) -> None:
    leader, follower = os.openpty()
    try:
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 97, 0, 0))
        assert submit(stub_spark_home, tmp_path, follower) == "1 97"
    finally:
        os.close(follower)
        os.close(leader)


def test_a_pipe_on_stdout_means_log_lines(stub_spark_home: Path, tmp_path: Path) -> None:
    # stderr is a pipe too here; what counts is stdout, where the driver's output lands.
    assert submit(stub_spark_home, tmp_path, subprocess.PIPE) == "0 unset"


def test_the_users_choice_stands(stub_spark_home: Path, tmp_path: Path) -> None:
    seen = submit(stub_spark_home, tmp_path, subprocess.PIPE, **{TERMINAL_ENV: "1"})
    assert seen == "1 unset"
