"""Driver side: a run's many small data files become a few large ones at commit time.

Executors leave a file per transfer (and per ROLL_ROWS rows): a small transfer's rows
stream as it is (a finished stream, `layout.is_finished_stream`), a larger one's Parquet
data file. A run of 1,000 small queues would commit 1,000 files of 20 rows, which every
reader of the table then opens (and the log can name Parquet files only).
`tables.commit_run` hands the small files and finished streams of a commit batch to
`compact`, which copies their rows into files of up to COMPACT_ROWS rows named
``compacted-<batch version>-<n>-<uuid>.parquet``; the commit adds those instead.

Crash safety rests on the order of durable steps, each complete or absent:

1. the compacted files (temp name, fsync, rename: `durable.write_data_file`);
2. the commit batch naming the executor files it chose, the compacted files, and
   which executor files those replace (`tables.CommitBatch`);
3. the Delta commit of the batch (idempotent through its `CommitKey`);
4. only then, the executor files the compacted ones replace are removed.

A driver dying after 1 leaves compacted files no batch names (`orphans`): they are
in no commit, and the next commit removes them and chooses again. After 2 the batch
is committed later under the same version, from the compacted files it names. After
3 nothing is committed again (the executor files are in a batch, so never chosen
again), and step 4 is repeated by the next commit. Resuming reads a transfer's rows
from compacted files filtered by its key columns (`resume.compacted_positions`), since
compacted files hold many transfers under no transfer's prefix.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rmq_spark.ledger import durable, removal, store
from rmq_spark.ledger.layout import (
    COMPACTED_PREFIX,
    DATA_SCHEMA,
    SMALL_FILE_BYTES,
    TEMP_PREFIX,
    is_finished_stream,
)

# Rows per compacted file: ~30-60 MB of ledger rows, large enough that a run of
# thousands of small queues commits a handful of files, small enough to build in memory.
COMPACT_ROWS = 262_144
# Executor files at least this large (layout.SMALL_FILE_BYTES) are committed as they are:
# copying them buys nothing.
# Files read or removed at once: I/O, not CPU (pyarrow's file systems are thread-safe),
# and enough to keep a far object store's pipe full.
REQUESTS_AT_ONCE = 32
# Executor files read by one dataset scan while compacting (`_read_scans`), and at most
# this many bytes of them: 16 MiB of Parquet is ~130,000-200,000 real ledger rows
# (checksums barely compress), so a scan holds about what a compacted file does, however
# large the small files are.
FILES_PER_SCAN = 256
SCAN_BYTES = 16 << 20


def file_sizes(partition: Any, names: Iterable[str]) -> dict[str, int]:
    """These data files' sizes in bytes, in the order of `names`, from one listing.

    On an object store the listing answers a thousand files a request; reading each
    file's footer for its row count cost two requests a file, 4,000 of the 1,000-queue
    job's commit behind a 20 ms round trip (bench.many_queues --ledger s3)."""
    listed = {path.name: size for path, size in store.sized_entries(partition)}
    return {name: listed[name] for name in names}


def small_files(sizes: Mapping[str, int]) -> list[str]:
    """The data files worth compacting: under SMALL_FILE_BYTES (`file_sizes`), and every
    finished stream (Arrow IPC: the log can only name Parquet files)."""
    return [
        name for name, size in sizes.items() if size < SMALL_FILE_BYTES or is_finished_stream(name)
    ]


def compact(
    partition: Any,
    names: Sequence[str],
    version: int,
    *,
    rows_per_file: int = COMPACT_ROWS,
    sizes: Mapping[str, int] | None = None,
) -> tuple[str, ...]:
    """Copy the rows of these data files into a few compacted files; their names.

    The rows are read in the order of `names` (sorted by the caller: a transfer's files
    share a prefix, so its rows stay together and row-group statistics of the key
    columns let a resume skip most of a file), a few hundred files per multi-threaded
    dataset scan (1,000 files one by one took 1 s), and cut into files of
    `rows_per_file` rows, the last one shorter; a source's rows may straddle two
    compacted files, which the commit batch adds together. The sources are left as they
    are. `sizes` are their sizes where the caller has listed them (`file_sizes`), so
    that reading one costs no request for its size; otherwise they are listed here.
    """
    known = sizes if sizes is not None else file_sizes(partition, names)
    written: list[str] = []
    pending: list[pa.Table] = []
    pending_rows = 0

    def write(table: pa.Table) -> None:
        name = f"{COMPACTED_PREFIX}{version:010d}-{len(written):04d}-{uuid.uuid4().hex}.parquet"
        durable.write_data_file(partition, name, table)
        written.append(name)

    for scanned in _read_scans(partition, [(name, known[name]) for name in names]):
        pending.append(scanned)
        pending_rows += scanned.num_rows
        if pending_rows >= rows_per_file:
            rows = pa.concat_tables(pending)
            start = 0
            while rows.num_rows - start >= rows_per_file:
                write(rows.slice(start, rows_per_file))
                start += rows_per_file
            rest = rows.slice(start)
            pending, pending_rows = [rest], rest.num_rows
    if pending_rows or not written:
        write(pa.concat_tables(pending) if pending else DATA_SCHEMA.empty_table())
    return tuple(written)


