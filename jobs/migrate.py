"""spark-submit entry point: classic -> quorum migration in place. All logic lives in rmq_spark."""

from __future__ import annotations

import sys

from rmq_spark.cli import migrate_main
from rmq_spark.process_exit import exit_job

if __name__ == "__main__":
    exit_job(migrate_main(sys.argv[1:]))
