"""The demo's ledger on an object store: `rmq-spark demo --ledger s3|azure`
(`make demo LEDGER=s3`).

Starts the local server the tests use (moto for S3, `s3_server`; Azurite for Azure
Blob, `azurite_server`), writes the demo's config with a ledger block on it (the keys
only by the names of the variables the job's environment carries), and, before the
server stops, reads every ledger table back from the store for the demo's last lines.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from rmq_spark.devtools import azurite_server, s3_server
from rmq_spark.ledger import schema, store, tables

LEDGERS = ("local", "s3", "azure")
KEY_ID_ENV, SECRET_ENV = "RMQ_SPARK_DEMO_S3_KEY_ID", "RMQ_SPARK_DEMO_S3_SECRET"
AZURE_KEY_ENV = "RMQ_SPARK_DEMO_AZURE_KEY"


@dataclass(frozen=True)
class DemoStore:
    """A running store for the demo's ledger: its URI, the config's ledger block and the
    variables holding its keys (for the job's environment only)."""

    uri: str
    block: dict[str, object]
    secrets: dict[str, str]
    options: store.StoreOptions
    # The server's process and request log, for benchmarks that count its work.
    server_pid: int | None = None
    request_log: Path | None = None

    def __repr__(self) -> str:
        return f"DemoStore(uri={self.uri!r})"

    def config(self, demo_config: Path, out: Path) -> Path:
        """The demo's config with this ledger block, written to `out`."""
        config = yaml.safe_load(demo_config.read_text(encoding="utf-8"))
        config["ledger"] = self.block
        out.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        return out

    def table_rows(self) -> dict[str, int]:
        """Every ledger table's row count, read from the store."""
        store.configure(self.uri, self.options)
        return {name: tables.read_arrow(self.uri, name).num_rows for name in schema.TABLES}


@contextmanager
def demo_store(kind: str, base: Path) -> Iterator[DemoStore]:
    """Start the local server for `kind` (s3 or azure) under `base`; stop it on exit."""
    if kind == "s3":
        s3 = s3_server.start(base / "s3", bucket="rmq-spark-demo")
        try:
            yield DemoStore(
                f"s3://{s3.bucket}/ledger",
                {
                    "path": f"s3://{s3.bucket}/ledger",
                    "storage_options": {
                        "endpoint": s3.endpoint,
                        "region": s3_server.REGION,
                        "access_key_id_env": KEY_ID_ENV,
                        "secret_access_key_env": SECRET_ENV,
                    },
                },
                {KEY_ID_ENV: s3.access_key_id, SECRET_ENV: s3.secret_access_key},
                store.StoreOptions(
                    endpoint=s3.endpoint,
                    region=s3_server.REGION,
                    access_key_id=s3.access_key_id,
                    secret_access_key=s3.secret_access_key,
                ),
                server_pid=s3.process.pid,
                request_log=s3.log_path,
            )
        finally:
            s3_server.stop(s3)
        return
    if kind != "azure":
        raise ValueError(f"no object store {kind!r}; expected one of {', '.join(LEDGERS)}")
    azure = azurite_server.start(base / "azurite", container="rmq-spark-demo")
    try:
        uri = f"az://{azure.container}/ledger"
        yield DemoStore(
            uri,
            {
                "path": uri,
                "storage_options": {
                    "endpoint": azure.endpoint,
                    "account_name": azure.account,
                    "account_key_env": AZURE_KEY_ENV,
                },
            },
            {AZURE_KEY_ENV: azure.account_key},
            store.StoreOptions(
                endpoint=azure.endpoint, account_name=azure.account, account_key=azure.account_key
            ),
        )
    finally:
        azurite_server.stop(azure)
