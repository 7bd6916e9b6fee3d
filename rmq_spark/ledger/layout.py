"""Where the ledger's files live, and how they are named.

Both sides stand on this: executors (`writer`) write rows streams, intent logs and
data files here; the driver (`tables`, `compaction`, `committers`, `brakes`) commits,
compacts and reads them. Directories are pathlib.Paths for a local ledger and
StorePaths for an object store (`store`): typed Any, as both have the operations
used on them.
"""

from __future__ import annotations

import re
from typing import Any

from rmq_spark.ledger import schema, store
from rmq_spark.model import TransferKey

# Data files carry every column but the partition column, as Delta expects.
DATA_COLUMNS = tuple(c for c in schema.MESSAGES if c.name != "run_id")
DATA_SCHEMA = schema.arrow_schema(DATA_COLUMNS)
# The transfer's identity in every row (TransferKey's fields).
KEY_COLUMNS: tuple[str, ...] = tuple(name for name in schema.TRANSFER_KEY if name != "run_id")
TEMP_PREFIX = ".staging-"
STREAM_SUFFIX = ".arrows"
# A transfer's rows stream becomes a Parquet data file every this many rows.
ROLL_ROWS = 65_536
# Data files under this size are compacted at commit time (`compaction`); a transfer's
# stream under it, once the transfer ends, is moved into the run partition as it is (a
# finished stream, `writer.MessageLedgerWriter.close`), since the commit would copy
# its rows anyway. A rolled stream's file (ROLL_ROWS rows) is 1.6 MiB even of the most
# compressible rows (the unit tests' builder), ~8 MiB of real checksums; a file under
# 1 MiB holds at most ~16,000 real rows. Sizes come with the directory listing, where
# row counts would cost a footer read per file (two requests on an object store).
SMALL_FILE_BYTES = 1 << 20
# Files the commit step compacts many transfers' small data files into (`compaction`):
# named for no transfer, so a transfer's rows there are found by its key columns.
COMPACTED_PREFIX = "compacted-"


# Names of the data files executors (and the commit step) write, and of the finished
# streams executors leave beside them: the transfer's file prefix first. Spark's Delta
# writer names its files part-00000-<uuid>...
_DATA_FILE_NAME = re.compile(r"part-[0-9a-f]{16}-.+\.(parquet|arrows)")


def is_data_file(name: str) -> bool:
    """Whether a file in a run partition is one of rmq-spark's own data files, or a
    finished stream (`is_finished_stream`), which only a commit's compaction reads."""
    return _DATA_FILE_NAME.fullmatch(name) is not None


def is_finished_stream(name: str) -> bool:
    """A transfer's rows stream its executor moved into the run partition when the
    transfer ended: rows the commit compacts, never a file the Delta log may name."""
    return name.endswith(STREAM_SUFFIX)


def run_partition_dir(ledger_path: str, run_id: str) -> Any:
    return store.root(ledger_path) / "messages" / f"run_id={run_id}"


def run_rows_dir(ledger_path: str, run_id: str) -> Any:
    """Rows streams of transfers still running (or whose task died); local ledgers only."""
    return store.root(ledger_path) / "rows" / f"run_id={run_id}"


def run_intents_dir(ledger_path: str, run_id: str) -> Any:
    return store.root(ledger_path) / "intents" / f"run_id={run_id}"


def run_fences_dir(ledger_path: str, run_id: str) -> Any:
    """Selective moves' fences whose publish was confirmed (`ledger/fences.py`)."""
    return store.root(ledger_path) / "fences" / f"run_id={run_id}"


# "part-" and 16 hex digits and "-": the length of TransferKey.file_prefix.
PREFIX_LENGTH = 22


def transfer_prefixes(key: TransferKey) -> tuple[str, ...]:
    """The file prefixes a transfer's files may carry: its own, and the one earlier
    builds wrote (`TransferKey.legacy_file_prefix`), so their runs resume."""
    return (key.file_prefix, key.legacy_file_prefix)
