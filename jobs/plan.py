"""spark-submit entry point: discovery and pre-flight only (a dry run). Logic in rmq_spark."""

from __future__ import annotations

import sys

from rmq_spark.cli import plan_main
from rmq_spark.process_exit import exit_job

if __name__ == "__main__":
    exit_job(plan_main(sys.argv[1:]))
