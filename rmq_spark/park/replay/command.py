"""`rmq-spark replay`: a parked run's rows back into queues.

    rmq-spark replay --config FILE --parked RUN_ID --to source|origin|CLUSTER:VHOST:QUEUE
        [--where SQL] [--messages-per-second N] [--run-id ID]
        [--broker-headers move|remove|keep] [--restore-expiration]

`--to` is `targets.py`'s: `source`, `origin` (the queue each row's x-death names, the
property bytes under the redrive's header policy, whose two options are the redrive's
own, `redrive/header_options.py`) or a CLUSTER:VHOST:QUEUE template over the row's
source (`{cluster}`, `{vhost}`, `{queue}`).

The config gives the clusters and the ledger (a park's config does). Exit 0 every
selected row is confirmed in its destination once (published now, or by an earlier
replay of the same parked run to the same queue), 1 not so, 2 bad input or a broker
refused (nothing published, or the rows before the refusal), 3 internal error. Spark
starts only for `--where`. docs/parking.md ("Replaying") is the user's page.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from rmq_spark.config import load_config, validate_run_id
from rmq_spark.errors import ConfigError
from rmq_spark.logs import mask_secrets_in_logs
from rmq_spark.redrive.header_options import (
    add_header_policy_arguments,
    header_policy,
    header_policy_given,
)

if TYPE_CHECKING:
    from rmq_spark.park.replay.plan import ReplayKey
    from rmq_spark.park.replay.run import ReplayResult

EXIT_OK, EXIT_UNVERIFIED = 0, 1
# The CLI's Spark session for a command (cli.command_session): app name -> session.
SessionFactory = Callable[[str], AbstractContextManager[Any]]


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="YAML config file (its clusters, ledger)")
    parser.add_argument(
        "--parked", required=True, metavar="RUN_ID", help="the park's run id whose rows to replay"
    )
    parser.add_argument(
        "--to",
        required=True,
        metavar="TARGET",
        help="'source' (each row back to the queue it was parked from), 'origin' (to the "
        "queue its x-death names, as rmq-spark redrive does, with its header policy; a "
        "row without x-death is refused, not guessed) or CLUSTER:VHOST:QUEUE, where any "
        "part may use the row's source as {cluster}, {vhost}, {queue}, e.g. "
        "main:/:orders or dr:{vhost}:{queue}.replayed ({{ and }}: a literal brace). "
        "Every target queue must exist and have room for its rows",
    )
    parser.add_argument(
        "--where",
        metavar="SQL",
        help="only the parked rows this selection expression is TRUE for, in Spark SQL over "
        "the parked table's columns, e.g. \"last_death.reason = 'rejected'\"",
    )
    parser.add_argument(
        "--messages-per-second", type=float, metavar="N", help="publish at most N a second"
    )
    parser.add_argument(
        "--run-id", help="the ledger's run id of this replay (default: replay-<UTC time>-<random>)"
    )
    add_header_policy_arguments(parser, applies=" (with --to origin only)", default=None)


def run_replay_command(args: argparse.Namespace, session: SessionFactory) -> int:
    """Replay a parked run; print where its rows went and the RESULT."""
    from rmq_spark.park.replay.run import compile_where, run_replay, selected_keys
    from rmq_spark.park.replay.targets import ORIGIN, parse_target
    from rmq_spark.run_id import new_run_id

    config = load_config(args.config)
    mask_secrets_in_logs(config)
    if args.to != ORIGIN and header_policy_given(args):
        raise ConfigError(
            f"--broker-headers and --restore-expiration apply to --to origin only; --to "
            f"{args.to} publishes the parked property bytes as they are"
        )
    target = parse_target(args.to, config, header_policy(args))
    selection = compile_where(args.where)
    validate_run_id(args.parked)
    if args.run_id is not None:
        validate_run_id(args.run_id)
    if args.messages_per_second is not None and not args.messages_per_second > 0:
        raise ConfigError(f"--messages-per-second {args.messages_per_second}: must be above 0")
    run_id = args.run_id or f"replay-{new_run_id()}"
    keys = None
    if selection is not None:
        from rmq_spark.ledger import store

        with session("rmq-spark replay") as spark:
            keys = selected_keys(spark, store.use_ledger(config.ledger), args.parked, selection)
    result = run_replay(
        config,
        parked_run_id=args.parked,
        target=target,
        run_id=run_id,
        keys=keys,
        messages_per_second=args.messages_per_second,
    )
    print(format_result(result), flush=True)
    return EXIT_OK if result.verified else EXIT_UNVERIFIED


def format_result(result: ReplayResult) -> str:
    """One line per destination queue, then RESULT."""
    lines = [
        f"replay {result.run_id} of parked run {result.parked_run_id} to {result.target}: "
        f"{result.selected} selected, {result.skipped} already replayed, "
        f"{result.published} published"
    ]
    if result.by_queue:
        labels = [":".join(queue) for queue, _ in result.by_queue]
        width = max(len("destination"), *map(len, labels))
        lines.append(f"  {'destination':<{width}}  {'published':>9}")
        for label, (_, count) in zip(labels, result.by_queue, strict=True):
            lines.append(f"  {label:<{width}}  {count:>9}")
    if result.possibly_twice:
        lines.extend(_possibly_twice_lines(result))
    if result.reconnected:
        lines.extend(_reconnected_lines(result))
    if not result.verified:
        lines.append(
            f"  {result.missing} selected row(s) not confirmed by any replay, "
            f"{result.duplicates} confirmed more than once"
        )
    rate = result.published / result.seconds if result.seconds > 0 else 0.0
    summary = {
        "run_id": result.run_id,
        "parked_run_id": result.parked_run_id,
        "to": result.target,
        "verified": result.verified,
        "selected": result.selected,
        "skipped": result.skipped,
        "published": result.published,
        "missing": result.missing,
        "duplicates": result.duplicates,
        "possibly_twice": len(result.possibly_twice),
        "interrupted": list(result.interrupted),
        "reconnected": len(result.reconnected),
        "bytes": result.bytes,
        "seconds": round(result.seconds, 2),
        "messages_per_second": round(rate, 1),
    }
    lines.append(f"RESULT {json.dumps(summary)}")
    return "\n".join(lines)


def _reconnected_lines(result: ReplayResult) -> list[str]:
    """The rows sent again after a lost connection, as position ranges per queue."""
    lines = [
        f"  {len(result.reconnected)} row(s) were in flight when a connection was lost and "
        "were sent again after reconnecting: each may be in its queue twice"
    ]
    return lines + _ranges(result.reconnected)


def _ranges(keys: Sequence[ReplayKey]) -> list[str]:
    from rmq_spark.park.replay.plan import position_ranges

    groups: dict[tuple[str, str], list[int]] = {}
    for key in keys:
        queues = (":".join(key[:3]), ":".join(key[4:]))
        groups.setdefault(queues, []).append(key[3])
    return [
        f"    {source} positions {position_ranges(positions)} -> {destination}"
        for (source, destination), positions in sorted(groups.items())
    ]


def _possibly_twice_lines(result: ReplayResult) -> list[str]:
    """The rows published again that an interrupted replay may have published already,
    as position ranges per source and destination queue."""
    lines = [
        f"  {len(result.possibly_twice)} row(s) published again may be in their queue twice: "
        f"{', '.join(result.interrupted)} stopped without recording its end, and may have "
        "published them after its last ledger append"
    ]
    return lines + _ranges(result.possibly_twice)
