"""An interrupted `rmq-spark replay` publishes no ledger-confirmed row twice (issue 27).

Real RabbitMQ 3.10 nodes, real Spark (the park), real Delta. A queue is parked, then
replayed to its source by a real `rmq-spark replay` process, slowed by its rate limit
so the fault lands mid-replay: the process group SIGKILLed once the ledger shows a
confirmed batch, or before it shows any; or the destination node's RabbitMQ restarted
under it (it reconnects, sends the row in flight again and finishes), or stopped for
longer than its reconnects (one error, exit 2, saying to run it again). After a stop,
the confirmed rows the ledger shows are read before the same command runs again. Then
an independent pika consumer reads the queue and finds every parked message, byte-exact,
in position order except for duplicates, and each duplicate is a row the replay named:
the killed attempt's last intended batch or the stopped one's row in flight (named by
the re-run, park/replay/journal.py), or the row it sent again after reconnecting.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from pyspark.sql import SparkSession

from rmq_spark.devtools.local_brokers import LocalNode
from rmq_spark.ledger import tables
from rmq_spark.park.replay.run import LEDGER_BATCH
from rmq_spark.park.run import run_park
from tests.support.brokers import Brokers, depth, fresh_vhost
from tests.support.faults import wait_until
from tests.support.killed_driver import started_driver
from tests.support.parking import QUEUE, park_config, published, read_queue, seed

MESSAGES = 2_000
# Five seconds of replaying at this rate (a ledger append every 1.25 s): the kill and
# the restart land after the first batch and well before the end.
RATE = 400
PARKED = "park-resume"
CHECKOUT = Path(__file__).resolve().parents[2]


def replay_command(config: Path, run_id: str, rate: int = RATE) -> list[str]:
    return [
        str(Path(sys.executable).parent / "rmq-spark"),
        "replay",
        "--config",
        str(config),
        "--parked",
        PARKED,
        "--to",
        "source",
        "--messages-per-second",
        str(rate),
        "--run-id",
        run_id,
    ]


def child_environment() -> dict[str, str]:
    """This checkout's rmq_spark first, whichever checkout the venv was installed from."""
    paths = [str(CHECKOUT), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def start(command: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command,
        env=child_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, killed as one
    )


def run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, env=child_environment(), capture_output=True, text=True, timeout=120, check=False
    )


def parked_queue(brokers: Brokers, tmp_path: Path, spark: SparkSession, name: str) -> str:
    """A vhost whose queue was filled with MESSAGES and parked (run PARKED)."""
    vhost = fresh_vhost(brokers, name)
    seed(brokers.dr, vhost, MESSAGES)
    assert run_park(spark, park_config(tmp_path, brokers, vhost), run_id=PARKED).verified
    assert depth(brokers.dr, vhost, QUEUE) == 0
    return vhost


def confirmed_positions(tmp_path: Path) -> list[int]:
    """The positions the ledger shows confirmed by a replay of PARKED (any run)."""
    rows = tables.read_arrow(
        str(tmp_path / "ledger"),
        "messages",
        columns=["position", "decision", "reason", "confirmed_at"],
    ).to_pylist()
    return sorted(
        r["position"]
        for r in rows
        if r["decision"] == "replayed" and r["reason"] == PARKED and r["confirmed_at"] is not None
    )


def publish_attempts(tmp_path: Path) -> dict[int, int]:
    """How many times each position's confirmed replay row says it was sent."""
    rows = tables.read_arrow(
        str(tmp_path / "ledger"),
        "messages",
        columns=["position", "decision", "reason", "confirmed_at", "publish_attempts"],
    ).to_pylist()
    return {
        r["position"]: r["publish_attempts"]
        for r in rows
        if r["decision"] == "replayed" and r["reason"] == PARKED and r["confirmed_at"] is not None
    }


def result_of(stdout: str) -> dict[str, Any]:
    [line] = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    return result


def named_positions(stdout: str) -> set[int]:
    """The positions the replay's console names as possibly twice in their queue."""
    named: set[int] = set()
    for ranges in re.findall(r"^    \S+ positions (.+) -> \S+$", stdout, re.MULTILINE):
        for span in ranges.split(", "):
            first, _, last = span.partition("-")
            named.update(range(int(first), int(last or first) + 1))
    return named


def duplicated_positions(brokers: Brokers, vhost: str) -> list[int]:
    """Read the queue with an independent consumer: every parked message is there,
    byte-exact, in position order once the later copies are left out. Returns the
    positions found more than once."""
    expected = published(vhost, MESSAGES)
    position_of = {e["message_id"]: p for p, e in enumerate(expected)}
    found = read_queue(brokers.dr, vhost, QUEUE)
    positions = [position_of[m["message_id"]] for m in found]
    for position, message in zip(positions, found, strict=True):
        assert message["body_sha256"] == expected[position]["body_sha256"]
        assert message["properties_sha256"] == expected[position]["properties_sha256"]
    first_copies = list(dict.fromkeys(positions))
    assert first_copies == list(range(MESSAGES)), "a message is missing or out of order"
    return sorted(p for p, n in Counter(positions).items() if n > 1)


