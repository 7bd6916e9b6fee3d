"""Where the mover's and the job's time goes: py-spy samples, grouped by what they were doing.

    python -m bench.profile mover [--messages N] [--window W] [--no-ledger]
    python -m bench.profile job [--messages N]

Starts its own two local nodes, seeds one 1 KiB persistent queue, and runs the mover
child (`bench.mover_child`) or the whole job in-process (``rmq-spark transfer``,
local[*,4]) under ``py-spy record --idle`` (``pip install py-spy``). Idle samples
are kept on purpose: a mover waiting in ``poll`` is waiting for a broker, and a
driver waiting on py4j is waiting for the JVM. Prints the share of samples per
category and writes the raw stacks to ``bench/results/profile-<what>-<stamp>.txt``
(feed them to flamegraph.pl or speedscope for a picture).
"""

from __future__ import annotations

import argparse
import json
import linecache
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import yaml

from bench.contenders import PASSWORD_ENV, REPO, WINDOW_BYTES, job_config
from bench.throughput import DEFAULT_WINDOW, KIB, RESULTS_DIR, SINGLE_VHOST
from bench.workload import (
    DESTINATION,
    SOURCE,
    Workload,
    declare_destination,
    local_brokers,
    seed_queue,
)
from rmq_spark.ledger import tables

log = logging.getLogger("bench.profile")

SAMPLES_PER_SECOND = 100
_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*):(?P<line>\d+)\)$")

# (category, test on one frame); the first category any frame of a stack matches wins,
# so specific work comes before the pika loop that every mover stack sits in.
MOVER_CATEGORIES: tuple[tuple[str, str], ...] = (
    ("pika: socket send", "_sigint_safe_send"),
    ("pika: socket recv", "_sigint_safe_recv"),
    ("intent log (Arrow IPC + fsync per batch)", "IntentLog.append"),
    ("ledger rows (Arrow append + fsync)", "MessageLedgerWriter.write"),
    ("checksums (sha256 of body and properties)", "@sha256"),
    ("window bookkeeping (window.py)", "rmq_spark/transfer/window.py"),
    ("property bytes (wire.py)", "rmq_spark/transfer/amqp091/wire.py"),
    ("source deliveries (inbound.py)", "rmq_spark/transfer/amqp091/inbound.py"),
    ("pika: frame encode/decode, callbacks, timers", "pika/"),
)
JOB_CATEGORIES: tuple[tuple[str, str], ...] = (
    ("imports", "_find_and_load"),
    ("Spark start (session)", "build_session"),
    ("pre-flight + discovery", "discover (rmq_spark"),
    ("plan DataFrame", "plan_dataframe"),
    ("move (driver waits for the tasks)", "move (rmq_spark/pipeline.py"),
    ("ledger commit (delta-rs)", "commit_run"),
    ("depths after (AMQP)", "measure_depths"),
    ("verify: Great Expectations + Data Docs", "_validate_with_gx"),
    ("verify: ledger read + summary (Spark)", "verify_run"),
    ("record queues/runs rows", "record_run"),
    ("report", "print_queue_table"),
    ("Spark stop", "stop (pyspark"),
)
# Only a process's main thread is counted (py-spy --idle also samples idle helper
# threads, py4j's among them); every main thread here was started with ``python -m``.
MAIN_THREAD = "_run_module_as_main"
# Stacks of the job's Python workers (where the movers run) start with this process.
WORKER_PROCESS = "pyspark.daemon"


def frame_matches(frame: str, test: str) -> bool:
    if test == "@sha256":
        parsed = _FRAME.match(frame)
        return parsed is not None and "sha256" in linecache.getline(
            str(REPO / parsed["file"]) if not parsed["file"].startswith("/") else parsed["file"],
            int(parsed["line"]),
        )
    return test in frame


def categorise(raw: Path, categories: Sequence[tuple[str, str]]) -> dict[str, Counter[str]]:
    """Main-thread samples per process kind ("driver"/"worker") and category.

    Reads py-spy's raw (collapsed) output; with --subprocesses each stack starts with
    a ``process PID:"command"`` frame.
    """
    counts: dict[str, Counter[str]] = {}
    for line in raw.read_text(encoding="utf-8").splitlines():
        stack, _, samples = line.rpartition(" ")
        frames = stack.split(";")
        if not any(MAIN_THREAD in frame for frame in frames):
            continue
        worker = frames[0].startswith("process ") and WORKER_PROCESS in frames[0]
        by_category = counts.setdefault("worker" if worker else "driver", Counter())
        if frames[-1].startswith("PollPoller.poll"):
            by_category["waiting for the brokers (poll)"] += int(samples)
            continue
        rules = MOVER_CATEGORIES if worker else categories
        name = next(
            (name for name, test in rules if any(frame_matches(f, test) for f in frames)),
            "other",
        )
        by_category[name] += int(samples)
    return counts


