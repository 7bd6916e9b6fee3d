"""A park's commit, executor side: each staged file becomes the table's data file.

`parked_rows.py` says why a park stages its rows first. At the commit, each staged file
of the run is read back a row group at a time, completed with the selection columns
(`parked_rows.with_selection_columns`) and written as the data file of the same name in
the run's partition, complete and durable or absent (`durable.write_row_groups`). The
same name makes it idempotent: a data file already written is kept, so a commit that
died part way is finished by the next, and the driver (`park/table.py`) knows which
staged files its log holds by name.

`complete_partition` is the Spark task (`partition_tasks.run_tasks`): the decoding, a
park's heaviest CPU after the broker's, runs on the executors in parallel, off the
source's acks; `complete_files` is the same without Spark (tests, benchmarks).
"""

from __future__ import annotations

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


def complete_file(ledger_path: str, run_id: str, name: str) -> int:
    """Make staged file `name` the run's data file of that name (kept if there); its rows."""
    target = run_partition(ledger_path, run_id) / name
    if target.exists():
        return int(store.read_metadata(target).num_rows)
    staged = staged_partition(ledger_path, run_id) / name
    where, filesystem = store.arrow_source(staged)
    try:
        with pq.ParquetFile(where, filesystem=filesystem) as source:
            write_row_groups(
                target.parent,
                name,
                DATA_SCHEMA,
                _completed(source),
                statistics=STATISTICS_COLUMNS,
                dictionary=DICTIONARY_COLUMNS,
            )
            return int(source.metadata.num_rows)
    except (OSError, pa.ArrowException) as exc:
        raise LedgerError(
            f"ledger {staged}: cannot complete the staged parked rows ({exc})"
        ) from exc


def _completed(source: pq.ParquetFile) -> Iterator[pa.Table]:
    """The staged file's rows with the selection columns, a row group at a time (the
    writer's groups: at most ROW_GROUP_BYTES of bodies, or one body)."""
    for index in range(source.num_row_groups):
        yield with_selection_columns(source.read_row_group(index))


def complete_files(ledger_path: str, run_id: str, names: Sequence[str]) -> list[dict[str, Any]]:
    """`complete_file` for each name, in this process; COMPLETED_SCHEMA rows."""
    run_partition(ledger_path, run_id).mkdir(parents=True, exist_ok=True)
    return [{"file": name, "rows": complete_file(ledger_path, run_id, name)} for name in names]


def complete_partition(
    indices: Sequence[int],
    *,
    groups: Sequence[Sequence[str]],
    ledger_path: str,
    ledger_store: StoreOptions | None,
    run_id: str,
) -> list[dict[str, Any]]:
    """Spark task (`partition_tasks.run_tasks`): complete the staged files of group(s)
    `indices`; COMPLETED_SCHEMA rows."""
    if ledger_store is not None:
        store.configure(ledger_path, ledger_store)
    names = [name for index in indices for name in groups[index]]
    return complete_files(ledger_path, run_id, names)
