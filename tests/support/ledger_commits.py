"""A recording committer and the commit key a run left in the messages table's log."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from rmq_spark.ledger import tables
from rmq_spark.ledger.committers import DELTA_RS, CommitKey, commit_app_id


def recorded_version(ledger: Path, run_id: str = "r1") -> int | None:
    table = DeltaTable(tables.table_path(str(ledger), "messages"))
    return table.transaction_version(commit_app_id(run_id))


class Recording:
    """Records what a committer is handed, then commits it with delta-rs (which
    records the key in the log as Spark's txnAppId/txnVersion options do)."""

    name = "recording"

    def __init__(self, *, fail_before: bool = False, fail_after: bool = False) -> None:
        self.calls: list[tuple[list[str], CommitKey]] = []
        self.fail_before, self.fail_after = fail_before, fail_after

    def add_data_files(
        self, table_path: str, run_id: str, files: Sequence[Path], key: CommitKey
    ) -> None:
        self.calls.append(([file.name for file in files], key))
        if self.fail_before:
            raise RuntimeError("driver died before the commit")
        DELTA_RS.add_data_files(table_path, run_id, files, key)
        if self.fail_after:
            raise RuntimeError("driver died after the commit")

    def append(self, table_path: str, table: str, rows: pa.Table) -> None:
        DELTA_RS.append(table_path, table, rows)
