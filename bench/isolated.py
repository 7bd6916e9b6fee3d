"""The parts of a benchmark that run in a fresh interpreter of their own.

``python -m bench.isolated seed|move|parked`` reads one JSON request on stdin and prints one
JSON result line on stdout (logs go to stderr). A fresh interpreter per step means
the mover's memory figures are its own: the process holds nothing but what an
executor's Python worker needs to move one queue. The module itself imports only
the standard library at the top, so the baseline taken after the mover's imports
is not inflated by the benchmark.

* ``seed``: declare a durable classic queue and publish ``count`` random bodies of
  ``size`` bytes (persistent), then wait until the queue holds exactly ``count``.
* ``parked``: commit a park's data files and count one source queue's rows in the
  `parked` table (the Delta readers stay out of the benchmark's own process, whose RSS
  floors a mover's peak).
* ``move``: import what a Spark Python worker and the task import, then call
  ``rmq_spark.transfer.executor.move_queue`` for one plan row, as an executor task does, and
  report peak RSS, the RSS after those imports, wall seconds and the outcome. With
  ``"park": true`` the row parks its queue in the ledger's `parked` table.

The password travels on stdin, never on a command line.
"""

from __future__ import annotations

import json
import logging
import resource
import sys
import time
from collections.abc import Iterable
from typing import Any

# Seeding publishes without confirms and then waits for the exact depth; persistent
# 16 MiB bodies take a while to reach the queue on a busy 2-core box.
SEED_DEPTH_TIMEOUT_SECONDS = 600.0


def proc_status_kib(field: str) -> int:
    """A ``kB`` field of /proc/self/status (VmRSS: now, VmHWM: this address space's peak)."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} line")


def max_rss_kib() -> int:
    """Peak RSS of this process as getrusage reports it (KiB on Linux).

    Linux carries the peak of the address space replaced by exec over into this
    figure, so it can never be below the spawning process's RSS at spawn time; the
    parent records that floor. VmHWM (reported too) has no such carry-over.
    """
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def seed(request: dict[str, Any]) -> dict[str, Any]:
    import random

    import pika

    from rmq_spark.devtools.demo import wait_for_depth

    rng = random.Random(request["seed"])
    queue = str(request["queue"])
    # (size, count) runs: the request goes through a pipe buffer, so no list per message.
    sizes = [int(size) for size, count in request["runs"] for _ in range(int(count))]
    count = len(sizes)
    started = time.monotonic()
    connection = pika.BlockingConnection(
        pika.ConnectionParameters(
            host="127.0.0.1",
            port=int(request["port"]),
            virtual_host=str(request["vhost"]),
            credentials=pika.PlainCredentials(request["username"], request["password"]),
        )
    )
    try:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True)
        for index, size in enumerate(sizes):
            channel.basic_publish(
                "",
                queue,
                rng.randbytes(size),
                pika.BasicProperties(
                    delivery_mode=pika.DeliveryMode.Persistent, message_id=f"bench-{index}"
                ),
            )
        wait_for_depth(channel, queue, count, timeout=SEED_DEPTH_TIMEOUT_SECONDS)
    finally:
        connection.close()
    return {"seconds": time.monotonic() - started}


def move(request: dict[str, Any]) -> dict[str, Any]:
    """Move one queue exactly as an executor task would; report memory and time."""
    # What a Spark Python worker has loaded before it runs a mapPartitions task, then
    # what the task itself imports.
    import pyspark.worker  # noqa: F401
    from pydantic import SecretStr

    from rmq_spark.config import ClusterConfig
    from rmq_spark.transfer.executor import ExecutorSettings, ParkSettings, move_queue

    baseline_rss = proc_status_kib("VmRSS")
    modules_before = list(sys.modules)
    settings = ExecutorSettings(
        run_id=str(request["run_id"]),
        ledger_path=str(request["ledger_path"]),
        clusters={
            name: ClusterConfig(
                amqp=cluster["amqp"],
                management=cluster["management"],
                username=cluster["username"],
                password=SecretStr(cluster["password"]),
            )
            for name, cluster in request["clusters"].items()
        },
        window_messages=int(request["window_messages"]),
        window_bytes=int(request["window_bytes"]),
        # A park: the row's destination cluster is the parked table (`config.PARKED`).
        park=ParkSettings() if request.get("park") else None,
    )
    started = time.monotonic()
    outcome = move_queue(request["row"], settings, str(request["attempt"]))
    seconds = time.monotonic() - started
    # Imported lazily on the way (pyarrow imports pandas on its first pa.array call, the
    # first intent-log write): in the transfer figure, but paid once per process.
    imported = sorted(_packages(sys.modules) - _packages(modules_before))
    import pyarrow as pa

    pool = pa.default_memory_pool()
    return {
        "baseline_rss_kib": baseline_rss,
        "peak_rss_kib": max_rss_kib(),
        "peak_hwm_kib": proc_status_kib("VmHWM"),
        # Arrow's own buffers (row tables, Parquet pages): their peak, and the allocator
        # behind them, which may keep freed pages (RSS counts them).
        "arrow_peak_bytes": pool.max_memory(),
        "arrow_pool": pool.backend_name,
        "seconds": seconds,
        "imported_during_move": imported,
        "outcome": {
            "status": outcome.status,
            "error": outcome.error,
            "messages": outcome.messages,
            "bytes": outcome.bytes,
            "sessions": outcome.sessions,
            "peak_held_bytes": outcome.peak_held_bytes,
            "mover_seconds": outcome.seconds,
        },
    }


def parked(request: dict[str, Any]) -> dict[str, Any]:
    """The parked table's committed rows of one source queue: the run's files committed
    as `rmq-spark park` commits them (the table created first if it is missing; the
    staged rows completed in this process); and this process's peak RSS."""
    from rmq_spark.park.table import commit_parked, ensure_parked_table
    from rmq_spark.transfer.parked_table import read_parked

    ledger, run_id = str(request["ledger_path"]), str(request["run_id"])
    ensure_parked_table(ledger)
    commit_parked(ledger, run_id)
    names = read_parked(ledger, run_id, ["source_queue"]).column("source_queue").to_pylist()
    return {
        "rows": sum(1 for name in names if name == request["queue"]),
        "peak_rss_kib": max_rss_kib(),
    }


def _packages(modules: Iterable[str]) -> set[str]:
    return {name.split(".")[0] for name in modules if not name.startswith("_")}


COMMANDS = {"seed": seed, "move": move, "parked": parked}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in COMMANDS:
        print(
            f"usage: python -m bench.isolated {{{'|'.join(COMMANDS)}}} < request.json",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="  %(asctime)s %(levelname)s %(message)s"
    )
    logging.getLogger("pika").setLevel(logging.WARNING)  # one INFO line per socket event
    result = COMMANDS[argv[0]](json.load(sys.stdin))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
