"""Reading what earlier attempts of a run left in the ledger.

A retried task continues numbering each transfer's drain order after every row
that earlier attempts made durable (`next_position`, `EarlierFiles`), committed to
the Delta log or not; the driver's commit (`tables`) finds a transfer's rows in
data files, compacted files and intent logs the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from rmq_spark.arrow_columns import column
from rmq_spark.ledger import store
from rmq_spark.ledger.durable import read_stream
from rmq_spark.ledger.fences import fence_file_name
from rmq_spark.ledger.layout import (
    COMPACTED_PREFIX,
    DATA_SCHEMA,
    KEY_COLUMNS,
    PREFIX_LENGTH,
    STREAM_SUFFIX,
    run_fences_dir,
    run_intents_dir,
    run_partition_dir,
    run_rows_dir,
    transfer_prefixes,
)
from rmq_spark.model import TransferKey


def next_position(ledger_path: str, run_id: str, key: TransferKey) -> int:
    """Where a (retried) task continues numbering this transfer's drain order.

    Reads the durable rows and intents of earlier attempts, committed to the Delta
    log or not, so positions stay unique across attempts of the same run.
    """
    return EarlierFiles(ledger_path, run_id).next_position(key)


class EarlierFiles:
    """A run's ledger files (data files, rows streams, intent logs, fences) as a task
    finds them when it starts, by transfer: where each of the task's transfers continues
    numbering (`next_position`), and whether its fence is in its source already
    (`fence_recorded`).

    One listing of four directories per task, not per transfer: a task moving 1,000
    queues listed them 1,000 times, each listing as long as the run's files. Files
    written after the listing do not matter: a task moves each of its transfers once,
    and the attempts before it, whose files do, are over (speculation is off).
    """

    def __init__(self, ledger_path: str, run_id: str) -> None:
        self._files: dict[str, list[Path]] = {}
        # Compacted files (a commit's, on a resumed run) hold many transfers' rows.
        self._compacted: list[Path] = []
        # Names of the intent logs left: a transfer whose attempts all finished has none.
        self._intent_logs: list[str] = []
        intents_dir = run_intents_dir(ledger_path, run_id)
        for directory, suffix in (
            # Data files, and the streams of transfers that ended (`writer.close`).
            (run_partition_dir(ledger_path, run_id), (".parquet", STREAM_SUFFIX)),
            (run_rows_dir(ledger_path, run_id), STREAM_SUFFIX),
            (intents_dir, STREAM_SUFFIX),
        ):
            for entry in store.entries(directory):
                if entry.name.startswith(COMPACTED_PREFIX):
                    self._compacted.append(entry)
                elif entry.name.endswith(suffix):
                    prefix = entry.name[:PREFIX_LENGTH]
                    self._files.setdefault(prefix, []).append(entry)
                    if directory is intents_dir:
                        self._intent_logs.append(entry.name)
        # Selective moves' fences already in their sources (`ledger/fences.py`).
        self._fences = {entry.name for entry in store.entries(run_fences_dir(ledger_path, run_id))}

    def fence_recorded(self, key: TransferKey) -> bool:
        """An earlier attempt of this run put the transfer's fence in its source."""
        return fence_file_name(key) in self._fences

    def next_position(self, key: TransferKey) -> int:
        highest = _max_position(compacted_positions(self._compacted, key))
        for prefix in transfer_prefixes(key):
            for path in sorted(self._files.get(prefix[:PREFIX_LENGTH], ())):
                if not path.name.startswith(prefix):
                    continue
                highest = max(highest, _max_position(file_positions(path, key)))
        return highest + 1

    def has_intents(self, key: TransferKey) -> bool:
        """An attempt of this transfer left its intent log: one that finished removes it,
        so without one no earlier session was lost holding publishes."""
        prefixes = transfer_prefixes(key)
        return any(name.startswith(prefixes) for name in self._intent_logs)

    def transfer_rows(self, key: TransferKey, columns: Sequence[str]) -> pa.Table:
        """`columns` of every row and intent earlier attempts left for this transfer
        (data files, rows streams, intent logs, compacted files), in no order."""
        tables = [
            compacted_rows(self._compacted, key, columns),
            *(
                _read_columns(path, key, columns)
                for prefix in transfer_prefixes(key)
                for path in sorted(self._files.get(prefix[:PREFIX_LENGTH], ()))
                if path.name.startswith(prefix)
            ),
        ]
        return pa.concat_tables(table.select(list(columns)) for table in tables)


