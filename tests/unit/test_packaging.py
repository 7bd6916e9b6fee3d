"""The wheel's pins are the tested versions, and the runtime lock is their closure."""

from __future__ import annotations

import importlib.metadata as md
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import rmq_spark

REPO = Path(__file__).resolve().parents[2]


def lock(path: Path) -> dict[str, str]:
    """{canonical name: version} of a `name==version` lock file."""
    pins: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        pin = line.split("#", 1)[0].strip()
        if pin:
            name, version = pin.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def project() -> dict[str, object]:
    with (REPO / "pyproject.toml").open("rb") as text:
        table: dict[str, object] = tomllib.load(text)["project"]
    return table


def exact_pins(requirements: list[str]) -> dict[str, str]:
    pins: dict[str, str] = {}
    for text in requirements:
        requirement = Requirement(text)
        (spec,) = requirement.specifier
        assert spec.operator == "==", f"{text!r} is not pinned to one version"
        pins[canonicalize_name(requirement.name)] = spec.version
    return pins


# Ranges, not pins: a Spark runtime brings its own (see pyproject.toml).
RANGED = {"pyarrow", "pandas"}


def pinned(requirements: list[str]) -> list[str]:
    return [r for r in requirements if canonicalize_name(Requirement(r).name) not in RANGED]


def test_the_ranged_dependencies_are_tested_at_both_ends() -> None:
    tested = lock(REPO / "requirements.lock")
    runtime = lock(REPO / "requirements-dbr.lock")
    requirements = [Requirement(r) for r in project()["dependencies"]]  # type: ignore[attr-defined]
    ranges = {
        canonicalize_name(r.name): {(s.operator, s.version) for s in r.specifier}
        for r in requirements
        if canonicalize_name(r.name) in RANGED
    }
    assert set(ranges) == RANGED
    for name, specifiers in ranges.items():
        assert specifiers == {(">=", runtime[name]), ("<=", tested[name])}, name


def test_the_wheels_dependencies_are_the_tested_versions() -> None:
    tested = lock(REPO / "requirements.lock")
    table = project()
    runtime = exact_pins(pinned(table["dependencies"]))  # type: ignore[arg-type]
    spark = exact_pins(table["optional-dependencies"]["spark"])  # type: ignore[index]
    assert {name: tested[name] for name in runtime} == runtime
    assert {name: tested[name] for name in spark} == spark
    # Spark is an extra only: a Spark runtime must not get a second pyspark from us.
    assert not {"pyspark", "delta-spark"} & set(runtime)
    assert set(spark) == {"pyspark", "delta-spark"}


def test_the_runtime_lock_is_the_tested_closure_without_spark_or_dev_tools() -> None:
    tested = lock(REPO / "requirements.lock")
    runtime = lock(REPO / "requirements-runtime.lock")
    assert {name: tested.get(name) for name in runtime} == runtime
    direct = exact_pins(pinned(project()["dependencies"]))  # type: ignore[arg-type]
    assert {name: runtime.get(name) for name in direct} == direct
    for name in RANGED:  # the archive and the image get the upper end
        assert runtime[name] == tested[name]
    for absent in ("pyspark", "py4j", "delta-spark", "pytest", "mypy", "ruff", "venv-pack"):
        assert absent not in runtime


def test_one_version_everywhere() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", rmq_spark.__version__)
    changelog = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"## {rmq_spark.__version__}" in changelog


def test_the_executor_lock_is_what_the_executor_side_imports() -> None:
    # Imported in a fresh interpreter: the modules a mover task and the probe load.
    code = (
        "import sys, json, importlib.metadata as md; before = set(sys.modules); "
        "import rmq_spark.transfer.executor, rmq_spark.ledger.writer, "
        "rmq_spark.planning.executor_preflight; "
        "tops = {m.split('.')[0] for m in set(sys.modules) - before}; "
        "tops -= set(sys.stdlib_module_names); "
        "dists = md.packages_distributions(); "
        "print(json.dumps(sorted({d for t in tops for d in dists.get(t, [])})))"
    )
    seen = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    imported = {canonicalize_name(name) for name in json.loads(seen.stdout)} - {"rmq-spark"}
    executor = lock(REPO / "requirements-executor.lock")
    runtime = lock(REPO / "requirements-runtime.lock")
    assert {name: runtime.get(name) for name in executor} == executor  # the tested pins
    # Everything imported is shipped; what pyarrow merely finds when present (numpy) is not.
    assert imported - {"numpy"} <= set(executor), imported - set(executor)
    for driver_only in (
        "deltalake",
        "great-expectations",
        "pandas",
        "numpy",
        "scipy",
        "matplotlib",
    ):
        assert driver_only not in executor
    # The pre-flight checks the executor lock's top-level imports, nothing it lacks.
    from rmq_spark.planning.executor_preflight import EXECUTOR_MODULES

    for module in EXECUTOR_MODULES:
        (dist,) = md.packages_distributions()[module]
        assert canonicalize_name(dist) in executor
