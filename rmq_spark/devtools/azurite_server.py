"""A local Azure Blob Storage server for an `az://`/`abfss://` ledger: Azurite.

Azurite is Microsoft's own emulator of the Blob service (npm package `azurite`), the
one Azure's SDKs, pyarrow's `AzureFileSystem` and delta-rs (object_store) test
against. It is installed once under ~/.cache/rmq-spark from the project's own
`devtools/azurite/package.json` and `package-lock.json` (`npm ci`, ~30 s), pinned to
3.35.0: the last release that runs on Debian's Node.js 20 (3.36 wants Node 21).

Each server gets an account of its own with a random shared key (`AZURITE_ACCOUNTS`),
not the emulator's published default, so a request signed with another key is
refused as on Azure, and one container. Azurite serves the Blob endpoint only (no
hierarchical namespace): pyarrow and delta-rs use Blob calls for such an account, as
they do for a storage account without ADLS Gen2.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from pyarrow import fs as pafs

from rmq_spark.devtools.ports import free_port

PACKAGE = Path(__file__).resolve().parent / "azurite"
CACHE = Path(os.environ.get("RMQ_SPARK_CACHE", Path.home() / ".cache" / "rmq-spark"))
ACCOUNT = "rmqsparkledger"
START_TIMEOUT_SECONDS = 60.0


@dataclass(frozen=True)
class AzuriteServer:
    """A running server: its blob endpoint (path style, account included), the account,
    its key and the container made for the ledger."""

    endpoint: str
    account: str
    account_key: str
    container: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def __repr__(self) -> str:
        return f"AzuriteServer(endpoint={self.endpoint!r}, container={self.container!r})"

    def filesystem(self, key: str | None = None) -> pafs.AzureFileSystem:
        """pyarrow's file system on this server (with another key if given)."""
        authority = self.endpoint.split("://", 1)[1].split("/", 1)[0]
        return pafs.AzureFileSystem(
            account_name=self.account,
            account_key=key or self.account_key,
            blob_storage_authority=authority,
            dfs_storage_authority=authority,
            blob_storage_scheme="http",
            dfs_storage_scheme="http",
        )


def installed() -> Path:
    """The Azurite install, made from the package lock when missing (`npm ci`, once)."""
    lock = (PACKAGE / "package-lock.json").read_bytes()
    digest = hashlib.sha256(lock).hexdigest()[:12]
    prefix = CACHE / f"azurite-{digest}"
    if (prefix / ".installed").exists():
        return prefix
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is needed to install Azurite (Debian: apt-get install npm)")
    shutil.rmtree(prefix, ignore_errors=True)
    prefix.mkdir(parents=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copyfile(PACKAGE / name, prefix / name)
    subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=prefix,
        check=True,
    )
    (prefix / ".installed").touch()
    return prefix


def _listens(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def start(base: Path, container: str = "rmq-spark-ledger") -> AzuriteServer:
    """Start Azurite's Blob service on a free loopback port, with an account of its own
    and `container` in it."""
    prefix = installed()
    port = free_port()
    key = base64.b64encode(secrets.token_bytes(64)).decode("ascii")
    base.mkdir(parents=True, exist_ok=True)
    log_path = base / "azurite.log"
    command = [
        str(prefix / "node_modules" / ".bin" / "azurite-blob"),
        *("--blobHost", "127.0.0.1", "--blobPort", str(port)),
        *("--location", str(base / "data"), "--disableTelemetry", "--skipApiVersionCheck"),
    ]
    env = {**os.environ, "AZURITE_ACCOUNTS": f"{ACCOUNT}:{key}"}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = AzuriteServer(
        f"http://127.0.0.1:{port}/{ACCOUNT}", ACCOUNT, key, container, process, log_path
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not _listens(port):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Azurite did not start; see {log_path}")
            time.sleep(0.1)
        server.filesystem().create_dir(container)  # a top-level directory is a container
    except BaseException:
        stop(server)
        raise
    return server


def stop(server: AzuriteServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


if __name__ == "__main__":  # `make roots`: install it ahead of the tests
    print(installed())
