"""The same job on a real Spark standalone cluster gives the same ledger as local[*].

A module fixture starts a master and two workers from the pip pyspark's
`bin/spark-class` (pip ships no sbin start scripts) on free loopback ports.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest
import requests

from rmq_spark.ledger import tables
from rmq_spark.report import RESULT_PREFIX
from tests.integration.support import (
    Brokers,
    declare,
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
def standalone_master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work = tmp_path_factory.mktemp("spark-standalone")
    port, ui_port = free_port(), free_port()
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(work)}
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
    for index in range(WORKERS):
        processes.append(
            subprocess.Popen(
                [
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


def run_job(config: Path, run_id: str, *master: str) -> dict[str, object]:
    completed = subprocess.run(
        [str(REPO / "spark-submit.sh"), *master, "--config", str(config), "--run-id", run_id],
        env=job_environment(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
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


def test_standalone_cluster_gives_the_same_ledger_as_local(
    brokers: Brokers, password_env: str, tmp_path: Path, standalone_master: str
) -> None:
    vhost = fresh_vhost(brokers, "standalone")
    # max_active 4 with two queues per task: two tasks, one per worker.
    config = write_config(
        tmp_path / "job.yaml", brokers, vhosts=[vhost], ledger=tmp_path / "ledger", max_active=4
    )
    results, contents = {}, {}
    for run_id, master in (("on-local", ()), ("on-standalone", ("--master", standalone_master))):
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
