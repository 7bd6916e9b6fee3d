"""What a replay was about to publish, and the row in flight when it stopped: recorded
in the ledger before it matters, so a later replay names exactly what may be twice.

A replay appends its confirmed rows to the ledger a batch at a time (`run.LEDGER_BATCH`).
A replay that dies between a confirm and its append published rows the ledger never
showed confirmed; a later replay of the same rows publishes them again. To name them,
each replay attempt writes, before it publishes a batch, the batch's replay keys
(`intent-<attempt>-<n>.json`), and when a publish fails (a lost connection, a nack) the
key of the row in flight (`stopped-<attempt>.json`), under

    <ledger>/replays/run_id=<run>/

each with `durable.write_file` (fsync and rename, or one PUT), so a record is complete
or absent. An attempt's rows that may be in their queue twice are then:

- it stopped on an error: the row in flight alone (every earlier row of its batch was
  confirmed and appended as it stopped; no later one was sent);
- it was killed: the rows it intended and the ledger does not show confirmed (at most
  its last batch: each batch is appended before the next is intended), also when it
  was killed before its first append.

Attempt names are unique, so a replay run again with the same `--run-id` keeps the
killed attempt's records beside its own.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rmq_spark.errors import LedgerError
from rmq_spark.ledger import store
from rmq_spark.ledger.durable import write_file
from rmq_spark.ledger.layout import TEMP_PREFIX
from rmq_spark.park.replay.plan import ReplayKey

DIRECTORY = "replays"
INTENT_PREFIX = "intent-"
STOPPED_PREFIX = "stopped-"


def journal_dir(ledger_path: str, run_id: str) -> Any:
    return store.root(ledger_path) / DIRECTORY / f"run_id={run_id}"


def _encode(parked_run_id: str, keys: Iterable[ReplayKey]) -> bytes:
    return json.dumps({"parked_run_id": parked_run_id, "keys": [list(k) for k in keys]}).encode()


def _decode(content: bytes, *, where: str) -> tuple[str, list[ReplayKey]]:
    """(parked run id, keys) as `_encode` wrote them; anything else is a LedgerError
    naming the file.

    >>> _decode(_encode("park-1", [("dr", "/", "q", 7, "dr", "/", "q")]), where="x")
    ('park-1', [('dr', '/', 'q', 7, 'dr', '/', 'q')])
    """
    try:
        record = json.loads(content)
        keys = [
            (str(c), str(v), str(q), int(p), str(dc), str(dv), str(dq))
            for c, v, q, p, dc, dv, dq in record["keys"]
        ]
        return str(record["parked_run_id"]), keys
    except (ValueError, TypeError, KeyError) as exc:
        raise LedgerError(f"{where}: not a replay's journal record ({exc})") from exc


class Journal:
    """One replay attempt's records: `intend` before each batch, `stopped` on a failed
    publish. Each call returns once its record is durable."""

    def __init__(self, ledger_path: str, run_id: str, parked_run_id: str) -> None:
        self._dir = journal_dir(ledger_path, run_id)
        self._parked_run_id = parked_run_id
        self._attempt = uuid.uuid4().hex
        self._batches = 0

    def intend(self, keys: Sequence[ReplayKey]) -> None:
        name = f"{INTENT_PREFIX}{self._attempt}-{self._batches:06d}.json"
        self._write(name, keys)
        self._batches += 1

    def stopped(self, key: ReplayKey) -> None:
        self._write(f"{STOPPED_PREFIX}{self._attempt}.json", [key])

    def _write(self, name: str, keys: Sequence[ReplayKey]) -> None:
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
            write_file(self._dir, name, _encode(self._parked_run_id, keys))
        except OSError as exc:
            raise LedgerError(
                f"ledger {self._dir}: cannot record the replay's journal ({exc}); "
                "nothing of this batch was published"
            ) from exc


@dataclass
class Attempt:
    """What one earlier attempt of a replay recorded."""

    run_id: str
    intended: set[ReplayKey] = field(default_factory=set)
    stopped: ReplayKey | None = None

    @property
    def uncertain(self) -> set[ReplayKey]:
        """The rows it may have published without the ledger showing them confirmed,
        among the rows the ledger does not show confirmed (the caller's part)."""
        return {self.stopped} if self.stopped is not None else self.intended


def read_attempts(ledger_path: str, parked_run_id: str, skip_runs: Iterable[str]) -> list[Attempt]:
    """Every recorded attempt of a replay of `parked_run_id` not in `skip_runs` (those
    that recorded their end), in run id and attempt order. Another parked run's rows
    have the same keys (a queue parked twice starts at position 0 twice), so attempts
    are told apart by the parked run their records name."""
    skip = set(skip_runs)
    root = store.root(ledger_path) / DIRECTORY
    attempts: dict[tuple[str, str], Attempt] = {}
    try:
        for run_dir in sorted(store.entries(root), key=lambda entry: entry.name):
            run_id = run_dir.name.removeprefix("run_id=")
            if run_id in skip or run_id == run_dir.name:
                continue
            for entry in sorted(store.entries(run_dir), key=lambda entry: entry.name):
                _read_record(entry, run_id, parked_run_id, attempts)
    except OSError as exc:
        raise LedgerError(f"ledger {root}: cannot read the replays' journals ({exc})") from exc
    return [attempts[key] for key in sorted(attempts)]


def _read_record(
    entry: Any, run_id: str, parked_run_id: str, attempts: dict[tuple[str, str], Attempt]
) -> None:
    name = entry.name
    if name.startswith(TEMP_PREFIX) or not name.endswith(".json"):
        return  # a write a crash cut short: its batch was never published
    if name.startswith(INTENT_PREFIX):
        attempt_id = name.removeprefix(INTENT_PREFIX).rsplit("-", 1)[0]
    elif name.startswith(STOPPED_PREFIX):
        attempt_id = name.removeprefix(STOPPED_PREFIX).removesuffix(".json")
    else:
        return
    replayed, keys = _decode(entry.read_bytes(), where=str(entry))
    if replayed != parked_run_id:
        return
    attempt = attempts.setdefault((run_id, attempt_id), Attempt(run_id))
    if name.startswith(STOPPED_PREFIX):
        attempt.stopped = keys[0] if keys else None
    else:
        attempt.intended.update(keys)
