"""Driver side: a run's many small data files become a few large ones at commit time.

Executors write a data file per transfer (and per ROLL_ROWS rows): a run of 1,000
small queues left 1,000 files of 20 rows in one Delta commit, which every reader of
the table then opens. `tables.commit_run` hands the small files of a commit batch to
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
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from rmq_spark.ledger import durable, store
from rmq_spark.ledger.layout import COMPACTED_PREFIX, DATA_SCHEMA, ROLL_ROWS, TEMP_PREFIX

# Rows per compacted file: ~30-60 MB of ledger rows, large enough that a run of
# thousands of small queues commits a handful of files, small enough to build in memory.
COMPACT_ROWS = 262_144
# Executor files at least this large are committed as they are: copying them buys
# nothing (a rolled stream's file already has ROLL_ROWS rows).
SMALL_FILE_ROWS = ROLL_ROWS // 4
# Footers read, or files removed, at once: I/O, not CPU (pyarrow's file systems are
# thread-safe), and enough to keep a far object store's pipe full.
REQUESTS_AT_ONCE = 32
# Executor files read by one dataset scan while compacting (`_read_group`).
FILES_PER_SCAN = 256


def row_counts(partition: Any, names: Iterable[str]) -> dict[str, int]:
    """Each data file's row count, from its footer; REQUESTS_AT_ONCE footers at a time.

    On an object store a footer is a request or two, one round trip each: a run of
    1,000 queues leaves 1,000 executor files, which read one by one behind a 20 ms
    round trip took minutes of the commit (bench.many_queues --ledger s3)."""
    names = list(names)
    if not names:
        return {}
    with ThreadPoolExecutor(min(REQUESTS_AT_ONCE, len(names))) as pool:
        counts = pool.map(lambda name: store.read_metadata(partition / name).num_rows, names)
        return dict(zip(names, counts, strict=True))


def small_files(rows: Mapping[str, int]) -> list[str]:
    """The data files worth compacting: fewer rows than SMALL_FILE_ROWS (`row_counts`)."""
    return [name for name, count in rows.items() if count < SMALL_FILE_ROWS]


def compact(
    partition: Any,
    names: Sequence[str],
    version: int,
    *,
    rows_per_file: int = COMPACT_ROWS,
    rows: Mapping[str, int] | None = None,
) -> tuple[str, ...]:
    """Copy the rows of these data files into a few compacted files; their names.

    Files are grouped in the order of `names` (sorted by the caller: a transfer's files
    share a prefix, so its rows stay together and row-group statistics of the key
    columns let a resume skip most of a file) into groups of at most `rows_per_file`
    rows (a file larger than that is a group of its own); each group is read by one
    multi-threaded dataset scan (1,000 files one by one took 1 s). The sources are
    left as they are. `rows` are their row counts where the caller has read them
    (`row_counts`); otherwise they are read here.
    """
    counts = rows if rows is not None else row_counts(partition, names)
    groups: list[list[Any]] = []
    group_rows = 0
    for name in names:
        if not groups or (group_rows and group_rows + counts[name] > rows_per_file):
            groups.append([])
            group_rows = 0
        groups[-1].append(partition / name)
        group_rows += counts[name]
    written: list[str] = []
    for group in groups:
        table = _read_group(group)
        name = f"{COMPACTED_PREFIX}{version:010d}-{len(written):04d}-{uuid.uuid4().hex}.parquet"
        durable.write_data_file(partition, name, table)
        written.append(name)
    return tuple(written)


def _read_group(files: list[Any]) -> pa.Table:
    """A group's rows as one table, read FILES_PER_SCAN files per dataset scan.

    Each scanned file is a chunk of its own, a few hundred bytes of rows under tens of
    KiB of buffers and metadata: one scan of 10,000 five-row files (a 10,000-queue run)
    took the driver to 945 MiB for a 14 MiB table. Combining each scan's chunks before
    the next lets those go: 212 MiB, in the same 5-6 s (measured on the files of a
    `bench.many_queues --queues 10000 --messages 5` run)."""
    return pa.concat_tables(
        store.dataset(files[start : start + FILES_PER_SCAN], schema=DATA_SCHEMA, format="parquet")
        .to_table()
        .combine_chunks()
        for start in range(0, len(files), FILES_PER_SCAN)
    )


def orphans(partition: Any, named: Iterable[str]) -> list[Any]:
    """Compacted files (whole or half-written) that no commit batch names: left by a
    driver that died before writing its batch, so in no commit and never read as such."""
    keep = set(named)
    found = [
        *partition.glob(f"{COMPACTED_PREFIX}*.parquet"),
        *partition.glob(f"{TEMP_PREFIX}{COMPACTED_PREFIX}*"),
    ]
    return sorted(path for path in found if path.name not in keep)


def remove(partition: Any, names: Iterable[str]) -> int:
    """Remove these files of the partition (those that are still there); how many.

    REQUESTS_AT_ONCE at a time: on an object store each is two round trips."""

    def remove_one(name: str) -> bool:
        path = partition / name
        if not path.exists():
            return False
        path.unlink()
        return True

    names = list(names)
    if not names:
        return 0
    with ThreadPoolExecutor(min(REQUESTS_AT_ONCE, len(names))) as pool:
        return sum(pool.map(remove_one, names))
