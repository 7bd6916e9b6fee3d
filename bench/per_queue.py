"""Per-queue overhead of the transfer engine: many small queues through one task.

``python -m bench.per_queue --queues 200 --messages 20 --vhosts 5`` starts two local
nodes (dr, main), seeds ``queues`` durable classic queues of ``messages`` demo
messages spread over ``vhosts`` vhosts, declares their destinations, and moves
them all with `rmq_spark.transfer.executor.move_queues`, the function one executor
task runs (ledger and intent log on, fsynced), ``--at-once`` queues at a time. It
prints one JSON line (and writes it to ``--output``): wall seconds of the move,
queues/s, ms per queue, client CPU seconds (this process: the loop and both
durability threads), and checks every destination holds its messages.
``--profile FILE`` writes cProfile stats of the move (``python -m pstats FILE``).
Run it under the shared lock: it starts brokers.

Only `move_queues`, `ExecutorSettings` and the harness are used, so the same script
measures an older build: copy it into that checkout's ``bench/`` and run it from there
(the working directory comes first on ``sys.path``).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import queues
from rmq_spark.config import MoverConfig
from rmq_spark.devtools.demo import demo_messages
from rmq_spark.devtools.local_brokers import LocalNode, start_nodes, stop_nodes
from rmq_spark.ledger import tables
from rmq_spark.transfer.executor import ExecutorSettings, move_queues


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def queue_layout(queues: int, vhosts: int) -> list[tuple[str, str]]:
    """(vhost, queue) for every queue, spread round-robin over the vhosts."""
    return [(f"pq-{index % vhosts}", f"q{index:05d}") for index in range(queues)]


def seed(dr: LocalNode, main: LocalNode, layout: list[tuple[str, str]], messages: int) -> None:
    """Source queues with `messages` each (publisher confirms), destinations empty."""
    for vhost in sorted({vhost for vhost, _ in layout}):
        for node in (dr, main):
            node.add_vhost(vhost)
        names = [queue for v, queue in layout if v == vhost]
        source, destination = dr.connect(vhost), main.connect(vhost)
        try:
            publish, declare = source.channel(), destination.channel()
            publish.confirm_delivery()
            for queue in names:
                publish.queue_declare(queue, durable=True)
                declare.queue_declare(queue, durable=True)
                for message in demo_messages(vhost, queue, messages):
                    publish.basic_publish("", queue, message.body, message.properties)
        finally:
            source.close()
            destination.close()


def destination_depths(main: LocalNode, layout: list[tuple[str, str]]) -> int:
    total = 0
    for vhost in sorted({vhost for vhost, _ in layout}):
        connection = main.connect(vhost)
        try:
            channel = connection.channel()
            for v, queue in layout:
                if v == vhost:
                    total += channel.queue_declare(queue, passive=True).method.message_count
        finally:
            connection.close()
    return total


def run(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    dr, main = start_nodes(["dr", "main"], base / "nodes")
    try:
        layout = queue_layout(args.queues, args.vhosts)
        seed(dr, main, layout, args.messages)
        ledger = base / "ledger"
        tables.ensure_tables(str(ledger))
        settings = ExecutorSettings(
            run_id="per-queue",
            ledger_path=str(ledger),
            clusters={"dr": queues.cluster(dr), "main": queues.cluster(main)},
            window_messages=1000,
            window_bytes=64 << 20,
            mover=MoverConfig(queues_per_task=args.at_once),
            max_active=args.at_once,
        )
        rows: list[dict[str, object]] = [
            {
                "source_cluster": "dr",
                "source_vhost": vhost,
                "source_queue": queue,
                "destination_cluster": "main",
                "destination_vhost": vhost,
                "destination_queue": queue,
                "messages": args.messages,
                "message_bytes": args.messages * 1024,
            }
            for vhost, queue in layout
        ]
        profiler = cProfile.Profile() if args.profile else None
        cpu, started = _cpu_seconds(), time.perf_counter()
        if profiler is not None:
            profiler.enable()
        outcomes = move_queues(rows, settings, "local")
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
        wall, cpu = time.perf_counter() - started, _cpu_seconds() - cpu
        moved = sum(outcome.messages for outcome in outcomes)
        arrived = destination_depths(main, layout)
        statuses = sorted({outcome.status for outcome in outcomes})
        return {
            "queues": args.queues,
            "messages_per_queue": args.messages,
            "vhosts": args.vhosts,
            "at_once": args.at_once,
            "wall_seconds": round(wall, 3),
            "queues_per_second": round(args.queues / wall, 1),
            "ms_per_queue": round(1000 * wall / args.queues, 2),
            "client_cpu_seconds": round(cpu, 3),
            "cpu_ms_per_queue": round(1000 * cpu / args.queues, 2),
            "moved": moved,
            "arrived": arrived,
            "statuses": statuses,
            "ok": moved == arrived == args.queues * args.messages and statuses == ["moved"],
        }
    finally:
        stop_nodes([dr, main])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", type=int, default=200)
    parser.add_argument("--messages", type=int, default=20)
    parser.add_argument("--vhosts", type=int, default=5)
    parser.add_argument("--at-once", type=int, default=2, help="queues moving at once")
    parser.add_argument("--profile", help="write cProfile stats of the move here")
    parser.add_argument("--output", help="also write the figures here (bench/results/...)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rmq-spark-per-queue-") as base:
        result = run(args, Path(base))
    print(json.dumps(result))
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
