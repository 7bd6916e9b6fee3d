"""rmq-spark against RabbitMQ's Shovel, side by side in one run (``make bench``).

    python -m bench.throughput            # the full run (~30 min on 2 cores, +4.3)
    python -m bench.throughput --quick    # 1 round, small counts: does it all work?
    python -m bench.throughput --rabbitmq 4.3 --fraction 0.5 --rounds 2
                                          # only the 4.3 section, half the messages

Starts its own two local nodes, then for each scenario seeds an identical, fresh
queue for every contender run and runs the contenders alternately (A B A B ...),
so a load change on the shared 2-core box hits every contender alike. Reports
per-contender medians and, per pair, the median of the per-round ratios; checks
the issue's targets; writes ``bench/results/throughput-<stamp>.json`` and a chart
``throughput-<stamp>.png`` beside it.

Before the scenarios, one small job runs untimed (`warm_up`): the first local job
writes the driver JVM's class-data-sharing archive (~10 s, once per machine and
checkout); the report keeps its time as ``warm_up_job_seconds``.

Scenarios (full run):

1. one 100k x 1 KiB persistent queue, window/prefetch 1000, classic -> classic and
   classic -> quorum: Shovel, mover alone (ledger on), full job; plus, on
   classic -> classic, the mover with no ledger (ledger cost, item 5);
2. message sizes 100 B, 64 KiB, 1 MiB (1 KiB is scenario 1): Shovel vs mover;
3. the mover's window curve: 1 ... 5000;
4. DR: 20 queues x 50k x 1 KiB over 2 vhosts: orchestrated shovels vs the job;
5. resource use from the runs above: client CPU per 100k, peak RSS, job overhead.

Those run on the host's RabbitMQ (3.10). Where a RabbitMQ 4.3 root is built
(``make roots``; nodes from a root need root), a 4.3 section follows (`peer_section`):
scenario 1's and 2's workloads on 4.3 nodes with the local shovel (RabbitMQ 4.2+)
as a contender beside the Shovel, the mover and the job, in two layouts:
``two_nodes`` (two clusters, as above; a local shovel cannot move between clusters,
and the report says so) and ``one_node`` (one node, queue into a sibling vhost:
where all four can run).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

from bench import chart
from bench.contenders import (
    LOCAL_SHOVEL,
    REPO,
    SHOVEL,
    WINDOW_BYTES,
    BenchError,
    Run,
    job_config,
    not_applicable,
    run_job,
    run_local_shovel,
    run_mover,
    run_orchestrated_shovels,
    run_shovel,
)
from bench.workload import (
    LAYOUTS,
    Brokers,
    Workload,
    declare_destination,
    delete_queues,
    depths_after,
    load_average,
    local_brokers,
    machine,
    seed_queue,
)
from rmq_spark.config import WindowConfig
from rmq_spark.devtools import rabbitmq_roots
from rmq_spark.transfer.window import prefetch_for

log = logging.getLogger("bench.throughput")

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SINGLE_VHOST = "bench"
DR_VHOSTS = ("dr-a", "dr-b")
# The RabbitMQ the local shovel is measured on (it needs 4.2+; 4.3 is the newest root).
PEER_VERSION = "4.3"
# Every contender of the 4.x section, in the order each round runs them.
PEER_CONTENDERS = (SHOVEL, LOCAL_SHOVEL, "mover", "job")
DEFAULT_WINDOW = WindowConfig().messages
# Scenarios 1, 2 and 5 compare at the prefetch/window, the same for every
# contender; the DR scenario runs the job as shipped (DEFAULT_WINDOW) and gives the
# orchestrated shovels the same prefetch.
SINGLE_QUEUE_WINDOW = 1000
# The untimed first job (`warm_up`).
WARM_UP_MESSAGES = 1_000
WINDOWS = (1, 10, 100, 300, 1000, 5000)
KIB = 1024
# Lets a broker finish deleting the last run's queues before the next run starts.
SETTLE_SECONDS = 2.0
# The job on 2 cores: local[*] gives 2 task slots, so the DR job runs 2 tasks (more
# tasks than slots would leave the last wave with an idle core) of 3 queues each on
# one I/O loop: a transfer mostly waits for round trips, and on this box 6 queues at
# once moved the 1M messages in 75 s where 4 (2 per task) took 91 s and 8 (4 per
# task) 79 s. The orchestrated shovels get 5 at once, as in the seed.
DR_JOB_MAX_ACTIVE = 6
DR_JOB_QUEUES_PER_TASK = 3

# The targets.
MOVER_VS_SHOVEL_MIN = 1.2
DR_JOB_VS_SHOVELS_MAX = 0.8
FIXED_OVERHEAD_MAX_SECONDS = 15.0
CLIENT_CPU_PER_100K_MAX = 3.0
LEDGER_OVERHEAD_MAX = 0.10
DEFAULT_WINDOW_OF_PLATEAU_MIN = 0.90
GOALS = {
    "mover_vs_shovel_min": MOVER_VS_SHOVEL_MIN,
    "dr_job_vs_shovels_max": DR_JOB_VS_SHOVELS_MAX,
    "fixed_overhead_max_seconds": FIXED_OVERHEAD_MAX_SECONDS,
    "client_cpu_per_100k_max": CLIENT_CPU_PER_100K_MAX,
    "ledger_overhead_max": LEDGER_OVERHEAD_MAX,
    "default_window_of_plateau_min": DEFAULT_WINDOW_OF_PLATEAU_MIN,
    "default_window": DEFAULT_WINDOW,
}


@dataclass(frozen=True)
class Scale:
    """How much each scenario moves, and how often; `QUICK` only checks it all works."""

    single_messages: int = 100_000
    rounds: int = 3
    # The job includes Spark start and verification (~1-2 min each): fewer rounds.
    job_rounds: int = 2
    quorum_job_rounds: int = 1
    # Large messages: fewer of them (about 256 MiB per queue).
    size_messages: dict[int, int] = field(
        default_factory=lambda: {100: 100_000, 64 * KIB: 4_000, 1024 * KIB: 256}
    )
    size_rounds: int = 2
    # Small windows are slow per message: fewer messages, same rate measure.
    window_messages: dict[int, int] = field(
        default_factory=lambda: {
            1: 2_000,
            10: 20_000,
            100: 100_000,
            300: 100_000,
            1000: 100_000,
            5000: 100_000,
        }
    )
    window_rounds: int = 1
    dr_queues_per_vhost: int = 10
    dr_messages: int = 50_000
    dr_rounds: int = 1


def scaled(scale: Scale, *, fraction: float = 1.0, max_rounds: int | None = None) -> Scale:
    """`scale` with every message count times `fraction` (at least 1) and every round
    count at most `max_rounds`: a shorter run of the same scenarios."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if max_rounds is not None and max_rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {max_rounds}")

    def count(messages: int) -> int:
        return max(1, round(messages * fraction))

    def rounds(value: int) -> int:
        return value if max_rounds is None else min(value, max_rounds)

    return replace(
        scale,
        single_messages=count(scale.single_messages),
        rounds=rounds(scale.rounds),
        job_rounds=rounds(scale.job_rounds),
        quorum_job_rounds=rounds(scale.quorum_job_rounds),
        size_messages={size: count(n) for size, n in scale.size_messages.items()},
        size_rounds=rounds(scale.size_rounds),
        window_messages={window: count(n) for window, n in scale.window_messages.items()},
        window_rounds=rounds(scale.window_rounds),
        dr_messages=count(scale.dr_messages),
        dr_rounds=rounds(scale.dr_rounds),
    )


