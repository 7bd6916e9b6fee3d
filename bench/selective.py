"""A selective move's rate against the same move without `select` (issue 26's 0.8x).

``python -m bench.selective --messages 100000`` starts two local nodes (dr, main) and,
for each case in turn, seeds a fresh vhost's queue with ``messages`` small persistent
messages (a ``tenant`` header: every third one "acme"), then moves it with
`rmq_spark.transfer.executor.move_queue` (what an executor task runs: ledger and intent
log on, fsynced):

- **plain**: no `select`, every message moves to the destination;
- **select**: ``headers['tenant'] = 'acme'``: a third move, the rest are published back
  to the source's tail (on the source node), each with a ledger row, and the move ends
  at its fence.

The rate is messages examined per second of the mover (`MoveOutcome.seconds`): every
message of the queue in both cases. After the timing it checks each case: the ledger's
committed rows (one per position, contiguous, `moved`/`kept` as the selection says, all
confirmed), and both queues read back in order by a plain consumer (the destination holds
exactly the moved ones, the source exactly the kept ones, each in their original order).
It prints one JSON line, writes it to ``--output`` and exits 1 if a check fails. Run it
under the shared lock: it starts brokers.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pika

from bench import queues
from rmq_spark.devtools.local_brokers import LocalNode, start_nodes, stop_nodes
from rmq_spark.devtools.rabbitmq_roots import HOST_VERSION
from rmq_spark.ledger import tables
from rmq_spark.transfer.executor import ExecutorSettings, move_queue

SELECT = "headers['tenant'] = 'acme'"
QUEUE = "orders"
ROUTE = "bench"


def seed(dr: LocalNode, main: LocalNode, vhost: str, messages: int, size: int) -> None:
    for node in (dr, main):
        node.add_vhost(vhost)
    source, destination = dr.connect(vhost), main.connect(vhost)
    try:
        publish = source.channel()
        publish.confirm_delivery()
        publish.queue_declare(QUEUE, durable=True)
        destination.channel().queue_declare(QUEUE, durable=True)
        pad = b"x" * max(0, size - 6)
        for index in range(messages):
            tenant = "acme" if index % 3 == 0 else "other"
            publish.basic_publish(
                "",
                QUEUE,
                b"%06d" % index + pad,
                pika.BasicProperties(delivery_mode=2, headers={"tenant": tenant}),
            )
    finally:
        source.close()
        destination.close()


def read_indices(node: LocalNode, vhost: str) -> list[int]:
    """Every message of the queue in delivery order (taken), as its body's index."""
    return [int(body[:6]) for body in queues.bodies(node, vhost, QUEUE)]


def ledger_problems(ledger: Path, run_id: str, messages: int, select: str | None) -> list[str]:
    """What the run's committed rows get wrong (nothing, when every message of the queue
    has one confirmed row at its position with the decision the selection makes)."""
    tables.commit_run(str(ledger), run_id)
    rows = tables.read_arrow(
        str(ledger), "messages", run_id=run_id, columns=["position", "decision", "confirmed_at"]
    ).to_pydict()
    problems = []
    if sorted(rows["position"]) != list(range(messages)):
        problems.append(f"positions are not 0..{messages - 1}, once each")
    if any(moment is None for moment in rows["confirmed_at"]):
        problems.append("unconfirmed rows")
    by_position = dict(zip(rows["position"], rows["decision"], strict=True))
    # Delivery order is publish order here: position p is the message with index p.
    wrong = [
        p
        for p, decision in by_position.items()
        if decision != ("moved" if select is None or p % 3 == 0 else "kept")
    ]
    if wrong:
        problems.append(f"{len(wrong)} rows with the wrong decision (first at {min(wrong)})")
    return problems


def move(
    dr: LocalNode, main: LocalNode, ledger: Path, vhost: str, *, select: str | None, window: int
) -> dict[str, Any]:
    settings = ExecutorSettings(
        run_id=f"selective-{vhost}",
        ledger_path=str(ledger),
        clusters={"dr": queues.cluster(dr), "main": queues.cluster(main)},
        window_messages=window,
        window_bytes=64 << 20,
        selections={ROUTE: select} if select is not None else {},
    )
    row: dict[str, object] = {
        "source_cluster": "dr",
        "source_vhost": vhost,
        "source_queue": QUEUE,
        "destination_cluster": "main",
        "destination_vhost": vhost,
        "destination_queue": QUEUE,
        "route": ROUTE,
    }
    started = time.perf_counter()
    outcome = move_queue(row, settings, "local")
    return {
        "status": outcome.status,
        "moved": outcome.messages,
        "kept": outcome.kept,
        "mover_seconds": round(outcome.seconds, 3),
        "wall_seconds": round(time.perf_counter() - started, 3),
        "in_destination": queues.depth(main, vhost, QUEUE),
        "in_source": queues.depth(dr, vhost, QUEUE),
    }


def run(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    dr, main = start_nodes(["dr", "main"], base / "nodes", version=args.version or HOST_VERSION)
    try:
        ledger = base / "ledger"
        tables.ensure_tables(str(ledger))
        cases: dict[str, dict[str, Any]] = {}
        for name, select in (("plain", None), ("select", SELECT)):
            vhost = f"bench-{name}"
            seed(dr, main, vhost, args.messages, args.size)
            case = move(dr, main, ledger, vhost, select=select, window=args.window)
            case["rate"] = round(args.messages / case["mover_seconds"], 1)
            # The checks, after the timing: the ledger, then both queues in order.
            problems = ledger_problems(ledger, f"selective-{vhost}", args.messages, select)
            everything = range(args.messages)
            wanted = [i for i in everything if select is None or i % 3 == 0]
            kept = [i for i in everything if select is not None and i % 3 != 0]
            if read_indices(main, vhost) != wanted:
                problems.append("the destination does not hold exactly the moved, in order")
            if read_indices(dr, vhost) != kept:
                problems.append("the source does not hold exactly the kept, in order")
            case["problems"] = problems
            cases[name] = case
        selected = len(range(0, args.messages, 3))
        plain, chosen = cases["plain"], cases["select"]
        ok = (
            plain["status"] == chosen["status"] == "moved"
            and plain["moved"] == plain["in_destination"] == args.messages
            and plain["in_source"] == 0
            and chosen["moved"] == chosen["in_destination"] == selected
            and chosen["kept"] == chosen["in_source"] == args.messages - selected
            and not plain["problems"]
            and not chosen["problems"]
        )
        return {
            "messages": args.messages,
            "size": args.size,
            "window": args.window,
            "rabbitmq": args.version or "host",
            "cases": cases,
            "select_over_plain": round(chosen["rate"] / plain["rate"], 3),
            "ok": ok,
        }
    finally:
        stop_nodes([dr, main])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=100, help="body bytes")
    parser.add_argument("--window", type=int, default=5000, help="window.messages")
    parser.add_argument("--version", default=None, help="RabbitMQ version (default: host's)")
    parser.add_argument("--output", help="also write the figures here (bench/results/...)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rmq-spark-selective-") as base:
        result = run(args, Path(base))
    print(json.dumps(result))
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
