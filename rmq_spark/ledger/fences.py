"""A selective move's fence, recorded in the ledger once the source confirmed it.

A selective move publishes one fence to its source queue's tail and consumes up to it
(`transfer/selective.py`). A Spark task attempt that dies mid-move leaves that fence in
the queue; the next attempt must stop at it and must not publish a second one, or the
second stays behind in the source, a message nobody sent. Task attempts share nothing
but the ledger, so the confirmed fence is a file there: one small file per transfer
and run (its content the fence's message-id), complete and durable when `record`
returns (`durable.write_file`: fsync and rename on a directory, one PUT on an object
store). The next attempt finds it with the run's other files (`resume.EarlierFiles`).

Recorded after the confirm and before the first delivery is consumed: a task killed in
between leaves a fence that is in the queue and not recorded, and the next attempt
publishes another, which stops at the first and stays behind (docs/selection.md says
so; the next selective move of the queue drops it as stale).
"""

from __future__ import annotations

from rmq_spark.errors import LedgerError
from rmq_spark.ledger.durable import write_file
from rmq_spark.ledger.layout import run_fences_dir
from rmq_spark.model import TransferKey

FENCE_SUFFIX = ".fence"


def fence_file_name(key: TransferKey) -> str:
    """The transfer's fence file: its file prefix, so a listing groups it with its files."""
    return f"{key.file_prefix}{FENCE_SUFFIX}"


def record_fence(ledger_path: str, run_id: str, key: TransferKey, message_id: str) -> None:
    """Record that the transfer's fence is in its source; durable on return."""
    directory = run_fences_dir(ledger_path, run_id)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        write_file(directory, fence_file_name(key), message_id.encode("utf-8"))
    except OSError as exc:
        raise LedgerError(
            f"ledger {directory}: cannot record the fence of {key.label()} ({exc})"
        ) from exc
