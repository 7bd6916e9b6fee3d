"""Memory benchmark: an executor's peak RSS while one mover drains one queue.

The issue's figure: with a 64 MiB byte window, moving 200 x 1 MiB and 20 x 16 MiB
messages must keep the executor's Python process at or under 300 MB. A queue of
20 000 x 1 KiB messages (window capped by message count) is the control.

For each case the benchmark publishes the messages into a fresh source queue, then
runs ONE mover (`rmq_spark.transfer.executor.move_queue`, exactly as an executor task calls
it) in a fresh interpreter (`bench.isolated move`), which reports its own peak RSS
and its RSS after imports. The transfer is then checked against the brokers: the
source is empty, the destination holds every message, the outcome is "moved".
Any failed check makes the script exit 1.

Against local brokers the mover rarely fills its window: confirms come back faster
than it reads the next messages. The "stalled" cases hold the destination under a
memory alarm from the start until the source reports the mover's first prefetch
delivered and unacked, then release it, and the transfer completes. The first
prefetch is what the byte window allows for the largest message a broker may hold
(byte_window.py: 1 message for a 64 MiB window), and the mover learns the real
sizes only from confirmed deliveries, so a destination blocked before the first
confirm costs one message. The mixed case (1 KiB messages with a burst of 32 MiB
ones) shows the byte window holding where no single prefetch fits; "held MiB" is the
mover's own peak of bytes held (`MoveOutcome.peak_held_bytes`).

``--park`` runs the park's cases instead (issue 27): 200 x 16 MiB and the 20 000 x 1 KiB
control parked into the ledger's `parked` table (`transfer/parked.py`), checked by the
table's committed rows of the queue instead of a destination's depth. A park holds a
batch's bodies in its window while it turns them into Arrow rows and one Parquet file.

Run from the repository root (it starts and removes its own two local nodes)::

    python -m bench.memory [--park]

Results go to bench/results/memory-<UTC timestamp>.json and a table is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from rmq_spark.config import PARKED
from rmq_spark.devtools.local_brokers import LocalNode, running_nodes
from rmq_spark.transfer.byte_window import ByteWindow
from rmq_spark.transfer.window import prefetch_for

log = logging.getLogger(__name__)

KiB = 1024
MiB = 1024 * KiB
REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO_ROOT / "bench" / "results"

WINDOW_MESSAGES = 1000
WINDOW_BYTES = 64 * MiB
# What the mover asks for before it has seen a message.
FIRST_PREFETCH = ByteWindow(WINDOW_MESSAGES, WINDOW_BYTES).granted
# The target, in decimal megabytes (300 MB = 286.1 MiB).
TARGET_PEAK_BYTES = 300 * 1000 * 1000
VHOST = "bench"
ATTEMPT = "bench"
# Generous: 320 MiB of persistent messages on two brokers sharing two busy cores.
CHILD_TIMEOUT_SECONDS = 1800.0
# Stalled cases: how long to wait for the full window to be delivered, and how long
# to hold it once it is (the mover reads 64 MiB in well under a second).
STALL_FILL_TIMEOUT_SECONDS = 120.0
STALL_HOLD_SECONDS = 2.0
POLL_SECONDS = 0.1


@dataclass(frozen=True)
class Case:
    count: int
    size: int  # the largest message
    stalled: bool = False
    control: bool = False
    mixed: tuple[int, ...] = ()  # every message's size, when they differ
    park: bool = False  # into the ledger's parked table instead of a queue

    @property
    def name(self) -> str:
        size = f"{self.size // MiB} MiB" if self.size >= MiB else f"{self.size // KiB} KiB"
        if self.mixed:
            return f"{self.count} mixed, to {size}"
        return f"{self.count} x {size}{', stalled' if self.stalled else ''}" + (
            ", parked" if self.park else ""
        )

    @property
    def sizes(self) -> list[int]:
        return list(self.mixed) or [self.size] * self.count

    @property
    def runs(self) -> list[tuple[int, int]]:
        """The sizes as (size, count) runs, in order."""
        runs: list[tuple[int, int]] = []
        for size in self.sizes:
            if runs and runs[-1][0] == size:
                runs[-1] = (size, runs[-1][1] + 1)
            else:
                runs.append((size, 1))
        return runs

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)


CASES = (
    Case(200, MiB),
    Case(20, 16 * MiB),
    Case(200, MiB, stalled=True),
    Case(20, 16 * MiB, stalled=True),
    Case(20_000, KiB, control=True),
    # 1 KiB messages with a burst of four 32 MiB ones after the first 3000: a
    # prefetch sized for the small ones would have all four out at once.
    Case(6004, 32 * MiB, mixed=(KiB,) * 3000 + (32 * MiB,) * 4 + (KiB,) * 3000),
)
# `--park` (issue 27): a park holds each batch's bodies in its window while it builds the
# batch's rows and writes them as one Parquet data file.
PARK_CASES = (
    Case(200, 16 * MiB, park=True),
    Case(20_000, KiB, control=True, park=True),
)


class BenchmarkError(Exception):
    """A step of the benchmark failed (not a figure over target: that is reported)."""


# -- measuring one case ---------------------------------------------------------------


def run_case(
    case: Case, source: LocalNode, destination: LocalNode, ledger: Path, run_id: str
) -> dict[str, Any]:
    """Seed, move in a fresh process, check the brokers; returns the case's figures."""
    source_queue = f"memory.{case.count}x{case.size}{'.stalled' if case.stalled else ''}.{run_id}"
    # A park's plan row names its source queue as its destination (`discover_parked`).
    destination_queue = source_queue if case.park else f"{source_queue}.moved"
    prefetch = prefetch_for(WINDOW_MESSAGES, WINDOW_BYTES, case.size)
    log.info("%s: seeding %s (prefetch will be %d)", case.name, source_queue, prefetch)
    seeded = run_isolated(
        "seed",
        {
            "port": source.amqp_port,
            "username": source.username,
            "password": source.password,
            "vhost": VHOST,
            "queue": source_queue,
            "runs": case.runs,
            "seed": f"{run_id}/{case.name}",
        },
    )
    if not case.park:
        declare(destination, destination_queue)
    if (depth := passive_depth(source, source_queue)) != case.count:
        raise BenchmarkError(f"{case.name}: seeded {depth} messages, expected {case.count}")

    log.info("%s: moving in a fresh process", case.name)
    load_before = os.getloadavg()[0]
    parent_rss_kib = reset_peak_rss()
    request = {
        "run_id": run_id,
        "ledger_path": str(ledger),
        "clusters": {node.label: cluster(node) for node in (source, destination)},
        "window_messages": WINDOW_MESSAGES,
        "window_bytes": WINDOW_BYTES,
        "attempt": ATTEMPT,
        "park": case.park,
        "row": {
            "source_cluster": source.label,
            "source_vhost": VHOST,
            "source_queue": source_queue,
            "destination_cluster": PARKED if case.park else destination.label,
            "destination_vhost": VHOST,
            "destination_queue": destination_queue,
            "messages": case.count,
            "message_bytes": case.total_bytes,
        },
    }
    held_unacked = None
    if case.stalled:
        with stalled(destination):
            mover = start_isolated("move", request)
            try:
                held_unacked = hold_full_window(
                    mover, source, source_queue, case.count, FIRST_PREFETCH
                )
            except BaseException:
                stop_child(mover)
                raise
        moved = finish_isolated("move", mover)
    else:
        moved = finish_isolated("move", start_isolated("move", request))
    outcome = moved["outcome"]
    committed = parked_commit(ledger, run_id, source_queue) if case.park else None
    problems = check(
        case,
        outcome,
        source_left=passive_depth(source, source_queue),
        destination_depth=int(committed["rows"])
        if committed is not None
        else passive_depth(destination, destination_queue),
    )
    delete_queue(source, source_queue)
    if not case.park:
        delete_queue(destination, destination_queue)

    baseline = moved["baseline_rss_kib"] * KiB
    peak = moved["peak_rss_kib"] * KiB
    return {
        "case": case.name,
        "control": case.control,
        "count": case.count,
        "size_bytes": case.size,
        "total_bytes": case.total_bytes,
        "prefetch": prefetch,
        "in_flight_cap_mib": round(min(prefetch * case.size, WINDOW_BYTES) / MiB, 1),
        "mover_peak_held_mib": mib(outcome["peak_held_bytes"]),
        "baseline_rss_mib": mib(baseline),
        "peak_rss_mib": mib(peak),
        # The process of a park's commit (its staged rows completed a row group at a
        # time, the Delta commit, then the queue's rows read back to count): its peak RSS.
        "commit_peak_rss_mib": None
        if committed is None
        else mib(int(committed["peak_rss_kib"]) * KiB),
        "transfer_rss_mib": mib(peak - baseline),
        "peak_vm_hwm_mib": mib(moved["peak_hwm_kib"] * KiB),
        "arrow_peak_mib": mib(moved["arrow_peak_bytes"]),
        "arrow_pool": moved["arrow_pool"],
        "parent_rss_at_spawn_mib": mib(parent_rss_kib * KiB),
        "within_target": peak <= TARGET_PEAK_BYTES,
        "seconds": round(moved["seconds"], 2),
        # A stalled case's time includes the hold: no throughput figure.
        "mb_per_second": None
        if case.stalled
        else round(case.total_bytes / moved["seconds"] / 1e6, 1),
        "stalled": case.stalled,
        "unacked_while_stalled": held_unacked,
        "imported_during_move": moved["imported_during_move"],
        "seed_seconds": round(seeded["seconds"], 1),
        "load_average_1m_before": round(load_before, 2),
        "outcome": outcome,
        "checks_passed": not problems,
        "problems": problems,
    }