def _read_columns(path: Any, key: TransferKey, columns: Sequence[str]) -> pa.Table:
    """`key`'s rows of one data file or stream, with at least `columns`."""
    if path.name.endswith(".parquet"):
        if not path.name.startswith(key.legacy_file_prefix):
            return store.read_parquet(path, columns=list(columns))
        return rows_of(key, store.read_parquet(path, columns=[*columns, *KEY_COLUMNS]))
    return rows_of(key, read_stream(path))


def file_positions(path: Any, key: TransferKey) -> pa.Table:
    """The `position` column of `key`'s rows in one of its files: a data file, or a rows
    stream (in `rows/`, or finished in the run partition)."""
    if path.name.endswith(".parquet"):
        return data_file_positions(path, key)
    return rows_of(key, read_stream(path)).select(["position"])


def data_file_positions(path: Any, key: TransferKey) -> pa.Table:
    """The `position` column of `key`'s rows in one of its data files.

    A file under the transfer's own prefix holds only its rows: one column is read. A
    file under the legacy prefix may hold a colliding transfer's too: those are dropped.
    """
    if not path.name.startswith(key.legacy_file_prefix):
        return store.read_parquet(path, columns=["position"])
    return rows_of(key, store.read_parquet(path, columns=["position", *KEY_COLUMNS]))


def compacted_files(partition: Any) -> list[Any]:
    """A run partition's compacted files (written by `tables.commit_run`)."""
    if not partition.is_dir():
        return []
    return sorted(partition.glob(f"{COMPACTED_PREFIX}*.parquet"))


def compacted_positions(files: Sequence[Any], key: TransferKey) -> pa.Table:
    """The `position` column of `key`'s rows in these compacted files."""
    return compacted_rows(files, key, ["position"])


def compacted_rows(files: Sequence[Any], key: TransferKey, columns: Sequence[str]) -> pa.Table:
    """`columns` of `key`'s rows in these compacted files.

    The filter on the key columns is pushed down: row groups whose statistics
    exclude the transfer are skipped.
    """
    if not files:  # built from buffers: pa.array (and Schema.empty_table) import pandas
        fields = [DATA_SCHEMA.field(name) for name in columns]
        return pa.Table.from_arrays(
            [column(field.type, []) for field in fields], schema=pa.schema(fields)
        )
    wanted = None
    for name in KEY_COLUMNS:
        # The value as an Arrow scalar built from buffers: a Python string here would
        # go through pa.scalar, which imports pandas (arrow_columns.py).
        match = pc.field(name) == column(pa.string(), [getattr(key, name)])[0]
        wanted = match if wanted is None else wanted & match
    return pa.concat_tables(
        store.read_parquet(path, columns=list(columns), filters=wanted) for path in sorted(files)
    )


def rows_of(key: TransferKey, table: pa.Table) -> pa.Table:
    """The rows of `table` that belong to `key`: a file under a legacy prefix may hold
    another transfer's rows (one whose "/"-joined names collide with this one's)."""
    keep = None
    for name in KEY_COLUMNS:
        match = pc.equal(table[name], getattr(key, name))
        keep = match if keep is None else pc.and_(keep, match)
    return table.filter(keep) if keep is not None else table


def _max_position(table: pa.Table) -> int:
    positions = table.column("position")
    return int(pc.max(positions).as_py()) if len(positions) else -1