def _read_scans(partition: Any, files: Sequence[tuple[str, int]]) -> Iterator[pa.Table]:
    """The files' rows, in order, one table per `scans` group.

    Each file read is a chunk of its own, a few hundred bytes of rows under tens of KiB
    of buffers and metadata: one scan of 10,000 five-row files (a 10,000-queue run) took
    the driver to 945 MiB for a 14 MiB table. Combining each group's chunks before the
    next lets those go: 212 MiB, in the same 5-6 s (measured on the files of a
    `bench.many_queues --queues 10000 --messages 5` run).

    Local files: a multi-threaded dataset scan per group, each file with its size as
    listed; a finished stream (Arrow IPC, `layout.is_finished_stream`) is read whole,
    with no footer or pages to decode. Objects: each file read whole, in one GET,
    REQUESTS_AT_ONCE at a time (`_read_whole`); a dataset scan reads a footer, then the
    rows, two round trips a file, and reading 400 small files through 20 ms round trips
    to the bench's store took 10.3 s at pyarrow's 4 files ahead, 5.7 s at 16.
    """
    if not isinstance(partition, store.StorePath):
        for scan in scans(files):
            yield pa.concat_tables(_read_local(partition, scan)).combine_chunks()
        return
    with ThreadPoolExecutor(REQUESTS_AT_ONCE) as pool:
        for scan in scans(files):
            read = pool.map(_read_whole, [partition / name for name, _ in scan])
            yield pa.concat_tables(read).combine_chunks()


def _read_local(partition: Path, scan: Sequence[tuple[str, int]]) -> list[pa.Table]:
    """A scan's local files in order: each run of Parquet files one dataset scan, each
    finished stream read whole."""
    tables: list[pa.Table] = []
    parquet: list[tuple[Path, int]] = []
    for name, size in scan:
        if not is_finished_stream(name):
            parquet.append((partition / name, size))
            continue
        if parquet:
            tables.append(_scan(parquet))
            parquet = []
        tables.append(durable.read_stream(partition / name))
    if parquet:
        tables.append(_scan(parquet))
    return tables


def _scan(files: Sequence[tuple[Path, int]]) -> pa.Table:
    return store.sized_dataset(files, DATA_SCHEMA).to_table(fragment_readahead=REQUESTS_AT_ONCE)


def _read_whole(path: store.StorePath) -> pa.Table:
    """A small data file's rows from one read of the whole object (`StorePath.read_bytes`)."""
    return pq.read_table(pa.BufferReader(path.read_bytes()), schema=DATA_SCHEMA)


def scans(files: Sequence[tuple[str, int]]) -> Iterator[list[tuple[str, int]]]:
    """(name, size) pairs in their order, cut into scans of at most FILES_PER_SCAN files
    and SCAN_BYTES bytes (a file larger than that is a scan of its own)."""
    scan: list[tuple[str, int]] = []
    scan_bytes = 0
    for name, size in files:
        if scan and (len(scan) == FILES_PER_SCAN or scan_bytes + size > SCAN_BYTES):
            yield scan
            scan, scan_bytes = [], 0
        scan.append((name, size))
        scan_bytes += size
    if scan:
        yield scan


def orphans(partition: Any, named: Iterable[str]) -> list[Any]:
    """Compacted files (whole or half-written) that no commit batch names: left by a
    driver that died before writing its batch, so in no commit and never read as such."""
    keep = set(named)
    found = [
        *partition.glob(f"{COMPACTED_PREFIX}*.parquet"),
        *partition.glob(f"{TEMP_PREFIX}{COMPACTED_PREFIX}*"),
    ]
    return sorted(path for path in found if path.name not in keep)


def remove(partition: Any, names: Iterable[str]) -> None:
    """Remove these files of the partition (those that are still there).

    In bulk on an object store, REQUESTS_AT_ONCE at a time locally (`removal`). No
    existence check first: a missing file (removed by a commit that died after it) is
    skipped, and asking first was one more request a file."""
    removal.remove_all([partition / name for name in names], REQUESTS_AT_ONCE)