@pytest.mark.parametrize("brokers_of_version", ["3.10"], indirect=True)
def test_a_killed_replay_run_again_publishes_no_confirmed_row_twice_and_names_its_copies(
    brokers_of_version: Brokers, version_password_env: str, tmp_path: Path, spark: SparkSession
) -> None:
    brokers = brokers_of_version
    vhost = parked_queue(brokers, tmp_path, spark, "replay-kill")
    command = replay_command(tmp_path / "job.yaml", "replay-kill")
    with started_driver(command, tmp_path / "first.log", env=child_environment()) as first:
        first.kill_once(
            lambda: len(confirmed_positions(tmp_path)) >= LEDGER_BATCH,
            "the ledger to show a confirmed batch",
            timeout=120,
        )
    at_kill = confirmed_positions(tmp_path)
    in_queue_at_kill = depth(brokers.dr, vhost, QUEUE)
    assert at_kill == list(range(len(at_kill))), "one queue's rows confirm in position order"
    assert len(at_kill) < MESSAGES, "the kill came after the replay"
    assert in_queue_at_kill > len(at_kill), "the kill left no published row unrecorded"

    again = run(command)

    print(again.stdout)  # the re-run's console, for `pytest -rP`
    assert again.returncode == 0, again.stderr
    result = result_of(again.stdout)
    assert result["verified"] is True
    assert (result["missing"], result["duplicates"]) == (0, 0)
    assert (result["skipped"], result["published"]) == (len(at_kill), MESSAGES - len(at_kill))
    assert result["interrupted"] == ["replay-kill"]
    named = named_positions(again.stdout)
    assert named == set(range(len(at_kill), min(len(at_kill) + LEDGER_BATCH, MESSAGES)))
    assert result["possibly_twice"] == len(named)
    twice = duplicated_positions(brokers, vhost)
    assert twice, "the rows the kill left unrecorded were not published again"
    assert not set(twice) & set(at_kill), "a row the ledger showed confirmed was published twice"
    assert set(twice) <= named, "a copy the re-run did not name"
    assert len(twice) == in_queue_at_kill - len(at_kill)


def with_reconnects(config: Path, attempts: int) -> Path:
    """The job's config with `mover.reconnect_attempts` set (the replay's reconnects)."""
    raw = yaml.safe_load(config.read_text(encoding="utf-8"))
    raw["mover"] = {"reconnect_attempts": attempts}
    config.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return config


def wait_for_replayed_rows(first: subprocess.Popen[str], node: LocalNode, vhost: str) -> None:
    def some_published() -> bool:
        if first.poll() is not None:
            raise AssertionError(f"the replay ended by itself: {first.communicate()}")
        return depth(node, vhost, QUEUE) >= LEDGER_BATCH + 100

    wait_until(some_published, "a batch and more back in the queue", timeout=120)


@pytest.mark.parametrize("brokers_of_version", ["3.10"], indirect=True)
def test_a_replay_whose_destination_node_restarts_reconnects_and_finishes(
    brokers_of_version: Brokers, version_password_env: str, tmp_path: Path, spark: SparkSession
) -> None:
    """The node's RabbitMQ stopped and started under the replay: it reconnects (eight
    reconnects: up to 91 s of backoff, longer than a start here), sends the row in
    flight again and finishes, verified; only that row may be in the queue twice, and
    it is named, in the console and in its ledger row's publish_attempts."""
    brokers = brokers_of_version
    node = brokers.dr  # --to source: the parked queue's own node is the destination
    vhost = parked_queue(brokers, tmp_path, spark, "replay-restart")
    command = replay_command(with_reconnects(tmp_path / "job.yaml", 8), "replay-restart")
    first = start(command)

    wait_for_replayed_rows(first, node, vhost)
    node.rabbitmqctl("stop_app")
    node.rabbitmqctl("start_app")
    node.rabbitmqctl("await_startup")
    stdout, stderr = first.communicate(timeout=240)

    print(stdout)
    assert first.returncode == 0, stderr
    assert "reconnecting in" in stderr  # it did lose the connection
    result = result_of(stdout)
    assert (result["verified"], result["missing"], result["duplicates"]) == (True, 0, 0)
    assert (result["published"], result["reconnected"]) == (MESSAGES, 1)
    [in_flight] = named_positions(stdout)
    twice = duplicated_positions(brokers, vhost)
    assert set(twice) <= {in_flight}, "only the row in flight may be in the queue twice"
    assert confirmed_positions(tmp_path) == list(range(MESSAGES))
    attempts = publish_attempts(tmp_path)
    assert attempts[in_flight] >= 2
    assert {p for p, sent in attempts.items() if sent > 1} == {in_flight}


