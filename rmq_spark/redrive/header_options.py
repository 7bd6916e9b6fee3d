"""The header policy's command-line options: `--broker-headers` and `--restore-expiration`.

One definition for the two commands that publish a dead-lettered message back to the
queue its `x-death` names: `rmq-spark redrive` and `rmq-spark replay --to origin`. The
policy itself is `headers.py`; this module does not import it at load time, so
`rmq-spark --help` need not load the selection language (tests/unit/redrive/test_command.py
checks the choices agree with `headers.HeaderAction`).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rmq_spark.redrive.headers import HeaderPolicy

# headers.HeaderAction's values, default first.
BROKER_HEADER_ACTIONS = ("move", "remove", "keep")
DEFAULT_BROKER_HEADERS = BROKER_HEADER_ACTIONS[0]


def add_header_policy_arguments(
    parser: argparse.ArgumentParser,
    *,
    applies: str = "",
    default: str | None = DEFAULT_BROKER_HEADERS,
) -> None:
    """`--broker-headers move|remove|keep` (default move) and `--restore-expiration`.

    `applies` ends each help text (e.g. " (with --to origin only)"). With `default`
    None the parsed `broker_headers` is None when the option was not given, so a command
    can tell a default from a choice (`header_policy` reads None as move).
    """
    parser.add_argument(
        "--broker-headers",
        choices=BROKER_HEADER_ACTIONS,
        default=default,
        help="x-death, x-first-death-*, x-last-death-*, x-delivery-count, x-acquired-count: "
        f"move them under one 'rmq-spark-death' table header (default), remove or keep them"
        f"{applies}",
    )
    parser.add_argument(
        "--restore-expiration",
        action="store_true",
        help="put the origin x-death entry's original-expiration back as the expiration "
        f"property (default: a redriven message has no TTL){applies}",
    )


def header_policy_given(args: argparse.Namespace) -> bool:
    """Whether either option was given on the command line."""
    return args.broker_headers is not None or bool(args.restore_expiration)


def header_policy(args: argparse.Namespace) -> HeaderPolicy:
    """The policy the options ask for (`--broker-headers` absent: move)."""
    from rmq_spark.redrive.headers import HeaderAction, HeaderPolicy

    action = HeaderAction(args.broker_headers or DEFAULT_BROKER_HEADERS)
    return HeaderPolicy(action, bool(args.restore_expiration))
