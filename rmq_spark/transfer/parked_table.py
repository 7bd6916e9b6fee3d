"""Reading the `parked` table without Spark: the current snapshot's data files (of one
run) as a pyarrow dataset or an Arrow table.

Here, below the park and report packages, because the driver's park (its verdicts), the
replay (its rows) and the run report (a park's or replay's counts by death,
`report/parked.py`) all read it; `park/table.py` creates and commits the table and reads
it with Spark. The rows' layout is `parked_rows.py`'s.
"""

from __future__ import annotations

from urllib.parse import unquote

import pyarrow as pa
import pyarrow.dataset as ds
from deltalake.exceptions import TableNotFoundError

from rmq_spark.errors import LedgerError
from rmq_spark.ledger import store
from rmq_spark.ledger.storage import open_table
from rmq_spark.transfer.parked_rows import PARTITION_BY, SCHEMA, TABLE


def table_path(ledger_path: str) -> str:
    return str(store.root(ledger_path) / TABLE)


def parked_files(ledger_path: str, run_id: str | None = None) -> list[str]:
    """The table's current data files (of one run), as URIs."""
    path = table_path(ledger_path)
    try:
        table = open_table(path)
    except TableNotFoundError as exc:
        raise LedgerError(f"ledger table {path} does not exist: nothing was parked") from exc
    return list(
        table.file_uris(partition_filters=[("run_id", "=", run_id)] if run_id is not None else None)
    )


def parked_dataset(ledger_path: str, run_id: str | None = None) -> ds.Dataset:
    """The table's snapshot (or one run's part of it) as a pyarrow dataset (DuckDB,
    polars and pandas read it as it is: `duckdb.sql("select ... from dataset")`)."""
    files = parked_files(ledger_path, run_id)
    base = table_path(ledger_path)
    filesystem = None
    if store.is_object_store(ledger_path):
        filesystem = store.filesystem_of(ledger_path)
        files = [store.StorePath(unquote(uri)).fs_path for uri in files]
        base = store.StorePath(base).fs_path
    else:
        files = [unquote(uri.removeprefix("file://")) for uri in files]
    partition_schema = pa.schema([SCHEMA.field(name) for name in PARTITION_BY])
    return ds.dataset(
        files,
        schema=SCHEMA,
        format="parquet",
        partitioning=ds.partitioning(partition_schema, flavor="hive"),
        partition_base_dir=base,
        filesystem=filesystem,
    )


def read_parked(
    ledger_path: str, run_id: str | None = None, columns: list[str] | None = None
) -> pa.Table:
    """The parked rows (of one run) as an Arrow table, without Spark."""
    return parked_dataset(ledger_path, run_id).to_table(columns=columns)
