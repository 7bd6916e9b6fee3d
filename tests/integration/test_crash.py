"""The destination's node crashes mid-move: its Erlang VM SIGKILLed (as a host crash or
the OOM killer does, not `stop_app`), started again on its data, while the movers of
many queues have a full window in flight and have read ahead.

As a user would run it (`spark-submit.sh`, default mover settings but a window of
1,000, 1 KiB persistent messages each with a unique message_id), on every RabbitMQ
version. The window: at the default 5,000 a queue of 3,000 moves in two batches (the
first sized by the plan's byte sample), and a run on 4.3 once found no queue with rows
on both sides of the crash; at 1,000 each queue moves in four. Then: the job ends
verified (exit 0, lost 0), a re-run of the run id verifies it again, an independent
reader finds every id in the destination exactly once and the sources empty, and the
ledger numbers every queue's positions without a gap, also across the crash. Taking
one row out of that sound ledger fails verification, naming the missing position.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from rmq_spark.devtools.local_brokers import LocalNode, kill_vm, restart_node
from rmq_spark.ledger import tables
from rmq_spark.model import TransferKey
from rmq_spark.verify import verify_run_arrow
from tests.support.brokers import (
    Brokers,
    Transactions,
    fresh_vhost,
    result_of,
    spark_submit,
    take_all,
    write_config,
)
from tests.support.faults import wait_until
from tests.support.matrix import fault_versions

QUEUES = 20
PER_QUEUE = 3_000
TOTAL = QUEUES * PER_QUEUE
BODY_BYTES = 1024
# The crash comes once the destination holds this share of the messages (the issue had
# ~15 %; a smaller share here, since a 3.10 node moves these 60,000 in a few seconds).
CRASH_AT = TOTAL * 5 // 100
# Each queue moves in several windows, so the crash lands mid-window (see above).
WINDOW = 1_000


def queue_name(index: int) -> str:
    return f"crash-{index:02d}"


def body_of(queue: str, index: int) -> bytes:
    return (hashlib.sha256(f"{queue}/{index}".encode()).digest() * 32)[:BODY_BYTES]


def seed_queues(node: LocalNode, brokers: Brokers, vhost: str) -> None:
    """QUEUES durable classic queues of PER_QUEUE persistent 1 KiB messages, unique ids."""
    connection = node.connect(vhost)
    try:
        channel = connection.channel()
        with Transactions(channel) as publish:
            for q in range(QUEUES):
                queue = queue_name(q)
                channel.queue_declare(queue, durable=True)
                for i in range(PER_QUEUE):
                    properties = pika.BasicProperties(delivery_mode=2, message_id=f"{queue}/{i}")
                    publish("", queue, body_of(queue, i), properties)
    finally:
        connection.close()


def queue_rows(node: LocalNode, vhost: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = node.management(
        "GET", f"/api/queues/{quote(vhost, safe='')}?columns=name,messages", timeout=10
    )
    return rows


def destination_total(connection: pika.BlockingConnection) -> int:
    """Messages in the destination queues now (0 for one not declared yet)."""
    total = 0
    for q in range(QUEUES):
        channel = connection.channel()
        try:
            total += channel.queue_declare(queue_name(q), passive=True).method.message_count
            channel.close()
        except pika.exceptions.ChannelClosedByBroker:
            pass  # 404: pre-flight has not created it yet
    return total


def ids_in(brokers: Brokers, node: LocalNode, vhost: str, queue: str) -> Counter[str]:
    """Independent reader: consume the whole queue, return its message ids (body checked)."""
    found: Counter[str] = Counter()
    connection = node.connect(vhost)
    try:
        channel = connection.channel()
        for properties, body in take_all(channel, queue):
            queue_of, index = str(properties.message_id).rsplit("/", 1)
            assert body == body_of(queue_of, int(index)), f"{properties.message_id} altered"
            found[properties.message_id] += 1
    finally:
        connection.close()
    return found


def crossed_the_crash(ledger: pa.Table) -> dict[str, pa.Table]:
    """Each source queue's ledger rows, for the queues whose rows span sessions."""
    crossed = {}
    for queue in pc.unique(ledger["source_queue"]).to_pylist():
        rows = ledger.filter(pc.equal(ledger["source_queue"], queue))
        attempts = pc.unique(rows["task_attempt"]).to_pylist()
        if len(attempts) > 1 or pc.max(rows["session"]).as_py() > 0:
            crossed[queue] = rows.sort_by(
                [("task_attempt", "ascending"), ("position", "ascending")]
            )
    return crossed


