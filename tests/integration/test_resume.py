"""A driver killed mid-run is resumed by starting it again as its scheduler would.

Each scheduler starts the second driver with what it keeps across attempts, and no
--run-id of ours: Databricks a repair run's arguments ({{job.run_id}} resolved, the
same job run), YARN a new ApplicationMaster container of the same application (its
CONTAINER_ID's attempt number changes), Kubernetes a new driver pod with the same
RMQ_SPARK_RUN_ID (set from the Job's or SparkApplication's name).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from rmq_spark.ledger import tables
from rmq_spark.report.console import RESULT_PREFIX
from tests.support.brokers import (
    Brokers,
    declare,
    depth,
    drain_fingerprints,
    fresh_vhost,
    scheduled_submit,
    seed,
    submit_as_scheduled,
    write_config,
)
from tests.support.faults import expected_fingerprints
from tests.support.killed_driver import started_driver
from tests.support.matrix import SOAK

QUEUES = ("a", "b")
MESSAGES = 20_000
WINDOW = 1000


@dataclass(frozen=True)
class Attempts:
    """How one scheduler starts the first driver and the second: arguments, environment."""

    name: str
    run_id: str  # what both drivers must take
    arguments: tuple[tuple[str, ...], tuple[str, ...]]
    environments: tuple[dict[str, str], dict[str, str]]


# YARN's in `make test`: its second driver's run id comes from a changed environment
# (the attempt number in CONTAINER_ID). The other two take the same path with the run id
# given outright, and run in `make soak` (tests/support/matrix.py).
SCHEDULERS = [
    pytest.param(
        Attempts(
            "databricks-repair",
            "7340298465120813",
            (("--run-id", "7340298465120813"),) * 2,
            ({}, {}),
        ),
        marks=SOAK,
    ),
    Attempts(
        "yarn-reattempt",
        "application_1764000000000_0042",
        ((), ()),
        # YARN gives every container its id and its local directories (LOCAL_DIRS,
        # which Spark uses instead of spark.local.dir once it sees CONTAINER_ID).
        (
            {"CONTAINER_ID": "container_e07_1764000000000_0042_01_000001"},
            {"CONTAINER_ID": "container_e07_1764000000000_0042_02_000001"},
        ),
    ),
    pytest.param(
        Attempts(
            "kubernetes-restart",
            "rmq-spark-nightly-29401",
            ((), ()),
            ({"RMQ_SPARK_RUN_ID": "rmq-spark-nightly-29401"},) * 2,
        ),
        marks=SOAK,
    ),
]


@pytest.mark.parametrize("attempts", SCHEDULERS, ids=lambda a: a.name)
def test_a_killed_driver_started_again_by_its_scheduler_finishes_the_run(
    brokers: Brokers, password_env: str, tmp_path: Path, attempts: Attempts
) -> None:
    vhost = fresh_vhost(brokers, f"resume-{attempts.name}")
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

    command, environment = scheduled_submit(
        config, attempts.arguments[0], attempts.environments[0], tmp_path / "first"
    )
    with started_driver(command, tmp_path / "first.log", env=environment) as first:
        first.kill_once(  # the driver dies, and its executors with it
            lambda: sum(depth(brokers.main, vhost, q) for q in QUEUES) >= MESSAGES // 5,
            "a fifth of the messages to arrive",
            timeout=180,
        )
    plans = tables.read_arrow(str(tmp_path / "ledger"), "plans").to_pylist()
    assert {(p["source_queue"], p["messages"]) for p in plans} == {(q, MESSAGES) for q in QUEUES}
    assert {p["run_id"] for p in plans} == {attempts.run_id}

    second = submit_as_scheduled(
        config, attempts.arguments[1], attempts.environments[1], tmp_path / "second"
    )
    stdout, stderr = second.communicate(timeout=600)

    assert second.returncode == 0, stderr[-4000:]
    (line,) = [x for x in stdout.splitlines() if x.startswith(RESULT_PREFIX)]
    result = json.loads(line[len(RESULT_PREFIX) :])
    assert result["verified"] is True
    assert result["run_id"] == attempts.run_id
    runs = tables.read_arrow(str(tmp_path / "ledger"), "runs").to_pylist()
    assert [run["run_id"] for run in runs] == [attempts.run_id]  # one run, not two
    assert result["queues"] == len(QUEUES)
    assert result["messages"] == len(QUEUES) * MESSAGES  # the whole run, both drivers
    assert (result["lost"], result["unexpected"]) == (0, 0)
    assert result["duplicates"] <= WINDOW * len(QUEUES)
    for queue in QUEUES:
        found = drain_fingerprints(lambda: brokers.main.connect(vhost), queue)
        expected = expected_fingerprints(vhost, queue, MESSAGES)
        assert not expected - found, f"{queue}: a message is missing from the destination"
        assert sum((found - expected).values()) <= WINDOW  # the extra copies: duplicates
        assert depth(brokers.dr, vhost, queue) == 0
