"""A retried task acks what the killed attempt moved and recorded, without publishing it.

A mover task is SIGKILLed right after a ledger write became durable and before the acks
it allowed went out (`tests/support/killed_mover.py`, its own process): the broker
requeues those messages, whose copies are in the destination already. The retried
attempt, the real executor code on the same run, recognises them from the ledger
(`transfer/recognition.py`) and acks them with a `recognised` row; it publishes again
only what the killed attempt never saw confirmed. Classic and quorum sources, on every
RabbitMQ version of the fault matrix.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.support.brokers import Brokers, declare, fresh_vhost, seed_declared
from tests.support.faults import Transfer, account, expected_fingerprints, fault_config
from tests.support.killed_mover import KILLED_ATTEMPT
from tests.support.matrix import fault_versions

MESSAGES = 4_000
WINDOW = 500
RETRIED_ATTEMPT = "3.0.1"


@pytest.mark.parametrize("brokers_of_version", fault_versions(), indirect=True)
@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_retried_task_acks_what_the_killed_one_moved_without_publishing_it_again(
    brokers_of_version: Brokers, version_password_env: str, tmp_path: Path, queue_type: str
) -> None:
    brokers = brokers_of_version
    vhost = fresh_vhost(brokers, f"recognise-{queue_type}")
    seed_declared(brokers.dr, vhost, "orders", MESSAGES, {"x-queue-type": queue_type})
    # A quorum destination confirms a window in parts, as its log commits: the killed
    # attempt's writes then leave publishes ahead of them that were never confirmed.
    declare(brokers.main, vhost, "orders", **{"x-queue-type": "quorum"})
    config = fault_config(tmp_path, brokers, vhost)
    run_id = f"recognise-{queue_type}"

    killed = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.support.killed_mover",
            str(tmp_path / "job.yaml"),
            run_id,
            vhost,
            "orders",
            str(MESSAGES),
            str(WINDOW),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    cut_short = json.loads(killed.stdout.splitlines()[-1])

    retry = Transfer(
        brokers, config, run_id, vhost, "orders", "orders", MESSAGES, WINDOW, RETRIED_ATTEMPT
    )
    outcome = retry.start().join().outcome
    assert outcome is not None
    assert outcome.status == "moved", outcome.error

    # The durable write the kill cut short was never acked: all of it is recognised (and
    # more, when acks of the write before were still on their way).
    assert outcome.recognised >= len(cut_short["written"])
    rows = retry.ledger().to_pylist()
    recognised = [row for row in rows if row["decision"] == "recognised"]
    assert len(recognised) == outcome.recognised
    assert {row["task_attempt"] for row in recognised} == {RETRIED_ATTEMPT}
    killed_rows = [row for row in rows if row["task_attempt"] == KILLED_ATTEMPT]
    confirmed_earlier = {
        (row["position"], row["body_sha256"], row["properties_sha256"])
        for row in killed_rows
        if row["confirmed_at"] is not None
    }
    for row in recognised:  # each names the killed attempt's confirmed row of its message
        earlier = int(row["reason"].rsplit(" ", 1)[1])
        assert (earlier, row["body_sha256"], row["properties_sha256"]) in confirmed_earlier
        assert (row["publish_seq"], row["publish_attempts"]) == (0, 0)
    assert set(cut_short["written"]) <= {int(row["reason"].rsplit(" ", 1)[1]) for row in recognised}

    # By body: a quorum source re-encodes a redelivery's properties (x-delivery-count),
    # and the mover forwards what it received.
    result = account(retry, expected_fingerprints(vhost, "orders", MESSAGES))
    expected, arrived = bodies(result.expected), bodies(result.in_destination)
    assert expected - arrived - bodies(result.left_in_source) == Counter(), "a message lost"
    assert result.left_in_source == Counter()
    named = bodies(result.confirmed_rows) + bodies(result.uncertain_rows)
    assert arrived - named == Counter(), "destination copies without a ledger row"
    # The only copies beyond one a message are of publishes the killed attempt never saw
    # confirmed (its uncertain rows); nothing recognised was published twice.
    extra = arrived - expected
    assert extra - bodies(result.uncertain_rows) == Counter()
    assert sum(extra.values()) <= cut_short["highest_intent"] - max(cut_short["written"])


def bodies(fingerprints: Counter[tuple[str, str]]) -> Counter[str]:
    found: Counter[str] = Counter()
    for (body, _properties), count in fingerprints.items():
        found[body] += count
    return found
