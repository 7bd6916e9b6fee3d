"""Commands that need no Spark run from the installed wheel alone (no pyspark); the
ones that do need it say which extra to install, and move nothing.

`report` and the ledger notebook from the same venv: tests/integration/test_run_report.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.support.brokers import (
    PASSWORD_ENV,
    Brokers,
    declare,
    depth,
    fresh_vhost,
    seed,
    write_config,
)
from tests.support.wheel_env import WheelEnv


def test_the_wheel_env_has_no_spark_and_no_dev_harness(wheel_env: WheelEnv, tmp_path: Path) -> None:
    for module in ("pyspark", "rmq_spark.devtools"):
        probe = subprocess.run(
            [str(wheel_env.python), "-c", f"import {module}"],
            cwd=tmp_path,
            env=wheel_env.environment(),
            capture_output=True,
            text=True,
            check=False,
        )
        assert probe.returncode == 1, module
        assert f"No module named '{module}'" in probe.stderr


def test_plan_runs_from_the_wheel_without_spark(
    brokers: Brokers, wheel_env: WheelEnv, tmp_path: Path
) -> None:
    vhost = fresh_vhost(brokers, "wheel-plan")
    seed(brokers.dr, vhost, "orders", 40)
    declare(brokers.main, vhost, "orders")
    config = write_config(
        tmp_path / "job.yaml", brokers, vhosts=[vhost], ledger=tmp_path / "ledger"
    )

    plan = subprocess.run(
        [str(wheel_env.rmq_spark), "plan", "--config", str(config), "--json"],
        cwd=tmp_path,
        env=wheel_env.environment({PASSWORD_ENV: brokers.dr.password}),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert plan.returncode == 0, plan.stderr
    document = json.loads(plan.stdout)
    assert [(q["source"], q["messages"]) for q in document["queues"]] == [
        (f"dr/{vhost}/orders", 40)
    ]
    assert depth(brokers.dr, vhost, "orders") == 40
    assert not (tmp_path / "ledger").exists()


def test_transfer_from_the_wheel_without_spark_names_the_extra_and_moves_nothing(
    brokers: Brokers, wheel_env: WheelEnv, tmp_path: Path
) -> None:
    vhost = fresh_vhost(brokers, "wheel-transfer")
    seed(brokers.dr, vhost, "orders", 5)
    config = write_config(
        tmp_path / "job.yaml", brokers, vhosts=[vhost], ledger=tmp_path / "ledger"
    )

    transfer = subprocess.run(
        [str(wheel_env.rmq_spark), "transfer", "--config", str(config)],
        cwd=tmp_path,
        env=wheel_env.environment({PASSWORD_ENV: brokers.dr.password}),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert transfer.returncode == 2
    (line,) = transfer.stderr.strip().splitlines()
    assert line.startswith("rmq-spark: error: rmq-spark transfer runs on Spark")
    assert "pip install 'rmq-spark[spark]'" in line
    assert depth(brokers.dr, vhost, "orders") == 5
    assert not (tmp_path / "ledger").exists()
