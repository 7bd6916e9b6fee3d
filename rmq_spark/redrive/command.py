"""`rmq-spark redrive`: each dead-lettered message back to the queue it died in.

    rmq-spark redrive --config FILE --queue CLUSTER:VHOST:QUEUE [--where SQL]
        [--messages-per-second N] [--dry-run] [--run-id ID] [--to-exchange]
        [--broker-headers move|remove|keep] [--restore-expiration]

Exit 0 verified (or the dry run's plan printed, or nothing to move), 1 moved but not
verified, 2 bad input or a broker refused (nothing moved), 3 internal error. Every run
prints the plan first (the dry run's read of the DLQ); a moving one then runs the
redrive on Spark (`redrive/run.py`) and prints what arrived where and the RESULT.
docs/redrive.md is the user's page.
"""

from __future__ import annotations

import argparse
import logging
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from rmq_spark.config import JobConfig, load_config, validate_run_id
from rmq_spark.errors import ConfigError
from rmq_spark.logs import mask_secrets_in_logs
from rmq_spark.redrive.header_options import add_header_policy_arguments, header_policy

if TYPE_CHECKING:
    from rmq_spark.redrive.preflight import DeadLetterQueue

log = logging.getLogger(__name__)

EXIT_OK, EXIT_UNVERIFIED, EXIT_ERROR = 0, 1, 2
# The CLI's Spark session for a command (cli.command_session): app name -> session.
SessionFactory = Callable[[str], AbstractContextManager[Any]]


def add_redrive_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="YAML config file (its clusters, ledger)")
    parser.add_argument(
        "--queue",
        required=True,
        metavar="CLUSTER:VHOST:QUEUE",
        help="the dead-letter queue to redrive, e.g. main:/:orders.dlq",
    )
    parser.add_argument(
        "--where",
        metavar="SQL",
        help="only messages this selection expression is TRUE for (docs/selection.md), "
        "e.g. \"last_death.reason = 'rejected' AND headers['tenant'] = 'acme'\"",
    )
    parser.add_argument(
        "--messages-per-second",
        type=float,
        metavar="N",
        help="at most N messages a second, moved and kept together (the rate brake of "
        "limits.messages_per_second)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print how many messages would go where, by origin queue and death reason; "
        "move nothing",
    )
    parser.add_argument(
        "--run-id",
        help="the ledger's run id of this redrive (default: redrive-<UTC time>-<random>)",
    )
    parser.add_argument(
        "--to-exchange",
        action="store_true",
        help="publish through the exchange and routing key x-death recorded (every queue "
        "bound there gets a copy) instead of straight to the origin queue",
    )
    add_header_policy_arguments(parser)


def run_redrive_command(args: argparse.Namespace, session: SessionFactory | None = None) -> int:
    """Redrive a dead-letter queue, or with --dry-run say what a redrive would do.

    `session` opens the Spark session a moving redrive runs on (the CLI's); none is
    needed for a dry run."""
    # Imported here: `rmq-spark --help` need not load DuckDB, sqlglot and pika.
    from rmq_spark.redrive.preflight import (
        compile_where,
        existing_queues,
        format_counts,
        parse_queue,
        redrive_decider,
        survey,
    )

    config = load_config(args.config)
    mask_secrets_in_logs(config)
    dlq = parse_queue(args.queue, config)
    selection = compile_where(args.where)
    if args.run_id is not None:
        validate_run_id(args.run_id)
    if args.messages_per_second is not None and not args.messages_per_second > 0:
        raise ConfigError(f"--messages-per-second {args.messages_per_second}: must be above 0")
    policy = header_policy(args)
    existing = existing_queues(config, dlq)
    decider = redrive_decider(dlq, existing, selection, policy, args.to_exchange)
    try:
        counts = survey(config, dlq, decider)
    finally:
        decider.close()
    print(format_counts(dlq, counts), flush=True)
    if args.dry_run:
        return EXIT_OK
    from rmq_spark.redrive.readings import readings_recorded
    from rmq_spark.transfer.decisions import MOVED

    # A killed run resumed with its --run-id is finished (committed, verified) even when
    # its first driver moved everything there was to move.
    resuming = args.run_id is not None and readings_recorded(config, args.run_id)
    if not resuming and not any(decision == MOVED for decision, _, _ in counts):
        print(f"redrive of {dlq.label}: no message to move; nothing moved", flush=True)
        return EXIT_OK
    if session is None:
        raise ConfigError("rmq-spark redrive: moving needs a Spark session (run it from the CLI)")
    return _move(args, config, dlq, counts, existing, session=session)


def _move(
    args: argparse.Namespace,
    config: JobConfig,
    dlq: DeadLetterQueue,
    counts: Counter[tuple[str, str, str]],
    existing: frozenset[str],
    *,
    session: SessionFactory,
) -> int:
    """The moving redrive (`redrive/run.py`), its result printed (`redrive/console.py`)."""
    from rmq_spark.redrive.console import format_result
    from rmq_spark.redrive.decider import RedriveSpec
    from rmq_spark.redrive.preflight import origin_queues
    from rmq_spark.redrive.run import run_redrive
    from rmq_spark.run_id import new_run_id

    spec = RedriveSpec(
        dlq.queue,
        existing,
        where=args.where,
        broker_headers=args.broker_headers,
        restore_expiration=args.restore_expiration,
        to_exchange=args.to_exchange,
    )
    run_id = args.run_id or f"redrive-{new_run_id()}"
    with session("rmq-spark redrive") as spark:
        result = run_redrive(
            spark,
            config,
            dlq,
            spec,
            origins=[] if args.to_exchange else origin_queues(counts, dlq),
            messages_per_second=args.messages_per_second,
            run_id=run_id,
        )
    print(format_result(result), flush=True)
    return EXIT_OK if result.verified else EXIT_UNVERIFIED
