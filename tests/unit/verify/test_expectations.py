"""Great Expectations' process-wide setting is ours only while we validate."""

from __future__ import annotations

import pytest

from rmq_spark.verify.expectations import pandas_fingerprints_off


def test_pandas_fingerprints_are_off_inside_and_restored_after() -> None:
    from great_expectations.execution_engine import pandas_execution_engine

    before = pandas_execution_engine.HASH_THRESHOLD
    assert before != 0  # GE's own default; importing verify does not change it

    with pandas_fingerprints_off():
        assert pandas_execution_engine.HASH_THRESHOLD == 0
    assert before == pandas_execution_engine.HASH_THRESHOLD

    with pytest.raises(RuntimeError), pandas_fingerprints_off():
        raise RuntimeError("validation failed")
    assert before == pandas_execution_engine.HASH_THRESHOLD
