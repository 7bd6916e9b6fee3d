"""`rmq-spark demo`: its arguments, and the call into the dev harness (`devtools.demo`),
which is in a source checkout only.

The command must still parse where the harness is missing (an installed wheel); running
it there says what is missing instead.
"""

from __future__ import annotations

import argparse

from rmq_spark.errors import RmqSparkError
from rmq_spark.logs import setup_logging

# Local brokers and the demo: in a source checkout only, not in the wheel (pyproject.toml)
# or the package zip spark-submit.sh ships to executors.
DEV_HARNESS = "rmq_spark.devtools"
# Where the demo's ledger lives (`devtools.demo_store.LEDGERS`, repeated so that the
# parser needs no harness).
DEMO_LEDGERS = ("local", "s3", "azure")


def is_dev_harness_missing(exc: ModuleNotFoundError) -> bool:
    """Whether the import failed because rmq_spark.devtools is absent (an installed wheel)."""
    return (exc.name or "").startswith(DEV_HARNESS)


def add_demo_arguments(demo: argparse.ArgumentParser) -> None:
    demo.add_argument("--messages-per-queue", type=int, default=3000)
    demo.add_argument("--base-dir", default=".demo")
    demo.add_argument("--keep-brokers", action="store_true", help="leave the demo nodes running")
    demo.add_argument(
        "--ledger",
        default="local",
        choices=DEMO_LEDGERS,
        help="where the ledger goes: local (a directory under --base-dir), or s3/azure: "
        "a local S3 server (moto) or Azure Blob emulator (Azurite) started for the demo, "
        "every table read back from it before it stops",
    )
    try:
        from rmq_spark.devtools.rabbitmq_roots import HOST_VERSION, VERSIONS
    except ModuleNotFoundError as exc:
        if not is_dev_harness_missing(exc):
            raise
        # Every other command must still parse; run_demo_command says what is missing.
        demo.add_argument("--rabbitmq", help="RabbitMQ version of the demo nodes")
        return
    demo.add_argument(
        "--rabbitmq",
        default=HOST_VERSION,
        choices=list(VERSIONS),
        help=f"RabbitMQ version of the demo nodes: {HOST_VERSION} is the host's Debian "
        "package, the others run from Debian roots built on first use (~20 s each)",
    )


def run_demo_command(args: argparse.Namespace) -> int:
    try:
        from rmq_spark.devtools.demo import run_demo
    except ModuleNotFoundError as exc:
        if not is_dev_harness_missing(exc):
            raise
        raise RmqSparkError(
            "rmq-spark demo runs from a source checkout (`make demo` in a clone of the "
            f"repository): the dev harness ({DEV_HARNESS}) is not in the installed package"
        ) from exc

    setup_logging()
    return run_demo(
        base_dir=args.base_dir,
        messages_per_queue=args.messages_per_queue,
        keep_brokers=args.keep_brokers,
        rabbitmq=args.rabbitmq,
        ledger=args.ledger,
    )
