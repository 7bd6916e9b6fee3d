"""databricks.yml asks for what the job needs, with the versions the wheel pins, and
passes what `databricks bundle deploy -t prod` checks.

It cannot be deployed from here (no workspace): tests/support/bundle_rules.py stands in
for the CLI (the bundle models of the pinned databricks-bundles package, and the CLI's
production-mode rules). Also: a Databricks-managed session is never stopped.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement

from rmq_spark import cli
from tests.support.bundle_rules import model_problems, production_problems, target_view

REPO = Path(__file__).resolve().parents[2]


def bundle() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((REPO / "databricks.yml").read_text())
    return loaded


def job() -> dict[str, Any]:
    transfer: dict[str, Any] = bundle()["resources"]["jobs"]["rmq_spark_transfer"]
    return transfer


def test_the_task_runs_the_wheels_exiting_entry_point() -> None:
    (task,) = job()["tasks"]
    wheel_task = task["python_wheel_task"]
    with (REPO / "pyproject.toml").open("rb") as text:
        scripts = tomllib.load(text)["project"]["scripts"]
    assert wheel_task["package_name"] == "rmq_spark"
    assert scripts[wheel_task["entry_point"]] == "rmq_spark.cli:script_main"
    assert wheel_task["parameters"][0] == "transfer"
    assert {"whl": "./dist/rmq_spark-*.whl"} in task["libraries"]


def test_the_artifact_is_the_wheel_alone_built_without_apt_java_or_brokers() -> None:
    assert bundle()["artifacts"]["rmq_spark_wheel"]["build"] == "make wheel"
    recipe = make_recipe("wheel")
    assert "pip wheel" in recipe
    for absent in ("apt-get", "setup", "venv-pack", "rabbitmq", "java"):
        assert absent not in recipe


def make_recipe(target: str) -> str:
    """The Makefile rule of `target`: its prerequisites line and recipe lines."""
    lines = (REPO / "Makefile").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    rule = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        rule.append(line)
    return "\n".join(rule)


def test_a_repair_run_resumes_the_job_runs_run_id() -> None:
    (task,) = job()["tasks"]
    parameters = task["python_wheel_task"]["parameters"]
    assert parameters[parameters.index("--run-id") + 1] == "{{job.run_id}}"


def test_the_bundle_passes_the_bundle_models() -> None:
    assert model_problems(bundle()) == []


def test_the_prod_target_passes_the_production_rules() -> None:
    assert production_problems(bundle(), "prod") == []
    view = target_view(bundle(), "prod")
    (cluster,) = view["resources"]["jobs"]["rmq_spark_transfer"]["job_clusters"]
    assert cluster["new_cluster"]["single_user_name"] == "${var.service_principal}"
    assert cluster["new_cluster"]["spark_version"] == "17.3.x-scala2.13"  # merged, kept
    assert view["run_as"] == {"service_principal_name": "${var.service_principal}"}


def test_the_dev_target_runs_as_the_deploying_user_on_their_own_cluster() -> None:
    view = target_view(bundle(), "dev")
    assert "run_as" not in view
    (cluster,) = view["resources"]["jobs"]["rmq_spark_transfer"]["job_clusters"]
    assert cluster["new_cluster"]["single_user_name"] == "${workspace.current_user.userName}"


def without(section: str, key: str | None = None) -> dict[str, Any]:
    broken = bundle()
    prod = broken["targets"]["prod"]
    if key is None:
        del prod[section]
    else:
        del prod[section][key]
    return broken


@pytest.mark.parametrize(
    ("broken", "problem"),
    [
        (without("workspace"), "must set 'workspace.root_path'"),
        (without("run_as"), "without run_as"),
        (without("permissions"), "without permissions"),
        (without("resources"), "is not the run_as identity"),
    ],
)
def test_the_production_rules_refuse_a_prod_target_missing_a_part(
    broken: dict[str, Any], problem: str
) -> None:
    assert any(problem in found for found in production_problems(broken, "prod"))


def test_the_production_rules_refuse_shared_access_mode_and_two_identities() -> None:
    broken = bundle()
    job_clusters = broken["resources"]["jobs"]["rmq_spark_transfer"]["job_clusters"]
    job_clusters[0]["new_cluster"]["data_security_mode"] = "DATA_SECURITY_MODE_STANDARD"
    broken["targets"]["prod"]["run_as"]["user_name"] = "someone@example.com"
    problems = production_problems(broken, "prod")
    assert any("not dedicated access mode" in p for p in problems)
    assert any("exactly one identity" in p for p in problems)


def test_the_bundle_models_refuse_an_unknown_access_mode() -> None:
    broken = bundle()
    cluster = broken["resources"]["jobs"]["rmq_spark_transfer"]["job_clusters"][0]
    cluster["new_cluster"]["data_security_mode"] = "DEDICATED"
    assert any("'DEDICATED'" in problem for problem in model_problems(broken))


def test_the_bundle_models_refuse_unknown_fields() -> None:
    broken = bundle()
    broken["resources"]["jobs"]["rmq_spark_transfer"]["max_retry"] = 1
    broken["targets"]["prod"]["run_as_user"] = "x"
    problems = "\n".join(model_problems(broken))
    assert "Unexpected field 'max_retry' for class Job" in problems
    assert "target 'prod': unknown section 'run_as_user'" in problems


def test_libraries_are_exactly_the_wheels_pins_without_spark_or_the_runtimes_own() -> None:
    (task,) = job()["tasks"]
    listed = {
        str(Requirement(library["pypi"]["package"]))
        for library in task["libraries"]
        if "pypi" in library
    }
    with (REPO / "pyproject.toml").open("rb") as text:
        requirements = [Requirement(r) for r in tomllib.load(text)["project"]["dependencies"]]
    pinned = {str(r) for r in requirements if str(r.specifier).startswith("==")}
    assert listed == pinned
    # pyarrow and pandas: ranges the runtime's own versions satisfy, so they stay.
    assert {r.name for r in requirements if str(r) not in pinned} == {"pyarrow", "pandas"}


def test_dedicated_access_mode_one_run_at_a_time_and_secrets_from_a_scope() -> None:
    (cluster,) = job()["job_clusters"]
    new_cluster = cluster["new_cluster"]
    assert new_cluster["data_security_mode"] == "DATA_SECURITY_MODE_DEDICATED"
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
        handed: object = spark  # the fake stands in for a SparkSession
        assert handed is session
    assert session.stopped is stopped
