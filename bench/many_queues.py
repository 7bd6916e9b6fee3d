"""Many small queues: the DR fail-back of thousands of queues over a few vhosts.

    python -m bench.many_queues            # 1,000 queues x 20 msgs over 5 vhosts, + 10k plan
    python -m bench.many_queues --quick    # 100 queues x 20 over 5 vhosts, 1,000 to plan
    python -m bench.many_queues --queues 200 --vhosts 2 --messages 50 --plan-queues 0
    python -m bench.many_queues --ledger s3 --shovel-queues 0 --plan-queues 0
    python -m bench.many_queues --queues 12 --vhosts 1 --messages 100000 --message-bytes 256 \
        --shovel-queues 0 --plan-queues 0     # verification at scale: 1.2 M ledger rows
    python -m bench.many_queues --queues 10000 --vhosts 5 --messages 5 \
        --shovel-queues 0 --plan-queues 0     # 10,000 queues end to end

Starts two local nodes (`bench.workload.local_brokers`), then:

1. **job**: seeds ``--queues`` queues of ``--messages`` 1 KiB persistent messages, spread
   over ``--vhosts`` vhosts (declares and publishes on one channel per vhost), and
   runs the whole job through ``./spark-submit.sh`` as `bench.contenders.run_job`
   does, with the config a new user writes (default ``max_active`` and
   ``queues_per_task``). Reports the whole job's seconds, its stages (from the
   ledger's timestamps, `contenders.job_stages`), the ledger files and commits of
   the run in the Delta log, milliseconds per queue, the peak memory of the JVM,
   the Python driver and the executors' Python workers (`bench.process_memory`), and
   the brokers' CPU per second while idle before it (their floor with that many queues).
2. **orchestrated shovels** (the seed's script: a Shovel per queue, 5 active, depths
   polled each second, `contenders.run_orchestrated_shovels`) on ``--shovel-queues``
   queues of the same shape (all of the job's count by default; fewer in quick mode).
   Its time per queue does not depend on the count (5 at a time, each at least one
   poll), so the report also scales it to the job's count
   (``extrapolated_seconds_for_job_queues``; the measured figure when the counts match).
3. **plan**: ``--plan-queues`` queues of one message over the same vhosts (AMQP declares
   and publishes on one channel per vhost), then ``rmq-spark plan --json`` timed whole (discovery,
   pre-flight, plan; a fresh interpreter, as a user runs it).

``--profile-driver`` runs the job's driver under cProfile (`bench/jobs/profiled_transfer.py`) and
writes the top functions into the report. Writes ``bench/results/many-queues-<stamp>.json``;
exits 1 if a contender left messages behind or a check failed.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml
from deltalake import DeltaTable

from bench.contenders import (
    PASSWORD_ENV,
    REPO,
    BenchError,
    Run,
    job_config,
    run_job,
    run_orchestrated_shovels,
)
from bench.ledger_store import LEDGERS, BenchLedger, bench_ledger
from bench.workload import (
    Brokers,
    Workload,
    bench_messages,
    code_state,
    depth,
    load_average,
    local_brokers,
)
from bench.workload import machine as machine_facts
from rmq_spark.config import WindowConfig
from rmq_spark.ledger import tables

log = logging.getLogger("bench.many_queues")

RESULTS_DIR = Path(__file__).resolve().parent / "results"
KIB = 1024
JOB_PATTERN, SHOVEL_PATTERN, PLAN_PATTERN = r"mq\.q\d+", r"sh\.q\d+", r"plan\.q\d+"
SEED_TIMEOUT_SECONDS = 300.0
PLAN_TIMEOUT_SECONDS = 600.0
PROFILE_TOP = 40
# bench/jobs/profiled_transfer.py (not importable: a job script, as jobs/transfer.py).
PROFILE_ENV = "RMQ_SPARK_DRIVER_PROFILE"
PROFILED_JOB = REPO / "bench" / "jobs" / "profiled_transfer.py"
# The management API lists a new queue only once its stats are collected (every 5 s
# on 3.10): discovery would not see it before.
LISTED_TIMEOUT_SECONDS = 120.0

# The targets for 1,000 queues x 20 messages over 5 vhosts.
TRANSFER_STAGE_MAX_SECONDS = 15.0
WHOLE_JOB_MAX_SECONDS = 25.0
JOB_VS_SHOVELS_MAX = 0.03
PLAN_10K_MAX_SECONDS = 10.0
# How long the brokers' CPU is measured while nothing moves, before the job.
IDLE_CPU_SECONDS = 10.0
# Issue #31's: 10,000 queues x 5 messages, the whole job.
TEN_THOUSAND_QUEUES_MAX_SECONDS = 120.0


@dataclass(frozen=True)
class Shape:
    queues: int
    vhosts: int
    messages: int
    shovel_queues: int
    plan_queues: int
    message_bytes: int = KIB

    def vhost_names(self) -> list[str]:
        return [f"mq-{index}" for index in range(self.vhosts)]

    def spread(self, prefix: str, count: int) -> list[tuple[str, str]]:
        """(vhost, queue) for `count` queues dealt round-robin over the vhosts."""
        names = self.vhost_names()
        return [(names[index % self.vhosts], f"{prefix}.q{index:05d}") for index in range(count)]


FULL = Shape(queues=1_000, vhosts=5, messages=20, shovel_queues=1_000, plan_queues=10_000)
QUICK = Shape(queues=100, vhosts=5, messages=20, shovel_queues=20, plan_queues=1_000)


def by_vhost(queues: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for vhost, queue in queues:
        grouped.setdefault(vhost, []).append(queue)
    return grouped


def seed(brokers: Brokers, queues: Sequence[tuple[str, str]], workload: Workload) -> None:
    """Declare and fill every source queue and declare every destination, one channel
    per vhost and node; then wait until every source holds its messages."""
    for vhost, names in by_vhost(queues).items():
        source = brokers.src.connect(vhost)
        destination = brokers.dst.connect(brokers.destination_vhost(vhost))
        try:
            publish, declare = source.channel(), destination.channel()
            for queue in names:
                publish.queue_declare(queue, durable=True)
                declare.queue_declare(queue, durable=True, arguments={"x-queue-type": "classic"})
                for body, properties in bench_messages(workload, f"many/{vhost}/{queue}"):
                    publish.basic_publish("", queue, body, properties)
            deadline = time.monotonic() + SEED_TIMEOUT_SECONDS
            for queue in names:
                while depth(publish, queue) < workload.messages:
                    if time.monotonic() > deadline:
                        raise BenchError(f"seeding {vhost}/{queue}: still short after the timeout")
                    time.sleep(0.1)
        finally:
            source.close()
            destination.close()


def declare_with_one(brokers: Brokers, queues: Sequence[tuple[str, str]]) -> None:
    """Each queue with one message (a route's default min_messages skips empty ones)."""
    one = Workload(1, KIB)
    for vhost, names in by_vhost(queues).items():
        connection = brokers.src.connect(vhost)
        try:
            channel = connection.channel()
            for queue in names:
                channel.queue_declare(queue, durable=True)
                for body, properties in bench_messages(one, f"plan/{vhost}/{queue}"):
                    channel.basic_publish("", queue, body, properties)
        finally:
            connection.close()


def wait_until_listed(brokers: Brokers, queues: Sequence[tuple[str, str]], prefix: str) -> None:
    """Until the source's management API lists every queue (what discovery reads)."""
    deadline = time.monotonic() + LISTED_TIMEOUT_SECONDS
    for vhost, names in by_vhost(queues).items():
        path = (
            f"/api/queues/{quote(vhost, safe='')}?page=1&page_size=1&columns=name"
            f"&name=^{prefix}&use_regex=true"
        )
        while brokers.src.management("GET", path, timeout=10)["filtered_count"] < len(names):
            if time.monotonic() > deadline:
                raise BenchError(f"{vhost}: the management API still lists fewer than {len(names)}")
            time.sleep(0.5)


def left_behind(brokers: Brokers, queues: Sequence[tuple[str, str]]) -> dict[str, int]:
    counts = {"left_in_source": 0, "at_destination": 0}
    for vhost, names in by_vhost(queues).items():
        for side, node, node_vhost in (
            ("left_in_source", brokers.src, vhost),
            ("at_destination", brokers.dst, brokers.destination_vhost(vhost)),
        ):
            connection = node.connect(node_vhost)
            try:
                channel = connection.channel()
                counts[side] += sum(depth(channel, queue) for queue in names)
            finally:
                connection.close()
    return counts


def ledger_files(ledger: Path, run_id: str) -> dict[str, int]:
    """What the run's commit(s) hold: data files in the Delta log, and commits made."""
    path = tables.table_path(str(ledger), "messages")
    files = DeltaTable(path).file_uris(partition_filters=[("run_id", "=", run_id)])
    commits = len(list(Path(path, "_delta_log").glob("*.json"))) - 1  # 0 is the create
    return {"ledger_files": len(files), "ledger_commits": commits}


def verification_phases(ledger: Path, run_id: str) -> dict[str, Any]:
    """The engine the job verified on and its phases (verification.json's `seconds`)."""
    path = ledger / "verification" / f"run_id={run_id}" / "verification.json"
    document = json.loads(path.read_text(encoding="utf-8"))
    return {"engine": document.get("engine"), "seconds": document.get("seconds", {})}


def cds_archives() -> set[str]:
    """The class-data-sharing archives spark-submit.sh keeps (its RMQ_SPARK_CDS_DIR rule).

    A local run with no archive for its checkout (the key includes the path of the
    pyspark jars, so every new checkout or copy) writes one as its JVM exits: ~6.5 s
    of that run's exit, once. A job run that wrote one is flagged in the report.
    """
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    directory = Path(os.environ.get("RMQ_SPARK_CDS_DIR") or Path(cache, "rmq-spark"))
    return {path.name for path in directory.glob("spark-driver-*.jsa")}


def top_functions(stats_path: Path, limit: int = PROFILE_TOP) -> list[str]:
    out = io.StringIO()
    stats = pstats.Stats(str(stats_path), stream=out)
    # The driver's own functions: the rest is mostly py4j waiting on the JVM.
    stats.sort_stats("cumulative").print_stats(r"rmq_spark|deltalake|pyarrow|requests", limit)
    return [line for line in out.getvalue().splitlines() if line.strip()]


def idle_broker_cpu(brokers: Brokers) -> dict[str, float]:
    """Each node's CPU seconds per second while nothing moves, measured over
    IDLE_CPU_SECONDS once the queues are seeded: the floor the job's brokers start
    from (statistics and housekeeping of every queue), which on a 2-core box the job's
    own processes share."""
    before = brokers.cpu_seconds()
    time.sleep(IDLE_CPU_SECONDS)  # a measurement window, not a wait for a condition
    after = brokers.cpu_seconds()
    return {node: round((after[node] - before[node]) / IDLE_CPU_SECONDS, 3) for node in after}


def job_scenario(
    brokers: Brokers,
    shape: Shape,
    work_dir: Path,
    *,
    profile: bool,
    options: dict[str, int],
    ledger_store: BenchLedger,
) -> Run:
    workload = Workload(shape.messages, shape.message_bytes)
    queues = shape.spread("mq", shape.queues)
    seed(brokers, queues, workload)
    wait_until_listed(brokers, queues, r"mq\.q")
    idle = idle_broker_cpu(brokers)
    run_id = "many-queues-job"
    ledger = work_dir / "ledgers" / run_id
    config = job_config(
        brokers,
        vhosts=shape.vhost_names(),
        queue_pattern=JOB_PATTERN,
        ledger=ledger,
        destination_type="classic",
        window=options.get("window"),  # None: as shipped (the window grows)
        max_active=options.get("max_active", 4),
        queues_per_task=options.get("queues_per_task"),
    )
    config["ledger"] = ledger_store.block(work_dir, run_id)
    stats_path = work_dir / "driver.prof"
    if profile:
        os.environ["RMQ_SPARK_JOB"] = str(PROFILED_JOB)
        os.environ[PROFILE_ENV] = str(stats_path)
    archives = cds_archives()
    store_before = ledger_store.usage()
    try:
        run = run_job(brokers, config, work_dir, run_id, workload.messages * len(queues))
    finally:
        os.environ.pop("RMQ_SPARK_JOB", None)
        os.environ.pop(PROFILE_ENV, None)
    # True: this run's exit included writing the JVM's class-data archive (first run).
    run.details["wrote_cds_archive"] = bool(cds_archives() - archives)
    run.details |= left_behind(brokers, queues) | ledger_store.describe()
    if ledger_store.kind != "local":
        used = ledger_store.usage().since(store_before)
        run.details["store"] = {
            "requests": used.requests,
            "requests_per_queue": round(used.requests / len(queues), 1),
            "server_and_proxy_cpu_seconds": used.cpu_seconds,
        }
    if ledger_store.kind == "local":
        run.details |= ledger_files(ledger, run_id)
        run.details["verification"] = verification_phases(ledger, run_id)
    run.details["queues"] = len(queues)
    run.details["broker_idle_cpu_per_second"] = idle
    run.details["transfer_ms_per_queue"] = round(
        1000 * run.details["stages"]["transfer"] / len(queues), 1
    )
    run.details["job_ms_per_queue"] = round(1000 * run.seconds / len(queues), 1)
    if profile:
        run.details["driver_profile"] = top_functions(stats_path)
    return run


def shovels_scenario(brokers: Brokers, shape: Shape) -> Run:
    workload = Workload(shape.messages, shape.message_bytes)
    queues = shape.spread("sh", shape.shovel_queues)
    seed(brokers, queues, workload)
    run = run_orchestrated_shovels(brokers, queues, workload, WindowConfig().first_messages)
    run.details |= left_behind(brokers, queues)
    run.details["queues"] = len(queues)
    run.details["ms_per_queue"] = round(1000 * run.seconds / len(queues), 1)
    run.details["extrapolated_seconds_for_job_queues"] = round(
        run.seconds * shape.queues / len(queues), 1
    )
    return run


def plan_scenario(
    brokers: Brokers, shape: Shape, work_dir: Path, profile_path: Path | None = None
) -> dict[str, Any]:
    """`rmq-spark plan --json` over `plan_queues` queues of one message, timed whole."""
    queues = shape.spread("plan", shape.plan_queues)
    started = time.monotonic()
    declare_with_one(brokers, queues)
    declared = time.monotonic() - started
    wait_until_listed(brokers, queues, r"plan\.q")
    config = job_config(
        brokers,
        vhosts=shape.vhost_names(),
        queue_pattern=PLAN_PATTERN,
        ledger=work_dir / "ledgers" / "plan",
        destination_type="classic",
        window=None,  # as shipped
        max_active=4,
    )
    config_path = work_dir / "plan.yaml"
    config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    env = {**os.environ, PASSWORD_ENV: brokers.src.password}
    command = [str(Path(sys.executable).parent / "rmq-spark"), "plan", "--json"]
    started = time.monotonic()
    completed = subprocess.run(
        [*command, "--config", str(config_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=PLAN_TIMEOUT_SECONDS,
        check=False,
    )
    seconds = time.monotonic() - started
    if completed.returncode != 0:
        raise BenchError(
            f"rmq-spark plan exited {completed.returncode}:\n{completed.stderr[-2000:]}"
        )
    planned = len(json.loads(completed.stdout)["queues"])
    if planned != len(queues):
        raise BenchError(f"rmq-spark plan: expected {len(queues)} transfers, found {planned}")
    profile: list[str] = []
    if profile_path is not None:  # a second, untimed run under cProfile
        subprocess.run(
            [
                sys.executable,
                "-m",
                "cProfile",
                "-o",
                str(profile_path),
                "-m",
                "rmq_spark.cli",
                *command[1:],
                "--config",
                str(config_path),
            ],
            env=env,
            capture_output=True,
            timeout=PLAN_TIMEOUT_SECONDS,
            check=True,
        )
        profile = top_functions(profile_path)
    return {
        "driver_profile": profile,
        "queues": len(queues),
        "vhosts": shape.vhosts,
        "declare_seconds": round(declared, 2),
        "plan_command_seconds": round(seconds, 2),
        "planned": planned,
    }


def targets(report: dict[str, Any], shape: Shape) -> list[dict[str, Any]]:
    """The issue's targets, checked at the issue's shape only (1,000 x 20 over 5, 10k)."""
    checks: list[dict[str, Any]] = []
    job, shovels, plan = report.get("job"), report.get("shovels"), report.get("plan")
    if job and (shape.queues, shape.vhosts, shape.messages) == (1_000, 5, 20):
        stages = job["details"]["stages"]
        checks += [
            {
                "target": "transfer stage <= 15 s",
                "value": stages["transfer"],
                "met": stages["transfer"] <= TRANSFER_STAGE_MAX_SECONDS,
            },
            {
                "target": "whole job <= 25 s",
                "value": round(job["seconds"], 2),
                "met": job["seconds"] <= WHOLE_JOB_MAX_SECONDS,
            },
        ]
        if shovels:
            ratio = job["seconds"] / shovels["details"]["extrapolated_seconds_for_job_queues"]
            checks.append(
                {
                    "target": "whole job <= 0.03 x orchestrated shovels (extrapolated)",
                    "value": round(ratio, 4),
                    "met": ratio <= JOB_VS_SHOVELS_MAX,
                }
            )
    if job and (shape.queues, shape.messages) == (10_000, 5):
        checks.append(
            {
                "target": "10,000 queues x 5, whole job <= 120 s (issue #31)",
                "value": round(job["seconds"], 2),
                "met": job["seconds"] <= TEN_THOUSAND_QUEUES_MAX_SECONDS,
            }
        )
    if plan and plan["queues"] == 10_000:
        checks.append(
            {
                "target": "discovery + plan of 10,000 queues <= 10 s",
                "value": plan["plan_command_seconds"],
                "met": plan["plan_command_seconds"] <= PLAN_10K_MAX_SECONDS,
            }
        )
    return checks


def parse(argv: Sequence[str] | None) -> tuple[argparse.Namespace, Shape]:
    parser = argparse.ArgumentParser(
        prog="python -m bench.many_queues",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="100 queues, 1,000 to plan")
    parser.add_argument("--queues", type=int, help="queues the job moves")
    parser.add_argument("--vhosts", type=int, help="vhosts they are spread over")
    parser.add_argument("--messages", type=int, help="messages per queue")
    parser.add_argument(
        "--message-bytes", type=int, default=KIB, help="body size of each message (1 KiB)"
    )
    parser.add_argument("--shovel-queues", type=int, help="queues the shovels move (0: none)")
    parser.add_argument("--plan-queues", type=int, help="queues to plan (0: none)")
    parser.add_argument("--max-active", type=int, default=4, help="the job's max_active")
    parser.add_argument("--queues-per-task", type=int, help="the job's mover.queues_per_task")
    parser.add_argument(
        "--window",
        type=int,
        help="a fixed window of this many messages (default: as shipped, it grows)",
    )
    parser.add_argument("--profile-driver", action="store_true", help="cProfile the job's driver")
    parser.add_argument("--keep-work-dir", action="store_true", help="keep ledgers and job logs")
    parser.add_argument(
        "--ledger", choices=LEDGERS, default="local", help="where the job keeps its ledger"
    )
    parser.add_argument(
        "--store-delay-ms",
        type=float,
        default=10.0,
        help="with --ledger s3: each request to the store waits this long each way",
    )
    args = parser.parse_args(argv)
    base = QUICK if args.quick else FULL
    shape = Shape(
        queues=args.queues if args.queues is not None else base.queues,
        vhosts=args.vhosts if args.vhosts is not None else base.vhosts,
        messages=args.messages if args.messages is not None else base.messages,
        shovel_queues=args.shovel_queues if args.shovel_queues is not None else base.shovel_queues,
        plan_queues=args.plan_queues if args.plan_queues is not None else base.plan_queues,
        message_bytes=args.message_bytes,
    )
    if shape.queues < 1 or shape.vhosts < 1 or shape.messages < 1:
        parser.error("--queues, --vhosts and --messages: expected at least 1 each")
    if shape.message_bytes < 1:
        parser.error("--message-bytes: expected at least 1")
    if shape.shovel_queues < 0 or shape.plan_queues < 0:
        parser.error("--shovel-queues and --plan-queues: expected 0 or more")
    return args, shape


def main(argv: Sequence[str] | None = None) -> int:
    args, shape = parse(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("pika").setLevel(logging.WARNING)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    ledger_label = "" if args.ledger == "local" else f"{args.ledger}-"
    name = f"many-queues-{'quick-' if args.quick else ''}{ledger_label}{stamp}"
    work_dir = Path(tempfile.mkdtemp(prefix="rmq-spark-many-queues-"))
    report: dict[str, Any] = {
        "benchmark": "many_queues",
        "command": "python -m bench.many_queues " + " ".join(argv or sys.argv[1:]),
        "shape": shape.__dict__,
        "started_at": datetime.now(UTC).isoformat(),
        "machine": machine_facts(),
        "code": code_state(),
        "load_average_start": load_average(),
    }
    options = {"max_active": args.max_active}
    if args.queues_per_task:
        options["queues_per_task"] = args.queues_per_task
    if args.window:
        options["window"] = args.window
    errors: list[str] = []
    try:
        with (
            local_brokers(work_dir / "brokers", shape.vhost_names()) as brokers,
            bench_ledger(args.ledger, args.store_delay_ms, work_dir / "store") as ledger_store,
        ):
            for label, scenario in (
                (
                    "job",
                    lambda: job_scenario(
                        brokers,
                        shape,
                        work_dir,
                        profile=args.profile_driver,
                        options=options,
                        ledger_store=ledger_store,
                    ).to_json(),
                ),
                (
                    "shovels",
                    lambda: (
                        shovels_scenario(brokers, shape).to_json() if shape.shovel_queues else None
                    ),
                ),
                (
                    "plan",
                    lambda: (
                        plan_scenario(
                            brokers,
                            shape,
                            work_dir,
                            work_dir / "plan.prof" if args.profile_driver else None,
                        )
                        if shape.plan_queues
                        else None
                    ),
                ),
            ):
                try:
                    result = scenario()
                except BenchError as exc:
                    log.error("scenario %s failed: %s", label, exc)
                    errors.append(f"{label}: {exc}")
                    continue
                if result is not None:
                    report[label] = result
                    log.info("%s: %s", label, json.dumps(result.get("details", result))[:2000])
    finally:
        if not args.keep_work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
    for label in ("job", "shovels"):
        left = report.get(label, {}).get("details", {}).get("left_in_source", 0)
        if left:
            errors.append(f"{label}: {left} messages left in the sources")
    report |= {
        "targets": targets(report, shape),
        "errors": errors,
        "finished_at": datetime.now(UTC).isoformat(),
        "load_average_end": load_average(),
    }
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    print(json.dumps({k: report.get(k) for k in ("targets", "errors")}, indent=2))
    print(f"wrote {path}")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