def py_spy(command: list[str], output: Path, *, stdin: str | None, subprocesses: bool) -> None:
    executable = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(executable).exists():
        raise SystemExit("py-spy is not installed: pip install py-spy")
    record = [executable, "record", "--idle", "-r", str(SAMPLES_PER_SECOND), "-f", "raw"]
    record += ["-o", str(output)] + (["--subprocesses"] if subprocesses else [])
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run(
        [*record, "--", *command],
        input=stdin,
        text=True,
        cwd=REPO,
        env=env,
        check=True,
        capture_output=stdin is not None,
    )


def profile(what: str, messages: int, window: int, ledger: bool) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    output = RESULTS_DIR / f"profile-{what}{'' if ledger else '-no-ledger'}-{stamp}.txt"
    work = Path(tempfile.mkdtemp(prefix="rmq-spark-profile-"))
    workload = Workload(messages, KIB)
    try:
        with local_brokers(work / "brokers", [SINGLE_VHOST]) as brokers:
            queue = f"profile.{what}"
            seed_queue(brokers, SINGLE_VHOST, queue, workload, seed="profile")
            declare_destination(brokers, SINGLE_VHOST, queue, "classic")
            if what == "mover":
                ledger_path = work / "ledger"
                tables.ensure_tables(str(ledger_path))
                request = {
                    "run_id": "profile",
                    "ledger": ledger,
                    "ledger_path": str(ledger_path),
                    "clusters": {
                        name: {
                            "amqp": node.amqp_uri,
                            "management": node.management_url,
                            "username": node.username,
                            "password": node.password,
                        }
                        for name, node in ((SOURCE, brokers.src), (DESTINATION, brokers.dst))
                    },
                    "window_messages": window,
                    "window_bytes": WINDOW_BYTES,
                    "row": {
                        "source_cluster": SOURCE,
                        "source_vhost": SINGLE_VHOST,
                        "source_queue": queue,
                        "destination_cluster": DESTINATION,
                        "destination_vhost": SINGLE_VHOST,
                        "destination_queue": queue,
                        "messages": messages,
                        "message_bytes": workload.bytes,
                    },
                }
                py_spy(
                    [sys.executable, "-m", "bench.mover_child"],
                    output,
                    stdin=json.dumps(request),
                    subprocesses=False,
                )
            else:
                config = work / "job.yaml"
                config.write_text(
                    yaml.safe_dump(
                        job_config(
                            brokers,
                            vhosts=[SINGLE_VHOST],
                            queues=[queue],
                            ledger=work / "ledger",
                            destination_type="classic",
                            window=window,
                            max_active=1,
                        )
                    ),
                    encoding="utf-8",
                )
                os.environ[PASSWORD_ENV] = brokers.src.password
                py_spy(
                    [
                        sys.executable,
                        "-m",
                        "rmq_spark.cli",
                        "transfer",
                        "--config",
                        str(config),
                        "--run-id",
                        "profile",
                    ],
                    output,
                    stdin=None,
                    subprocesses=True,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return output


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.profile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("what", choices=("mover", "job"))
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--window", type=int, default=DEFAULT_WINDOW)
    parser.add_argument("--no-ledger", action="store_true", help="mover: discard the rows")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    logging.getLogger("pika").setLevel(logging.WARNING)
    output = profile(args.what, args.messages, args.window, not args.no_ledger)
    counts = categorise(output, MOVER_CATEGORIES if args.what == "mover" else JOB_CATEGORIES)
    print(f"raw stacks in {output}; main-thread samples at {SAMPLES_PER_SECOND}/s, idle included")
    for kind, by_category in counts.items():
        total = sum(by_category.values())
        label = "the mover" if args.what == "mover" else f"job {kind}"
        print(f"\n{label}: {total / SAMPLES_PER_SECOND:.1f} s of samples")
        for name, samples in by_category.most_common():
            print(f"{100 * samples / total:5.1f}%  {samples / SAMPLES_PER_SECOND:6.1f} s  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
