"""A Hadoop edge node names its master in spark-defaults.conf: spark-submit.sh runs the
job there, not on its local[*,4] default (real spark-submit, real Spark)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "spark-submit.sh"

JOB = """
import sys
from pyspark.sql import SparkSession

spark = SparkSession.builder.getOrCreate()
print("MASTER=" + spark.sparkContext.master)
spark.stop()
"""


def test_spark_defaults_master_is_the_one_the_job_runs_on(tmp_path: Path) -> None:
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    # A local master (this box has no YARN), distinct from the script's local[*,4].
    (conf_dir / "spark-defaults.conf").write_text("spark.master local[2,3]\n")
    job = tmp_path / "job.py"
    job.write_text(JOB)

    completed = subprocess.run(
        [str(SCRIPT), "--config", "unused.yaml"],
        env={
            **{k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "MASTER")},
            "SPARK_CONF_DIR": str(conf_dir),
            "RMQ_SPARK_JOB": str(job),
        },
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "MASTER=local[2,3]" in completed.stdout.splitlines()