QUICK = Scale(
    single_messages=10_000,
    rounds=1,
    job_rounds=1,
    quorum_job_rounds=1,
    size_messages={100: 10_000, 64 * KIB: 400, 1024 * KIB: 32},
    size_rounds=1,
    window_messages={1: 300, 10: 2_000, 100: 10_000, 300: 10_000, 1000: 10_000, 5000: 10_000},
    dr_queues_per_vhost=2,
    dr_messages=5_000,
)


@dataclass
class Bench:
    """One benchmark run: the brokers, a scratch directory, and every Run so far."""

    brokers: Brokers
    work_dir: Path
    results: dict[str, dict[str, list[Run]]] = field(default_factory=dict)
    # Contenders that cannot run on these brokers, and why (the local shovel across clusters).
    not_applicable: dict[str, str] = field(default_factory=dict)

    def record(self, scenario: str, run: Run) -> None:
        run.details["load_1m"] = load_average()[0]  # other tenants of the box, for the record
        log.info(
            "%s %-20s %8d msgs %8.2fs %9.0f msg/s cpu %s",
            scenario,
            run.contender,
            run.messages,
            run.seconds,
            run.rate,
            run.client_cpu_seconds,
        )
        self.results.setdefault(scenario, {}).setdefault(run.contender, []).append(run)

    def ledger(self, run_id: str) -> Path:
        return self.work_dir / "ledgers" / run_id


