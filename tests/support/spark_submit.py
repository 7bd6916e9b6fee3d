"""spark-submit.sh run against a stub spark-submit that records what it was given."""

from __future__ import annotations

import itertools
import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "spark-submit.sh"
# Records every argument (one a line) and the Python variables spark-submit was given.
ARGS_STUB = r"""#!/bin/sh
printf '%s\n' "$@" > "$STUB_OUT.args"
printf 'PYSPARK_PYTHON=%s\nPYSPARK_DRIVER_PYTHON=%s\n' \
  "${PYSPARK_PYTHON-unset}" "${PYSPARK_DRIVER_PYTHON-unset}" > "$STUB_OUT.env"
"""
ENVIRONMENT_PYTHON = "./environment/bin/python"
REPO = SCRIPT.parent


@pytest.fixture
def args_spark_home(tmp_path: Path) -> Path:
    home = tmp_path / "spark"
    (home / "bin").mkdir(parents=True)
    stub = home / "bin" / "spark-submit"
    stub.write_text(ARGS_STUB)
    stub.chmod(0o755)
    return home


def submitted(
    spark_home: Path, tmp_path: Path, *spark_args: str
) -> tuple[list[str], dict[str, str]]:
    """Run spark-submit.sh with a clean Python environment; the stub's (args, env)."""
    out = tmp_path / "stub"
    environ = {
        key: value
        for key, value in os.environ.items()
        if key not in ("SPARK_HOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
    }
    subprocess.run(
        [str(SCRIPT), *spark_args, "--config", "conf/prod.yaml", "--run-id", "r1"],
        env={**environ, "SPARK_HOME": str(spark_home), "STUB_OUT": str(out)},
        capture_output=True,
        check=True,
        timeout=60,
    )
    args = Path(f"{out}.args").read_text().splitlines()
    env = dict(line.split("=", 1) for line in Path(f"{out}.env").read_text().splitlines())
    return args, env


def confs(args: list[str]) -> dict[str, str]:
    return dict(
        value.split("=", 1) for option, value in itertools.pairwise(args) if option == "--conf"
    )
