"""Verification alone, on the job's JVM: `bench.verification` submits this with
./spark-submit.sh (``RMQ_SPARK_JOB``), so the master, the JVM's options and the
shipped package are the transfer job's, and calls the entry point the job calls
(`verify_ledger_run`) on a committed ledger.

``--config`` names a JSON file: ``ledger``, ``run_id``, ``counters`` (the rows the
pipeline would pass), ``out_dir``, ``local_max_rows`` (0: the Spark engine) and
``result`` (where this writes its figures: the call's seconds, the Spark jobs it ran,
each with its duration, from the driver's REST API). With ``RMQ_SPARK_BENCH_PROFILE``
set to a path, the call runs under pyinstrument and its text report goes there.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from rmq_spark.cli import default_master
from rmq_spark.process_exit import exit_job
from rmq_spark.spark_session import build_session
from rmq_spark.verify import preload_great_expectations, verify_ledger_run

PROFILE_ENV = "RMQ_SPARK_BENCH_PROFILE"
JOB_GROUP = "verification"


def _rest(spark: Any, path: str) -> Any:
    ui = spark.sparkContext.uiWebUrl
    app = spark.sparkContext.applicationId
    with urllib.request.urlopen(f"{ui}/api/v1/applications/{app}/{path}", timeout=30) as answer:
        return json.load(answer)


def spark_jobs(spark: Any) -> dict[str, Any]:
    """The verification's Spark jobs and stages from the driver's REST API: what ran,
    how long, what it shuffled and spilled, and the JVM's GC time."""
    if not spark.sparkContext.uiWebUrl:
        return {}
    jobs = [j for j in _rest(spark, "jobs") if j.get("jobGroup") == JOB_GROUP]
    wanted = {stage for job in jobs for stage in job.get("stageIds", [])}
    stages = {
        s["stageId"]: s
        for s in _rest(spark, "stages")
        if s["stageId"] in wanted and s.get("status") == "COMPLETE"
    }
    executors = _rest(spark, "executors")
    return {
        "jobs": [
            {
                "job": job["jobId"],
                "name": job.get("name", ""),
                "submitted": job.get("submissionTime"),
                "completed": job.get("completionTime"),
                "tasks": job.get("numTasks"),
                "stages": [
                    {
                        "stage": stage,
                        "name": stages[stage].get("name", ""),
                        "tasks": stages[stage].get("numTasks"),
                        "run_ms": stages[stage].get("executorRunTime"),
                        "cpu_ms": round(stages[stage].get("executorCpuTime", 0) / 1e6),
                        "input_bytes": stages[stage].get("inputBytes"),
                        "shuffle_write_bytes": stages[stage].get("shuffleWriteBytes"),
                        "shuffle_read_bytes": stages[stage].get("shuffleReadBytes"),
                        "spilled_bytes": stages[stage].get("diskBytesSpilled"),
                    }
                    for stage in job.get("stageIds", [])
                    if stage in stages
                ],
            }
            for job in sorted(jobs, key=lambda j: j["jobId"])
        ],
        "gc_ms": sum(e.get("totalGCTime", 0) for e in executors),
        "max_memory_bytes": sum(e.get("maxMemory", 0) for e in executors),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="verify_ledger")
    parser.add_argument("--config", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    config = json.loads(Path(args.config).read_text(encoding="utf-8"))
    preload_great_expectations()  # as the transfer command does, while Spark starts
    started = time.monotonic()
    spark = build_session("rmq-spark verify bench", master=default_master())
    session_seconds = time.monotonic() - started
    spark.sparkContext.setJobGroup(JOB_GROUP, "verify_ledger_run")

    def verify() -> Any:
        return verify_ledger_run(
            spark,
            config["ledger"],
            config["run_id"],
            config["counters"],
            config["out_dir"],
            local_max_rows=int(config["local_max_rows"]),
        )

    started = time.monotonic()
    profile_path = os.environ.get(PROFILE_ENV)
    if profile_path:
        from pyinstrument import Profiler

        with Profiler(interval=0.005) as profiler:
            verification = verify()
        Path(profile_path).write_text(profiler.output_text(show_all=False), encoding="utf-8")
    else:
        verification = verify()
    seconds = time.monotonic() - started
    result = {
        "seconds": round(seconds, 3),
        "session_seconds": round(session_seconds, 3),
        "engine": verification.engine,
        "verified": verification.verified,
        "messages": verification.messages,
        "duplicates": verification.duplicates,
        "lost": verification.lost,
        "phases": dict(verification.phases),
        "results_path": verification.results_path,
        "spark_jobs": spark_jobs(spark),
        "master": spark.sparkContext.master,
        "shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
    }
    Path(config["result"]).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    spark.stop()
    return 0


if __name__ == "__main__":
    exit_job(main(sys.argv[1:]))