Contender = tuple[str, int, Callable[[int], Run]]  # name, rounds, run(round)


def alternate(bench: Bench, scenario: str, rounds: int, contenders: Sequence[Contender]) -> None:
    """A B C A B C ...: each contender once per round, while it has rounds left."""
    for round_ in range(rounds):
        for _name, contender_rounds, run in contenders:
            if round_ < contender_rounds:
                bench.record(scenario, run(round_))


def single_queue_run(
    bench: Bench,
    scenario: str,
    contender: str,
    round_: int,
    workload: Workload,
    *,
    destination_type: str = "classic",
    window: int = SINGLE_QUEUE_WINDOW,
) -> Run:
    """Seed a fresh queue, let one contender move it, delete it on both nodes."""
    brokers, vhost = bench.brokers, SINGLE_VHOST
    queue = f"{scenario}.{contender}.{round_}"
    run_id = f"{scenario}-{contender}-{round_}".replace(".", "-").replace("_", "-")
    seed_queue(brokers, vhost, queue, workload, seed=f"{scenario}/{workload.size}")
    declare_destination(brokers, vhost, queue, destination_type)
    prefetch = prefetch_for(window, WINDOW_BYTES, workload.size)
    try:
        if contender == SHOVEL:
            run = run_shovel(brokers, vhost, queue, workload, prefetch)
        elif contender == LOCAL_SHOVEL:
            run = run_local_shovel(brokers, vhost, queue, workload, credit=prefetch)
        elif contender in ("mover", "mover_no_ledger"):
            ledger = bench.ledger(run_id) if contender == "mover" else None
            run = run_mover(
                brokers, vhost, queue, workload, window=window, ledger=ledger, run_id=run_id
            )
        else:
            config = job_config(
                brokers,
                vhosts=[vhost],
                queues=[queue],
                ledger=bench.ledger(run_id),
                destination_type=destination_type,
                window=window,
                max_active=1,
            )
            run = run_job(brokers, config, bench.work_dir, run_id, workload.messages)
        run.details |= depths_after(brokers, vhost, [queue])
        return run
    finally:
        delete_queues(brokers, vhost, [queue])
        time.sleep(SETTLE_SECONDS)


def warm_up(bench: Bench) -> float:
    """One small, untimed job before the scenarios; returns its wall seconds.

    The first local job on a machine (and in each new checkout) writes the driver
    JVM's class-data-sharing archive as it exits (`spark-submit.sh`, ~10 s once), and
    finds cold caches. The scenarios measure the job as it runs from then on; this
    first run's time goes into the report on its own.
    """
    run = single_queue_run(bench, "warm_up", "job", 0, Workload(WARM_UP_MESSAGES, KIB))
    log.info("warm-up job: %.2fs (not a contender run)", run.seconds)
    return round(run.seconds, 2)


def single_queue(bench: Bench, scale: Scale) -> None:
    """Scenario 1 (and 5, the ledger pair): one 1 KiB queue, classic and quorum."""
    workload = Workload(scale.single_messages, KIB)
    for scenario, destination_type, contenders in (
        (
            "single_classic",
            "classic",
            (
                ("shovel", scale.rounds),
                ("mover", scale.rounds),
                ("mover_no_ledger", scale.rounds),
                ("job", scale.job_rounds),
            ),
        ),
        (
            "single_quorum",
            "quorum",
            (("shovel", scale.rounds), ("mover", scale.rounds), ("job", scale.quorum_job_rounds)),
        ),
    ):
        alternate(
            bench,
            scenario,
            scale.rounds,
            [
                (
                    name,
                    rounds,
                    partial(
                        single_queue_run,
                        bench,
                        scenario,
                        name,
                        workload=workload,
                        destination_type=destination_type,
                    ),
                )
                for name, rounds in contenders
            ],
        )


def sizes(bench: Bench, scale: Scale, contenders: Sequence[str] = (SHOVEL, "mover")) -> None:
    """Scenario 2: Shovel vs mover across message sizes, same prefetch for both."""
    for size, messages in scale.size_messages.items():
        scenario = f"size_{size}"
        workload = Workload(messages, size)
        alternate(
            bench,
            scenario,
            scale.size_rounds,
            [
                (
                    name,
                    scale.size_rounds,
                    partial(single_queue_run, bench, scenario, name, workload=workload),
                )
                for name in contenders
            ],
        )


