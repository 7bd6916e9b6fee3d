"""Fault scenarios shared by the fault matrix (tests/integration/test_faults.py) and its
object-store subset (test_object_store_faults.py): each starts a transfer or the whole
job, injects the fault, and checks with `faults.account` that nothing was lost and every
duplicate was named. `ledger`: a config's ledger block (an object store) in place of a
directory under tmp_path.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from rmq_spark.ledger import tables
from rmq_spark.pipeline import run_transfer
from tests.support.brokers import Brokers, declare, depth, fresh_vhost, seed
from tests.support.faults import (
    Accounting,
    Transfer,
    account,
    fault_config,
    key_ordered_fingerprints,
    mover_connections,
    seed_key_ordered,
    wait_until,
)

MESSAGES = 30_000
# The SIGKILL test runs the whole job under the job's own brake, so the transfer lasts
# at least SIGKILL_MESSAGES / SIGKILL_RATE seconds (15 s) whatever the machine's speed:
# it is still running when the test has found the worker (a few seconds) and a tenth has
# arrived. Unbraked, a fast run once finished before the kill and nothing was retried.
SIGKILL_MESSAGES = 30_000
SIGKILL_RATE = 2_000
WINDOW = 500


def assert_nothing_lost(result: Accounting, *, lost_sessions: int, window: int = WINDOW) -> None:
    assert result.lost == Counter(), f"{sum(result.lost.values())} message(s) lost"
    assert result.unexplained == Counter(), "destination copies without a ledger row"
    # A recognised redelivery made no copy: the one it names is a confirmed row's.
    assert result.recognised_rows - result.confirmed_rows == Counter(), "recognised, never moved"
    named = (result.confirmed_rows - result.expected) + result.uncertain_rows
    assert result.destination_extra - named == Counter(), "a duplicate is not named"
    assert sum(result.destination_extra.values()) <= window * lost_sessions


def start_transfer(
    brokers: Brokers,
    tmp_path: Path,
    name: str,
    *,
    count: int = MESSAGES,
    window: int = WINDOW,
    ledger: dict[str, object] | None = None,
    **mover: Any,
) -> Transfer:
    vhost = fresh_vhost(brokers, f"fault-{name}")
    seed_key_ordered(brokers.dr, vhost, "orders", count)
    declare(brokers.main, vhost, "orders")  # discovery would; these tests drive the mover alone
    config = fault_config(tmp_path, brokers, vhost, ledger=ledger, **mover)
    return Transfer(brokers, config, name, vhost, "orders", "orders", count, window).start()


def finished(transfer: Transfer) -> Accounting:
    transfer.join()
    assert transfer.error is None, f"mover raised {transfer.error!r}"
    assert transfer.outcome is not None
    assert transfer.outcome.status == "moved", transfer.outcome.error
    result = account(
        transfer, key_ordered_fingerprints(transfer.vhost, "orders", transfer.messages)
    )
    assert result.left_in_source == Counter(), "the source was not drained"
    return result


def close_connections_mid_window(
    brokers: Brokers,
    tmp_path: Path,
    sides: tuple[str, ...],
    ledger: dict[str, object] | None = None,
) -> None:
    """Close every connection of the transfer's vhost on `sides` ("dr", "main") while
    the mover holds a window in flight: it reconnects, nothing is lost, every duplicate
    is named."""
    transfer = start_transfer(brokers, tmp_path, f"drop-{'-'.join(sides)}", ledger=ledger)
    wait_until(lambda: transfer.moved_at_least(MESSAGES // 10), "a tenth to arrive")

    for label in sides:
        node = brokers.dr if label == "dr" else brokers.main
        node.rabbitmqctl("close_all_connections", "-p", transfer.vhost, "rmq-spark fault test")

    result = finished(transfer)
    assert transfer.outcome is not None
    assert transfer.outcome.sessions >= 2
    assert_nothing_lost(result, lost_sessions=transfer.outcome.sessions - 1)


def worker_pid_of(brokers: Brokers, run_id: str) -> int:
    """The pid of the one Python worker holding the run's source connections (a
    selective move holds two there: its consumer's and its kept link's)."""
    pids = set()
    for connection in mover_connections(brokers.dr, "consumer", run_id):
        output = subprocess.run(
            ["ss", "-Htnp", f"sport = :{connection['peer_port']}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        pids.add(int(output.split("pid=", 1)[1].split(",", 1)[0]))
    (pid,) = pids
    return pid


def kill_a_worker_mid_job(
    brokers: Brokers,
    tmp_path: Path,
    spark: SparkSession,
    *,
    run_id: str = "sigkill",
    messages: int = SIGKILL_MESSAGES,
    ledger: dict[str, object] | None = None,
) -> None:
    """Run the whole job and SIGKILL the Python worker moving its queue once a tenth
    has arrived: Spark runs the task again, the job verifies, nothing is lost and the
    duplicates (at most a window per failed attempt) are named."""
    vhost = fresh_vhost(brokers, f"fault-{run_id}")
    seed(brokers.dr, vhost, "orders", messages)
    declare(brokers.main, vhost, "orders")
    config = fault_config(
        tmp_path,
        brokers,
        vhost,
        window=WINDOW,
        ledger=ledger,
        limits={"messages_per_second": SIGKILL_RATE},
    )
    outcome: dict[str, object] = {}

    def job() -> None:
        try:
            outcome["result"] = run_transfer(spark, config, run_id=run_id)
        except BaseException as exc:  # handed to the test thread
            outcome["error"] = exc

    runner = threading.Thread(target=job, daemon=True)
    runner.start()
    # The worker is found first (the management API lists a connection within a few
    # seconds), then killed once a tenth has arrived, so it dies mid-transfer.
    wait_until(lambda: bool(mover_connections(brokers.dr, "consumer", run_id)), "the consumer")
    worker = worker_pid_of(brokers, run_id)
    wait_until(lambda: depth(brokers.main, vhost, "orders") >= messages // 10, "a tenth to arrive")
    os.kill(worker, signal.SIGKILL)
    runner.join(300)

    assert "error" not in outcome, outcome.get("error")
    result = outcome["result"]
    verification = result.verification  # type: ignore[attr-defined]
    assert verification.verified, verification.failed_expectations
    assert (verification.lost, verification.unexpected) == (0, 0)
    assert verification.messages == messages
    assert verification.duplicates <= WINDOW * 2  # a window per failed attempt
    rows = tables.read_arrow(config.ledger.path, "messages", run_id=run_id).to_pylist()
    first_attempt = min(row["task_attempt"] for row in rows)
    retried = [row for row in rows if row["task_attempt"] != first_attempt]
    assert retried, "Spark did not run the task again"
    # The killed attempt left deliveries unacked; the retry moved them again. Whether
    # a copy had already arrived (a named duplicate) or not depends on where the kill
    # landed: published and confirmed, or still waiting for its intent to be durable.
    assert any(row["redelivered"] for row in retried)
