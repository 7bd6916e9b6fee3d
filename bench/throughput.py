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
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
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
from bench.cpu_layout import (
    CPU_LAYOUTS,
    SEPARATED,
    SHARED,
    Placement,
    applied,
    broker_cost,
    idle_cpu_per_second,
    placement,
)
from bench.delay_proxy import DelayProxy
from bench.throughput_report import WINDOWS, figures, goals, markdown, targets
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
# The window a transfer starts with as shipped (it grows with the rate it measures, up
# to WindowConfig().messages, where that rate keeps growing: window_growth.py).
DEFAULT_WINDOW = WindowConfig().first_messages
# Scenarios 1, 2 and 5 compare at the prefetch/window, the same for every
# contender; the DR scenario runs the job as shipped (starting at DEFAULT_WINDOW) and
# gives the orchestrated shovels DEFAULT_WINDOW as their prefetch.
SINGLE_QUEUE_WINDOW = 1000
# The mover with its window fixed where the far scenarios start it (no growth).
MOVER_FIXED = "mover_fixed"
# The untimed first job (`warm_up`).
WARM_UP_MESSAGES = 1_000
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

# The destination "in another datacenter" (`far_single`, `far_dr`): what
# ``netem delay 20ms`` on its ports would add, each way (a 40 ms round trip).
FAR_ONE_WAY_DELAY_SECONDS = 0.020
# ...and on another continent (`farther_single`): 40 ms each way, an 80 ms round trip.
FARTHER_ONE_WAY_DELAY_SECONDS = 0.040
GOALS = goals(DEFAULT_WINDOW) | {
    "far_one_way_delay_ms": FAR_ONE_WAY_DELAY_SECONDS * 1000,
    "farther_one_way_delay_ms": FARTHER_ONE_WAY_DELAY_SECONDS * 1000,
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
    # Which cores the brokers and the client run on, and what the idle VMs spend.
    placement: Placement = field(default_factory=lambda: placement(SHARED))
    idle_broker_cpu_per_second: float = 0.0
    # The delay proxy in front of the destination in the far scenarios.
    proxy: DelayProxy | None = None

    def record(self, scenario: str, run: Run) -> None:
        run.details["load_1m"] = load_average()[0]  # other tenants of the box, for the record
        run.details["broker_cpu_per_100k"] = round(
            broker_cost(
                sum(run.broker_cpu_seconds.values()),
                run.seconds,
                run.messages,
                self.idle_broker_cpu_per_second,
            ),
            3,
        )
        if self.placement.broker_cpus is not None:
            # Only here do the brokers have cores of their own, and a limit to reach.
            run.details["broker_cores"] = self.placement.broker_cores()
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
                proxy_before = bench.proxy.cpu_seconds() if bench.proxy else None
                result = run(round_)
                if bench.proxy and proxy_before is not None:
                    # The simulated network's own cost (it runs on the client's cores).
                    result.details["proxy_cpu_seconds"] = round(
                        bench.proxy.cpu_seconds() - proxy_before, 2
                    )
                bench.record(scenario, result)


def single_queue_run(
    bench: Bench,
    scenario: str,
    contender: str,
    round_: int,
    workload: Workload,
    *,
    destination_type: str = "classic",
    window: int = SINGLE_QUEUE_WINDOW,
    window_bound: int | None = None,
) -> Run:
    """Seed a fresh queue, let one contender move it, delete it on both nodes.

    The mover's window is fixed at `window`, or, with `window_bound`, starts there and
    grows with the rate it measures up to `window_bound` ("mover_fixed" keeps it fixed).
    """
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
        elif contender in ("mover", "mover_no_ledger", MOVER_FIXED):
            ledger = bench.ledger(run_id) if contender != "mover_no_ledger" else None
            adapts = window_bound is not None and contender == "mover"
            run = run_mover(
                brokers,
                vhost,
                queue,
                workload,
                window=window_bound if adapts and window_bound else window,
                start_window=window if adapts else None,
                ledger=ledger,
                run_id=run_id,
                contender=contender,
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


def dr(bench: Bench, scale: Scale, scenario: str = "dr") -> None:
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
        run_id = f"{scenario}-job-{round_}".replace("_", "-")
        config = job_config(
            brokers,
            vhosts=list(DR_VHOSTS),
            queue_pattern=r"dr\.q\d+",
            ledger=bench.ledger(run_id),
            destination_type="classic",
            window=None,  # as shipped
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
        scenario,
        scale.dr_rounds,
        [("orchestrated_shovels", scale.dr_rounds, shovels), ("job", scale.dr_rounds, job)],
    )


@contextmanager
def far_destination(
    bench: Bench, one_way_delay: float = FAR_ONE_WAY_DELAY_SECONDS
) -> Iterator[Bench]:
    """`bench` with its contenders reaching the destination through a delay proxy.

    The kernel here has no netem, so `bench.delay_proxy` adds the one-way delay in
    user space; the Shovel's destination URI, the mover's and the job's destination
    cluster all point at it. Seeding and depth checks still go to the node itself.
    """
    with DelayProxy(bench.brokers.dst.amqp_port, one_way_delay) as proxy:
        yield replace(bench, brokers=replace(bench.brokers, dst_amqp_port=proxy.port), proxy=proxy)


def far_single(bench: Bench, scale: Scale) -> None:
    """The destination 20 ms away, one 1 KiB queue classic -> classic: Shovel vs mover.

    Twice: at the single-queue window (1000, the Shovel's usual prefetch) and at the
    mover's default window (5000), the same for both contenders, since whether a
    window keeps a 40 ms round trip full is what this scenario asks.
    """
    single_far_away(bench, scale, "far_single", FAR_ONE_WAY_DELAY_SECONDS)


def farther_single(bench: Bench, scale: Scale) -> None:
    """`far_single` with the destination 40 ms away each way (an 80 ms round trip, an
    ocean between the datacenters), at the same two windows."""
    single_far_away(bench, scale, "farther_single", FARTHER_ONE_WAY_DELAY_SECONDS)


def single_far_away(bench: Bench, scale: Scale, family: str, one_way_delay: float) -> None:
    """One 1 KiB queue through a delay proxy, Shovel vs mover, at windows 1000 and 5000.

    The Shovel's prefetch is the window; the mover's window starts there and grows as
    shipped (up to `window.messages`'s default) while the rate it measures grows with
    it; `mover_fixed` keeps it at the Shovel's prefetch, what the mover did before.
    """
    workload = Workload(scale.single_messages, KIB)
    with far_destination(bench, one_way_delay) as far:
        for window in (SINGLE_QUEUE_WINDOW, DEFAULT_WINDOW):
            scenario = far_single_scenario(window, family)
            run = partial(
                single_queue_run,
                far,
                scenario,
                workload=workload,
                window=window,
                window_bound=WindowConfig().messages,
            )
            alternate(
                far,
                scenario,
                scale.rounds,
                [
                    (name, scale.rounds, partial(run, name))
                    for name in (SHOVEL, "mover", MOVER_FIXED)
                ],
            )


def far_single_scenario(window: int, family: str = "far_single") -> str:
    return family if window == SINGLE_QUEUE_WINDOW else f"{family}_window_{window}"


def far_dr(bench: Bench, scale: Scale) -> None:
    """The destination 20 ms away, the DR fail-back: job vs orchestrated shovels."""
    with far_destination(bench) as far:
        dr(far, scale, "far_dr")


# Scenario families by the name ``--scenarios`` takes.
SCENARIOS: dict[str, Callable[[Bench, Scale], None]] = {
    "single": single_queue,
    "sizes": sizes,
    "windows": windows,
    "dr": dr,
    "far_single": far_single,
    "farther_single": farther_single,
    "far_dr": far_dr,
}
# What each CPU layout runs by default. The separated layout is the deployment's
# shape: the single-queue pair and the far destination. The shared one keeps the
# older scenarios (sizes, window curve, DR) without running them twice.
DEFAULT_SCENARIOS = {
    SHARED: ("single", "sizes", "windows", "dr"),
    SEPARATED: ("single", "far_single", "farther_single", "far_dr"),
}
# The 4.3 section: the single-queue workloads (the sizes too when ``--scenarios``
# names them).
PEER_SCENARIOS: dict[str, Callable[[Bench, Scale], None]] = {
    "single": peers_single_queue,
    "sizes": peers_sizes,
}
DEFAULT_PEER_SCENARIOS = ("single",)


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
        "--single-messages",
        type=int,
        help="messages in the single-queue scenarios (default 100,000, times --fraction); "
        "issue 31 measures the whole job against the Shovel on 200,000",
    )
    parser.add_argument(
        "--layouts",
        type=_names(CPU_LAYOUTS),
        default=list(CPU_LAYOUTS),
        help=f"CPU layouts, comma-separated, from {','.join(CPU_LAYOUTS)} (default: both)",
    )
    parser.add_argument(
        "--scenarios",
        type=_names([*SCENARIOS]),
        help=f"scenario families for every layout, comma-separated, from {','.join(SCENARIOS)}; "
        "default: "
        + "; ".join(f"{layout}: {','.join(names)}" for layout, names in DEFAULT_SCENARIOS.items())
        + f"; the 4.3 section runs {','.join(DEFAULT_PEER_SCENARIOS)} "
        f"(and sizes when named)",
    )
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
        if args.single_messages is not None:
            if args.single_messages < 1:
                raise ValueError(
                    f"--single-messages must be at least 1, got {args.single_messages}"
                )
            scale = replace(scale, single_messages=args.single_messages)
        for layout in args.layouts:
            placement(layout)  # a layout this box cannot give fails here, not mid-run
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
        + ([f"--single-messages {args.single_messages}"] if args.single_messages else [])
        + ([f"--layouts {','.join(args.layouts)}"] if args.layouts != list(CPU_LAYOUTS) else [])
        + ([f"--scenarios {','.join(args.scenarios)}"] if args.scenarios else [])
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
    run = BenchRun(report, scale, started, json_path, args.layouts, args.scenarios)
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
    for layout, section in report.get("layouts", {}).items():
        png_path = RESULTS_DIR / f"{name}-{layout}.png"
        section["chart"] = str(png_path.relative_to(REPO))
        chart.draw(report, layout, png_path)
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
    layouts: Sequence[str] = CPU_LAYOUTS
    # None: each layout's defaults (`DEFAULT_SCENARIOS`, `DEFAULT_PEER_SCENARIOS`).
    scenarios: Sequence[str] | None = None
    # The host RabbitMQ's benches, per CPU layout.
    hosts: dict[str, Bench] = field(default_factory=dict)
    # Per root version, per "<CPU layout> <node layout>".
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

    def in_layouts(
        self, brokers: Brokers, work_dir: Path, label: str
    ) -> Iterator[tuple[str, Bench]]:
        """For each CPU layout: pin as it says, yield a fresh Bench, restore after.

        Each layout's ledgers and run ids live in their own directory (a job refuses a
        run id its ledger already holds).
        """
        for layout in self.layouts:
            where = placement(layout)
            with applied(where, brokers.broker_pids()):
                idle = idle_cpu_per_second(brokers.broker_pids())
                log.info("%s, %s layout %s: idle brokers %.3f CPU-s/s", label, layout, where, idle)
                layout_dir = work_dir / layout
                layout_dir.mkdir(parents=True, exist_ok=True)
                yield (
                    layout,
                    Bench(brokers, layout_dir, placement=where, idle_broker_cpu_per_second=idle),
                )

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
        if self.hosts:
            report["layouts"] = {}
            report["targets"] = []
            for layout, bench in self.hosts.items():
                summary = figures(bench.results)
                report["layouts"][layout] = _bench_json(bench) | {"figures": summary}
                report["targets"] += targets(summary, layout, DEFAULT_WINDOW)
        for version, by_layout in self.peers.items():
            section = report.setdefault("peers", {}).setdefault(version, {})
            section["layouts"] = {
                layout: _bench_json(bench)
                | {"figures": figures(bench.results), "not_applicable": bench.not_applicable}
                for layout, bench in by_layout.items()
            }
        self.path.parent.mkdir(exist_ok=True)
        self.path.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")


def _bench_json(bench: Bench) -> dict[str, Any]:
    return {
        "placement": bench.placement.to_json(),
        "idle_broker_cpu_per_second": bench.idle_broker_cpu_per_second,
        "runs": {
            scenario: {name: [run.to_json() for run in runs] for name, runs in by_contender.items()}
            for scenario, by_contender in bench.results.items()
        },
    }


def host_section(run: BenchRun, work_dir: Path) -> None:
    """The scenarios on two nodes of the host's RabbitMQ (3.10), in each CPU layout."""
    with local_brokers(work_dir / "brokers", [SINGLE_VHOST, *DR_VHOSTS]) as brokers:
        run.report["versions"] = versions(brokers)
        for layout, bench in run.in_layouts(brokers, work_dir, "host"):
            run.hosts[layout] = bench
            run.warm_up_once(bench)
            for name in run.scenarios or DEFAULT_SCENARIOS[layout]:
                run.stage(SCENARIOS[name], bench, f"{name} ({layout})")


def peer_section(run: BenchRun, work_dir: Path, version: str) -> None:
    """The 4.x scenarios on RabbitMQ `version` nodes, in each node layout (fresh nodes
    per node layout) and each CPU layout."""
    names = [name for name in (run.scenarios or DEFAULT_PEER_SCENARIOS) if name in PEER_SCENARIOS]
    if not names:
        return
    for node_layout in LAYOUTS:
        with local_brokers(
            work_dir / f"brokers-{version}-{node_layout}",
            [SINGLE_VHOST],
            version=version,
            layout=node_layout,
        ) as brokers:
            run.report.setdefault("peers", {}).setdefault(version, {})["versions"] = versions(
                brokers
            )
            section_dir = work_dir / f"rabbitmq-{version}-{node_layout}"
            for cpu_layout, bench in run.in_layouts(brokers, section_dir, version):
                key = f"{cpu_layout} {node_layout}"
                run.peers.setdefault(version, {})[key] = bench
                run.warm_up_once(bench)
                for name in names:
                    run.stage(PEER_SCENARIOS[name], bench, f"{name} on RabbitMQ {version}, {key}")


def _names(allowed: Sequence[str]) -> Callable[[str], list[str]]:
    """An argparse type: a comma-separated list, each name one of `allowed`."""

    def parse(value: str) -> list[str]:
        names = [name.strip() for name in value.split(",") if name.strip()]
        unknown = [name for name in names if name not in allowed]
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(map(repr, unknown)) or 'empty list'}; "
                f"expected a comma-separated list of {', '.join(allowed)}"
            )
        return names

    return parse


if __name__ == "__main__":
    raise SystemExit(main())
