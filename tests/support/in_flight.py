"""What is in flight between two queues while a job moves one to the other, from exact depths.

The sampler counts the destination, the source's ready messages, and the destination
again, each by a passive declare. In source order (one consumer per queue), the
messages in flight are the positions from the destination's count up to what has left
the source; a sample counts only when the destination's count did not move while the
source's was read. Since a message is acked only after the destination confirmed it,
what it sees in flight is never more than the mover's prefetch.
"""

from __future__ import annotations

import threading

from rmq_spark.devtools.local_brokers import LocalNode
from tests.support.brokers import queue_depth


class InFlightSampler:
    """A thread sampling the bytes in flight between two queues until stopped."""

    def __init__(
        self, source: LocalNode, destination: LocalNode, vhost: str, queue: str, sizes: list[int]
    ) -> None:
        self._connections = (source.connect(vhost), destination.connect(vhost))
        self._queue = queue
        self._sizes = sizes
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="in-flight-sampler")
        self.peak_bytes = 0
        self.peak_messages = 0
        self.samples = 0

    def __enter__(self) -> InFlightSampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        for connection in self._connections:
            connection.close()

    def _run(self) -> None:
        source, destination = self._connections
        total = len(self._sizes)
        while not self._stop.is_set():
            arrived = queue_depth(destination, self._queue)
            left = total - queue_depth(source, self._queue)
            if queue_depth(destination, self._queue) != arrived:
                continue
            in_flight = self._sizes[arrived:left]
            self.samples += 1
            self.peak_messages = max(self.peak_messages, len(in_flight))
            self.peak_bytes = max(self.peak_bytes, sum(in_flight))
