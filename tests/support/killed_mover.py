"""A mover task killed between a durable ledger write and the acks it allows.

`python -m tests.support.killed_mover CONFIG RUN_ID VHOST QUEUE MESSAGES WINDOW` moves
QUEUE (cluster dr to cluster main, the same vhost and name) as task attempt
KILLED_ATTEMPT with the real ledger writer and intent log, and SIGKILLs its own process
right after a rows write has become durable, before the mover could ack what it
covers: the second write or later, once intents were logged past that write's rows
(it waits for them a while, else lets the write's acks go and tries the next), so the
ledger holds publishes whose confirm it never recorded (recognition.py's proof needs
them). Before dying it prints one JSON line: the positions of that last
durable write and the highest intent logged.

Its own process, so the kill is real: the broker sees the connection drop and requeues
whatever was unacked, as it does when Spark loses an executor.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Sequence

from rmq_spark.config import load_config
from rmq_spark.ledger import store, tables
from rmq_spark.ledger.writer import IntentLog, MessageLedgerWriter
from rmq_spark.model import Delivery
from rmq_spark.transfer import executor

KILLED_ATTEMPT = "3.0.0"

_logged = threading.Condition()
# How long a write waits for a later batch's intents before it lets its acks go.
INTENTS_WAIT_SECONDS = 5.0
_highest_intent = -1
_writes = 0


class RecordingIntentLog(IntentLog):
    """The real intent log, remembering the highest position made durable."""

    def _append_to_file(self, deliveries: Sequence[Delivery]) -> None:
        global _highest_intent  # noqa: PLW0603 - shared with the ledger writer's thread
        super()._append_to_file(deliveries)
        if deliveries:
            with _logged:
                _highest_intent = max(_highest_intent, *(d.position for d in deliveries))
                _logged.notify_all()


class KillingLedgerWriter(MessageLedgerWriter):
    """The real ledger writer; its process dies after a durable write (see the module)."""

    def write(self, deliveries: Sequence[Delivery]) -> None:
        global _writes  # noqa: PLW0603 - one writer per process
        super().write(deliveries)
        _writes += 1
        written = [d.position for d in deliveries]
        if _writes < 2 or not written:
            return
        with _logged:  # the mover goes on receiving and logging meanwhile; only acks wait
            intents_beyond = _logged.wait_for(
                lambda: _highest_intent > max(written), timeout=INTENTS_WAIT_SECONDS
            )
        if intents_beyond:
            print(json.dumps({"written": written, "highest_intent": _highest_intent}), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


def main(argv: Sequence[str]) -> None:
    config_path, run_id, vhost, queue, messages, window = argv
    config = load_config(config_path)
    store.use_ledger(config.ledger)
    tables.ensure_tables(config.ledger.path)
    executor.MessageLedgerWriter = KillingLedgerWriter  # type: ignore[attr-defined]
    executor.IntentLog = RecordingIntentLog  # type: ignore[attr-defined]
    settings = executor.ExecutorSettings(
        run_id=run_id,
        ledger_path=config.ledger.path,
        clusters=dict(config.clusters),
        window_messages=int(window),
        window_bytes=1 << 30,
        mover=config.mover,
    )
    row = {
        "source_cluster": "dr",
        "source_vhost": vhost,
        "source_queue": queue,
        "destination_cluster": "main",
        "destination_vhost": vhost,
        "destination_queue": queue,
        "messages": int(messages),
        "message_bytes": int(messages) * 1024,
    }
    executor.move_queue(row, settings, KILLED_ATTEMPT)
    raise SystemExit(f"the mover moved all {messages} messages before a write was cut short")


if __name__ == "__main__":
    main(sys.argv[1:])
