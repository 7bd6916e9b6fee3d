"""spark-submit.sh for a cluster that runs the rmq-spark image (--in-image, and Kubernetes
cluster mode, which implies it): the command line a stub spark-submit is given."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.spark_submit import REPO, SCRIPT, args_spark_home, confs, submitted

__all__ = ["args_spark_home"]  # the stub spark-submit fixture, shared

IMAGE_PYTHON = "/opt/rmq-spark/venv/bin/python"
IMAGE_LOG4J = "-Dlog4j2.configurationFile=file:/opt/rmq-spark/conf/log4j2.properties"
K8S = "k8s://https://api.example:6443"


def test_kubernetes_cluster_mode_ships_nothing_and_runs_the_images_job(
    args_spark_home: Path, tmp_path: Path
) -> None:
    args, env = submitted(args_spark_home, tmp_path, "--master", K8S, "--deploy-mode", "cluster")

    assert "--py-files" not in args
    assert "--archives" not in args
    settings = confs(args)
    # Paths of the image, never of this machine.
    assert settings["spark.driver.extraJavaOptions"] == IMAGE_LOG4J
    assert settings["spark.pyspark.python"] == IMAGE_PYTHON
    assert settings["spark.pyspark.driver.python"] == IMAGE_PYTHON
    assert env == {"PYSPARK_PYTHON": "unset", "PYSPARK_DRIVER_PYTHON": "unset"}
    assert args[-5:] == ["local:///opt/rmq-spark/jobs/transfer.py", "--config", "conf/prod.yaml",
                         "--run-id", "r1"]  # fmt: skip
    assert not any(str(REPO) in arg for arg in args)


def test_another_job_is_the_images_copy_of_it(args_spark_home: Path, tmp_path: Path) -> None:
    out = tmp_path / "stub"
    subprocess.run(
        [str(SCRIPT), "--master", K8S, "--deploy-mode=cluster", "--config", "c.yaml"],
        env={
            **os.environ,
            "SPARK_HOME": str(args_spark_home),
            "STUB_OUT": str(out),
            "RMQ_SPARK_JOB": "jobs/migrate.py",
        },
        capture_output=True,
        check=True,
        timeout=60,
    )
    args = Path(f"{out}.args").read_text().splitlines()
    assert args[-3] == "local:///opt/rmq-spark/jobs/migrate.py"


def test_in_image_client_mode_runs_the_driver_here_and_the_executors_in_the_image(
    args_spark_home: Path, tmp_path: Path
) -> None:
    args, env = submitted(
        args_spark_home, tmp_path, "--master", "spark://127.0.0.1:7077", "--in-image"
    )

    assert "--py-files" not in args
    assert "--in-image" not in args
    settings = confs(args)
    assert settings["spark.pyspark.python"] == IMAGE_PYTHON
    # The driver is here: this checkout's Python, job and log4j config.
    assert settings["spark.pyspark.driver.python"] == env["PYSPARK_DRIVER_PYTHON"]
    assert not env["PYSPARK_DRIVER_PYTHON"].startswith("/opt/rmq-spark")
    assert settings["spark.driver.extraJavaOptions"] == (
        f"-Dlog4j2.configurationFile=file:{REPO}/conf/log4j2.properties"
    )
    assert args[-5] == str(REPO / "jobs" / "transfer.py")


def test_kubernetes_client_mode_still_ships_the_package(
    args_spark_home: Path, tmp_path: Path
) -> None:
    args, _ = submitted(args_spark_home, tmp_path, "--master", K8S)

    assert "--py-files" in args
    assert args[-5] == str(REPO / "jobs" / "transfer.py")


def test_cluster_mode_without_the_image_sends_no_log4j_path_of_this_machine(
    args_spark_home: Path, tmp_path: Path
) -> None:
    args, _ = submitted(args_spark_home, tmp_path, "--master", "yarn", "--deploy-mode", "cluster")

    assert "spark.driver.extraJavaOptions" not in confs(args)
    assert "--py-files" in args


@pytest.mark.parametrize(
    ("spark_args", "message"),
    [
        (("--master", "yarn", "--in-image", "--env-archive", "{archive}"), "choose one"),
        (("--in-image",), "for cluster masters"),
    ],
    ids=["with an archive", "local master"],
)
def test_a_wrong_in_image_stops_before_spark_submit(
    args_spark_home: Path, tmp_path: Path, spark_args: tuple[str, ...], message: str
) -> None:
    archive = tmp_path / "env.tar.gz"
    archive.write_bytes(b"x")
    out = tmp_path / "stub"
    completed = subprocess.run(
        [str(SCRIPT), *(a.format(archive=archive) for a in spark_args), "--config", "c.yaml"],
        env={**os.environ, "SPARK_HOME": str(args_spark_home), "STUB_OUT": str(out)},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert completed.returncode == 2
    assert message in completed.stderr
    assert not Path(f"{out}.args").exists()
