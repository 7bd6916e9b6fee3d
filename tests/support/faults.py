"""Fault injection against real nodes, and the checks every fault test makes.

Every check is independent of the mover's own bookkeeping: an independent consumer
reads the destination, the ledger is read back through delta-rs, and the source is
counted with a passive declare.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import yaml

from rmq_spark.config import JobConfig, MoverConfig, load_config
from rmq_spark.devtools.demo import DemoMessage, demo_messages, wait_for_depth
from rmq_spark.devtools.local_brokers import LocalNode
from rmq_spark.ledger import store, tables
from rmq_spark.model import MoveOutcome
from rmq_spark.transfer.executor import ExecutorSettings, move_queue
from tests.support.brokers import (
    Brokers,
    depth,
    drain_fingerprints,
    write_config,
)

Fingerprint = tuple[str, str]
CONDITION_TIMEOUT_SECONDS = 60.0


def wait_until(
    condition: Callable[[], bool],
    what: str,
    timeout: float = CONDITION_TIMEOUT_SECONDS,
    *,
    every: float = 0.02,
) -> None:
    """Poll a condition on the brokers or the ledger until it holds (or fail the test).

    `every`: seconds between polls; a condition that asks a management API for
    statistics polls more slowly, so the polling does not itself load the node that
    collects them.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def expected_fingerprints(vhost: str, queue: str, count: int) -> Counter[Fingerprint]:
    return Counter(
        (
            hashlib.sha256(m.body).hexdigest(),
            hashlib.sha256(b"".join(m.properties.encode())).hexdigest(),
        )
        for m in demo_messages(vhost, queue, count)
    )


def _key_ordered(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _key_ordered(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_key_ordered(item) for item in value]
    return value


def key_ordered_messages(vhost: str, queue: str, count: int) -> Iterator[DemoMessage]:
    """The demo messages with every header table in key order.

    RabbitMQ 3.13 and later re-encode the properties on delivery, header tables sorted
    by key; in that form a classic queue delivers exactly the published bytes on every
    version (3.10, 4.0, 4.3), so what an independent consumer finds can be compared
    with what was published. Byte fidelity of other forms is test_byte_exact's subject.
    """
    for message in demo_messages(vhost, queue, count):
        message.properties.headers = _key_ordered(message.properties.headers)
        yield message


def seed_key_ordered(node: LocalNode, vhost: str, queue: str, count: int) -> None:
    """A durable classic queue holding `count` key-ordered demo messages."""
    connection = node.connect(vhost)
    try:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True)
        for message in key_ordered_messages(vhost, queue, count):
            channel.basic_publish("", queue, message.body, message.properties)
        wait_for_depth(channel, queue, count)
    finally:
        connection.close()


def key_ordered_fingerprints(vhost: str, queue: str, count: int) -> Counter[Fingerprint]:
    return Counter(
        (
            hashlib.sha256(m.body).hexdigest(),
            hashlib.sha256(b"".join(m.properties.encode())).hexdigest(),
        )
        for m in key_ordered_messages(vhost, queue, count)
    )


def mover_connections(node: LocalNode, role: str, run_id: str) -> list[dict[str, Any]]:
    """The node's AMQP connections opened by a mover of `run_id` ("consumer"/"publisher").

    Listed with a sample range, which the management plugin answers afresh: a plain
    listing comes from a cache that on a busy node outlives a short move."""
    return [
        c
        for c in node.management(
            "GET", "/api/connections?data_rates_age=60&data_rates_incr=60", timeout=10
        )
        if f"rmq-spark {run_id} {role}"
        in (c.get("client_properties") or {}).get("connection_name", "")
    ]


def close_mover_connections(node: LocalNode, role: str, run_id: str) -> int:
    """Force-close them, as a network failure or an operator would."""
    closed = 0
    for connection in mover_connections(node, role, run_id):
        name = quote(connection["name"], safe="")
        node.management(
            "DELETE",
            f"/api/connections/{name}",
            headers={"X-Reason": "rmq-spark fault test"},
            timeout=10,
            missing_ok=True,
        )
        closed += 1
    return closed