def windows(bench: Bench, scale: Scale) -> None:
    """Scenario 3: the mover's rate against its window (prefetch)."""
    for round_ in range(scale.window_rounds):
        for window in WINDOWS:
            workload = Workload(scale.window_messages[window], KIB)
            bench.record(
                f"window_{window}",
                single_queue_run(
                    bench, f"window_{window}", "mover", round_, workload, window=window
                ),
            )


def runnable_peers(bench: Bench) -> list[str]:
    """The 4.x section's contenders that can run on these brokers; the others go into
    `Bench.not_applicable` with the reason (the local shovel between two clusters)."""
    version = bench.brokers.rabbitmq_version()
    for name in PEER_CONTENDERS:
        reason = not_applicable(name, bench.brokers.layout, version)
        if reason is not None:
            bench.not_applicable[name] = reason
    return [name for name in PEER_CONTENDERS if name not in bench.not_applicable]


def peers_single_queue(bench: Bench, scale: Scale) -> None:
    """The 4.x section, scenario 1 with the local shovel among the contenders.

    Same workloads, same prefetch (the local shovel's credit), same A B C D rounds as
    on the host's RabbitMQ.
    """
    runnable = runnable_peers(bench)
    workload = Workload(scale.single_messages, KIB)
    for scenario, destination_type, job_rounds in (
        ("single_classic", "classic", scale.job_rounds),
        ("single_quorum", "quorum", scale.quorum_job_rounds),
    ):
        alternate(
            bench,
            scenario,
            scale.rounds,
            [
                (
                    name,
                    job_rounds if name == "job" else scale.rounds,
                    partial(
                        single_queue_run,
                        bench,
                        scenario,
                        name,
                        workload=workload,
                        destination_type=destination_type,
                    ),
                )
                for name in runnable
            ],
        )


def peers_sizes(bench: Bench, scale: Scale) -> None:
    """The 4.x section, scenario 2: every contender but the job across message sizes."""
    sizes(bench, scale, [name for name in runnable_peers(bench) if name != "job"])


def dr(bench: Bench, scale: Scale) -> None:
    """Scenario 4: the DR fail-back, 2 vhosts of 1 KiB queues: job vs orchestrated shovels."""
    brokers = bench.brokers
    workload = Workload(scale.dr_messages, KIB)
    queues = [
        (vhost, f"dr.q{index:02d}")
        for vhost in DR_VHOSTS
        for index in range(scale.dr_queues_per_vhost)
    ]

    def prepare() -> None:
        for vhost, queue in queues:
            seed_queue(brokers, vhost, queue, workload, seed=f"dr/{vhost}/{queue}")
            declare_destination(brokers, vhost, queue, "classic")

    def clean() -> None:
        for vhost in DR_VHOSTS:
            delete_queues(brokers, vhost, [q for v, q in queues if v == vhost])
        time.sleep(SETTLE_SECONDS)

    def left_behind(run: Run) -> Run:
        for vhost in DR_VHOSTS:
            found = depths_after(brokers, vhost, [q for v, q in queues if v == vhost])
            for key, count in found.items():
                run.details[key] = run.details.get(key, 0) + count
        return run

    def shovels(_round: int) -> Run:
        prepare()
        try:
            return left_behind(run_orchestrated_shovels(brokers, queues, workload, DEFAULT_WINDOW))
        finally:
            clean()

    def job(round_: int) -> Run:
        prepare()
        run_id = f"dr-job-{round_}"
        config = job_config(
            brokers,
            vhosts=list(DR_VHOSTS),
            queue_pattern=r"dr\.q\d+",
            ledger=bench.ledger(run_id),
            destination_type="classic",
            window=DEFAULT_WINDOW,
            max_active=DR_JOB_MAX_ACTIVE,
            queues_per_task=DR_JOB_QUEUES_PER_TASK,
        )
        try:
            return left_behind(
                run_job(brokers, config, bench.work_dir, run_id, workload.messages * len(queues))
            )
        finally:
            clean()

    alternate(
        bench,
        "dr",
        scale.dr_rounds,
        [("orchestrated_shovels", scale.dr_rounds, shovels), ("job", scale.dr_rounds, job)],
    )


