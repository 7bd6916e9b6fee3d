"""MoveOutcome rows: the Arrow schema follows the dataclass, and a row comes back as
the outcome it was (no Spark)."""

from __future__ import annotations

import dataclasses

import pyarrow as pa

from rmq_spark.config import Limits
from rmq_spark.model import MoveOutcome, TransferKey
from rmq_spark.transfer.outcomes import OUTCOME_SCHEMA, outcome_of, outcome_row

KEY = TransferKey("dr", "a/b", "orders", "main", "a/b", "orders")


def outcome(**changes: object) -> MoveOutcome:
    base = MoveOutcome(
        key=KEY,
        status="failed",
        error="destination refused",
        messages=7,
        bytes=700,
        first_position=3,
        next_position=10,
        seconds=1.5,
        sessions=2,
        peak_held_bytes=300,
        rate_limits=Limits(messages_per_second=50.0, destination_max_depth=100),
        rate_held_seconds=0.25,
        depth_held_seconds=0.5,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_every_field_of_the_dataclass_is_a_column() -> None:
    assert OUTCOME_SCHEMA.names == [f.name for f in dataclasses.fields(MoveOutcome)]
    key = OUTCOME_SCHEMA.field("key")
    assert key.type == pa.struct(
        [pa.field(f.name, pa.string(), nullable=False) for f in dataclasses.fields(TransferKey)]
    )
    assert not key.nullable
    assert OUTCOME_SCHEMA.field("error").nullable
    assert not OUTCOME_SCHEMA.field("messages").nullable
    assert OUTCOME_SCHEMA.field("seconds").type == pa.float64()


def test_an_outcome_survives_an_arrow_batch() -> None:
    for original in (outcome(), outcome(status="moved", error=None, rate_limits=None)):
        batch = pa.RecordBatch.from_pylist([outcome_row(original)], schema=OUTCOME_SCHEMA)

        assert outcome_of(batch.to_pylist()[0]) == original
