"""`rmq-spark redrive`: each dead-lettered message back to the queue it died in.

    rmq-spark redrive --config FILE --queue CLUSTER:VHOST:QUEUE [--where SQL]
        [--messages-per-second N] [--dry-run] [--to-exchange]
        [--broker-headers move|remove|keep] [--restore-expiration]

Exit 0 the dry run's plan printed, 2 bad input or a broker refused (nothing moved), 3
internal error. Only --dry-run is built so far (issue 26): without it the command prints
the same plan and exits 2. docs/redrive.md is the user's page.
"""

from __future__ import annotations

import argparse
import logging

from rmq_spark.config import load_config
from rmq_spark.errors import ConfigError
from rmq_spark.logs import mask_secrets_in_logs

log = logging.getLogger(__name__)

EXIT_OK, EXIT_ERROR = 0, 2
# headers.HeaderAction's values, default first (not imported: `rmq-spark --help` need not
# load the selection language; tests/unit/redrive/test_command.py checks they agree).
BROKER_HEADER_ACTIONS = ("move", "remove", "keep")


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
        help="at most N messages a second (the rate brake of limits.messages_per_second); "
        "checked now, used once moving is built",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print how many messages would go where, by origin queue and death reason; "
        "move nothing (required for now: moving is not built yet)",
    )
    parser.add_argument(
        "--to-exchange",
        action="store_true",
        help="publish through the exchange and routing key x-death recorded (every queue "
        "bound there gets a copy) instead of straight to the origin queue",
    )
    parser.add_argument(
        "--broker-headers",
        choices=BROKER_HEADER_ACTIONS,
        default=BROKER_HEADER_ACTIONS[0],
        help="x-death, x-first-death-*, x-last-death-*, x-delivery-count, x-acquired-count: "
        "move them under one 'rmq-spark-death' table header (default), remove or keep them",
    )
    parser.add_argument(
        "--restore-expiration",
        action="store_true",
        help="put the origin x-death entry's original-expiration back as the expiration "
        "property (default: a redriven message has no TTL)",
    )


def run_redrive_command(args: argparse.Namespace) -> int:
    """Redrive a dead-letter queue, or with --dry-run say what a redrive would do."""
    # Imported here: `rmq-spark --help` need not load DuckDB, sqlglot and pika.
    from rmq_spark.redrive.headers import HeaderAction, HeaderPolicy
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
    if args.messages_per_second is not None and not args.messages_per_second > 0:
        raise ConfigError(f"--messages-per-second {args.messages_per_second}: must be above 0")
    policy = HeaderPolicy(HeaderAction(args.broker_headers), args.restore_expiration)
    existing = existing_queues(config, dlq)
    decider = redrive_decider(dlq, existing, selection, policy, args.to_exchange)
    try:
        counts = survey(config, dlq, decider)
    finally:
        decider.close()
    print(format_counts(dlq, counts), flush=True)
    if args.dry_run:
        return EXIT_OK
    # The engine's path for a redrive (one route, the origin queues as its destinations,
    # their depths in verification) is not built yet: the plan above is all it does.
    raise ConfigError(
        f"--queue {dlq.label}: rmq-spark redrive moves nothing yet (issue 26); the plan "
        "above is what --dry-run prints"
    )