# -- figures ------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def summarise(runs: Sequence[Run]) -> dict[str, Any]:
    seconds = [run.seconds for run in runs]
    summary: dict[str, Any] = {
        "runs": len(runs),
        "messages": max(run.messages for run in runs),
        "bytes": max(run.bytes for run in runs),
        "median_seconds": round(median(seconds), 2),
        "min_seconds": round(min(seconds), 2),
        "max_seconds": round(max(seconds), 2),
        "median_rate": round(median([run.rate for run in runs]), 1),
        "median_mib_per_second": round(
            median([run.bytes / run.seconds / 2**20 for run in runs]), 2
        ),
        "median_broker_cpu_seconds": {
            side: round(median([run.broker_cpu_seconds[side] for run in runs]), 2)
            for side in runs[0].broker_cpu_seconds
        },
    }
    incomplete = [run for run in runs if run.details.get("left_in_source")]
    if incomplete:
        # The contender said it was done, yet the source still held messages.
        summary["runs_leaving_messages_in_source"] = [
            {"moved": run.messages, "left_in_source": run.details["left_in_source"]}
            for run in incomplete
        ]
    cpu = [run.client_cpu_seconds for run in runs if run.client_cpu_seconds is not None]
    if cpu:
        summary["median_client_cpu_seconds"] = round(median(cpu), 2)
    rss = [run.peak_rss_kib for run in runs if run.peak_rss_kib is not None]
    if rss:
        summary["max_peak_rss_mib"] = round(max(rss) / 1024, 1)
    overhead = [run.details["fixed_overhead_seconds"] for run in runs if "stages" in run.details]
    if overhead:
        summary["median_fixed_overhead_seconds"] = round(median(overhead), 2)
        summary["median_stages"] = {
            stage: round(median([run.details["stages"][stage] for run in runs]), 2)
            for stage in runs[0].details["stages"]
        }
    return summary


def speedup(baseline: Sequence[Run], contender: Sequence[Run]) -> float:
    """How many times faster `contender` is than `baseline`: median of per-round ratios."""
    pairs = list(zip(baseline, contender, strict=False))
    return round(median([b.seconds / c.seconds for b, c in pairs]), 3)


