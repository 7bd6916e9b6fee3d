"""Where a bench job's ledger lives: a local directory, or an object store far away.

    python -m bench.many_queues --ledger s3 --store-delay-ms 10

`--ledger s3` starts the local S3 server the tests and the demo use (moto,
`rmq_spark.devtools.demo_store`) and puts `bench.delay_proxy` in front of it, so every
request to the store waits `--store-delay-ms` each way (10 ms each way: a 20 ms round
trip per request, as a bucket in the same region answers a small PUT). The job's
config names the proxy as the store's endpoint; its keys reach the job only through
the environment variables the ledger block names, as in production.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.delay_proxy import DelayProxy, process_cpu_seconds
from rmq_spark.devtools.demo_store import DemoStore, demo_store
from rmq_spark.ledger import store as ledger_store

LEDGERS = ("local", "s3")


@dataclass(frozen=True)
class StoreUsage:
    """What the bench's store has done so far: requests answered, and the CPU time of
    its server and delay proxy, which share this machine's cores with the job."""

    requests: int = 0
    cpu_seconds: float = 0.0

    def since(self, before: StoreUsage) -> StoreUsage:
        return StoreUsage(
            self.requests - before.requests, round(self.cpu_seconds - before.cpu_seconds, 2)
        )


@dataclass(frozen=True)
class BenchLedger:
    """A ledger block per run: a directory under the work dir, or a prefix on the store."""

    kind: str
    store_delay_ms: float = 0.0
    store_block: dict[str, Any] = field(default_factory=dict)
    usage: Callable[[], StoreUsage] = StoreUsage

    def block(self, work_dir: Path, run_id: str) -> dict[str, Any]:
        if self.kind == "local":
            return {"path": str(work_dir / "ledgers" / run_id)}
        base = str(self.store_block["path"]).rstrip("/")
        return {**self.store_block, "path": f"{base}-{run_id}"}

    def describe(self) -> dict[str, Any]:
        return {"ledger": self.kind} | (
            {"store_delay_ms_each_way": self.store_delay_ms} if self.kind != "local" else {}
        )


@contextmanager
def bench_ledger(kind: str, store_delay_ms: float, base: Path) -> Iterator[BenchLedger]:
    """The ledger for `kind`; for s3 the server and its delay proxy run until exit."""
    if kind == "local":
        yield BenchLedger("local")
        return
    if kind != "s3":
        raise ValueError(f"no bench ledger {kind!r}; expected one of {', '.join(LEDGERS)}")
    with demo_store("s3", base) as store:
        endpoint = str(store.block["storage_options"]["endpoint"])  # type: ignore[index]
        server_port = urlsplit(endpoint).port
        assert server_port is not None, endpoint
        with DelayProxy(server_port, store_delay_ms / 1000) as proxy:
            options = dict(store.block["storage_options"])  # type: ignore[call-overload]
            options["endpoint"] = f"http://127.0.0.1:{proxy.port}"
            # The bench reads the run's stages back through the same far endpoint.
            ledger_store.configure(
                store.uri, dataclasses.replace(store.options, endpoint=options["endpoint"])
            )
            saved = {name: os.environ.get(name) for name in store.secrets}
            os.environ.update(store.secrets)  # the job's spark-submit inherits them
            try:
                yield BenchLedger(
                    "s3",
                    store_delay_ms,
                    {**store.block, "storage_options": options},
                    partial(_usage, store, proxy),
                )
            finally:
                for name, value in saved.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value


# A request line of the store's log (moto's server: werkzeug's access log, its method
# and path coloured by ANSI codes for some responses).
_REQUEST_LINE = re.compile(
    r'"(?:\x1b\[[0-9;]*m)*[A-Z]+ \S+ HTTP/[0-9.]+(?:\x1b\[[0-9;]*m)*" \d{3} '
)


def count_requests(request_log: Path) -> int:
    """The requests the store's server has logged so far."""
    with open(request_log, encoding="utf-8", errors="replace") as log:
        return sum(1 for line in log if _REQUEST_LINE.search(line))


def _usage(store: DemoStore, proxy: DelayProxy) -> StoreUsage:
    assert store.server_pid is not None, "the S3 server's process is known"
    assert store.request_log is not None, "the S3 server's log is known"
    cpu = process_cpu_seconds(store.server_pid) + proxy.cpu_seconds()
    return StoreUsage(count_requests(store.request_log), cpu)
