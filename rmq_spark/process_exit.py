"""Ending a spark-submit job's Python driver once its work is done and recorded.

By then the ledger is committed and fsynced, the report written, Spark stopped.
What a normal interpreter exit still does is tear down every module the job
imported (Great Expectations, pandas, pyarrow, matplotlib, delta-rs): 0.75 s of
the 1,000-queue benchmark's job (~3% of it), with nothing left to make durable.
`exit_job` runs the atexit handlers, flushes logging and the standard streams,
then ends the process with the job's code without that teardown.

It falls back to the normal exit when the process is not its own (a Databricks
driver runs the job file inside its REPL, which must live on) and when a thread
the interpreter would wait for is still running (its work may not be done).
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import NoReturn

HOSTED_ENV = "DATABRICKS_RUNTIME_VERSION"


def exit_job(code: int) -> NoReturn:
    """End the process with `code`; see the module docstring for when and why."""
    if not can_skip_teardown(os.environ, threading.enumerate(), threading.main_thread()):
        sys.exit(code)
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    os._exit(code)


def can_skip_teardown(
    environ: Mapping[str, str], threads: Sequence[threading.Thread], main: threading.Thread
) -> bool:
    """True when the process is the job's own and no non-daemon thread but `main` runs."""
    if HOSTED_ENV in environ:
        return False
    return not any(t is not main and not t.daemon and t.is_alive() for t in threads)
