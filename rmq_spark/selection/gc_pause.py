"""Cyclic garbage collection paused while a batch of messages is decoded.

Decoding a batch's property blocks (`columns.message_table`) builds tens of small
containers per message (typed header values, maps, death rows) that all live until the
batch becomes Arrow arrays. They survive the young collections they trigger, are promoted,
and set off full collections of the whole heap: an executor's heap holds pyarrow, pika
and pyspark, so each full pass costs tens of milliseconds. Measured with `bench.park`
(20,000 demo messages): ten full collections, 0.6-0.7 s of a 2.1-2.3 s park; with the
pause, none. A park pauses it around all of a batch's rows (`parked_rows.py`), whose
other columns are lists as long as the batch: 30,000 messages on 4.3 then spent 0.03 s
collecting instead of 0.3 s. The containers hold no reference cycles (they are freed by reference
counting the moment the arrays are built), so nothing waits for the collector meanwhile.

The pause is process-wide (the collector is), so it is counted: several movers of one
task may decode at once on their own threads, and the collector comes back when the last
of them is done, and only if it was on when the first began.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class _Pauses:
    """How many blocks pause the collector now, and whether it was on before the first."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active = 0
        self.was_enabled = False


_pauses = _Pauses()


@contextmanager
def collection_paused() -> Iterator[None]:
    """No automatic cyclic collection inside the block (reference counting goes on)."""
    with _pauses.lock:
        if _pauses.active == 0:
            _pauses.was_enabled = gc.isenabled()
            gc.disable()
        _pauses.active += 1
    try:
        yield
    finally:
        with _pauses.lock:
            _pauses.active -= 1
            if _pauses.active == 0 and _pauses.was_enabled:
                gc.enable()
