"""A park's commit, executor side: a transfer's staged files become the table's data files.

`parked_rows.py` says why a park stages its rows first: one small file per batch, a few
hundred rows each. At the commit, the run's staged files are dealt into *groups*, each
one transfer's files in name order up to GROUP_BYTES (`group_staged`, on the driver); each
group becomes one data file in the run's partition (`complete_group`): its staged files
read back a row group at a time, completed with the selection columns
(`parked_rows.with_selection_columns`), written complete and durable or absent
(`durable.write_row_groups`). So a large park leaves files a lake reads well, not one
per batch.

Idempotent, without a record beside the table:

- A group's data file is named after its staged files (a digest of their names), so a
  retried or speculative Spark task writes the same file, and finds it written.
- The data file's footer names the staged files it holds (`STAGED_KEY`), so the driver
  (`park/table.py`) knows which staged files are done, in the log or not yet, and a
  commit that died part way is finished by the next with only the rest.

`complete_partition` is the Spark task (`partition_tasks.run_tasks`): the decoding, a
park's heaviest CPU after the broker's, runs on the executors in parallel, off the
source's acks; `complete_groups` is the same without Spark (tests, benchmarks).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rmq_spark.errors import LedgerError
from rmq_spark.ledger import store
from rmq_spark.ledger.durable import write_row_groups
from rmq_spark.ledger.store import StoreOptions
from rmq_spark.transfer.parked_rows import (
    DATA_SCHEMA,
    DICTIONARY_COLUMNS,
    STATISTICS_COLUMNS,
    run_partition,
    staged_partition,
    with_selection_columns,
)

# The rows a completion task returns: one per data file it made (or found made).
COMPLETED_SCHEMA = pa.schema([pa.field("file", pa.string()), pa.field("rows", pa.int64())])
# A data file's footer key naming the staged files it holds (a JSON list).
STAGED_KEY = b"rmq_spark.staged"
# Staged bytes per data file, at most (one staged file at least). On an object store a
# data file is encoded in memory before its one PUT (`durable.write_row_groups`), so
# this also bounds what a completion task holds there.
GROUP_BYTES = 64 << 20
# A staged file's transfer: `TransferKey.file_prefix` (part-<16 hex>-).
_TRANSFER = re.compile(r"^part-[0-9a-f]{16}-")


def transfer_of(name: str) -> str:
    """The transfer prefix of a staged file's name (the whole name if it has none)."""
    found = _TRANSFER.match(name)
    return found.group(0) if found else name


def group_staged(staged: Sequence[tuple[str, int]]) -> list[list[str]]:
    """(name, size) of staged files -> groups of names, each one transfer's files in
    name order, up to GROUP_BYTES of them (one file at least)."""
    by_transfer: dict[str, list[tuple[str, int]]] = {}
    for name, size in sorted(staged):
        by_transfer.setdefault(transfer_of(name), []).append((name, size))
    found: list[list[str]] = []
    for files in by_transfer.values():
        group: list[str] = []
        held = 0
        for name, size in files:
            if group and held + size > GROUP_BYTES:
                found.append(group)
                group, held = [], 0
            group.append(name)
            held += size
        found.append(group)
    return found


def data_file_name(group: Sequence[str]) -> str:
    """The data file of a group of staged files: its transfer's prefix and a digest of
    the names, so every attempt at the same group writes the same file."""
    digest = hashlib.sha256("\n".join(group).encode()).hexdigest()[:32]
    return f"{transfer_of(group[0])}completed-{digest}.parquet"


def staged_names_of(metadata: pq.FileMetaData, name: str) -> list[str]:
    """The staged files a data file holds: its footer's list, or (a data file completed
    one to one, before groups) its own name."""
    found = (metadata.metadata or {}).get(STAGED_KEY)
    return list(json.loads(found)) if found is not None else [name]


def complete_group(ledger_path: str, run_id: str, group: Sequence[str]) -> dict[str, Any]:
    """Make the group's data file (kept if there); a COMPLETED_SCHEMA row."""
    name = data_file_name(group)
    target = run_partition(ledger_path, run_id) / name
    if target.exists():
        return {"file": name, "rows": int(store.read_metadata(target).num_rows)}
    schema = DATA_SCHEMA.with_metadata({STAGED_KEY: json.dumps(list(group)).encode()})
    rows = _Counted()
    try:
        write_row_groups(
            target.parent,
            name,
            schema,
            rows.of(_completed(ledger_path, run_id, group)),
            statistics=STATISTICS_COLUMNS,
            dictionary=DICTIONARY_COLUMNS,
        )
    except (OSError, pa.ArrowException) as exc:
        raise LedgerError(
            f"ledger {target.parent}: cannot complete the staged parked rows of "
            f"{', '.join(group)} ({exc})"
        ) from exc
    return {"file": name, "rows": rows.count}


class _Counted:
    """Counts the rows of the tables it passes on."""

    def __init__(self) -> None:
        self.count = 0

    def of(self, tables: Iterator[pa.Table]) -> Iterator[pa.Table]:
        for table in tables:
            self.count += table.num_rows
            yield table


def _completed(ledger_path: str, run_id: str, group: Sequence[str]) -> Iterator[pa.Table]:
    """The group's staged rows with the selection columns, in its files' order, a row
    group at a time (the writer's groups: at most ROW_GROUP_BYTES of bodies, or one)."""
    for name in group:
        where, filesystem = store.arrow_source(staged_partition(ledger_path, run_id) / name)
        with pq.ParquetFile(where, filesystem=filesystem) as source:
            for index in range(source.num_row_groups):
                yield with_selection_columns(source.read_row_group(index))


def complete_groups(
    ledger_path: str, run_id: str, found: Sequence[Sequence[str]]
) -> list[dict[str, Any]]:
    """`complete_group` for each group, in this process; COMPLETED_SCHEMA rows."""
    run_partition(ledger_path, run_id).mkdir(parents=True, exist_ok=True)
    return [complete_group(ledger_path, run_id, group) for group in found]


def complete_partition(
    indices: Sequence[int],
    *,
    groups: Sequence[Sequence[Sequence[str]]],
    ledger_path: str,
    ledger_store: StoreOptions | None,
    run_id: str,
) -> list[dict[str, Any]]:
    """Spark task (`partition_tasks.run_tasks`): complete the groups of staged files
    dealt to task(s) `indices`; COMPLETED_SCHEMA rows."""
    if ledger_store is not None:
        store.configure(ledger_path, ledger_store)
    return complete_groups(ledger_path, run_id, [group for i in indices for group in groups[i]])
