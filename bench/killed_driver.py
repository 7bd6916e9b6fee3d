"""Duplicates after a killed driver: what a re-run publishes a second time.

    python -m bench.killed_driver                       # 20 queues x 5,000, killed at ~30 %
    python -m bench.killed_driver --queues 4 --messages 2000 --kill-at 0.5
    python -m bench.killed_driver --no-recognise        # as before recognition

Starts two local nodes (`bench.workload.local_brokers`), seeds ``--queues`` queues of
``--messages`` 1 KiB persistent messages in one vhost, and runs the whole job through
``./spark-submit.sh`` with the config a new user writes. Once the destination holds
``--kill-at`` of the messages it SIGKILLs the driver's whole process group (the JVM, its
Python workers), then runs the job again with the same run id, as a scheduler's retry
does, to a verified ledger (`bench.contenders.run_job`).

Reports, from the verified run's RESULT and its ledger: the duplicates (copies that
reached the destination twice), the uncertain rows (publishes the killed driver never
saw confirmed: the most a re-run must publish again), the rows recognised (redeliveries
the re-run acked without publishing, `transfer/recognition.py`), and the confirmed rows
the re-run published a second time. ``--no-recognise`` sets
`mover.recognise_redeliveries: false` for both runs: the figures before recognition, on
the same box. Writes ``bench/results/killed-driver-<stamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from bench.contenders import PASSWORD_ENV, SPARK_SUBMIT, BenchError, job_config, run_job
from bench.many_queues import KIB, Shape, seed, wait_until_listed
from bench.workload import Brokers, Workload, code_state, local_brokers
from bench.workload import machine as machine_facts
from rmq_spark.ledger import tables
from rmq_spark.report.console import RESULT_PREFIX

RESULTS = Path(__file__).parent / "results"
RUN_ID = "killed-driver"
PATTERN = r"^kd\.q\d+$"
# How long the first driver may take to move --kill-at of the messages.
FIRST_DRIVER_TIMEOUT_SECONDS = 600


def destination_total(brokers: Brokers, shape: Shape) -> int:
    total = 0
    for vhost, queues in by_vhost(shape).items():
        connection = brokers.dst.connect(brokers.destination_vhost(vhost))
        try:
            channel = connection.channel()
            for queue in queues:
                total += int(channel.queue_declare(queue, passive=True).method.message_count)
        finally:
            connection.close()
    return total


def by_vhost(shape: Shape) -> dict[str, list[str]]:
    queues: dict[str, list[str]] = {}
    for vhost, queue in shape.spread("kd", shape.queues):
        queues.setdefault(vhost, []).append(queue)
    return queues


def kill_first_driver(
    brokers: Brokers, shape: Shape, config_path: Path, kill_at: int, log: Path
) -> float:
    """Start the job, SIGKILL its process group once the destination holds `kill_at`
    messages; returns the seconds it ran."""
    env = {**os.environ, PASSWORD_ENV: brokers.src.password}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    started = time.monotonic()
    with log.open("w", encoding="utf-8") as output:
        driver = subprocess.Popen(
            [str(SPARK_SUBMIT), "--config", str(config_path), "--run-id", RUN_ID],
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            while destination_total(brokers, shape) < kill_at:
                if driver.poll() is not None:
                    raise BenchError(
                        f"the first driver ended (exit {driver.returncode}) before the "
                        f"destination held {kill_at} messages; its log: {log}"
                    )
                if time.monotonic() - started > FIRST_DRIVER_TIMEOUT_SECONDS:
                    raise BenchError(f"the first driver did not move {kill_at} messages")
                time.sleep(0.05)  # a polling interval, not a wait for a condition
        finally:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    return time.monotonic() - started


def ledger_figures(ledger: Path) -> dict[str, int]:
    """The run's rows by kind, and the confirmed rows published a second time."""
    rows = tables.read_arrow(str(ledger), "messages", run_id=RUN_ID).to_pylist()
    rows.sort(key=lambda row: (row["source_queue"], row["position"]))
    confirmed: Counter[tuple[str, str, str]] = Counter()
    republished = 0
    for row in rows:
        fingerprint = (row["source_queue"], row["body_sha256"], row["properties_sha256"])
        if row["confirmed_at"] is None or row["decision"] == "recognised":
            continue
        if confirmed[fingerprint] and row["redelivered"]:
            republished += 1
        confirmed[fingerprint] += 1
    return {
        "ledger_rows": len(rows),
        "uncertain_rows": sum(1 for row in rows if row["confirmed_at"] is None),
        "recognised_rows": sum(1 for row in rows if row["decision"] == "recognised"),
        "confirmed_rows_published_again": republished,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.killed_driver",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--queues", type=int, default=20)
    parser.add_argument("--messages", type=int, default=5_000, help="messages per queue")
    parser.add_argument("--kill-at", type=float, default=0.3, help="share moved at the kill")
    parser.add_argument("--no-recognise", action="store_true", help="as before recognition")
    args = parser.parse_args(argv)
    shape = Shape(
        queues=args.queues, vhosts=1, messages=args.messages, shovel_queues=0, plan_queues=0
    )
    total = shape.queues * shape.messages
    work_dir = Path(tempfile.mkdtemp(prefix="rmq-spark-killed-driver-"))
    with local_brokers(work_dir / "brokers", shape.vhost_names()) as brokers:
        queues = shape.spread("kd", shape.queues)
        seed(brokers, queues, Workload(shape.messages, shape.message_bytes))
        wait_until_listed(brokers, queues, r"kd\.q")
        ledger = work_dir / "ledger"
        config = job_config(
            brokers,
            vhosts=shape.vhost_names(),
            queue_pattern=PATTERN,
            ledger=ledger,
            destination_type="classic",
            window=None,  # as shipped
            max_active=4,
        )
        config["mover"] = {"recognise_redeliveries": not args.no_recognise}
        config_path = work_dir / f"{RUN_ID}.yaml"
        config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
        killed_after = kill_first_driver(
            brokers, shape, config_path, int(total * args.kill_at), work_dir / "first.log"
        )
        at_kill = destination_total(brokers, shape)
        rerun = run_job(brokers, config, work_dir, RUN_ID, total)
        stdout = (work_dir / f"{RUN_ID}.stdout").read_text(encoding="utf-8")
        (line,) = [x for x in stdout.splitlines() if x.startswith(RESULT_PREFIX)][-1:]
        result = json.loads(line[len(RESULT_PREFIX) :])
        report: dict[str, Any] = {
            "bench": "killed_driver",
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": machine_facts(),
            "code": code_state(),
            "shape": {"queues": shape.queues, "messages": shape.messages, "bytes": KIB},
            "recognise": not args.no_recognise,
            "first_driver_seconds": round(killed_after, 2),
            "destination_at_kill": at_kill,
            "rerun_seconds": round(rerun.seconds, 2),
            "result": {
                name: result.get(name)
                for name in ("verified", "messages", "lost", "duplicates", "recognised")
            },
            "ledger": ledger_figures(ledger),
        }
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = RESULTS / f"killed-driver-{stamp}.json"
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(report, indent=2))
    print(f"written {path}")
    return 0 if report["result"]["verified"] and report["result"]["lost"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
