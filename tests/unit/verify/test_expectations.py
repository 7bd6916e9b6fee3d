"""Great Expectations' process-wide setting is ours only while we validate."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


# A fresh interpreter (GE is imported once per process), running a file: under
# `python -c` an import of GE runs the __main__ code a second time.
_WHILE_PRELOADING = """
import sys, time
from rmq_spark.verify.expectations import pandas_fingerprints_off, preload_great_expectations
thread = preload_great_expectations()
while "great_expectations" not in sys.modules:  # the preload is halfway through GE
    time.sleep(0.001)
with pandas_fingerprints_off():
    pass
thread.join()
print("restored")
"""


def test_fingerprints_can_be_turned_off_while_the_preload_is_importing_ge(
    tmp_path: Path,
) -> None:
    script = tmp_path / "while_preloading.py"
    script.write_text(_WHILE_PRELOADING, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "restored"), done.stderr[-2000:]
