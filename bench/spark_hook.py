"""What the movers' Spark hook costs, side by side in one fresh session per round:

- `arrow`: `DataFrame.mapInArrow` over `spark.range(n, n)`, what Spark Connect runs
  (`partition_tasks.run_tasks` on a Connect session);
- `rdd`: `parallelize(range(n), n).mapPartitions` with the groups and settings in
  the task's closure, what classic Spark runs (`run_tasks` on a classic session);
- `broadcast`: `parallelize(groups, n).flatMap.mapPartitions` with the settings in a
  broadcast, what the job ran before issue 24.

    python -m bench.spark_hook            # 4 tasks (the demo's), 1,000-queue plan

Each round starts a fresh local[*,4] session in a child process and runs the same
do-nothing task (one row per task; the plan groups and settings of `--queues` queues
in its closure) through each hook, the first call of each on a session that has run
no job: the order rotates between rounds. Also reports the pickled size of a task's
closure. Writes bench/results/spark-hook-<stamp>.json.
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
HOOKS = ("arrow", "rdd", "broadcast")


def _plan(queues: int, tasks: int) -> tuple[list[list[dict[str, Any]]], Any]:
    from rmq_spark.config import ClusterConfig
    from rmq_spark.model import QueueTransfer
    from rmq_spark.planning.plan import assign_partitions, plan_groups
    from rmq_spark.transfer.executor import ExecutorSettings

    transfers = [
        QueueTransfer(
            route="dr-failback",
            source_cluster="dr",
            source_vhost=f"vhost-{i % 5}",
            source_queue=f"orders.region-{i:05d}",
            source_type="classic",
            source_node="rabbit@dr-node-1",
            destination_cluster="main",
            destination_vhost=f"vhost-{i % 5}",
            destination_queue=f"orders.region-{i:05d}",
            messages=20,
            message_bytes=20 * 1024,
            destination_messages=0,
        )
        for i in range(queues)
    ]
    groups = plan_groups(transfers, assign_partitions(transfers, tasks))
    cluster = ClusterConfig(
        amqp=["amqp://10.0.0.1:5672", "amqp://10.0.0.2:5672", "amqp://10.0.0.3:5672"],
        management="http://10.0.0.1:15672",
        username="rmqspark",
        password_env="RMQ_SPARK_PASSWORD",
    )
    settings = ExecutorSettings(
        run_id="20261125T000000Z-abcdef",
        ledger_path="/mnt/shared/ledger",
        clusters={"dr": cluster, "main": cluster},
        window_messages=5000,
        window_bytes=64 << 20,
        max_active=tasks,
        task_attempts=4,
    )
    return groups, settings


def _task(indices: Any, *, groups: Any, settings: Any) -> list[dict[str, Any]]:
    """Touches its group and settings, as the movers' task does, and nothing else."""
    return [{"index": int(i), "queues": len(groups[i]) + len(settings.run_id) * 0} for i in indices]


def _rdd_task(rows: Any, *, settings: Any) -> Any:
    """The same, over the rows of an RDD partition and broadcast settings."""
    resolved = settings.value
    rows = list(rows)
    yield {"index": 0, "queues": len(rows) + len(resolved.run_id) * 0}


def child(queues: int, tasks: int, calls: int, first: int) -> dict[str, Any]:
    """One fresh session: each hook `calls` times, HOOKS[first] first."""
    import pyarrow as pa

    from rmq_spark.partition_tasks import _arrow_task, index_frame, run_tasks, spark_schema_of
    from rmq_spark.spark_session import build_session

    started = time.monotonic()
    spark = build_session("bench spark hook", master="local[*,4]")
    session_seconds = time.monotonic() - started
    groups, settings = _plan(queues, tasks)
    schema = pa.schema([("index", pa.int64()), ("queues", pa.int64())])

    task = partial(_task, groups=groups, settings=settings)

    def arrow() -> list[dict[str, Any]]:
        frame = index_frame(spark, tasks).mapInArrow(
            partial(_arrow_task, task=task, schema=schema), spark_schema_of(schema)
        )
        rows: list[dict[str, Any]] = frame.toArrow().to_pylist()
        return rows

    def rdd() -> list[dict[str, Any]]:
        return run_tasks(spark, tasks, task, schema)

    def broadcast() -> list[dict[str, Any]]:
        # As pipeline.move did before: rows in the RDD, settings in a broadcast.
        context = spark.sparkContext
        shared = context.broadcast(settings)
        try:
            rows: list[dict[str, Any]] = (
                context.parallelize(groups, tasks)
                .flatMap(lambda group: group)
                .mapPartitions(partial(_rdd_task, settings=shared))
                .collect()
            )
        finally:
            shared.unpersist()
        return rows

    hooks = {"arrow": arrow, "rdd": rdd, "broadcast": broadcast}
    timings: dict[str, list[float]] = {name: [] for name in hooks}
    order = list(HOOKS[first:] + HOOKS[:first])
    for _ in range(calls):
        for name in order:
            began = time.monotonic()
            rows = hooks[name]()
            timings[name].append(time.monotonic() - began)
            assert len(rows) == tasks, (name, rows)
        order.reverse()
    spark.stop()
    return {"session_seconds": session_seconds, "timings": timings}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        result = child(args.queues, args.tasks, args.calls, args.child)
        print(json.dumps(result))
        return 0

    groups, settings = _plan(args.queues, args.tasks)
    closure = len(pickle.dumps((groups, settings)))
    rounds = []
    for index in range(args.rounds):
        first = index % len(HOOKS)
        out = (
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "bench.spark_hook",
                    "--child",
                    str(first),
                    "--queues",
                    str(args.queues),
                    "--tasks",
                    str(args.tasks),
                    "--calls",
                    str(args.calls),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        rounds.append({"first": HOOKS[first], **json.loads(out)})

    def summary(name: str) -> dict[str, float]:
        firsts = [r["timings"][name][0] for r in rounds]
        later = [t for r in rounds for t in r["timings"][name][1:]]
        return {
            "first_call_median_s": round(statistics.median(firsts), 3),
            "later_calls_median_s": round(statistics.median(later), 3),
        }

    summaries = {name: summary(name) for name in HOOKS}
    base = summaries["broadcast"]
    report = {
        "queues": args.queues,
        "tasks": args.tasks,
        "closure_bytes": closure,
        **summaries,
        "ratios_over_broadcast": {
            name: {
                "first_call": round(s["first_call_median_s"] / base["first_call_median_s"], 2),
                "later_calls": round(s["later_calls_median_s"] / base["later_calls_median_s"], 2),
            }
            for name, s in summaries.items()
        },
        "rounds": rounds,
    }
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = RESULTS / f"spark-hook-{stamp}.json"
    path.write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "rounds"}, indent=2))
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