def check(
    case: Case, outcome: dict[str, Any], *, source_left: int, destination_depth: int
) -> list[str]:
    """What the brokers and the outcome say, against what must hold after a move."""
    expected = {
        "outcome status": ("moved", outcome["status"]),
        "outcome messages": (case.count, outcome["messages"]),
        "outcome bytes": (case.total_bytes, outcome["bytes"]),
        "source depth": (0, source_left),
        "destination depth": (case.count, destination_depth),
    }
    problems = [
        f"{case.name}: {what}: expected {want}, found {got}"
        for what, (want, got) in expected.items()
        if want != got
    ]
    if outcome["error"]:
        problems.append(f"{case.name}: mover error: {outcome['error']}")
    return problems


def run_isolated(command: str, request: dict[str, Any]) -> dict[str, Any]:
    """Run `python -m bench.isolated <command>` with the request on stdin; its result."""
    return finish_isolated(command, start_isolated(command, request))


def start_isolated(command: str, request: dict[str, Any]) -> subprocess.Popen[str]:
    """Start the child with the request already in its stdin pipe (it is small)."""
    read_end, write_end = os.pipe()
    with os.fdopen(write_end, "w", encoding="utf-8") as pipe:
        pipe.write(json.dumps(request))
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "bench.isolated", command],
            stdin=read_end,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
        )
    finally:
        os.close(read_end)


