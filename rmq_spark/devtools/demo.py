"""Demo data shaped like the DR fail-back case, and the embedded default setup.

Two local nodes stand for a DR cluster ("dr", holding orphaned messages) and the
main cluster ("main", where they must go). Each of two vhosts has ten queues of
1 KiB persistent messages with varied properties and headers. Generation is
deterministic (seeded), so a test can rebuild exactly what was published.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import BinaryIO, TextIO

import pika

from rmq_spark.devtools.demo_store import DemoStore, demo_store
from rmq_spark.devtools.local_brokers import LocalNode, save_nodes, start_nodes, stop_nodes
from rmq_spark.devtools.rabbitmq_roots import HOST_VERSION
from rmq_spark.errors import RmqSparkError
from rmq_spark.progress import TERMINAL_ENV
from rmq_spark.report.console import RESULT_PREFIX

log = logging.getLogger(__name__)

DEMO_VHOSTS = ("orders", "billing")
QUEUES_PER_VHOST = 10
BODY_BYTES = 1024
_CONTENT_TYPES = ("application/json", "application/octet-stream", "text/plain")
_SEED_TIMEOUT_SECONDS = 60.0
_READ_BYTES = 65536


@dataclass(frozen=True)
class DemoMessage:
    body: bytes
    properties: pika.BasicProperties


def demo_queue_names(
    vhosts: Sequence[str] = DEMO_VHOSTS, per_vhost: int = QUEUES_PER_VHOST
) -> list[tuple[str, str]]:
    return [(vhost, f"{vhost}.q{index:02d}") for vhost in vhosts for index in range(per_vhost)]


def demo_messages(
    vhost: str, queue: str, count: int, *, body_bytes: int = BODY_BYTES
) -> Iterator[DemoMessage]:
    """Deterministic messages for one queue: same arguments, same messages."""
    rng = random.Random(f"{vhost}/{queue}")
    base_ms = 1_790_000_000_000
    for index in range(count):
        body = rng.randbytes(body_bytes)
        headers: dict[str, object] = {
            "sequence": index,
            "source-dc": "ltm",
            "retry-count": rng.randrange(0, 5),
            "tenant": f"tenant-{rng.randrange(0, 50):02d}",
            "is-replay": rng.random() < 0.1,
            "amount": Decimal(rng.randrange(0, 100_000)) / 100,  # AMQP decimal
            "tags": ["demo", vhost],
            "trace": {"span": rng.randrange(1 << 30), "sampled": rng.random() < 0.5},
        }
        properties = pika.BasicProperties(
            content_type=_CONTENT_TYPES[index % len(_CONTENT_TYPES)],
            delivery_mode=pika.DeliveryMode.Persistent,
            message_id=f"{vhost}/{queue}/{index}",
            correlation_id=f"corr-{rng.randrange(1 << 20):05x}",
            timestamp=(base_ms + index * 1000) // 1000,
            priority=rng.randrange(0, 10),
            app_id="rmq-spark-demo",
            type=("order.created", "order.paid", "invoice.sent")[index % 3],
            headers=headers,
        )
        yield DemoMessage(body, properties)


def seed_queue(
    channel: pika.adapters.blocking_connection.BlockingChannel, vhost: str, queue: str, count: int
) -> None:
    """Declare a durable classic queue and publish `count` demo messages into it."""
    channel.queue_declare(queue, durable=True)
    for message in demo_messages(vhost, queue, count):
        channel.basic_publish("", queue, message.body, message.properties)


def wait_for_depth(
    channel: pika.adapters.blocking_connection.BlockingChannel,
    queue: str,
    expected: int,
    *,
    timeout: float = _SEED_TIMEOUT_SECONDS,
) -> None:
    """Wait until the queue holds `expected` ready messages (publishes are asynchronous)."""
    deadline = time.monotonic() + timeout
    while True:
        depth = channel.queue_declare(queue, passive=True).method.message_count
        if depth == expected:
            return
        if depth > expected or time.monotonic() > deadline:
            raise RmqSparkError(
                f"demo queue {queue!r}: expected {expected} messages, found {depth}"
            )
        channel.connection.process_data_events(time_limit=0.05)


def seed_demo(
    connect: Callable[[str], pika.BlockingConnection],
    *,
    vhosts: Sequence[str] = DEMO_VHOSTS,
    per_vhost: int = QUEUES_PER_VHOST,
    messages_per_queue: int,
) -> int:
    """Fill every demo queue on the DR node; returns the number of messages published."""
    total = 0
    for vhost in vhosts:
        connection = connect(vhost)
        try:
            channel = connection.channel()
            names = [queue for v, queue in demo_queue_names([vhost], per_vhost)]
            for queue in names:
                channel.queue_declare(queue, durable=True)
                channel.queue_purge(queue)
                seed_queue(channel, vhost, queue, messages_per_queue)
            for queue in names:
                wait_for_depth(channel, queue, messages_per_queue)
                total += messages_per_queue
        finally:
            connection.close()
    log.info("seeded %d demo messages at %s", total, datetime.now(UTC).isoformat())
    return total


# -- the embedded default: `rmq-spark demo` / `make demo` ------------------------------

REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO_CONFIG = REPO_ROOT / "conf" / "demo.yaml"
SPARK_SUBMIT = REPO_ROOT / "spark-submit.sh"


def demo_environment(dr: LocalNode, main: LocalNode, ledger: Path) -> dict[str, str]:
    """The variables conf/demo.yaml refers to."""
    return {
        "RMQ_SPARK_DEMO_DR_AMQP_PORT": str(dr.amqp_port),
        "RMQ_SPARK_DEMO_DR_HTTP_PORT": str(dr.management_port),
        "RMQ_SPARK_DEMO_MAIN_AMQP_PORT": str(main.amqp_port),
        "RMQ_SPARK_DEMO_MAIN_HTTP_PORT": str(main.management_port),
        "RMQ_SPARK_DEMO_USER": dr.username,
        "RMQ_SPARK_DEMO_PASSWORD": dr.password,
        "RMQ_SPARK_DEMO_LEDGER": str(ledger),
    }


def run_demo(
    *,
    base_dir: str,
    messages_per_queue: int,
    keep_brokers: bool,
    rabbitmq: str = HOST_VERSION,
    ledger: str = "local",
) -> int:
    """Start a DR and a main node, fill DR, spark-submit the job, return its exit code.

    ``rabbitmq``: the nodes' version (see ``local_brokers.start_nodes``). ``ledger``:
    ``local`` (a directory under ``base_dir``), or ``s3``/``azure``: the ledger on a
    local object-store server started for the demo (``demo_store``), every table read
    back from it before the server stops.
    """
    if not SPARK_SUBMIT.exists():
        raise RmqSparkError(f"the demo runs from a checkout; {SPARK_SUBMIT} is missing")
    base = Path(base_dir).resolve()
    if ledger == "local":
        return _run_demo_on(base, messages_per_queue, keep_brokers, rabbitmq, None)
    with demo_store(ledger, base) as on_store:
        return _run_demo_on(base, messages_per_queue, keep_brokers, rabbitmq, on_store)


def _run_demo_on(
    base: Path,
    messages_per_queue: int,
    keep_brokers: bool,
    rabbitmq: str,
    on_store: DemoStore | None,
) -> int:
    ledger = base / "ledger"
    nodes = start_nodes(
        ["dr", "main"], base / "brokers", password=secrets.token_urlsafe(16), version=rabbitmq
    )
    if keep_brokers:
        save_nodes(nodes, base / "brokers")  # what `local_brokers stop` reads
    try:
        dr, main = nodes
        for node in nodes:
            for vhost in DEMO_VHOSTS:
                node.add_vhost(vhost)
        started = time.monotonic()
        total = seed_demo(dr.connect, messages_per_queue=messages_per_queue)
        log.info("demo: %d messages on the DR node in %.1fs", total, time.monotonic() - started)
        env = {
            **os.environ,
            **demo_environment(dr, main, ledger),
            **terminal_environment(sys.stdout, os.environ),
        }
        config = DEMO_CONFIG
        if on_store is not None:
            config = on_store.config(DEMO_CONFIG, base / "demo-object-store.yaml")
            env.update(on_store.secrets)
        command = [str(SPARK_SUBMIT), "--config", str(config)]
        log.info("demo: %s", " ".join(command))
        exit_code, result = _run_holding_result(command, env)
        if on_store is not None and exit_code == 0:
            rows = on_store.table_rows()
            counts = ", ".join(f"{name} {count}" for name, count in rows.items())
            print(f"ledger tables on {on_store.uri} (rows): {counts}", flush=True)
    finally:
        if keep_brokers:
            log.info(
                "demo: nodes left running; stop them with "
                "python -m rmq_spark.devtools.local_brokers stop --base-dir %s",
                base / "brokers",
            )
        else:
            stop_nodes(nodes, remove_data=True)
    if result is not None:
        print(result, flush=True)  # the demo's last line, after the nodes are stopped
    return exit_code


def terminal_environment(stream: TextIO, environ: Mapping[str, str]) -> dict[str, str]:
    """Tell the job whether its output ends on a terminal, and how wide it is.

    The job's output reaches `stream` through two pipes (spark-submit's JVM, then this
    process), so neither the job nor spark-submit.sh can see the terminal; the
    progress bars need to know (see progress.progress_console). A choice the user
    made in RMQ_SPARK_TERMINAL stands.
    """
    if TERMINAL_ENV in environ:
        return {}
    if not stream.isatty():
        return {TERMINAL_ENV: "0"}
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except OSError:
        return {TERMINAL_ENV: "1"}
    return {TERMINAL_ENV: "1", "COLUMNS": str(columns)}


@dataclass
class ResultHoldingRelay:
    """Passes the job's output on as it comes, except its RESULT line, which it keeps.

    Bytes, not lines: a progress bar redraw ends without a newline (the cursor stays on
    the bars), so waiting for whole lines would show each redraw one redraw late. Only
    a line that may be the RESULT line is held until its end decides.
    """

    out: BinaryIO
    result: str | None = field(default=None, init=False)
    _pending: bytes = field(default=b"", init=False)
    _at_line_start: bool = field(default=True, init=False)
    _prefix: bytes = field(default=RESULT_PREFIX.encode(), init=False)

    def feed(self, data: bytes) -> None:
        self._pending += data
        while self._pending:
            if self._at_line_start and self._may_be_result(self._pending):
                end = self._pending.find(b"\n")
                if end < 0:
                    return  # wait for the rest of the line
                line, self._pending = self._pending[: end + 1], self._pending[end + 1 :]
                if line.startswith(self._prefix):
                    self.result = line.decode(errors="replace").rstrip("\n")
                else:
                    self._write(line)
                continue
            end = self._pending.find(b"\n")
            if end < 0:
                chunk, self._pending = self._pending, b""
                self._at_line_start = False
            else:
                chunk, self._pending = self._pending[: end + 1], self._pending[end + 1 :]
                self._at_line_start = True
            self._write(chunk)

    def close(self) -> None:
        """The job ended: a last line without a newline is decided now."""
        if self._pending.startswith(self._prefix):  # only a possible RESULT line is held
            self.result = self._pending.decode(errors="replace")
        elif self._pending:
            self._write(self._pending)
        self._pending = b""

    def _may_be_result(self, data: bytes) -> bool:
        head = data[: len(self._prefix)]
        return self._prefix.startswith(head)

    def _write(self, data: bytes) -> None:
        self.out.write(data)
        self.out.flush()


def _run_holding_result(command: list[str], env: dict[str, str]) -> tuple[int, str | None]:
    """Run the job, echoing its output but keeping its RESULT line for the very end."""
    sys.stdout.flush()
    relay = ResultHoldingRelay(sys.stdout.buffer)
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE) as job:
        assert job.stdout is not None
        while data := os.read(job.stdout.fileno(), _READ_BYTES):
            relay.feed(data)
        relay.close()
    return job.returncode, relay.result
