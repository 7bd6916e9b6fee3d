"""databricks.yml asks for what the job needs, with the versions the wheel pins.

It cannot be deployed from here (no workspace); these checks keep it consistent
with the package. Also: a Databricks-managed session is never stopped.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement

from rmq_spark import cli

REPO = Path(__file__).resolve().parents[2]


def bundle() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((REPO / "databricks.yml").read_text())
    return loaded


def job() -> dict[str, Any]:
    jobs: dict[str, Any] = bundle()["resources"]["jobs"]
    return jobs["rmq_spark_transfer"]


def test_the_task_runs_the_wheels_exiting_entry_point() -> None:
    (task,) = job()["tasks"]
    wheel_task = task["python_wheel_task"]
    with (REPO / "pyproject.toml").open("rb") as text:
        scripts = tomllib.load(text)["project"]["scripts"]
    assert wheel_task["package_name"] == "rmq_spark"
    assert scripts[wheel_task["entry_point"]] == "rmq_spark.cli:script_main"
    assert wheel_task["parameters"][0] == "transfer"
    assert {"whl": "./dist/rmq_spark-*.whl"} in task["libraries"]
    assert bundle()["artifacts"]["rmq_spark_wheel"]["build"] == "make package"


def test_libraries_are_exactly_the_wheels_pins_without_spark() -> None:
    (task,) = job()["tasks"]
    listed = {
        str(Requirement(library["pypi"]["package"]))
        for library in task["libraries"]
        if "pypi" in library
    }
    with (REPO / "pyproject.toml").open("rb") as text:
        pinned = {str(Requirement(r)) for r in tomllib.load(text)["project"]["dependencies"]}
    assert listed == pinned
    assert all("==" in requirement for requirement in listed)


def test_dedicated_access_mode_one_run_at_a_time_and_secrets_from_a_scope() -> None:
    (cluster,) = job()["job_clusters"]
    new_cluster = cluster["new_cluster"]
    assert new_cluster["data_security_mode"] == "SINGLE_USER"
    assert job()["max_concurrent_runs"] == 1
    assert new_cluster["spark_conf"]["spark.speculation"] == "false"
    for value in new_cluster["spark_env_vars"].values():
        assert value.startswith("{{secrets/${var.secret_scope}/")


class FakeSession:
    stopped = False

    def stop(self) -> None:
        self.stopped = True


@pytest.mark.parametrize(
    ("environ", "stopped"), [({}, True), ({"DATABRICKS_RUNTIME_VERSION": "17.3"}, False)]
)
def test_a_databricks_session_is_not_stopped(
    monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], stopped: bool
) -> None:
    session = FakeSession()
    monkeypatch.delenv("DATABRICKS_RUNTIME_VERSION", raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr("pyspark.sql.SparkSession.getActiveSession", lambda: None)
    monkeypatch.setattr("rmq_spark.spark_session.build_session", lambda *_a, **_k: session)

    with cli.command_session("test", "local[1]") as spark:
        assert spark is session
    assert session.stopped is stopped
