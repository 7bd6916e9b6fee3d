"""parked_completion's pure parts: which staged files go into which data file, and its name."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rmq_spark.transfer import parked_completion
from rmq_spark.transfer.parked_completion import (
    STAGED_KEY,
    data_file_name,
    group_staged,
    staged_names_of,
)

A = "part-aaaaaaaaaaaaaaaa-"
B = "part-bbbbbbbbbbbbbbbb-"


def test_groups_hold_one_transfers_files_in_name_order_up_to_group_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(parked_completion, "GROUP_BYTES", 10)
    staged = [
        (f"{B}{0:020d}-0-x.parquet", 4),
        (f"{A}{5:020d}-0-y.parquet", 4),
        (f"{A}{0:020d}-0-x.parquet", 4),
        (f"{A}{9:020d}-0-z.parquet", 4),
        (f"{A}{12:020d}-0-w.parquet", 30),  # larger than a group: alone
        ("legacy.parquet", 1),  # no transfer prefix: a group of its own
    ]
    assert group_staged(staged) == [
        ["legacy.parquet"],
        [f"{A}{0:020d}-0-x.parquet", f"{A}{5:020d}-0-y.parquet"],
        [f"{A}{9:020d}-0-z.parquet"],
        [f"{A}{12:020d}-0-w.parquet"],
        [f"{B}{0:020d}-0-x.parquet"],
    ]


def test_a_groups_data_file_name_is_its_transfers_and_the_same_for_the_same_files() -> None:
    group = [f"{A}{0:020d}-0-x.parquet", f"{A}{5:020d}-0-y.parquet"]
    name = data_file_name(group)
    assert name.startswith(f"{A}completed-")
    assert name.endswith(".parquet")
    assert data_file_name(list(group)) == name
    assert data_file_name(group[:1]) != name


def test_a_data_file_names_the_staged_files_it_holds(tmp_path: Path) -> None:
    schema = pa.schema([("x", pa.int64())])
    with_list = f"{tmp_path}/grouped.parquet"
    pq.write_table(
        pa.table({"x": [1]}, schema.with_metadata({STAGED_KEY: b'["s1", "s2"]'})), with_list
    )
    one_to_one = f"{tmp_path}/s3.parquet"
    pq.write_table(pa.table({"x": [1]}, schema), one_to_one)
    assert staged_names_of(pq.read_metadata(with_list), "grouped.parquet") == ["s1", "s2"]
    assert staged_names_of(pq.read_metadata(one_to_one), "s3.parquet") == ["s3.parquet"]
