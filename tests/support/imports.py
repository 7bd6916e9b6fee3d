"""What a fresh interpreter has imported after running a snippet: for the executors'
code paths that must not load a heavy library they never use (pandas: 55 MiB of a
worker's RSS, `rmq_spark/arrow_columns.py`)."""

from __future__ import annotations

import subprocess
import sys


def imported_after(script: str, module: str) -> bool:
    """Whether `module` is in sys.modules after `script` ran in a fresh interpreter (the
    script's own assertions must pass)."""
    probe = f"{script}\nimport sys\nprint({module!r} in sys.modules)\n"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    return result.stdout.strip().splitlines()[-1] == "True"
