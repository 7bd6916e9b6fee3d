"""Whose master `rmq-spark transfer` runs on without spark-submit: the user's, found
where spark-submit finds it, before the local default (no Spark)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rmq_spark import cli
from rmq_spark.spark_session import configured_master


@pytest.fixture
def conf_dir(tmp_path: Path) -> Path:
    path = tmp_path / "conf"
    path.mkdir()
    (path / "spark-defaults.conf").write_text("# an edge node\nspark.master   yarn\n")
    return path


def test_spark_defaults_name_the_master(conf_dir: Path) -> None:
    assert configured_master({"SPARK_CONF_DIR": str(conf_dir)}) == "yarn"


def test_spark_home_conf_is_read_without_spark_conf_dir(conf_dir: Path) -> None:
    assert configured_master({"SPARK_HOME": str(conf_dir.parent)}) == "yarn"


@pytest.mark.parametrize(
    ("submit_args", "expected"),
    [
        ("--master local[2] --conf spark.master=k8s://x pyspark-shell", "local[2]"),
        ("--conf spark.master=k8s://x pyspark-shell", "k8s://x"),
        ("--conf=spark.master=k8s://x pyspark-shell", "k8s://x"),
        ("--driver-memory 2g pyspark-shell", "yarn"),
    ],
    ids=["--master first", "--conf next", "--conf=", "spark-defaults last"],
)
def test_submit_args_come_before_spark_defaults(
    conf_dir: Path, submit_args: str, expected: str
) -> None:
    environ = {"SPARK_CONF_DIR": str(conf_dir), "PYSPARK_SUBMIT_ARGS": submit_args}
    assert configured_master(environ) == expected


def test_a_properties_file_replaces_spark_defaults(conf_dir: Path, tmp_path: Path) -> None:
    properties = tmp_path / "job.properties"
    properties.write_text("spark.executor.cores=2\n")
    environ = {"SPARK_CONF_DIR": str(conf_dir), "MASTER": "spark://m:7077"}

    args = f"--properties-file {properties} pyspark-shell"
    assert configured_master({**environ, "PYSPARK_SUBMIT_ARGS": args}) == "spark://m:7077"
    args = f"--properties-file {properties} --load-spark-defaults pyspark-shell"
    assert configured_master({**environ, "PYSPARK_SUBMIT_ARGS": args}) == "yarn"
    properties.write_text("spark.master=local[3]\n")
    args = f"--properties-file={properties} pyspark-shell"
    assert configured_master({**environ, "PYSPARK_SUBMIT_ARGS": args}) == "local[3]"


def test_nothing_set_means_none(tmp_path: Path) -> None:
    (tmp_path / "spark-defaults.conf").write_text("spark.executor.memory 2g\n#spark.master yarn\n")
    assert configured_master({"SPARK_CONF_DIR": str(tmp_path)}) is None


def test_the_cli_defaults_to_local_only_when_no_master_is_set(
    conf_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("PYSPARK_GATEWAY_PORT", "DATABRICKS_RUNTIME_VERSION", "PYSPARK_SUBMIT_ARGS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("MASTER", raising=False)
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf_dir))
    assert cli.default_master() == "yarn"

    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "empty"))
    assert cli.default_master() == cli.LOCAL_MASTER
