"""The job on a real Spark standalone cluster whose workers have a bare Python.

A module fixture starts a master and two workers from the pip pyspark's
`bin/spark-class` (pip ships no sbin start scripts) on free loopback ports. Each
worker runs in its own mount namespace with a private tmpfs at one directory, so a
ledger there is "local to each host", as a path on each node's own disk would be. The
workers' Python is a fresh `python -m venv` without any package (first on their PATH
and their PYSPARK_PYTHON), as on a YARN node or a Spark image: the job runs there only
with the environment archive `make package` builds, shipped by `spark-submit.sh
--env-archive`, and gives the same ledger as local[*]; without it, the executor
pre-flight refuses the run before anything moves.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest
import requests

from rmq_spark.ledger import tables
from rmq_spark.report.console import RESULT_PREFIX
from tests.support.brokers import (
    Brokers,
    declare,
    depth,
    fresh_vhost,
    job_environment,
    seed,
    write_config,
)

REPO = Path(__file__).resolve().parents[2]
SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
WORKERS = 2
QUEUES = ("q1", "q2", "q3", "q4")
MESSAGES = 2000
START_TIMEOUT_SECONDS = 120
NOT_SHARED = "not-shared"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def alive_workers(ui_port: int) -> int:
    try:
        state = requests.get(f"http://127.0.0.1:{ui_port}/json/", timeout=5).json()
    except (requests.RequestException, ValueError):
        return 0
    return sum(1 for worker in state.get("workers", []) if worker.get("state") == "ALIVE")


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python of the driver's version with no package at all (not even pip)."""
    venv = tmp_path_factory.mktemp("bare-python") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    for module in ("pika", "pyarrow", "deltalake", "pyspark"):
        found = subprocess.run(
            [str(python), "-c", f"import {module}"], capture_output=True, check=False
        )
        assert found.returncode != 0, f"the bare Python imports {module}"
    return python