def finish_isolated(command: str, child: subprocess.Popen[str]) -> dict[str, Any]:
    """Wait for the child and read its one-line JSON result (it logs to stderr)."""
    try:
        output, _ = child.communicate(timeout=CHILD_TIMEOUT_SECONDS)
    except BaseException:
        stop_child(child)
        raise
    code = child.returncode
    if code != 0:
        raise BenchmarkError(f"bench.isolated {command} exited with {code}")
    lines = output.strip().splitlines()
    if not lines:
        raise BenchmarkError(f"bench.isolated {command} printed no result")
    reply: dict[str, Any] = json.loads(lines[-1])
    return reply


def stop_child(child: subprocess.Popen[str]) -> None:
    if child.poll() is None:
        child.kill()
        child.wait()


@contextlib.contextmanager
def stalled(node: LocalNode) -> Iterator[None]:
    """Hold a memory alarm on the node: it blocks publishers (confirms stop) until exit."""
    limit = memory_limit(node)
    node.rabbitmqctl("set_vm_memory_high_watermark", "0")
    try:
        deadline = time.monotonic() + STALL_FILL_TIMEOUT_SECONDS
        while not node.management("GET", f"/api/nodes/{node.node_name}", timeout=10)["mem_alarm"]:
            if time.monotonic() > deadline:
                raise BenchmarkError(f"node {node.label}: the memory alarm never went on")
            time.sleep(POLL_SECONDS)
        yield
    finally:
        node.rabbitmqctl("set_vm_memory_high_watermark", "absolute", str(limit))


