"""A driver killed mid-run is resumed by re-running the same run id."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from rmq_spark.ledger import tables
from rmq_spark.report.console import RESULT_PREFIX
from tests.support.brokers import (
    Brokers,
    declare,
    depth,
    drain_fingerprints,
    fresh_vhost,
    job_environment,
    seed,
    write_config,
)
from tests.support.faults import expected_fingerprints, wait_until

REPO = Path(__file__).resolve().parents[2]
QUEUES = ("a", "b")
MESSAGES = 20_000
WINDOW = 1000


def submit(config: Path, run_id: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(REPO / "spark-submit.sh"), "--config", str(config), "--run-id", run_id],
        env=job_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the driver, JVM and workers
    )


def test_rerun_with_the_same_run_id_finishes_a_killed_run(
    brokers: Brokers, password_env: str, tmp_path: Path
) -> None:
    vhost = fresh_vhost(brokers, "resume")
    for queue in QUEUES:
        seed(brokers.dr, vhost, queue, MESSAGES)
        declare(brokers.main, vhost, queue)
    config = write_config(
        tmp_path / "job.yaml",
        brokers,
        vhosts=[vhost],
        ledger=tmp_path / "ledger",
        max_active=2,
        window={"messages": WINDOW},
    )

    first = submit(config, "resume-1")
    wait_until(
        lambda: sum(depth(brokers.main, vhost, q) for q in QUEUES) >= MESSAGES // 5,
        "a tenth of the messages to arrive",
        timeout=180,
    )
    os.killpg(first.pid, signal.SIGKILL)  # the driver dies, and its executors with it
    first.wait(30)
    plans = tables.read_arrow(str(tmp_path / "ledger"), "plans").to_pylist()
    assert {(p["source_queue"], p["messages"]) for p in plans} == {(q, MESSAGES) for q in QUEUES}

    second = submit(config, "resume-1")
    stdout, stderr = second.communicate(timeout=600)

    assert second.returncode == 0, stderr[-4000:]
    (line,) = [x for x in stdout.splitlines() if x.startswith(RESULT_PREFIX)]
    result = json.loads(line[len(RESULT_PREFIX) :])
    assert result["verified"] is True
    assert result["queues"] == len(QUEUES)
    assert result["messages"] == len(QUEUES) * MESSAGES  # the whole run, both drivers
    assert (result["lost"], result["unexpected"]) == (0, 0)
    assert result["duplicates"] <= WINDOW * len(QUEUES)
    for queue in QUEUES:
        found = drain_fingerprints(lambda: brokers.connect(brokers.main, vhost), queue)
        expected = expected_fingerprints(vhost, queue, MESSAGES)
        assert not expected - found, f"{queue}: a message is missing from the destination"
        assert sum((found - expected).values()) <= WINDOW  # the extra copies: duplicates
        assert depth(brokers.dr, vhost, queue) == 0
