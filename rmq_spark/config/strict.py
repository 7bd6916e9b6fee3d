"""The base of every config model: unknown keys refused, values frozen, and each
field's docstring its description."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    # The string under each field is its description: the JSON Schema (`rmq-spark
    # config-schema`) and the configuration reference (docs/reference/config.md) carry it.
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
