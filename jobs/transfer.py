"""spark-submit entry point: the transfer job. All logic lives in rmq_spark."""

from __future__ import annotations

import sys

from rmq_spark.cli import transfer_main
from rmq_spark.process_exit import exit_job

if __name__ == "__main__":
    exit_job(transfer_main(sys.argv[1:]))