def hold_full_window(
    mover: subprocess.Popen[str], source: LocalNode, queue: str, count: int, prefetch: int
) -> int:
    """Wait until the source has delivered the whole prefetch (unacked), then hold it.

    Returns the unacked count seen. The mover cannot get an ack out while the
    destination is blocked, so it holds its full window of bodies, and most of them
    a second time in pika's outbound buffer (the rest sits in socket buffers).
    """
    full = min(prefetch, count)
    deadline = time.monotonic() + STALL_FILL_TIMEOUT_SECONDS
    while (unacked := count - passive_depth(source, queue)) < full:
        if mover.poll() is not None:
            raise BenchmarkError(f"the mover exited with {mover.returncode} while stalled")
        if time.monotonic() > deadline:
            raise BenchmarkError(
                f"stalled mover: {unacked} of {full} messages delivered after "
                f"{STALL_FILL_TIMEOUT_SECONDS:.0f}s"
            )
        time.sleep(POLL_SECONDS)
    time.sleep(STALL_HOLD_SECONDS)
    return unacked


def reset_peak_rss() -> int:
    """Reset this process's peak RSS and return its RSS (KiB).

    A child's getrusage peak starts at the parent's peak when it is exec'd; resetting
    (clear_refs 5, Linux >= 4.0) keeps that floor at the parent's current, small RSS.
    """
    with open("/proc/self/clear_refs", "w", encoding="ascii") as clear_refs:
        clear_refs.write("5")
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise BenchmarkError("/proc/self/status has no VmHWM line")


# -- brokers ------------------------------------------------------------------------------


def declare(node: LocalNode, queue: str) -> None:
    connection = node.connect(VHOST)
    try:
        connection.channel().queue_declare(queue, durable=True)
    finally:
        connection.close()


def passive_depth(node: LocalNode, queue: str) -> int:
    """Exact ready count (AMQP passive declare; management counters are sampled)."""
    connection = node.connect(VHOST)
    try:
        return int(connection.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        connection.close()


def parked_commit(ledger: Path, run_id: str, queue: str) -> dict[str, Any]:
    """The park's commit, in a child, as `rmq-spark park` commits a run's files (the
    Delta readers would raise this process's RSS, which floors the next mover's peak,
    `bench.isolated.max_rss_kib`): the committed rows of one source queue (`rows`) and
    the child's peak RSS (`peak_rss_kib`)."""
    return run_isolated("parked", {"ledger_path": str(ledger), "run_id": run_id, "queue": queue})


def delete_queue(node: LocalNode, queue: str) -> None:
    connection = node.connect(VHOST)
    try:
        connection.channel().queue_delete(queue)
    finally:
        connection.close()


def cluster(node: LocalNode) -> dict[str, Any]:
    """The cluster as the child builds its ClusterConfig (password via stdin only)."""
    return {
        "amqp": [node.amqp_uri],
        "management": node.management_url,
        "username": node.username,
        "password": node.password,
    }


def rabbitmq_version(node: LocalNode) -> str:
    return str(node.management("GET", "/api/overview", timeout=10).get("rabbitmq_version", "?"))


@functools.cache
def memory_limit(node: LocalNode) -> int:
    """The node's memory high watermark in bytes (restored after a stall).

    Read once: the API samples it, so right after a stall it may still say 0.
    """
    return int(node.management("GET", f"/api/nodes/{node.node_name}", timeout=10)["mem_limit"])


# -- report -------------------------------------------------------------------------------


def mib(value: float) -> float:
    return round(value / MiB, 1)


def machine_facts() -> dict[str, Any]:
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        total_kib = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal:"))
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "memory_total_gib": round(total_kib / MiB, 1),
        "kernel": platform.release(),
        "libc": " ".join(platform.libc_ver()),
        "python": platform.python_version(),
        "pika": metadata.version("pika"),
        "pyarrow": metadata.version("pyarrow"),
        "note": "the two RabbitMQ nodes run on the same cores as the mover",
    }