@pytest.fixture(scope="module")
def env_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The environment archive, built by `make package` as a user would (~1 min)."""
    dist = tmp_path_factory.mktemp("dist")
    completed = subprocess.run(
        ["make", "-s", "-C", str(REPO), "package", f"DIST={dist}"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-4000:]
    (archive,) = dist.glob("rmq-spark-env-*.tar.gz")
    return archive


@pytest.fixture(scope="module")
def standalone_work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spark-standalone")


@pytest.fixture(scope="module")
def standalone_master(standalone_work: Path, bare_python: Path) -> Iterator[str]:
    work = standalone_work
    port, ui_port = free_port(), free_port()
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")},
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(work),
        # What the executors find: python3 on PATH is the bare one.
        "PATH": f"{bare_python.parent}{os.pathsep}{os.environ['PATH']}",
        "PYSPARK_PYTHON": str(bare_python),
    }
    logs = [open(work / f"{name}.log", "w") for name in ("master", *map(str, range(WORKERS)))]  # noqa: SIM115
    processes = [
        subprocess.Popen(
            [
                str(SPARK_CLASS),
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(ui_port),
            ],
            env=env,
            stdout=logs[0],
            stderr=subprocess.STDOUT,
        )
    ]
    url = f"spark://127.0.0.1:{port}"
    private = work / NOT_SHARED
    private.mkdir()
    for index in range(WORKERS):
        processes.append(
            subprocess.Popen(
                [
                    # Each worker (and so its executors) gets its own mount namespace
                    # with an empty tmpfs at <work>/not-shared: a path that exists on
                    # every "host" but is not shared with the driver.
                    "unshare",
                    "--mount",
                    "--propagation",
                    "private",
                    "--",
                    "sh",
                    "-c",
                    'mount -t tmpfs rmq-spark-not-shared "$0" && exec "$@"',
                    str(private),
                    str(SPARK_CLASS),
                    "org.apache.spark.deploy.worker.Worker",
                    url,
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    "1",
                    "--memory",
                    "1g",
                    "--webui-port",
                    str(free_port()),
                    "--work-dir",
                    str(work / f"worker-{index}"),
                ],
                env=env,
                stdout=logs[index + 1],
                stderr=subprocess.STDOUT,
            )
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while alive_workers(ui_port) < WORKERS:
            assert time.monotonic() < deadline, f"standalone cluster not up; logs in {work}"
            assert all(p.poll() is None for p in processes), f"a Spark daemon died; logs in {work}"
            time.sleep(0.5)
        yield url
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(30)
        for log in logs:
            log.close()


def submit(config: Path, run_id: str, *spark_args: str) -> subprocess.CompletedProcess[str]:
    # Nothing of this machine's Python is exported: spark-submit.sh decides.
    environ = {
        key: value
        for key, value in job_environment().items()
        if key not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
    }
    return subprocess.run(
        [str(REPO / "spark-submit.sh"), *spark_args, "--config", str(config), "--run-id", run_id],
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def run_job(config: Path, run_id: str, *spark_args: str) -> dict[str, object]:
    completed = submit(config, run_id, *spark_args)
    assert completed.returncode == 0, completed.stderr[-4000:]
    (line,) = [x for x in completed.stdout.splitlines() if x.startswith(RESULT_PREFIX)]
    result: dict[str, object] = json.loads(line[len(RESULT_PREFIX) :])
    return result


def ledger_content(ledger: Path, run_id: str) -> dict[str, Counter[tuple[str, str]]]:
    rows = tables.read_arrow(str(ledger), "messages", run_id=run_id)
    content: dict[str, Counter[tuple[str, str]]] = {}
    for row in rows.to_pylist():
        content.setdefault(row["source_queue"], Counter())[
            (row["body_sha256"], row["properties_sha256"])
        ] += 1
    return content


@pytest.mark.usefixtures("password_env")
def test_with_the_archive_bare_workers_give_the_same_ledger_as_local(
    brokers: Brokers,
    tmp_path: Path,
    standalone_master: str,
    standalone_work: Path,
    env_archive: Path,
) -> None:
    vhost = fresh_vhost(brokers, "standalone")
    # max_active 4 with two queues per task: two tasks, one per worker.
    config = write_config(
        tmp_path / "job.yaml", brokers, vhosts=[vhost], ledger=tmp_path / "ledger", max_active=4
    )
    results, contents = {}, {}
    on_cluster = ("--master", standalone_master, "--env-archive", str(env_archive))
    for run_id, master in (("on-local", ()), ("on-standalone", on_cluster)):
        for queue in QUEUES:  # the same deterministic messages for both runs
            seed(brokers.dr, vhost, queue, MESSAGES)
            declare(brokers.main, vhost, queue)
        results[run_id] = run_job(config, run_id, *master)
        contents[run_id] = ledger_content(tmp_path / "ledger", run_id)

    for result in results.values():
        assert result["verified"] is True
        assert result["messages"] == len(QUEUES) * MESSAGES
        assert (result["lost"], result["duplicates"]) == (0, 0)
    assert contents["on-standalone"] == contents["on-local"]
    assert set(contents["on-local"]) == set(QUEUES)
    # The second run really ran on the cluster: standalone application ids start "app-".
    runs = tables.read_arrow(str(tmp_path / "ledger"), "runs").to_pylist()
    app_ids = {run["run_id"]: run["spark_app_id"] for run in runs}
    assert app_ids["on-local"].startswith("local-")
    assert app_ids["on-standalone"].startswith("app-")
    # Each executor ran from the archive Spark unpacked into its working directory.
    unpacked = list(standalone_work.glob("worker-*/app-*/*/environment/bin/python"))
    assert len({path.parents[4] for path in unpacked}) == WORKERS, unpacked


def test_without_the_archive_bare_workers_are_refused_before_anything_moves(
    brokers: Brokers, password_env: str, tmp_path: Path, standalone_master: str, bare_python: Path
) -> None:
    vhost = fresh_vhost(brokers, "standalone-bare")
    config = write_config(
        tmp_path / "job.yaml", brokers, vhosts=[vhost], ledger=tmp_path / "ledger", max_active=4
    )
    seed(brokers.dr, vhost, "q1", 100)
    declare(brokers.main, vhost, "q1")

    completed = submit(config, "bare", "--master", standalone_master)

    # spark-submit's PythonRunner merges the driver's stderr into its stdout.
    output = completed.stdout + completed.stderr
    assert completed.returncode == 2, output[-4000:]
    errors = [line for line in output.splitlines() if "rmq-spark: error:" in line]
    assert errors == [
        "rmq-spark: error: executor pre-flight refused the run; nothing was moved:"
    ], output[-4000:]
    assert f"Python {bare_python.parent}/" in output  # the executors' python3
    assert "lacks the Python module(s) pika, pyarrow, deltalake" in output
    assert "--env-archive" in output
    assert (depth(brokers.dr, vhost, "q1"), depth(brokers.main, vhost, "q1")) == (100, 0)


@pytest.mark.usefixtures("password_env")
def test_a_ledger_path_the_executors_do_not_share_is_refused_before_anything_moves(
    brokers: Brokers,
    tmp_path: Path,
    standalone_master: str,
    standalone_work: Path,
    env_archive: Path,
) -> None:
    vhost = fresh_vhost(brokers, "standalone-unshared")
    ledger = standalone_work / NOT_SHARED / "ledger"  # each worker sees its own tmpfs here
    config = write_config(tmp_path / "job.yaml", brokers, vhosts=[vhost], ledger=ledger)
    seed(brokers.dr, vhost, "q1", 100)
    declare(brokers.main, vhost, "q1")

    completed = submit(
        config, "unshared", "--master", standalone_master, "--env-archive", str(env_archive)
    )

    output = completed.stdout + completed.stderr
    assert completed.returncode == 2, output[-4000:]
    errors = [line for line in output.splitlines() if "rmq-spark: error:" in line]
    assert errors == [
        "rmq-spark: error: executor pre-flight refused the run; nothing was moved:"
    ], output[-4000:]
    assert f"ledger.path {ledger} is not shared: the executor on host" in output
    assert "lacks the Python module" not in output  # the archive was shipped
    assert (depth(brokers.dr, vhost, "q1"), depth(brokers.main, vhost, "q1")) == (100, 0)
    assert not (ledger / "_preflight").exists() or not any((ledger / "_preflight").iterdir())


def test_standalone_refuses_cluster_deploy_mode_for_python(
    tmp_path: Path, standalone_master: str, env_archive: Path
) -> None:
    # Spark 4's standalone master runs no Python driver in the cluster: SparkSubmit
    # says so before contacting it. (YARN and Kubernetes do; see the README.)
    config = tmp_path / "job.yaml"
    config.write_text("{}\n")
    completed = submit(
        config,
        "cluster-mode",
        "--master",
        standalone_master,
        "--deploy-mode",
        "cluster",
        "--env-archive",
        str(env_archive),
    )

    assert completed.returncode != 0
    assert (
        "Cluster deploy mode is currently not supported for python applications on "
        "standalone clusters" in completed.stderr
    ), completed.stderr[-4000:]
