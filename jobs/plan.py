"""spark-submit entry point: discovery and pre-flight only (a dry run). Logic in rmq_spark."""

from __future__ import annotations

import sys

from rmq_spark.cli import plan_main

if __name__ == "__main__":
    sys.exit(plan_main(sys.argv[1:]))
