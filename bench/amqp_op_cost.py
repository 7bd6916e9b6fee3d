"""What one AMQP operation costs the broker: CPU milliseconds of its Erlang VM per call.

    python -m bench.amqp_op_cost [--calls 1000] [--rabbitmq 3.10]

Starts one local node (`bench.workload.local_brokers`, one-node layout), then makes
each operation ``--calls`` times over pika's BlockingConnection, one after another,
and reads the VM's CPU time from /proc around each batch, less what the idle VM spends
meanwhile. The operations are the ones a mover makes for every queue it moves (issue
31's 10,000 small queues): opening and closing a channel, with confirms on, with a
consumer set up and cancelled, a passive declare, a basic.get on an empty queue, a
consume and cancel, a basic.qos. Prints one JSON line. Run it under the shared lock.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pika

from bench.workload import ONE_NODE, local_brokers, process_cpu_seconds
from rmq_spark.devtools.rabbitmq_roots import HOST_VERSION

VHOST = "op-cost"
QUEUE = "op-cost"
IDLE_SECONDS = 2.0


def broker_cpu_ms_per_call(pid: int, calls: int, operation: Callable[[], None]) -> dict[str, float]:
    """Broker CPU-ms and wall ms per call of `operation`, the idle VM's share taken out."""
    idle_from = process_cpu_seconds(pid)
    time.sleep(IDLE_SECONDS)  # measures the idle VM's rate: nothing is awaited here
    idle_rate = (process_cpu_seconds(pid) - idle_from) / IDLE_SECONDS
    started, cpu_from = time.monotonic(), process_cpu_seconds(pid)
    for _ in range(calls):
        operation()
    wall = time.monotonic() - started
    used = process_cpu_seconds(pid) - cpu_from - idle_rate * wall
    return {
        "broker_cpu_ms": round(1000 * used / calls, 3),
        "wall_ms": round(1000 * wall / calls, 3),
    }


def measure(port: int, username: str, password: str, pid: int, calls: int) -> dict[str, object]:
    credentials = pika.PlainCredentials(username, password)
    connection = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", port, VHOST, credentials)
    )
    channel = connection.channel()
    channel.queue_declare(QUEUE, durable=True)

    def open_close() -> None:
        connection.channel().close()

    def open_confirm_close() -> None:
        opened = connection.channel()
        opened.confirm_delivery()
        opened.close()

    def open_consume_cancel_close() -> None:
        opened = connection.channel()
        opened.basic_qos(prefetch_count=1000)
        opened.basic_cancel(opened.basic_consume(QUEUE, lambda *_: None))
        opened.close()

    def consume_cancel() -> None:
        channel.basic_cancel(channel.basic_consume(QUEUE, lambda *_: None))

    operations: dict[str, Callable[[], None]] = {
        "channel open + close": open_close,
        "channel open + confirm.select + close": open_confirm_close,
        "channel open + qos + consume + cancel + close": open_consume_cancel_close,
        "queue.declare passive": lambda: channel.queue_declare(QUEUE, passive=True),
        "basic.get, empty queue": lambda: channel.basic_get(QUEUE),
        "basic.consume + basic.cancel": consume_cancel,
        "basic.qos": lambda: channel.basic_qos(prefetch_count=1000),
    }
    figures = {name: broker_cpu_ms_per_call(pid, calls, op) for name, op in operations.items()}
    connection.close()
    return {"benchmark": "amqp_op_cost", "calls": calls, "per_call": figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rabbitmq", default=HOST_VERSION)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="rmq-spark-op-cost-") as scratch,
        local_brokers(Path(scratch), [VHOST], version=args.rabbitmq, layout=ONE_NODE) as brokers,
    ):
        node = brokers.src
        report = measure(node.amqp_port, node.username, node.password, brokers.src_pid, args.calls)
    report["rabbitmq"] = args.rabbitmq
    print(json.dumps(report))


if __name__ == "__main__":
    main()