def figures(results: dict[str, dict[str, list[Run]]]) -> dict[str, Any]:
    """Per scenario: contender summaries and the ratios the targets are about."""
    out: dict[str, Any] = {}
    for scenario, by_contender in results.items():
        entry: dict[str, Any] = {name: summarise(runs) for name, runs in by_contender.items()}
        ratios = {}
        if SHOVEL in by_contender:
            for name in ("mover", "job", LOCAL_SHOVEL):
                if name in by_contender:
                    ratios[f"{name}_vs_shovel"] = speedup(by_contender[SHOVEL], by_contender[name])
        if LOCAL_SHOVEL in by_contender and "mover" in by_contender:
            ratios["mover_vs_local_shovel"] = speedup(
                by_contender[LOCAL_SHOVEL], by_contender["mover"]
            )
        if "mover_no_ledger" in by_contender:
            pairs = zip(by_contender["mover"], by_contender["mover_no_ledger"], strict=False)
            ratios["ledger_overhead"] = round(
                median([(on.seconds - off.seconds) / on.seconds for on, off in pairs]), 3
            )
        if "orchestrated_shovels" in by_contender:
            pairs = zip(by_contender["job"], by_contender["orchestrated_shovels"], strict=False)
            ratios["job_time_vs_shovels"] = round(
                median([j.seconds / s.seconds for j, s in pairs]), 3
            )
        entry["ratios"] = ratios
        out[scenario] = entry
    return out


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, each with the measured figure and met/missed.

    A target whose scenario did not complete is reported as not measured (and missed).
    """

    def single(scenario: str, name: str, figure: str) -> Any:
        return summary[scenario][name][figure]

    def client_cpu_per_100k() -> float:
        mover: dict[str, float] = summary["single_classic"]["mover"]
        return round(mover["median_client_cpu_seconds"] * 100_000 / mover["messages"], 2)

    def default_window_share() -> float:
        rates: dict[int, float] = {
            w: summary[f"window_{w}"]["mover"]["median_rate"] for w in WINDOWS
        }
        return round(rates[DEFAULT_WINDOW] / max(rates.values()), 3)

    checks: list[tuple[str, Callable[[], Any], str, float]] = [
        (
            "mover vs Shovel, 1 KiB classic->classic (x faster)",
            lambda: summary["single_classic"]["ratios"]["mover_vs_shovel"],
            ">=",
            MOVER_VS_SHOVEL_MIN,
        ),
        (
            "mover vs Shovel, 1 KiB classic->quorum (x faster)",
            lambda: summary["single_quorum"]["ratios"]["mover_vs_shovel"],
            ">=",
            MOVER_VS_SHOVEL_MIN,
        ),
        (
            "DR: job wall time / orchestrated shovels' wall time",
            lambda: summary["dr"]["ratios"]["job_time_vs_shovels"],
            "<=",
            DR_JOB_VS_SHOVELS_MAX,
        ),
        (
            "job fixed overhead (s): Spark start + plan + commit + verify",
            lambda: single("single_classic", "job", "median_fixed_overhead_seconds"),
            "<=",
            FIXED_OVERHEAD_MAX_SECONDS,
        ),
        (
            "mover client CPU-s per 100k 1 KiB messages",
            client_cpu_per_100k,
            "<=",
            CLIENT_CPU_PER_100K_MAX,
        ),
        (
            "ledger overhead (share of mover transfer time)",
            lambda: summary["single_classic"]["ratios"]["ledger_overhead"],
            "<=",
            LEDGER_OVERHEAD_MAX,
        ),
        (
            f"default window ({DEFAULT_WINDOW}) rate / window-curve plateau",
            default_window_share,
            ">=",
            DEFAULT_WINDOW_OF_PLATEAU_MIN,
        ),
    ]
    out = []
    for name, measure, op, goal in checks:
        try:
            value = measure()
        except KeyError:
            value = None  # its scenario failed; the report's "errors" say why
        met = value is not None and (value >= goal if op == ">=" else value <= goal)
        out.append({"target": name, "measured": value, "goal": f"{op} {goal}", "met": met})
    return out


def code_state() -> dict[str, Any]:
    """Which code was measured: the commit, and files changed on top of it."""

    def git(*args: str) -> str:
        completed = subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, check=False
        )
        return completed.stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "changed": git("status", "--short").splitlines()}


def versions(brokers: Brokers) -> dict[str, str]:
    found = {"rabbitmq": brokers.rabbitmq_version(), "erlang": brokers.erlang_version()}
    for package in ("pika", "pyspark", "deltalake", "pyarrow", "great_expectations"):
        found[package] = metadata.version(package)
    return found


def markdown(report: dict[str, Any]) -> str:
    """The tables the README's Performance section shows."""
    lines: list[str] = []
    if "figures" in report:
        lines += host_markdown(report)
    for version, section in report.get("peers", {}).items():
        lines += ["", *peers_markdown(version, section)]
    return "\n".join(lines).strip("\n")


