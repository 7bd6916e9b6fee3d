"""What the brake for live destinations did in a run: a JSON file beside the tables.

The limits in force and how long each transfer was held back by them are not
ledger rows: the tables are the proof of what moved, and their schemas stay as the
ledgers already out there have them. The driver writes this file after the movers
return (only when a limit was set) and the HTML report reads it:
<ledger>/limits/run_id=<run>/limits.json, written whole or not at all. It names
queues and limits, never a host or a credential.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from rmq_spark.errors import LedgerError
from rmq_spark.ledger import durable, store

LIMITS_FILE = "limits.json"


@dataclass(frozen=True)
class HeldBack:
    """One transfer under a rate limit."""

    source: str  # cluster/vhost/queue, for display
    destination: str
    limits: str  # rate_limit.describe_limits
    held_seconds: float  # time the rate brake held its publishes back
    depth_held_seconds: float = 0.0  # ...and the destination depth bound


@dataclass(frozen=True)
class BrakeRecord:
    in_force: str  # rate_limit.limits_in_force: the config's limits in one line
    transfers: tuple[HeldBack, ...]


def brakes_dir(ledger_path: str, run_id: str) -> Any:
    """A pathlib.Path, or a StorePath on an object-store ledger (`store.root`)."""
    return store.root(ledger_path) / "limits" / f"run_id={run_id}"


def write_brakes(ledger_path: str, run_id: str, record: BrakeRecord) -> None:
    directory = brakes_dir(ledger_path, run_id)
    directory.mkdir(parents=True, exist_ok=True)
    content = {"in_force": record.in_force, "transfers": [asdict(t) for t in record.transfers]}
    durable.write_file(directory, LIMITS_FILE, json.dumps(content, indent=1).encode())


def read_brakes(ledger_path: str, run_id: str) -> BrakeRecord | None:
    """The run's record, or None when it ran without limits."""
    path = brakes_dir(ledger_path, run_id) / LIMITS_FILE
    if not path.is_file():
        return None
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
        transfers = tuple(HeldBack(**transfer) for transfer in content["transfers"])
        return BrakeRecord(str(content["in_force"]), transfers)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LedgerError(
            f"rate limits record {path}: expected JSON with in_force and transfers ({exc}); "
            "it is written whole or not at all, so this file was changed by hand"
        ) from exc