@pytest.mark.parametrize("brokers_of_version", ["3.10"], indirect=True)
def test_a_replay_whose_destination_node_stays_down_stops_with_one_error_and_a_rerun_finishes(
    brokers_of_version: Brokers, version_password_env: str, tmp_path: Path, spark: SparkSession
) -> None:
    """Two reconnects (1.5 s of backoff) while the node's RabbitMQ is stopped: the replay
    gives up with one error, exit 2; the re-run, with the node back, finishes it."""
    brokers = brokers_of_version
    node = brokers.dr
    vhost = parked_queue(brokers, tmp_path, spark, "replay-down")
    command = replay_command(with_reconnects(tmp_path / "job.yaml", 2), "replay-down")
    first = start(command)

    wait_for_replayed_rows(first, node, vhost)
    node.rabbitmqctl("stop_app")
    try:
        _, stderr = first.communicate(timeout=60)
    finally:
        node.rabbitmqctl("start_app")
        node.rabbitmqctl("await_startup")

    print(stderr)  # the stopped replay's error, for `pytest -rP`
    assert first.returncode == 2, stderr
    assert "Traceback" not in stderr
    [error] = [line for line in stderr.splitlines() if line.startswith("rmq-spark: error:")]
    assert error.startswith(
        f"rmq-spark: error: replay replay-down of parked run {PARKED} stopped: cluster dr "
        f"vhost '{vhost}' queue '{QUEUE}': the connection was lost while a replayed message "
        "awaited its confirm ("
    ), error
    assert "; 2 reconnect(s) failed, the last: cluster dr (127.0.0.1:" in error
    assert f"vhost '{vhost}': cannot connect (connection refused)" in error
    assert "run the same replay again when the broker is back" in error
    said = re.search(r"the row in flight, position (\d+) of ", error)
    assert said is not None, error
    in_flight = int(said[1])
    at_stop = confirmed_positions(tmp_path)
    assert at_stop == list(range(in_flight)), "the ledger holds every row confirmed before it"

    again = run(command)

    print(again.stdout)
    assert again.returncode == 0, again.stderr
    result = result_of(again.stdout)
    assert (result["verified"], result["missing"], result["duplicates"]) == (True, 0, 0)
    assert (result["skipped"], result["published"]) == (in_flight, MESSAGES - in_flight)
    twice = duplicated_positions(brokers, vhost)
    assert set(twice) <= {in_flight}, "only the row in flight may be in the queue twice"
    # The stopped replay recorded its row in flight (journal.py): that row alone is named.
    assert named_positions(again.stdout) == {in_flight}
    assert result["interrupted"] == ["replay-down"]


@pytest.mark.parametrize("brokers_of_version", ["3.10"], indirect=True)
def test_a_replay_killed_before_its_first_append_is_named_by_the_rerun(
    brokers_of_version: Brokers, version_password_env: str, tmp_path: Path, spark: SparkSession
) -> None:
    """It left no ledger row, only the intent it wrote before publishing its first batch."""
    brokers = brokers_of_version
    vhost = parked_queue(brokers, tmp_path, spark, "replay-early")
    # Ten seconds to its first append: the kill lands among the first batch's publishes.
    command = replay_command(tmp_path / "job.yaml", "replay-early", rate=LEDGER_BATCH // 10)
    with started_driver(command, tmp_path / "first.log", env=child_environment()) as first:
        first.kill_once(
            lambda: depth(brokers.dr, vhost, QUEUE) >= 10,
            "the first rows back in the queue",
            timeout=120,
        )
    assert confirmed_positions(tmp_path) == [], "the kill came after the first append"
    in_queue_at_kill = depth(brokers.dr, vhost, QUEUE)

    again = run(replay_command(tmp_path / "job.yaml", "replay-early"))  # at RATE: 5 s

    print(again.stdout)
    assert again.returncode == 0, again.stderr
    result = result_of(again.stdout)
    assert (result["verified"], result["missing"], result["duplicates"]) == (True, 0, 0)
    assert (result["skipped"], result["published"]) == (0, MESSAGES)
    assert result["interrupted"] == ["replay-early"]
    named = named_positions(again.stdout)
    assert named == set(range(LEDGER_BATCH))
    twice = duplicated_positions(brokers, vhost)
    assert len(twice) == in_queue_at_kill
    assert set(twice) <= named, "a copy the re-run did not name"