def source_tree() -> dict[str, Any]:
    """The commit measured, and whether rmq_spark/ differed from it (figures depend on it)."""

    def git(*args: str) -> str:
        result = subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=False
        )
        return result.stdout.rstrip() if result.returncode == 0 else "?"

    return {
        "commit": git("rev-parse", "HEAD"),
        "rmq_spark_modified": git("status", "--porcelain", "--", "rmq_spark").splitlines(),
    }


def table(cases: list[dict[str, Any]]) -> str:
    header = (
        f"{'case':<24} {'prefetch':>8} {'cap MiB':>8} {'held MiB':>8} {'base MiB':>9} "
        f"{'peak MiB':>9} {'peak-base':>9} {'seconds':>8} {'MB/s':>7}  result"
    )
    lines = [header, "-" * len(header)]
    for case in cases:
        verdict = "ok" if case["checks_passed"] else "CHECK FAILED"
        if not case["control"]:
            verdict += ", within 300 MB" if case["within_target"] else ", OVER 300 MB"
        throughput = "-" if case["mb_per_second"] is None else case["mb_per_second"]
        lines.append(
            f"{case['case']:<24} {case['prefetch']:>8} {case['in_flight_cap_mib']:>8} "
            f"{case['mover_peak_held_mib']:>8} {case['baseline_rss_mib']:>9} "
            f"{case['peak_rss_mib']:>9} "
            f"{case['transfer_rss_mib']:>9} {case['seconds']:>8} {throughput:>7}  "
            f"{verdict}"
        )
    return "\n".join(lines)


def write_results(results: dict[str, Any], directory: Path, stamp: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"memory-{stamp}.json"
    partial = target.with_name(f"{target.name}.tmp")
    partial.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    partial.replace(target)
    return target


# -- main ---------------------------------------------------------------------------------


def run(results_dir: Path, cases: tuple[Case, ...]) -> int:
    started = datetime.now(UTC)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    run_id = f"bench-memory-{stamp}"
    figures: list[dict[str, Any]] = []
    problems: list[str] = []
    with (
        tempfile.TemporaryDirectory(prefix="rmq-spark-bench-memory-") as base,
        running_nodes(["src", "dst"], Path(base) / "brokers", remove_data=True) as nodes,
    ):
        source, destination = nodes
        for node in nodes:
            node.add_vhost(VHOST)
        facts = {**machine_facts(), "rabbitmq": rabbitmq_version(source)}
        for case in cases:
            figure = run_case(case, source, destination, Path(base) / "ledger", run_id)
            figures.append(figure)
            problems.extend(figure["problems"])
    results = {
        "benchmark": "memory",
        "started_at": started.isoformat(),
        "command": "python -m bench.memory" + (" --park" if cases == PARK_CASES else ""),
        "machine": facts,
        "source": source_tree(),
        "window_messages": WINDOW_MESSAGES,
        "window_bytes": WINDOW_BYTES,
        "target_peak_bytes": TARGET_PEAK_BYTES,
        "rss_source": "peak: getrusage(RUSAGE_SELF).ru_maxrss of the mover process; "
        "baseline: its VmRSS after importing pyspark.worker and rmq_spark.transfer.executor, "
        "before moving",
        "cases": figures,
        "checks_passed": not problems,
    }
    path = write_results(results, results_dir, stamp)
    print(table(figures))
    print(f"results: {path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path}")
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__)
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument(
        "--park", action="store_true", help="park the queues in the parked table (PARK_CASES)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("pika").setLevel(logging.WARNING)  # one INFO line per socket event
    started = time.monotonic()
    try:
        code = run(args.results_dir, PARK_CASES if args.park else CASES)
    except BenchmarkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    log.info("benchmark took %.0fs", time.monotonic() - started)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
