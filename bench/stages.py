"""Where a mover's window sits while it moves a queue (``python -m bench.stages``).

    python -m bench.stages                                  # 100k x 1 KiB, window 1000
    python -m bench.stages --destination-type quorum --window 5000

Starts its own two local nodes, seeds one queue, and runs one mover in this process,
ledger on, exactly as an executor task does, while a thread samples
`QueueMover.window_stages` every few milliseconds. Little's law turns the average
number of deliveries in a stage into the time a delivery spends there (deliveries /
rate). What the window holds outside the mover's three stages is the source's part:
a delivery acked, and the next one not yet arrived.

* logging: received, waiting for or in the intent-log append (group commit);
* destination: published, waiting for the destination's confirm;
* ledger: confirmed, its row being written (the source ack follows at once);
* source: the rest of the round trip.

``destination_full_share`` is the share of samples in which nearly the whole window
(90% or more) waited on the destination while the mover had nothing else to do.
Only the middle 80% of the run counts: the window is filling at the start and
emptying at the end. Writes ``bench/results/stages-<stamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.contenders import WINDOW_BYTES, cluster_request
from bench.mover_child import settings_from
from bench.workload import (
    DESTINATION,
    SOURCE,
    Brokers,
    Workload,
    declare_destination,
    delete_queues,
    load_average,
    local_brokers,
    machine,
    seed_queue,
)
from rmq_spark.ledger import tables
from rmq_spark.model import MoveOutcome
from rmq_spark.transfer.amqp091.links import event_loop
from rmq_spark.transfer.executor import queue_mover
from rmq_spark.transfer.lanes import run_movers
from rmq_spark.transfer.mover import QueueMover
from rmq_spark.transfer.stages import WindowStages

RESULTS_DIR = Path(__file__).resolve().parent / "results"
VHOST = "stages"
SAMPLE_SECONDS = 0.002
# The window counts as waiting on the destination when this share of it does.
FULL_SHARE = 0.9

Sample = tuple[float, WindowStages]


def stage_times(samples: Sequence[Sample], window: int) -> dict[str, Any]:
    """Per-stage milliseconds per delivery (Little's law) over the middle 80% of samples."""
    if len(samples) < 10:
        raise ValueError(f"{len(samples)} samples: too few to say where the time goes")
    middle = samples[len(samples) // 10 : len(samples) * 9 // 10]
    (first_at, first), (last_at, last) = middle[0], middle[-1]
    rate = (last.moved - first.moved) / (last_at - first_at)
    if rate <= 0:
        raise ValueError("nothing moved in the middle of the run")
    count = len(middle)
    occupancy = {
        "logging": sum(stages.logging for _, stages in middle) / count,
        "destination": sum(stages.destination for _, stages in middle) / count,
        "ledger": sum(stages.ledger for _, stages in middle) / count,
    }
    milliseconds = {stage: 1000 * held / rate for stage, held in occupancy.items()}
    round_trip = 1000 * window / rate
    milliseconds["source"] = max(0.0, round_trip - sum(milliseconds.values()))
    full = sum(1 for _, stages in middle if stages.destination >= FULL_SHARE * window)
    return {
        "rate": round(rate),
        "round_trip_ms": round(round_trip, 1),
        "milliseconds": {stage: round(ms, 1) for stage, ms in milliseconds.items()},
        "share": {stage: round(ms / round_trip, 3) for stage, ms in milliseconds.items()},
        "destination_full_share": round(full / count, 3),
    }


def sampled_move(mover: QueueMover) -> tuple[MoveOutcome, list[Sample]]:
    """Run `mover` on this thread while another samples its stages."""
    samples: list[Sample] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(SAMPLE_SECONDS):
            samples.append((time.monotonic(), mover.window_stages()))

    sampler = threading.Thread(target=sample, name="bench-stages-sampler", daemon=True)
    sampler.start()
    try:
        (outcome,) = run_movers([lambda: mover], ioloop=event_loop())
    finally:
        done.set()
        sampler.join()
    return outcome, samples


def measure(
    brokers: Brokers,
    workload: Workload,
    *,
    window: int,
    destination_type: str,
    ledger: Path,
    queue: str = "stages",
) -> dict[str, Any]:
    """Seed `queue`, move it once with sampling, and say where the window sat."""
    seed_queue(brokers, VHOST, queue, workload, seed=f"stages/{workload.size}")
    declare_destination(brokers, VHOST, queue, destination_type)
    tables.ensure_tables(str(ledger))
    settings = settings_from(
        {
            "run_id": f"stages-{queue}",
            "ledger_path": str(ledger),
            "clusters": {
                SOURCE: cluster_request(brokers.src),
                DESTINATION: cluster_request(brokers.dst),
            },
            "window_messages": window,
            "window_bytes": WINDOW_BYTES,
        }
    )
    row = {
        "source_cluster": SOURCE,
        "source_vhost": VHOST,
        "source_queue": queue,
        "destination_cluster": DESTINATION,
        "destination_vhost": VHOST,
        "destination_queue": queue,
        "messages": workload.messages,
        "message_bytes": workload.bytes,
    }
    try:
        mover = queue_mover(row, settings, "bench")
        outcome, samples = sampled_move(mover)
    finally:
        delete_queues(brokers, VHOST, [queue])
    if outcome.status != "moved" or outcome.messages != workload.messages:
        raise RuntimeError(f"the mover did not move the queue: {outcome}")
    return {"messages": outcome.messages, "seconds": round(outcome.seconds, 2)} | stage_times(
        samples, mover.prefetch
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.stages",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=1024, help="body bytes per message")
    parser.add_argument("--window", type=int, default=1000, help="the mover's window (prefetch)")
    parser.add_argument("--destination-type", choices=("classic", "quorum"), default="classic")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    workload = Workload(args.messages, args.size)
    work_dir = Path(tempfile.mkdtemp(prefix="rmq-spark-stages-"))
    report: dict[str, Any] = {
        "benchmark": "stages",
        "command": "python -m bench.stages " + " ".join(argv or sys.argv[1:]),
        "started_at": datetime.now(UTC).isoformat(),
        "machine": machine(),
        "load_average_start": load_average(),
        "workload": {"messages": args.messages, "size": args.size},
        "window": args.window,
        "destination_type": args.destination_type,
        "rounds": [],
    }
    try:
        with local_brokers(work_dir / "brokers", [VHOST]) as brokers:
            for round_ in range(args.rounds):
                result = measure(
                    brokers,
                    workload,
                    window=args.window,
                    destination_type=args.destination_type,
                    ledger=work_dir / f"ledger-{round_}",
                    queue=f"stages-{round_}",
                )
                report["rounds"].append(result)
                print(describe(result), flush=True)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    report["load_average_end"] = load_average()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = RESULTS_DIR / f"stages-{stamp}.json"
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}")
    return 0


def describe(result: dict[str, Any]) -> str:
    ms = result["milliseconds"]
    return (
        f"{result['rate']:,} msg/s, round trip {result['round_trip_ms']} ms: "
        f"source {ms['source']}, logging {ms['logging']}, destination {ms['destination']}, "
        f"ledger {ms['ledger']} ms; whole window at the destination "
        f"{result['destination_full_share']:.0%} of the time"
    )


if __name__ == "__main__":
    raise SystemExit(main())