@dataclass
class Transfer:
    """One queue transfer driven by the mover in a background thread."""

    brokers: Brokers
    config: JobConfig
    run_id: str
    vhost: str
    source_queue: str
    destination_queue: str
    messages: int
    window: int
    attempt: str = "local"  # the Spark task attempt it moves as
    outcome: MoveOutcome | None = None
    error: BaseException | None = None
    _thread: threading.Thread | None = field(default=None, repr=False)

    def start(self) -> Transfer:
        store.use_ledger(self.config.ledger)  # an object store's options, in this process
        tables.ensure_tables(self.config.ledger.path)
        settings = ExecutorSettings(
            run_id=self.run_id,
            ledger_path=self.config.ledger.path,
            clusters=dict(self.config.clusters),
            window_messages=self.window,
            window_bytes=1 << 30,
            mover=self.config.mover,
        )
        row = {
            "source_cluster": "dr",
            "source_vhost": self.vhost,
            "source_queue": self.source_queue,
            "destination_cluster": "main",
            "destination_vhost": self.vhost,
            "destination_queue": self.destination_queue,
            "messages": self.messages,
            "message_bytes": self.messages * 1024,
        }

        def run() -> None:
            try:
                self.outcome = move_queue(row, settings, self.attempt)
            except BaseException as exc:  # handed to the test thread, which asserts on it
                self.error = exc

        self._thread = threading.Thread(target=run, name=f"mover-{self.run_id}", daemon=True)
        self._thread.start()
        return self

    def moved_at_least(self, count: int) -> bool:
        return depth(self.brokers.main, self.vhost, self.destination_queue) >= count

    def join(self, timeout: float = 180.0) -> Transfer:
        assert self._thread is not None
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"mover {self.run_id} still running after {timeout}s"
        return self

    def ledger(self) -> pa.Table:
        tables.commit_run(self.config.ledger.path, self.run_id)
        return tables.read_arrow(self.config.ledger.path, "messages", run_id=self.run_id)


def fault_config(
    tmp_path: Path,
    brokers: Brokers,
    vhost: str,
    *,
    window: int | None = None,
    ledger: dict[str, object] | None = None,
    limits: dict[str, object] | None = None,
    **mover: Any,
) -> JobConfig:
    """A config whose retries are quick, so a fault test waits seconds, not minutes.

    `window` (messages) for tests that run the whole job and bound duplicates by it;
    `ledger`, a ledger block (an object store) in place of a directory under tmp_path;
    `limits`, the job's brake (`limits:`).
    """
    retries = {"backoff_seconds": 0.2, "max_backoff_seconds": 2.0, **mover}
    extra: dict[str, Any] = {"window": {"messages": window}} if window is not None else {}
    if limits is not None:
        extra["limits"] = limits
    path = write_config(
        tmp_path / "job.yaml",
        brokers,
        vhosts=[vhost],
        ledger=tmp_path / "ledger",
        mover=MoverConfig(**retries).model_dump(),
        **extra,
    )
    if ledger is not None:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
        config["ledger"] = ledger
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return load_config(path)


@dataclass(frozen=True)
class Accounting:
    """What the destination, the source and the ledger say, put side by side."""

    expected: Counter[Fingerprint]
    in_destination: Counter[Fingerprint]
    left_in_source: Counter[Fingerprint]
    confirmed_rows: Counter[Fingerprint]
    uncertain_rows: Counter[Fingerprint]
    named_duplicates: int  # redelivered confirmed rows repeating an earlier confirmed row
    # Rows of redeliveries acked without a publish (recognition.py): no copy of their own.
    recognised_rows: Counter[Fingerprint]

    @property
    def lost(self) -> Counter[Fingerprint]:
        """Published, and now in neither the source nor the destination."""
        return self.expected - self.in_destination - self.left_in_source

    @property
    def destination_extra(self) -> Counter[Fingerprint]:
        """Copies in the destination beyond one per message: the duplicates."""
        return self.in_destination - self.expected

    @property
    def unexplained(self) -> Counter[Fingerprint]:
        """Destination copies no ledger row (confirmed or uncertain) accounts for."""
        return self.in_destination - self.confirmed_rows - self.uncertain_rows


def account(transfer: Transfer, expected: Counter[Fingerprint]) -> Accounting:
    """Drain destination and source with an independent consumer; read the ledger."""
    brokers, vhost = transfer.brokers, transfer.vhost
    ledger = transfer.ledger()
    rows = ledger.sort_by("position").to_pylist()
    confirmed: Counter[Fingerprint] = Counter()
    uncertain: Counter[Fingerprint] = Counter()
    recognised: Counter[Fingerprint] = Counter()
    named = 0
    for row in rows:
        fingerprint = (row["body_sha256"], row["properties_sha256"])
        if row["decision"] == "recognised":
            recognised[fingerprint] += 1
            continue
        if row["confirmed_at"] is None:
            uncertain[fingerprint] += 1
            continue
        if confirmed[fingerprint] and row["redelivered"]:
            named += 1
        confirmed[fingerprint] += 1
    return Accounting(
        expected=expected,
        in_destination=drain_fingerprints(
            lambda: brokers.main.connect(vhost), transfer.destination_queue
        ),
        left_in_source=drain_fingerprints(lambda: brokers.dr.connect(vhost), transfer.source_queue),
        confirmed_rows=confirmed,
        uncertain_rows=uncertain,
        named_duplicates=named,
        recognised_rows=recognised,
    )
