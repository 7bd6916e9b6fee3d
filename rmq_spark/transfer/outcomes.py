"""MoveOutcome as Arrow rows: how the movers' outcomes come back from the executors.

The schema is derived from the dataclass (`model.MoveOutcome` and its `TransferKey`),
so a field added there is a column here. `rate_limits` (a `config.Limits`, typed
`Any` in the model) travels as its JSON.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

import pyarrow as pa

from rmq_spark.config import Limits
from rmq_spark.model import MoveOutcome, TransferKey

_SCALARS: dict[Any, pa.DataType] = {
    str: pa.string(),
    int: pa.int64(),
    float: pa.float64(),
    bool: pa.bool_(),
    Any: pa.string(),  # a config.Limits, as its JSON (the only Any field)
}


def arrow_schema(cls: type) -> pa.Schema:
    """The Arrow schema of a dataclass of scalars, optional scalars and dataclasses."""
    return pa.schema([_arrow_field(name, hint) for name, hint in _hints(cls).items()])


def _hints(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _arrow_field(name: str, hint: Any) -> pa.Field:
    nullable = hint is Any
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        options = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        nullable, hint = True, options[0]
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return pa.field(name, pa.struct(list(arrow_schema(hint))), nullable=nullable)
    return pa.field(name, _SCALARS[hint], nullable=nullable)


OUTCOME_SCHEMA = arrow_schema(MoveOutcome)


def outcome_row(outcome: MoveOutcome) -> dict[str, Any]:
    """One OUTCOME_SCHEMA row."""
    row = dataclasses.asdict(outcome)
    limits = outcome.rate_limits
    row["rate_limits"] = limits.model_dump_json() if limits is not None else None
    return row


def outcome_of(row: dict[str, Any]) -> MoveOutcome:
    """The MoveOutcome of an OUTCOME_SCHEMA row."""
    limits = row["rate_limits"]
    return MoveOutcome(
        **{
            **row,
            "key": TransferKey(**row["key"]),
            "rate_limits": Limits.model_validate_json(limits) if limits is not None else None,
        }
    )
