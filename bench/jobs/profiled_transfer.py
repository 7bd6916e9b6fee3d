"""The transfer job under cProfile: `bench.many_queues --profile-driver` runs this
instead of jobs/transfer.py (``RMQ_SPARK_JOB``), so the driver's per-queue work shows
up by function. The stats go to the file named by ``RMQ_SPARK_DRIVER_PROFILE``."""

from __future__ import annotations

import cProfile
import os
import sys

from rmq_spark.cli import transfer_main

PROFILE_ENV = "RMQ_SPARK_DRIVER_PROFILE"  # bench.many_queues sets it

if __name__ == "__main__":
    profiler = cProfile.Profile()
    code = profiler.runcall(transfer_main, sys.argv[1:])
    profiler.dump_stats(os.environ[PROFILE_ENV])
    sys.exit(code)
