"""A transfer's identity: its six names, never a label joined with "/"."""

from __future__ import annotations

import re
from dataclasses import asdict, replace

from rmq_spark.ledger.layout import is_data_file
from rmq_spark.model import MoveOutcome, TransferKey
from rmq_spark.pipeline import _plan_fields, counters_rows
from tests.support.builders import transfer

# vhost "a/b" + queue "c" and vhost "a" + queue "b/c": both read "dr/a/b/c".
A_B_C = replace(transfer("c", 30), source_vhost="a/b", destination_vhost="a/b")
A_BC = replace(
    transfer("b/c", 70), source_vhost="a", destination_vhost="a", destination_queue="b/c"
)


def outcome(key: TransferKey, messages: int, status: str = "moved") -> MoveOutcome:
    return MoveOutcome(
        key=key,
        status=status,
        error=None if status == "moved" else f"{key.label()}: refused",
        messages=messages,
        bytes=messages,
        first_position=0,
        next_position=messages,
        seconds=1.0,
        sessions=1,
    )


def test_transfers_whose_names_contain_slashes_keep_separate_keys() -> None:
    assert A_B_C.source_label == A_BC.source_label  # the labels do collide
    assert A_B_C.key != A_BC.key
    assert len({A_B_C.key, A_BC.key}) == 2
    assert A_B_C.key.file_prefix != A_BC.key.file_prefix
    for key in (A_B_C.key, A_BC.key):
        assert re.fullmatch(r"part-[0-9a-f]{16}-", key.file_prefix)
        assert is_data_file(f"{key.file_prefix}0.0.0-{'f' * 32}.parquet")
    # What earlier builds wrote, and why they lost one of these transfers on resume.
    assert A_B_C.key.legacy_file_prefix == A_BC.key.legacy_file_prefix


def test_key_of_a_row_is_the_key_of_its_transfer() -> None:
    row = {**asdict(A_BC.key), "run_id": "r1", "ledger_rows": 3}
    assert TransferKey.of(row) == A_BC.key
    assert TransferKey.of(row) != A_B_C.key


def test_file_prefix_does_not_depend_on_where_names_are_split() -> None:
    # Moving characters between neighbouring fields changes the prefix.
    keys = [
        TransferKey("dr", "ab", "c", "main", "x", "y"),
        TransferKey("dr", "a", "bc", "main", "x", "y"),
        TransferKey("dra", "b", "c", "main", "x", "y"),
        TransferKey("dr", "a:b", "c", "main", "x", "y"),
        TransferKey("dr", "a", "b:c", "main", "x", "y"),
    ]
    assert len({key.file_prefix for key in keys}) == len(keys)


def test_counters_pair_each_transfer_with_its_own_outcome_and_partition() -> None:
    after = {A_B_C: (0, 30), A_BC: (5, 65)}
    outcomes = [outcome(A_BC.key, 65, "failed"), outcome(A_B_C.key, 30)]

    rows = counters_rows(
        "r1", [A_B_C, A_BC], {A_B_C.key: 0, A_BC.key: 1}, outcomes, after, shared_routes=()
    )

    by_source = {(r["source_vhost"], r["source_queue"]): r for r in rows}
    assert {k: (r["status"], r["partition"]) for k, r in by_source.items()} == {
        ("a/b", "c"): ("moved", 0),
        ("a", "b/c"): ("failed", 1),
    }
    assert by_source[("a", "b/c")]["error"] == "dr:a:b/c -> main:a:b/c: refused"
    assert by_source[("a", "b/c")]["source_depth_after"] == 5


def test_a_plans_row_holds_the_transfers_fields_as_asdict_would() -> None:
    """record_plan writes each transfer's fields without asdict's deep copy: that is the
    same only while every field is a scalar (a new list or dict field fails here)."""
    planned = replace(
        A_B_C, destination_created=True, destination_type="quorum", source_delivery_limit=20
    )
    assert _plan_fields(planned) == asdict(planned)
    assert all(
        isinstance(value, str | int | bool | None) for value in _plan_fields(planned).values()
    )