def ledger_excerpt(queue: str, rows: pa.Table) -> str:
    """Per task attempt and session: positions, confirmed and uncertain rows (for people)."""
    lines = [f"ledger of {queue}:"]
    groups = rows.group_by(["task_attempt", "session"]).aggregate(
        [("position", "min"), ("position", "max"), ("position", "count")]
    )
    for group in sorted(groups.to_pylist(), key=lambda g: g["position_min"]):
        part = rows.filter(
            pc.and_(
                pc.equal(rows["task_attempt"], group["task_attempt"]),
                pc.equal(rows["session"], group["session"]),
            )
        )
        uncertain = part.filter(pc.is_null(part["confirmed_at"]))
        redelivered = pc.sum(pc.cast(part["redelivered"], pa.int64())).as_py() or 0
        lines.append(
            f"  attempt {group['task_attempt']} session {group['session']}: positions "
            f"{group['position_min']}-{group['position_max']} ({group['position_count']} rows, "
            f"{uncertain.num_rows} uncertain at {uncertain['position'].to_pylist()[:12]}, "
            f"{redelivered} redelivered)"
        )
    return "\n".join(lines)


@pytest.mark.parametrize("brokers_of_version", fault_versions(), indirect=True)
def test_destination_vm_killed_mid_move_ends_verified(
    brokers_of_version: Brokers, version_password_env: str, tmp_path: Path
) -> None:
    brokers = brokers_of_version
    vhost = fresh_vhost(brokers, "crash-destination")
    seed_queues(brokers.dr, brokers, vhost)
    wait_until(
        lambda: sum(int(r.get("messages") or 0) for r in queue_rows(brokers.dr, vhost)) == TOTAL,
        "the sources to hold every message",
        timeout=60,
    )
    config = write_config(
        tmp_path / "job.yaml",
        brokers,
        vhosts=[vhost],
        ledger=tmp_path / "ledger",
        window={"messages": WINDOW},
    )
    run_id = "crash"
    jobs: dict[str, Any] = {}
    job = threading.Thread(target=lambda: jobs.update(first=spark_submit(config, run_id)))
    job.start()
    # Exact depths (passive declares on one connection): the management API's lag by a
    # statistics interval, in which a 3.10 node moves most of the messages.
    watcher = brokers.main.connect(vhost)
    try:
        wait_until(
            lambda: destination_total(watcher) >= CRASH_AT,
            "the destination to hold 5 %",
            timeout=300,
        )
    finally:
        watcher.close()
        # The crash, then the node starts again on its data (a boot of several seconds:
        # the destination is down meanwhile, as after a host crash).
        kill_vm(brokers.main)
        restart_node(brokers.main)
    job.join(600)
    first = jobs["first"]
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    result = result_of(first.stdout)
    assert result["verified"] is True, result
    assert (result["messages"], result["lost"]) == (TOTAL, 0), result

    # A re-run of the run id re-verifies the whole run from its ledger.
    again = spark_submit(config, run_id)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert result_of(again.stdout)["verified"] is True

    # Independent reader: every id once in the destination; the sources are empty.
    in_destination: Counter[str] = Counter()
    for q in range(QUEUES):
        in_destination += ids_in(brokers, brokers.main, vhost, queue_name(q))
    expected = Counter(f"{queue_name(q)}/{i}" for q in range(QUEUES) for i in range(PER_QUEUE))
    duplicates = in_destination - expected
    assert expected - in_destination == Counter(), "lost"
    assert sum(duplicates.values()) == result["duplicates"], "a duplicate is not named"
    assert all(int(r.get("messages") or 0) == 0 for r in queue_rows(brokers.dr, vhost))

    # Every queue's positions run 0..n-1 without a gap, also those that crossed the crash.
    ledger = tables.read_arrow(str(tmp_path / "ledger"), "messages", run_id=run_id)
    crossed = crossed_the_crash(ledger)
    assert crossed, "no queue's ledger spans a second session: the crash came too late"
    for queue in pc.unique(ledger["source_queue"]).to_pylist():
        positions = ledger.filter(pc.equal(ledger["source_queue"], queue))["position"]
        distinct = sorted(set(positions.to_pylist()))
        assert distinct == list(range(len(distinct))), f"{queue}: positions have a gap"
    queue, rows = max(crossed.items(), key=lambda item: item[1].num_rows - PER_QUEUE)
    print(ledger_excerpt(queue, rows))  # the closing note's excerpt (pytest -s)

    # A real missing row still fails: take one out of the sound ledger and verify again.
    # The queues table has a row per transfer and run of the id (the job, the re-run).
    counters = list(
        {
            TransferKey.of(row): row
            for row in tables.read_rows(str(tmp_path / "ledger"), "queues", run_id)
        }.values()
    )
    middle = rows["position"][rows.num_rows // 2].as_py()
    holed = ledger.filter(
        pc.invert(
            pc.and_(pc.equal(ledger["source_queue"], queue), pc.equal(ledger["position"], middle))
        )
    )
    verification = verify_run_arrow(run_id, holed, counters, tmp_path / "holed")
    assert not verification.verified
    named = [line for line in verification.failed_expectations if "positions_contiguous" in line]
    assert len(named) == 1, verification.failed_expectations
    assert f"missing positions {middle} (1 position(s))" in named[0]
