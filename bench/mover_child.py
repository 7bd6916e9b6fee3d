"""One mover run in a fresh interpreter, the way a Spark executor's Python worker runs it.

``python -m bench.mover_child < request.json`` prints one JSON line: wall seconds of
the transfer, client CPU seconds (user + system, this process only), peak RSS, and
the outcome. The request (password included) comes on stdin, never on a command line.

``"ledger": true`` calls `rmq_spark.transfer.executor.move_queue` exactly as an executor task
does: intent log and message ledger, fsynced. ``"ledger": false`` is the
benchmark-only switch for the ledger's cost: the same `QueueMover`, checksums and
window, but rows go to a sink that keeps nothing and no intent log is written.
Profile a run with ``py-spy record -o profile.txt -f raw -- python -m
bench.mover_child < request.json``.
"""

from __future__ import annotations

import json
import logging
import resource
import sys
import time
from collections.abc import Sequence
from typing import Any

from pydantic import SecretStr

from rmq_spark.broker.connection import connection_parameters
from rmq_spark.config import ClusterConfig
from rmq_spark.model import Delivery, MoveOutcome, TransferKey
from rmq_spark.transfer.amqp091.links import Amqp091Connector, Endpoint
from rmq_spark.transfer.executor import ExecutorSettings, move_queue
from rmq_spark.transfer.mover import NoIntents, QueueMover


class DiscardingLedger:
    """A LedgerSink that keeps nothing: the 'no ledger' side of the ledger-cost pair."""

    def write(self, deliveries: Sequence[Delivery]) -> None:
        return None

    def close(self) -> None:
        return None


def settings_from(request: dict[str, Any]) -> ExecutorSettings:
    return ExecutorSettings(
        run_id=str(request["run_id"]),
        ledger_path=str(request["ledger_path"]),
        clusters={
            name: ClusterConfig(
                amqp=[cluster["amqp"]],
                management=cluster["management"],
                username=cluster["username"],
                password=SecretStr(cluster["password"]),
            )
            for name, cluster in request["clusters"].items()
        },
        window_messages=int(request["window_messages"]),
        window_start_messages=request.get("window_start_messages"),
        window_bytes=int(request["window_bytes"]),
    )


def move_without_ledger(row: dict[str, Any], settings: ExecutorSettings) -> MoveOutcome:
    """`move_queue` minus the ledger: same endpoints and windows, rows discarded."""
    key = TransferKey(
        source_cluster=str(row["source_cluster"]),
        source_vhost=str(row["source_vhost"]),
        source_queue=str(row["source_queue"]),
        destination_cluster=str(row["destination_cluster"]),
        destination_vhost=str(row["destination_vhost"]),
        destination_queue=str(row["destination_queue"]),
    )

    def endpoint(cluster: str, vhost: str, queue: str, role: str) -> Endpoint:
        params = connection_parameters(
            cluster, settings.clusters[cluster], vhost, purpose=f"bench {role} {queue}"
        )
        return Endpoint(cluster, vhost, queue, tuple(params))

    connector = Amqp091Connector(
        endpoint(key.source_cluster, key.source_vhost, key.source_queue, "consumer"),
        endpoint(
            key.destination_cluster, key.destination_vhost, key.destination_queue, "publisher"
        ),
    )
    # No ledger and, by name, no intent log: what the ledger costs is the difference.
    return QueueMover(
        key,
        connector,
        DiscardingLedger(),
        NoIntents(),
        window_messages=settings.window_messages,
        window_bytes=settings.window_bytes,
        start_messages=settings.window_start_messages,
    ).run()


def peak_rss_kib() -> int:
    """VmHWM: this address space's peak RSS (ru_maxrss can inherit the parent's at exec)."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("/proc/self/status has no VmHWM line")


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run(request: dict[str, Any]) -> dict[str, Any]:
    settings = settings_from(request)
    row = request["row"]
    cpu_before, started = cpu_seconds(), time.monotonic()
    if request["ledger"]:
        outcome = move_queue(row, settings, "bench")
    else:
        outcome = move_without_ledger(row, settings)
    seconds = time.monotonic() - started
    return {
        "seconds": seconds,
        "client_cpu_seconds": cpu_seconds() - cpu_before,
        "peak_rss_kib": peak_rss_kib(),
        "status": outcome.status,
        "error": outcome.error,
        "messages": outcome.messages,
        "bytes": outcome.bytes,
        "sessions": outcome.sessions,
        "window_messages": outcome.window_messages,
    }


def main() -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    print(json.dumps(run(json.load(sys.stdin))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
