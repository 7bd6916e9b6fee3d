"""spark-submit entry point: classic -> quorum migration in place. All logic lives in rmq_spark."""

from __future__ import annotations

import sys

from rmq_spark.cli import migrate_main

if __name__ == "__main__":
    sys.exit(migrate_main(sys.argv[1:]))
