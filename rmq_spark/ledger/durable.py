"""Files that are complete and durable, or absent; and reading streams back.

On a local (or FUSE-mounted) ledger a file is written under a temporary name,
fsynced, renamed into place and its directory fsynced. On an object store
(`store.StorePath`) there are no renames and no fsync: a file is one upload,
durable when the PUT returns. Arrow IPC streams (rows streams, intent logs) are
read back batch by batch, a torn last batch dropped.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rmq_spark.ledger.layout import DATA_SCHEMA, STREAM_SUFFIX, TEMP_PREFIX
from rmq_spark.ledger.store import StorePath


def write_data_file(directory: Any, name: str, table: pa.Table) -> None:
    """Write a Parquet data file so that it is complete and durable, or absent."""
    write_row_groups(directory, name, table.schema, [table])


def write_row_groups(
    directory: Any,
    name: str,
    schema: pa.Schema,
    groups: Iterable[pa.Table],
    *,
    statistics: bool | list[str] = True,
    dictionary: bool | list[str] = True,
) -> None:
    """Write a Parquet data file of one row group per table of `groups`, complete and
    durable, or absent. Each table is encoded and written as it comes, so a caller that
    builds them one at a time holds one group's rows and pages, not the file's
    (`parked_rows.py`: a batch of 16 MiB bodies). `statistics`: the columns that get
    min/max statistics (all by default); `dictionary`: the columns dictionary-encoded (all by
    default; a column of distinct values, digests or bodies, only pays for trying)."""
    if isinstance(directory, StorePath):  # one PUT: complete or absent, durable on return
        # Encoded in memory first (a flush's rows: checksums, not bodies): a stream
        # closed by an error inside the Parquet writer would still complete its upload,
        # leaving a partial object the commit could not read.
        buffer = pa.BufferOutputStream()
        _write_groups(buffer, schema, groups, statistics, dictionary)
        (directory / name).write_bytes(buffer.getvalue().to_pybytes())
        return
    temp = directory / f"{TEMP_PREFIX}{name}"
    with open(temp, "wb") as sink:
        _write_groups(sink, schema, groups, statistics, dictionary)
        sink.flush()
        os.fsync(sink.fileno())
    os.replace(temp, directory / name)
    fsync_dir(directory)


def _write_groups(
    sink: Any,
    schema: pa.Schema,
    groups: Iterable[pa.Table],
    statistics: bool | list[str],
    dictionary: bool | list[str],
) -> None:
    # Snappy: half zstd's CPU for a few hundred rows (0.9 vs 1.9 ms per file,
    # files ~15% larger); executors write one file per flush, on the mover's CPU.
    with pq.ParquetWriter(
        sink,
        schema,
        compression="snappy",
        write_statistics=statistics,
        use_dictionary=dictionary,
    ) as writer:
        for group in groups:
            writer.write_table(group)
            del group  # before the next one is built


def write_file(directory: Any, name: str, content: bytes) -> None:
    """Write a small file so that it is complete and durable, or absent."""
    if isinstance(directory, StorePath):
        (directory / name).write_bytes(content)
        return
    temp = directory / f"{TEMP_PREFIX}{name}"
    with open(temp, "wb") as sink:
        sink.write(content)
        sink.flush()
        os.fsync(sink.fileno())
    os.replace(temp, directory / name)
    fsync_dir(directory)


def read_stream(path: Any) -> pa.Table:
    """Every complete batch of an intent log or rows stream; a torn last batch is
    dropped (its write never returned, so nothing depended on it)."""
    batches = []
    try:
        source = (
            pa.BufferReader(path.read_bytes())
            if isinstance(path, StorePath)
            else pa.OSFile(str(path))
        )
        with pa.ipc.open_stream(source) as reader:
            for batch in reader:
                batches.append(batch)
    except (pa.ArrowInvalid, OSError):
        pass  # the tail a crash left unfinished: never published
    return pa.Table.from_batches(batches, schema=DATA_SCHEMA)


def stream_to_data_file(stream: Any, partition: Any, *, sync_removal: bool = True) -> int:
    """Turn a rows stream into the Parquet data file of the same name, then remove it.

    Idempotent: a data file of that name is complete (it is renamed into place), so a
    crash between the two steps leaves a stream that is only removed. For the same
    reason the removal need not be durable (`sync_removal=False`, the executors): a
    stream a crash brings back is removed by the commit. Returns the rows of the
    data file it wrote (0 if it wrote none).
    """
    data_file = partition / f"{stream.name.removesuffix(STREAM_SUFFIX)}.parquet"
    rows = 0
    if not data_file.exists():
        table = read_stream(stream)
        if table.num_rows:
            write_data_file(partition, data_file.name, table)
            rows = table.num_rows
    stream.unlink(missing_ok=True)
    if sync_removal:
        fsync_dir(stream.parent)
    return rows


def fsync_dir(directory: Any) -> None:
    """Make the rename itself durable (POSIX needs the directory fsynced)."""
    if isinstance(directory, StorePath):
        return  # no directories, no renames: each PUT is durable when it returns
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
