"""`rmq-spark park`: a queue's messages into the ledger's `parked` Delta table.

    rmq-spark park --config FILE [--run-id ID]

The config's routes name `destination: {table: parked}` (docs/parking.md). Exit 0
verified (or nothing to park), 1 parked but not verified, 2 bad input or a broker refused
(nothing parked), 3 internal error. Prints one line per source queue and the RESULT.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from rmq_spark.config import load_config, validate_run_id
from rmq_spark.logs import mask_secrets_in_logs

if TYPE_CHECKING:
    from rmq_spark.park.run import ParkResult

EXIT_OK, EXIT_UNVERIFIED = 0, 1
# The CLI's Spark session for a command (cli.command_session): app name -> session.
SessionFactory = Callable[[str], AbstractContextManager[Any]]


def add_park_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        required=True,
        help="YAML config file whose routes park (destination: {table: parked})",
    )
    parser.add_argument(
        "--run-id", help="the ledger's run id of this park (default: park-<UTC time>-<random>)"
    )


def run_park_command(args: argparse.Namespace, session: SessionFactory) -> int:
    """Park the config's queues on Spark; print what was parked and the RESULT."""
    from rmq_spark.park.run import run_park
    from rmq_spark.run_id import new_run_id

    config = load_config(args.config)
    mask_secrets_in_logs(config)
    config.require_parks()  # before Spark starts
    if args.run_id is not None:
        validate_run_id(args.run_id)
    run_id = args.run_id or f"park-{new_run_id()}"
    with session("rmq-spark park") as spark:
        result = run_park(spark, config, run_id=run_id)
    print(format_result(result), flush=True)
    return EXIT_OK if result.verified else EXIT_UNVERIFIED


def format_result(result: ParkResult) -> str:
    """One line per source queue (parked, kept, table rows, depths), then RESULT."""
    if not result.queues:
        return f"park {result.run_id}: no queue to park; nothing parked"
    labels = [
        f"{q.transfer.source_cluster}:{q.transfer.source_vhost}:{q.transfer.source_queue}"
        for q in result.queues
    ]
    width = max(len("source"), *map(len, labels))
    lines = [
        f"park {result.run_id} into the parked table"
        + (" (bodies excluded)" if result.exclude_body else "")
        + ":",
        f"  {'source':<{width}}  {'parked':>7}  {'kept':>6}  {'rows':>7}  "
        f"{'depth before':>12}  {'after':>6}  {'lost':>4}  witness",
    ]
    for label, q in zip(labels, result.queues, strict=True):
        v = q.verdict
        lines.append(
            f"  {label:<{width}}  {v.parked:>7}  {v.kept:>6}  {v.table_rows:>7}  "
            f"{q.before.depth:>12}  {q.after.depth:>6}  {v.lost:>4}  {v.witness}"
        )
        if q.outcome.error:
            lines.append(f"    failed: {q.outcome.error}")
        if v.unmatched or v.unexpected:
            lines.append(
                f"    {v.unmatched} confirmed row(s) not in the table, {v.unexpected} row(s) "
                "in the table without a ledger row"
            )
    rate = result.parked / result.seconds if result.seconds > 0 else 0.0
    summary = {
        "run_id": result.run_id,
        "verified": result.verified,
        "queues": len(result.queues),
        "parked": result.parked,
        "kept": result.kept,
        "lost": result.lost,
        "duplicates": result.duplicates,
        "bytes": result.bytes,
        "seconds": round(result.seconds, 2),
        "messages_per_second": round(rate, 1),
        "exclude_body": result.exclude_body,
    }
    lines.append(f"RESULT {json.dumps(summary)}")
    return "\n".join(lines)
