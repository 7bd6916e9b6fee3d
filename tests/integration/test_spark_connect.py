"""The job over Spark Connect (Databricks Standard access mode, serverless, Databricks
Connect have no RDDs, SparkContext or broadcast): the demo-sized run through pip
pyspark's own Spark Connect server, in a process of its own, ends verified.

The client (`rmq-spark transfer --remote sc://...`) talks to the server over gRPC
only. The server's Python workers cannot import the checkout (its editable install is
hidden from them and they run elsewhere than the checkout): they run the package the
client ships as an artifact, as a remote server's would.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmq_spark.devtools.demo import QUEUES_PER_VHOST, seed_demo
from rmq_spark.report.console import RESULT_PREFIX
from tests.support.brokers import Brokers, fresh_vhost, write_config
from tests.support.faults import wait_until

REPO = Path(__file__).resolve().parents[2]
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
MESSAGES_PER_QUEUE = 50

# Hides the editable install's import hook (rmq_spark from the checkout) from the
# server's workers; runs after site-packages' .pth files.
HIDE_CHECKOUT = """import sys
sys.meta_path[:] = [
    f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")
]
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """pip pyspark's Spark Connect server on local[2,4], its workers without the checkout."""
    base = tmp_path_factory.mktemp("connect-server")
    hide = base / "hide-checkout"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE_CHECKOUT)
    worker_python = base / "python"
    path = f"{hide}${{PYTHONPATH:+:$PYTHONPATH}}"
    worker_python.write_text(f'#!/bin/sh\nPYTHONPATH="{path}" exec "{sys.executable}" "$@"\n')
    worker_python.chmod(0o755)
    cannot = subprocess.run(
        [str(worker_python), "-c", "import rmq_spark"], cwd=base, capture_output=True, check=False
    )
    assert cannot.returncode != 0, "the server's workers must not import the checkout"

    port = _free_port()
    log = (base / "server.log").open("wb")
    server = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "spark-submit"),
            "--master",
            "local[2,4]",
            "--class",
            SERVER_CLASS,
            "--conf",
            f"spark.connect.grpc.binding.port={port}",
            "--conf",
            "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf",
            "spark.speculation=false",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            f"spark.driver.extraJavaOptions=-Dlog4j2.configurationFile=file:{REPO}/conf/log4j2.properties",
        ],
        cwd=base,
        env={**os.environ, "PYSPARK_PYTHON": str(worker_python)},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(
            lambda: server.poll() is not None or _listening(port),
            "the Spark Connect server to listen",
            timeout=180,
        )
        assert server.poll() is None, (base / "server.log").read_text()[-3000:]
        yield f"sc://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()


def test_the_demo_job_over_spark_connect_ends_verified(
    connect_server: str, brokers: Brokers, password_env: str, tmp_path: Path
) -> None:
    vhosts = [fresh_vhost(brokers, "connect-orders"), fresh_vhost(brokers, "connect-billing")]
    seeded = seed_demo(
        brokers.dr.connect,
        vhosts=vhosts,
        messages_per_queue=MESSAGES_PER_QUEUE,
    )
    config = write_config(
        tmp_path / "connect.yaml",
        brokers,
        vhosts=vhosts,
        ledger=tmp_path / "ledger",
        destination={"vhost": "{vhost}", "queue": "{queue}"},
        max_active=4,
    )

    completed = subprocess.run(
        [sys.executable, "-m", "rmq_spark.cli", "transfer", "--config", str(config)],
        cwd=tmp_path,
        env={**os.environ, "SPARK_REMOTE": connect_server, "RMQ_SPARK_TERMINAL": "0"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )

    assert completed.returncode == 0, completed.stderr[-4000:]
    last_line = completed.stdout.rstrip("\n").splitlines()[-1]
    assert last_line.startswith(RESULT_PREFIX), completed.stdout[-2000:]
    result = json.loads(last_line[len(RESULT_PREFIX) :])
    assert result["queues"] == len(vhosts) * QUEUES_PER_VHOST
    assert result["messages"] == seeded == len(vhosts) * QUEUES_PER_VHOST * MESSAGES_PER_QUEUE
    assert (result["lost"], result["duplicates"], result["verified"]) == (0, 0, True)


# Run in a process of its own, as the CLI runs: a Spark Connect session beside the tests'
# classic one would share pyspark's default-session state. The stuck task is a nested
# function, so it is pickled by value (the server's workers cannot import the tests).
CANCEL_SCRIPT = """
import sys, time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import pyarrow as pa

from rmq_spark.errors import ConfigError
from rmq_spark.partition_tasks import run_tasks
from rmq_spark.pipeline import probe_beside
from rmq_spark.spark_session import connect_session

remote, started, stuck_seconds = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])


def stuck_probe(session, ledger_path):
    def stuck_task(indices):
        started.touch()
        time.sleep(stuck_seconds)
        return [{"i": 0}]

    run_tasks(session, 1, stuck_task, pa.schema([("i", pa.int64())]))


def refused_pre_flight():
    deadline = time.monotonic() + 120
    while not started.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the probe's task did not start")
        time.sleep(0.02)
    raise ConfigError("cluster dr: the username or password was refused")


spark = connect_session("cancel-probe", remote)
began = time.monotonic()
try:
    with ThreadPoolExecutor(max_workers=1) as pool:
        probe_beside(spark, str(started.parent), pool.submit(refused_pre_flight), stuck_probe)
except ConfigError as exc:
    print(f"raised {type(exc).__name__} after {time.monotonic() - began:.1f}s")
spark.stop()
"""


def test_a_failed_pre_flight_interrupts_the_probe_over_spark_connect(
    connect_server: str, tmp_path: Path
) -> None:
    """The probe's job is tagged and interrupted through the Connect session's tag."""
    stuck_seconds = 120
    completed = subprocess.run(
        [
            sys.executable,
            "-c",
            CANCEL_SCRIPT,
            connect_server,
            str(tmp_path / "started"),
            str(stuck_seconds),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )

    assert completed.returncode == 0, completed.stderr[-4000:]
    said = completed.stdout.strip().splitlines()[-1]
    assert said.startswith("raised ConfigError after "), completed.stdout
    assert float(said.removeprefix("raised ConfigError after ").rstrip("s")) < stuck_seconds / 3
