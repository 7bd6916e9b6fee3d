"""A park's rate against a move of the same queue (issue 27's 0.8x).

``python -m bench.park --messages 100000`` starts two local nodes (dr, main) and seeds two
twin queues on dr with the same demo messages (``devtools.demo.demo_messages``: nine
basic properties, headers of six AMQP types, nested arrays and tables among them,
``--size`` byte bodies, persistent). Then,
with `rmq_spark.transfer.executor.move_queue` (what an executor task runs: ledger and
intent log on, fsynced), in this order:

- **move**: the first twin into a classic queue on main;
- **park**: the second twin into the ledger's `parked` table (`transfer/parked.py`):
  staged rows, durable before each ack.

The rate is messages per second of the mover (`MoveOutcome.seconds`, first consumed to
last confirmed): how fast the source drains. A park's commit then completes its staged
rows with the selection columns decoded from each message's property bytes
(`park/table.commit_parked`); here it runs in this process, one file after another
(`rmq-spark park` runs it in Spark tasks), and is timed apart: `completion_seconds`, and
`park_with_completion_over_move` counts it in the park's time. After the timing it
checks both: the destination queue read back in order
holds the published bodies; the parked rows (committed as
`rmq-spark park` commits them) are positions 0..n-1, each with the body its message
was published with; both sources are empty. ``--rounds N`` repeats the pair on fresh
twins and reports each round and the median ratio. Each case also reports the cyclic
garbage collector's seconds and full passes while it ran (`selection/gc_pause.py` says
why a park once spent a third of its time there). It prints one JSON line, writes it
to ``--output`` and exits 1 if a check fails. Run it under the shared lock: it starts
brokers.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import queues
from bench.memory import source_tree
from rmq_spark.config import PARKED
from rmq_spark.devtools.demo import demo_messages, wait_for_depth
from rmq_spark.devtools.local_brokers import LocalNode, start_nodes, stop_nodes
from rmq_spark.devtools.rabbitmq_roots import HOST_VERSION
from rmq_spark.ledger import tables
from rmq_spark.park.table import commit_parked, ensure_parked_table
from rmq_spark.transfer.executor import ExecutorSettings, ParkSettings, move_queue
from rmq_spark.transfer.parked_table import read_parked

VHOST = "bench-park"
MOVED, PARKED_QUEUE = "orders.moved", "orders.parked"


def seed(dr: LocalNode, main: LocalNode, round_: int, messages: int, size: int) -> list[str]:
    """The twins (and the move's destination), filled with the same messages; returns
    each message's fingerprint (body digest, property digest) in publish order."""
    # The destination's connection is closed before the seeding: a blocking connection
    # left idle through minutes of publishing misses its heartbeats and is reset.
    destination = main.connect(VHOST)
    try:
        destination.channel().queue_declare(f"{MOVED}.{round_}", durable=True)
    finally:
        destination.close()
    connection = dr.connect(VHOST)
    fingerprints = []
    try:
        # Unconfirmed publishes, then each twin's depth awaited: a confirm awaited per
        # message made seeding most of the benchmark's time.
        publish = connection.channel()
        twins = (f"{MOVED}.{round_}", f"{PARKED_QUEUE}.{round_}")
        for queue in twins:
            publish.queue_declare(queue, durable=True)
        for message in demo_messages(VHOST, "orders", messages, body_bytes=size):
            for queue in twins:
                publish.basic_publish("", queue, message.body, message.properties)
            fingerprints.append(hashlib.sha256(message.body).hexdigest())
        for queue in twins:
            wait_for_depth(publish, queue, messages)
    finally:
        connection.close()
    return fingerprints


def read_bodies(node: LocalNode, queue: str) -> list[str]:
    """Every message of the queue in delivery order (taken), as its body's digest."""
    return [hashlib.sha256(body).hexdigest() for body in queues.bodies(node, VHOST, queue)]


def run_mover(settings: ExecutorSettings, queue: str, destination_cluster: str) -> dict[str, Any]:
    """Move `queue` on dr to the queue of its name on `destination_cluster` (a park's
    plan row names its source queue as its destination, as `discover_parked` does)."""
    row: dict[str, object] = {
        "source_cluster": "dr",
        "source_vhost": VHOST,
        "source_queue": queue,
        "destination_cluster": destination_cluster,
        "destination_vhost": VHOST,
        "destination_queue": queue,
    }
    with collections_timed() as collections:
        started = time.perf_counter()
        outcome = move_queue(row, settings, "local")
        wall = time.perf_counter() - started
    return {
        "status": outcome.status,
        "error": outcome.error,
        "messages": outcome.messages,
        "mover_seconds": round(outcome.seconds, 3),
        "wall_seconds": round(wall, 3),
        "gc_seconds": round(collections.seconds, 3),
        "full_collections": collections.full,
    }


class Collections:
    """The cyclic collector's passes while a mover ran (every thread's)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        self.seconds += time.perf_counter() - self._started
        self.full += info["generation"] == 2


@contextlib.contextmanager
def collections_timed() -> Iterator[Collections]:
    collections = Collections()
    gc.callbacks.append(collections)
    try:
        yield collections
    finally:
        gc.callbacks.remove(collections)


def commit_park(ledger: Path, run_id: str) -> float:
    """Commit the run as `rmq-spark park` does (the ledger's rows, then the parked table's,
    its staged rows completed in this process); the parked table's commit's seconds."""
    tables.commit_run(str(ledger), run_id)
    started = time.perf_counter()
    commit_parked(str(ledger), run_id)
    return time.perf_counter() - started


def parked_problems(ledger: Path, run_id: str, queue: str, fingerprints: list[str]) -> list[str]:
    """What the park's committed rows get wrong against the published messages."""
    rows = read_parked(str(ledger), run_id, ["source_queue", "position", "body_sha256", "body"])
    rows = rows.filter(rows.column("source_queue").to_numpy(zero_copy_only=False) == queue)
    by_position = sorted(
        zip(rows.column("position").to_pylist(), rows.column("body").to_pylist(), strict=True)
    )
    problems = []
    if [position for position, _ in by_position] != list(range(len(fingerprints))):
        problems.append(f"{queue}: parked positions are not 0..{len(fingerprints) - 1}, once each")
    parked = [hashlib.sha256(body).hexdigest() for _, body in by_position]
    if parked != fingerprints:
        problems.append(f"{queue}: parked bodies differ from the published ones, in order")
    return problems


def run_round(
    dr: LocalNode, main: LocalNode, ledger: Path, round_: int, args: argparse.Namespace
) -> dict[str, Any]:
    fingerprints = seed(dr, main, round_, args.messages, args.size)
    run_id = f"bench-park-{round_}"
    settings = ExecutorSettings(
        run_id=run_id,
        ledger_path=str(ledger),
        clusters={"dr": queues.cluster(dr), "main": queues.cluster(main)},
        window_messages=args.window,
        window_bytes=64 << 20,
        park=ParkSettings(exclude_body=False),
    )
    moved_queue, parked_queue = f"{MOVED}.{round_}", f"{PARKED_QUEUE}.{round_}"
    move = run_mover(settings, moved_queue, "main")
    park = run_mover(settings, parked_queue, PARKED)
    problems = [
        f"{name}: {case['status']} {case['error'] or ''}".strip()
        for name, case in (("move", move), ("park", park))
        if case["status"] != "moved" or case["messages"] != args.messages
    ]
    if queues.depth(dr, VHOST, moved_queue) or queues.depth(dr, VHOST, parked_queue):
        problems.append("a source is not empty")
    if read_bodies(main, moved_queue) != fingerprints:
        problems.append("the moved queue does not hold the published bodies, in order")
    park["completion_seconds"] = round(commit_park(ledger, run_id), 3)
    problems += parked_problems(ledger, run_id, parked_queue, fingerprints)
    move["rate"] = round(args.messages / move["mover_seconds"], 1)
    park["rate"] = round(args.messages / park["mover_seconds"], 1)
    with_completion = args.messages / (park["mover_seconds"] + park["completion_seconds"])
    return {
        "move": move,
        "park": park,
        "park_over_move": round(park["rate"] / move["rate"], 3),
        "park_with_completion_over_move": round(with_completion / move["rate"], 3),
        "problems": problems,
    }


def run(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    dr, main = start_nodes(["dr", "main"], base / "nodes", version=args.version or HOST_VERSION)
    try:
        for node in (dr, main):
            node.add_vhost(VHOST)
        ledger = base / "ledger"
        tables.ensure_tables(str(ledger))
        ensure_parked_table(str(ledger))
        rounds = [run_round(dr, main, ledger, index, args) for index in range(args.rounds)]
        return {
            "messages": args.messages,
            "size": args.size,
            "window": args.window,
            "rabbitmq": args.version or HOST_VERSION,
            "source": source_tree(),
            "rounds": rounds,
            "park_over_move_median": round(
                statistics.median(r["park_over_move"] for r in rounds), 3
            ),
            "park_with_completion_over_move_median": round(
                statistics.median(r["park_with_completion_over_move"] for r in rounds), 3
            ),
            "ok": not any(r["problems"] for r in rounds),
        }
    finally:
        stop_nodes([dr, main])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=1024, help="body bytes")
    parser.add_argument("--window", type=int, default=5000, help="window.messages (the default)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--version", default=None, help="RabbitMQ version (default: host's)")
    parser.add_argument("--output", help="also write the figures here (bench/results/...)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rmq-spark-park-") as base:
        result = run(args, Path(base))
    print(json.dumps(result))
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