def host_markdown(report: dict[str, Any]) -> list[str]:
    """The host RabbitMQ's scenarios and the issue's targets."""
    summary = report["figures"]
    lines = [
        "| scenario | contender | messages | median s | msg/s | MiB/s | client CPU-s | ratio |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for scenario, entry in summary.items():
        for name, figures_ in entry.items():
            if name == "ratios":
                continue
            ratio = entry["ratios"].get(f"{name}_vs_shovel", "")
            lines.append(
                f"| {scenario} | {name} | {figures_['messages']:,} | {figures_['median_seconds']} "
                f"| {figures_['median_rate']:,.0f} | {figures_['median_mib_per_second']} "
                f"| {figures_.get('median_client_cpu_seconds', '')} | {ratio} |"
            )
    lines += _left_in_source(summary)
    lines += ["", "| target | measured | goal | |", "|---|---:|---:|---|"]
    for target in report["targets"]:
        verdict = "met" if target["met"] else "**missed**"
        lines.append(
            f"| {target['target']} | {target['measured']} | {target['goal']} | {verdict} |"
        )
    return lines


def peers_markdown(version: str, section: dict[str, Any]) -> list[str]:
    """One 4.x section: every layout's contenders, and the ones a layout rules out."""
    rabbitmq = section.get("versions", {}).get("rabbitmq", version)
    lines = [
        f"RabbitMQ {rabbitmq}:",
        "",
        "| layout | scenario | contender | messages | median s | msg/s | MiB/s "
        "| broker CPU-s | vs shovel |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for layout, entry in section["layouts"].items():
        for scenario, by_contender in entry["figures"].items():
            for name, figures_ in by_contender.items():
                if name == "ratios":
                    continue
                cpu = sum(figures_["median_broker_cpu_seconds"].values())
                ratio = by_contender["ratios"].get(f"{name}_vs_shovel", "")
                lines.append(
                    f"| {layout} | {scenario} | {name} | {figures_['messages']:,} "
                    f"| {figures_['median_seconds']} | {figures_['median_rate']:,.0f} "
                    f"| {figures_['median_mib_per_second']} | {cpu:.2f} | {ratio} |"
                )
        for name, reason in entry.get("not_applicable", {}).items():
            lines.append(f"| {layout} | every scenario | {name} | not applicable: {reason} |")
    for layout, entry in section["layouts"].items():
        lines += [f"{layout}: {line.strip()}" for line in _left_in_source(entry["figures"])]
    return lines


def _left_in_source(summary: dict[str, Any]) -> list[str]:
    lines = []
    for scenario, entry in summary.items():
        for name, figures_ in entry.items():
            for bad in (
                figures_.get("runs_leaving_messages_in_source", []) if name != "ratios" else []
            ):
                lines.append(
                    f"\n{scenario} {name}: reported done after moving {bad['moved']:,}; "
                    f"{bad['left_in_source']} message(s) were still in the source"
                )
    return lines


def default_versions() -> list[str]:
    """The host's RabbitMQ, and 4.3 where its root is built and nodes can run from it."""
    found = [rabbitmq_roots.HOST_VERSION]
    if os.geteuid() == 0 and rabbitmq_roots.load_root(PEER_VERSION) is not None:
        found.append(PEER_VERSION)
    else:
        log.warning(
            "no RabbitMQ %s section: its root is not built (make roots) or this is not root",
            PEER_VERSION,
        )
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="1 round, small counts")
    parser.add_argument("--keep-work-dir", action="store_true", help="keep ledgers and job logs")
    parser.add_argument(
        "--rabbitmq",
        nargs="+",
        choices=rabbitmq_roots.VERSIONS,
        help=f"the sections to run: {rabbitmq_roots.HOST_VERSION} (the host's, every scenario) "
        f"and/or a root's version (the local-shovel section); default: "
        f"{rabbitmq_roots.HOST_VERSION}, and {PEER_VERSION} where its root is built",
    )
    parser.add_argument(
        "--fraction",
        type=float,
        default=1.0,
        help="scale every message count by this (0 < F <= 1) for a shorter run",
    )
    parser.add_argument("--rounds", type=int, help="run every scenario at most this many rounds")
    parser.add_argument(
        "--many-queues",
        action="store_true",
        help="run bench.many_queues instead (with --quick, its quick mode)",
    )
    args = parser.parse_args(argv)
    if args.many_queues:
        from bench import many_queues

        return many_queues.main(["--quick"] if args.quick else [])
    try:
        scale = scaled(
            QUICK if args.quick else Scale(), fraction=args.fraction, max_rounds=args.rounds
        )
    except ValueError as exc:
        parser.error(str(exc))
    # Stopped by a signal (even from a background shell, which ignores SIGINT), the
    # nodes are still stopped and removed by the context managers on the way out.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("pika").setLevel(logging.WARNING)
    sections = args.rabbitmq or default_versions()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    work_dir = Path(tempfile.mkdtemp(prefix="rmq-spark-bench-"))
    command = "python -m bench.throughput" + " ".join(
        [""]
        + (["--quick"] if args.quick else [])
        + (["--rabbitmq", *args.rabbitmq] if args.rabbitmq else [])
        + ([f"--fraction {args.fraction}"] if args.fraction != 1.0 else [])
        + ([f"--rounds {args.rounds}"] if args.rounds else [])
    )
    report: dict[str, Any] = {
        "benchmark": "throughput",
        "command": command,
        "quick": args.quick,
        "started_at": datetime.now(UTC).isoformat(),
        "machine": machine(),
        "code": code_state(),
        "load_average_start": load_average(),
    }
    started = time.monotonic()
    name = f"throughput-{'quick-' if args.quick else ''}{stamp}"
    json_path = RESULTS_DIR / f"{name}.json"
    run = BenchRun(report, scale, started, json_path)
    try:
        for version in sections:
            if version == rabbitmq_roots.HOST_VERSION:
                host_section(run, work_dir)
            else:
                peer_section(run, work_dir, version)
    finally:
        if not args.keep_work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
    run.write()
    charts = []
    if run.host is not None:
        png_path = RESULTS_DIR / f"{name}.png"
        report["chart"] = str(png_path.relative_to(REPO))
        chart.draw(report, png_path)
        charts.append(png_path)
    for version, section in report.get("peers", {}).items():
        png_path = RESULTS_DIR / f"{name}-rabbitmq-{version}.png"
        section["chart"] = str(png_path.relative_to(REPO))
        chart.draw_peers(report, version, png_path)
        charts.append(png_path)
    run.write()
    print(markdown(report))
    print(f"\nwrote {json_path}" + "".join(f" and {path}" for path in charts))
    return 1 if report.get("errors") else 0


@dataclass
class BenchRun:
    """Everything one invocation measured so far, and where its report goes."""

    report: dict[str, Any]
    scale: Scale
    started: float
    path: Path
    host: Bench | None = None
    # Per root version, per layout.
    peers: dict[str, dict[str, Bench]] = field(default_factory=dict)
    warmed_up: bool = False

    def warm_up_once(self, bench: Bench) -> None:
        """The untimed first job (`warm_up`), in whichever section runs first."""
        if not self.warmed_up:
            self.report["warm_up_job_seconds"] = warm_up(bench)
            self.warmed_up = True

    def stage(self, stage: Callable[[Bench, Scale], None], bench: Bench, label: str) -> None:
        """Run one scenario family; a failure is reported and the others still run."""
        log.info("scenario %s", label)
        try:
            stage(bench, self.scale)
        except BenchError as exc:
            log.error("scenario %s failed: %s", label, exc)
            self.report.setdefault("errors", []).append(f"{label}: {exc}")
        # Figures so far, so an interrupted run still leaves its numbers.
        self.write()

    def write(self) -> None:
        """Summarise every run so far into the report and write it as JSON."""
        report = self.report
        report |= {
            "finished_at": datetime.now(UTC).isoformat(),
            "wall_seconds": round(time.monotonic() - self.started, 1),
            "load_average_end": load_average(),
            "scale": self.scale.__dict__,
            "goals": GOALS,
        }
        if self.host is not None:
            summary = figures(self.host.results)
            report |= {
                "figures": summary,
                "targets": targets(summary),
                "runs": runs_json(self.host),
            }
        for version, by_layout in self.peers.items():
            section = report.setdefault("peers", {}).setdefault(version, {})
            section["layouts"] = {
                layout: {
                    "figures": figures(bench.results),
                    "not_applicable": bench.not_applicable,
                    "runs": runs_json(bench),
                }
                for layout, bench in by_layout.items()
            }
        self.path.parent.mkdir(exist_ok=True)
        self.path.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")


def runs_json(bench: Bench) -> dict[str, Any]:
    return {
        scenario: {name: [run.to_json() for run in runs] for name, runs in by_contender.items()}
        for scenario, by_contender in bench.results.items()
    }


def host_section(run: BenchRun, work_dir: Path) -> None:
    """Every scenario on two nodes of the host's RabbitMQ (3.10)."""
    with local_brokers(work_dir / "brokers", [SINGLE_VHOST, *DR_VHOSTS]) as brokers:
        run.report["versions"] = versions(brokers)
        run.host = Bench(brokers, work_dir)
        run.warm_up_once(run.host)
        for stage in (single_queue, sizes, windows, dr):
            run.stage(stage, run.host, stage.__name__)


def peer_section(run: BenchRun, work_dir: Path, version: str) -> None:
    """The 4.x scenarios on RabbitMQ `version` nodes, in each layout (fresh nodes per layout)."""
    for layout in LAYOUTS:
        with local_brokers(
            work_dir / f"brokers-{version}-{layout}", [SINGLE_VHOST], version=version, layout=layout
        ) as brokers:
            run.report.setdefault("peers", {}).setdefault(version, {})["versions"] = versions(
                brokers
            )
            # Run ids and ledgers of one layout must not meet another's (a job refuses
            # a run id its ledger already holds).
            section_dir = work_dir / f"rabbitmq-{version}-{layout}"
            section_dir.mkdir(parents=True, exist_ok=True)
            bench = Bench(brokers, section_dir)
            run.peers.setdefault(version, {})[layout] = bench
            run.warm_up_once(bench)
            for stage in (peers_single_queue, peers_sizes):
                run.stage(stage, bench, f"{stage.__name__} on RabbitMQ {version}, {layout}")


if __name__ == "__main__":
    raise SystemExit(main())
