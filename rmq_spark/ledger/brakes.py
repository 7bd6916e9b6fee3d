"""What the brake for live destinations did in a run: a JSON file beside the tables.

The limits in force and how long each transfer was held back by them are not
ledger rows: the tables are the proof of what moved, and their schemas stay as the
ledgers already out there have them. The driver writes this file after the movers
return (only when a limit was set) and the HTML report reads it:
<ledger>/limits/run_id=<run>/limits.json, written whole or not at all. It names
queues and limits, never a host or a credential.

Each transfer is named by its `TransferKey` (six names under "key"). Files an
earlier build wrote named them by "/"-joined strings ("source", "destination"),
which cannot be split back into names ("/" is legal in vhost and queue names):
they are read, and shown as written.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from rmq_spark.errors import LedgerError
from rmq_spark.ledger import durable, store
from rmq_spark.model import TransferKey

LIMITS_FILE = "limits.json"


@dataclass(frozen=True)
class HeldBack:
    """One transfer under a rate limit."""

    key: TransferKey | None  # None only in a file an earlier build wrote
    limits: str  # planning.rate_limits.describe_limits
    held_seconds: float  # time the rate brake held its publishes back
    depth_held_seconds: float = 0.0  # ...and the destination depth bound
    # (source, destination) as an earlier build wrote them ("/"-joined); display only.
    written_names: tuple[str, str] | None = None

    @property
    def source(self) -> str:
        """`cluster/vhost/queue`, for people (as the report's queue tables show it)."""
        if self.key is None:
            return self.written_names[0] if self.written_names else ""
        return f"{self.key.source_cluster}/{self.key.source_vhost}/{self.key.source_queue}"

    @property
    def destination(self) -> str:
        if self.key is None:
            return self.written_names[1] if self.written_names else ""
        key = self.key
        return f"{key.destination_cluster}/{key.destination_vhost}/{key.destination_queue}"

    def record(self) -> dict[str, Any]:
        """The transfer's entry in limits.json."""
        return {
            "key": None if self.key is None else asdict(self.key),
            **(
                {}
                if self.written_names is None
                else dict(zip(_WRITTEN, self.written_names, strict=True))
            ),
            "limits": self.limits,
            "held_seconds": self.held_seconds,
            "depth_held_seconds": self.depth_held_seconds,
        }

    @classmethod
    def from_record(cls, entry: dict[str, Any]) -> HeldBack:
        """An entry of limits.json, as this build or an earlier one wrote it."""
        written = tuple(str(entry[name]) for name in _WRITTEN if name in entry)
        key = entry.get("key")
        if key is None and len(written) != len(_WRITTEN):
            raise KeyError("key")
        return cls(
            key=None if key is None else TransferKey.of(key),
            limits=str(entry["limits"]),
            held_seconds=float(entry["held_seconds"]),
            depth_held_seconds=float(entry.get("depth_held_seconds", 0.0)),
            written_names=(written[0], written[1]) if len(written) == len(_WRITTEN) else None,
        )


# The names an earlier build gave a transfer in limits.json ("/"-joined, display only).
_WRITTEN = ("source", "destination")


@dataclass(frozen=True)
class BrakeRecord:
    in_force: str  # planning.rate_limits.limits_in_force: the config's limits in one line
    transfers: tuple[HeldBack, ...]


def brakes_dir(ledger_path: str, run_id: str) -> Any:
    """A pathlib.Path, or a StorePath on an object-store ledger (`store.root`)."""
    return store.root(ledger_path) / "limits" / f"run_id={run_id}"


def write_brakes(ledger_path: str, run_id: str, record: BrakeRecord) -> None:
    directory = brakes_dir(ledger_path, run_id)
    directory.mkdir(parents=True, exist_ok=True)
    content = {"in_force": record.in_force, "transfers": [t.record() for t in record.transfers]}
    durable.write_file(directory, LIMITS_FILE, json.dumps(content, indent=1).encode())


def read_brakes(ledger_path: str, run_id: str) -> BrakeRecord | None:
    """The run's record, or None when it ran without limits."""
    path = brakes_dir(ledger_path, run_id) / LIMITS_FILE
    if not path.is_file():
        return None
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
        transfers = tuple(HeldBack.from_record(transfer) for transfer in content["transfers"])
        return BrakeRecord(str(content["in_force"]), transfers)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LedgerError(
            f"rate limits record {path}: expected JSON with in_force and transfers, each "
            f"with key (or source and destination), limits and held_seconds ({exc!r}); "
            "it is written whole or not at all, so this file was changed by hand"
        ) from exc
