"""Verification at scale: a run of a million ledger rows and more, verified as the job
verifies it, without brokers.

    python -m bench.verification                        # 12 queues x 100,000 x 256 B (~4 min)
    python -m bench.verification --engines spark        # the Spark engine only (~2 min)
    python -m bench.verification --queues 3 --messages 20000 --rounds 2
    python -m bench.verification --profile              # pyinstrument report per round

1. **ledger**: writes a run's ledger the way the job's executors write it
   (`write_run`): one `MessageLedgerWriter` per queue transfer, one durable write per
   window of deliveries, rows streams rolled into Parquet data files, then
   `tables.commit_run` (compaction and the Delta commit). The rows are a clean
   run's: every message confirmed once, positions 0..n-1 in publish order, checksums
   of ``--message-bytes`` random bodies. The counters are what the pipeline records
   for such a run (`run_counters`: each source drained, each destination risen by
   its messages, the consumer counters at the messages moved).
2. **verification**: ``./spark-submit.sh`` runs `bench/jobs/verify_ledger.py` (the
   job's master, JVM options and shipped package), which calls `verify_ledger_run`,
   the entry point the job calls, with ``local_max_rows`` 0 (the Spark engine) or
   above the run's rows (the driver engine, for comparison); each engine
   ``--rounds`` times. It reports the call's seconds, the verification's phases
   (verification.json's ``seconds``) and every Spark job the call ran with its
   duration.

Checks: every round verified, the run's messages all counted once, no duplicates,
and (both engines) the same summary rows from each. Writes
``bench/results/verification-<stamp>.json``; exits 1 if a check failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.contenders import REPO, SPARK_SUBMIT, BenchError
from bench.workload import code_state, load_average
from bench.workload import machine as machine_facts
from rmq_spark.ledger import tables
from rmq_spark.ledger.writer import MessageLedgerWriter
from rmq_spark.model import Delivery, DeliveryState, TransferKey
from rmq_spark.verify import (
    DESTINATION_SHARED,
    ENGINE_DRIVER,
    ENGINE_SPARK,
    FENCES,
    SOURCE_REMOVED,
)

log = logging.getLogger("bench.verification")

RESULTS_DIR = Path(__file__).resolve().parent / "results"
VERIFY_JOB = REPO / "bench" / "jobs" / "verify_ledger.py"
PROFILE_ENV = "RMQ_SPARK_BENCH_PROFILE"  # bench/jobs/verify_ledger.py reads it
RUN_ID = "verification-at-scale"
WINDOW = 1_000  # deliveries per durable write, the default window
# The job's pace, for realistic timestamps: a delivery every 70 us, confirmed 20 ms later.
DELIVERY_INTERVAL = timedelta(microseconds=70)
CONFIRM_DELAY = timedelta(milliseconds=20)
STARTED = datetime(2026, 11, 27, 6, 0, tzinfo=UTC)
JOB_TIMEOUT_SECONDS = 1_800.0
# Issue 31's target for a 1.2 M-message run on the Spark engine.
TARGET_SECONDS = 15.0


@dataclass(frozen=True)
class Shape:
    queues: int
    messages: int  # per queue
    message_bytes: int

    @property
    def rows(self) -> int:
        return self.queues * self.messages


def transfer_key(index: int) -> TransferKey:
    return TransferKey("old", "/", f"vq.{index:05d}", "new", "/", f"vq.{index:05d}")


def deliveries(shape: Shape, index: int) -> list[Delivery]:
    """A clean move of one queue: each message consumed, published and confirmed once."""
    rng = random.Random(f"verification/{index}")
    queue = transfer_key(index).source_queue
    moved = []
    for position in range(shape.messages):
        consumed = STARTED + DELIVERY_INTERVAL * position
        message_id = f"{queue}/{position}"
        moved.append(
            Delivery(
                tag=position + 1,
                seq=position + 1,
                position=position,
                redelivered=False,
                body_size=shape.message_bytes,
                body_sha256=hashlib.sha256(rng.randbytes(shape.message_bytes)).hexdigest(),
                properties_sha256=hashlib.sha256(message_id.encode()).hexdigest(),
                message_id=message_id,
                consumed_at=consumed,
                confirmed_at=consumed + CONFIRM_DELAY,
                state=DeliveryState.DURABLE,
            )
        )
    return moved


def write_run(ledger: str, run_id: str, shape: Shape) -> int:
    """The run's ledger as the job leaves it: executor writes, then the driver's commit.

    Returns the rows committed."""
    tables.ensure_tables(ledger)
    for index in range(shape.queues):
        writer = MessageLedgerWriter(ledger, run_id, transfer_key(index), f"3.{index}.0")
        moved = deliveries(shape, index)
        for start in range(0, len(moved), WINDOW):
            writer.write(moved[start : start + WINDOW])
        writer.close()
    return tables.commit_run(ledger, run_id)


def reused_rows(ledger: str) -> int:
    """The rows of the run an earlier `write_run` committed at `ledger` (0: none)."""
    if not Path(ledger, "messages", "_delta_log").is_dir():
        return 0
    return int(tables.arrow_dataset(ledger, "messages", RUN_ID).count_rows())


def run_counters(run_id: str, shape: Shape) -> list[dict[str, Any]]:
    """What `pipeline.counters_rows` records for the clean run `write_run` writes."""
    rows = []
    for index in range(shape.queues):
        key = transfer_key(index)
        rows.append(
            {
                "run_id": run_id,
                **dataclasses.asdict(key),
                "partition": index,
                "status": "moved",
                "error": None,
                "source_depth_before": shape.messages,
                "source_depth_after": 0,
                "destination_depth_before": 0,
                "destination_depth_after": shape.messages,
                DESTINATION_SHARED: False,
                SOURCE_REMOVED: shape.messages,
                "reordered_by_priority": 0,
                FENCES: 0,
            }
        )
    return rows


def verify_round(
    ledger: str,
    shape: Shape,
    engine: str,
    work_dir: Path,
    label: str,
    *,
    profile: bool,
    submit_args: Sequence[str] = (),
) -> dict[str, Any]:
    """One verification through spark-submit; its figures, the submit's wall time
    and the verification.json it wrote."""
    result_path = work_dir / label / "result.json"
    config = {
        "ledger": ledger,
        "run_id": RUN_ID,
        "counters": run_counters(RUN_ID, shape),
        "out_dir": str(work_dir / label / "verification"),
        "local_max_rows": 0 if engine == ENGINE_SPARK else shape.rows,
        "result": str(result_path),
    }
    (work_dir / label).mkdir(parents=True)
    config_path = work_dir / label / "config.json"
    config_path.write_text(json.dumps(config), encoding="utf-8")
    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "RMQ_SPARK_JOB": str(VERIFY_JOB),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
    }
    profile_path = work_dir / label / "profile.txt"
    if profile:
        env[PROFILE_ENV] = str(profile_path)
    started = time.monotonic()
    completed = subprocess.run(
        [str(SPARK_SUBMIT), *submit_args, "--config", str(config_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_SECONDS,
        check=False,
    )
    submit_seconds = time.monotonic() - started
    (work_dir / label / "stderr.txt").write_text(completed.stderr, encoding="utf-8")
    if completed.returncode != 0:
        raise BenchError(
            f"{label}: verify_ledger exited {completed.returncode}:\n{completed.stderr[-3000:]}"
        )
    result: dict[str, Any] = json.loads(result_path.read_text(encoding="utf-8"))
    result["submit_seconds"] = round(submit_seconds, 2)
    if profile:
        result["profile"] = profile_path.read_text(encoding="utf-8").splitlines()
    result["summary_rows"] = [
        queue["summary"]
        for queue in json.loads(Path(result["results_path"]).read_text("utf-8"))["queues"]
    ]
    return result


def check(result: dict[str, Any], shape: Shape, label: str) -> list[str]:
    errors = []
    if not result["verified"]:
        errors.append(f"{label}: not verified")
    if (result["messages"], result["duplicates"], result["lost"]) != (shape.rows, 0, 0):
        errors.append(
            f"{label}: expected {shape.rows} messages, 0 duplicates, 0 lost; found "
            f"{result['messages']}, {result['duplicates']}, {result['lost']}"
        )
    return errors


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.verification",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--queues", type=int, default=12, help="queue transfers in the run")
    parser.add_argument("--messages", type=int, default=100_000, help="messages per queue")
    parser.add_argument("--message-bytes", type=int, default=256, help="body size")
    parser.add_argument(
        "--engines",
        default=f"{ENGINE_SPARK},{ENGINE_DRIVER}",
        help="comma-separated: spark (the engine above 1M rows), driver (pyarrow + pandas)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="verifications per engine")
    parser.add_argument("--profile", action="store_true", help="pyinstrument the verify call")
    parser.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="passed to spark-submit as --conf (repeatable), e.g. "
        "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=4 for the C2 JIT",
    )
    parser.add_argument("--keep-work-dir", action="store_true", help="keep ledger and outputs")
    parser.add_argument(
        "--ledger",
        type=Path,
        help="write the ledger here (kept), or reuse the run this command wrote there before",
    )
    args = parser.parse_args(argv)
    engines = [name.strip() for name in args.engines.split(",") if name.strip()]
    unknown = [name for name in engines if name not in (ENGINE_SPARK, ENGINE_DRIVER)]
    if unknown or not engines:
        parser.error(f"--engines: expected spark and/or driver, found {args.engines!r}")
    if args.queues < 1 or args.messages < 1 or args.message_bytes < 0 or args.rounds < 1:
        parser.error("--queues, --messages and --rounds: at least 1; --message-bytes: 0 or more")
    args.engines = engines
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    shape = Shape(args.queues, args.messages, args.message_bytes)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    work_dir = Path(tempfile.mkdtemp(prefix="rmq-spark-verification-"))
    report: dict[str, Any] = {
        "benchmark": "verification",
        "command": "python -m bench.verification " + " ".join(argv or sys.argv[1:]),
        "shape": shape.__dict__ | {"rows": shape.rows},
        "started_at": datetime.now(UTC).isoformat(),
        "machine": machine_facts(),
        "code": code_state(),
        "load_average_start": load_average(),
    }
    errors: list[str] = []
    rounds: dict[str, list[dict[str, Any]]] = {}
    try:
        ledger = str(args.ledger or work_dir / "ledger")
        started = time.monotonic()
        committed = reused_rows(ledger) or write_run(ledger, RUN_ID, shape)
        report["ledger"] = {
            "path": ledger,
            "rows": committed,
            "data_files": len(
                tables.arrow_dataset(ledger, "messages", RUN_ID).files  # type: ignore[attr-defined]
            ),
            "write_seconds": round(time.monotonic() - started, 1),
        }
        log.info("ledger: %s", report["ledger"])
        if committed != shape.rows:
            raise BenchError(f"ledger: expected {shape.rows} rows committed, found {committed}")
        for number in range(args.rounds):
            for engine in args.engines:
                label = f"{engine}-{number}"
                try:
                    result = verify_round(
                        ledger,
                        shape,
                        engine,
                        work_dir,
                        label,
                        profile=args.profile,
                        submit_args=[a for c in args.spark_conf for a in ("--conf", c)],
                    )
                except BenchError as exc:
                    errors.append(str(exc))
                    continue
                errors += check(result, shape, label)
                rounds.setdefault(engine, []).append(result)
                log.info("%s: %.1f s (%s)", label, result["seconds"], json.dumps(result["phases"]))
    except BenchError as exc:
        errors.append(str(exc))
    finally:
        if not args.keep_work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
        else:
            report["work_dir"] = str(work_dir)
    summaries = {
        json.dumps(result["summary_rows"], sort_keys=True, default=str)
        for results in rounds.values()
        for result in results
    }
    if len(summaries) > 1:
        errors.append("the engines' (or rounds') summary rows differ")
    report |= {
        "rounds": {
            engine: [{k: v for k, v in r.items() if k != "summary_rows"} for r in results]
            for engine, results in rounds.items()
        },
        "summary_rows": next(iter(rounds.values()))[0]["summary_rows"] if rounds else [],
        "figures": figures(rounds, shape),
        "errors": errors,
        "finished_at": datetime.now(UTC).isoformat(),
        "load_average_end": load_average(),
    }
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"verification-{stamp}.json"
    path.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    print(json.dumps({k: report[k] for k in ("figures", "errors")}, indent=2))
    print(f"wrote {path}")
    return 1 if errors else 0


def figures(rounds: dict[str, list[dict[str, Any]]], shape: Shape) -> dict[str, Any]:
    """Per engine: the verification's seconds per round, and the target where it applies."""
    found: dict[str, Any] = {}
    for engine, results in rounds.items():
        seconds = [r["seconds"] for r in results]
        entry: dict[str, Any] = {
            "seconds": seconds,
            "spark_jobs": [len(r["spark_jobs"].get("jobs", [])) for r in results],
        }
        if engine == ENGINE_SPARK and shape.rows >= 1_200_000:
            entry["target"] = f"<= {TARGET_SECONDS:.0f} s for 1.2 M messages"
            entry["met"] = max(seconds) <= TARGET_SECONDS
        found[engine] = entry
    return found


if __name__ == "__main__":
    raise SystemExit(main())
