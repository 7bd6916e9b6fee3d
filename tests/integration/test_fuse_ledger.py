"""The ledger on a FUSE mount without hard links, as on Databricks' /Volumes.

A pass-through FUSE file system (tests/fuse/nolink_fs.py: link(2) fails with ENOSYS)
is mounted over a temporary directory. delta-rs' default commit fails there; the
ledger's tables, executor row files and run commit work because rmq-spark chooses
`allow_unsafe_rename` for FUSE storage. No Spark and no broker: what differs on such
storage is the file system calls, all made here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from rmq_spark.ledger import tables
from rmq_spark.ledger.storage import file_system_of, mounts
from rmq_spark.ledger.writer import MessageLedgerWriter
from rmq_spark.model import TransferKey
from tests.support.builders import delivery

REPO = Path(__file__).resolve().parents[2]
MOUNT_TIMEOUT_SECONDS = 30
KEY = TransferKey("dr", "/", "orders", "main", "/", "orders")


@pytest.fixture
def fuse_dir(tmp_path: Path) -> Iterator[Path]:
    backing, mountpoint = tmp_path / "backing", tmp_path / "mounted"
    backing.mkdir()
    mountpoint.mkdir()
    log = (tmp_path / "fuse.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.fuse.nolink_fs", str(backing), str(mountpoint)],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + MOUNT_TIMEOUT_SECONDS
        while not os.path.ismount(mountpoint):
            assert process.poll() is None, (tmp_path / "fuse.log").read_text()
            assert time.monotonic() < deadline, "the FUSE file system did not mount"
            time.sleep(0.1)
        yield mountpoint
    finally:
        unmount(mountpoint)
        process.wait(30)
        log.close()


def unmount(mountpoint: Path) -> None:
    """Unmount, waiting while the test process' last handles on the mount close (once,
    in CI, a plain unmount found it busy and the FUSE process never ended); still busy
    after MOUNT_TIMEOUT_SECONDS, detach it lazily so the FUSE process ends anyway."""
    deadline = time.monotonic() + MOUNT_TIMEOUT_SECONDS
    while os.path.ismount(mountpoint) and time.monotonic() < deadline:
        if subprocess.run(["fusermount3", "-u", str(mountpoint)], check=False).returncode:
            time.sleep(0.2)
    if os.path.ismount(mountpoint):
        subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=True)


def test_delta_rs_default_commit_fails_on_the_mount(fuse_dir: Path) -> None:
    # The premise: without the option, this storage refuses delta-rs' commit.
    assert file_system_of(str(fuse_dir), mounts()) == "fuse"
    with pytest.raises(OSError, match=r"rename|link|not permitted|not implemented"):
        write_deltalake(str(fuse_dir / "plain"), pa.table({"a": [1]}), mode="append")


def test_the_ledger_works_on_the_mount(fuse_dir: Path) -> None:
    ledger = str(fuse_dir / "ledger")

    tables.ensure_tables(ledger)
    writer = MessageLedgerWriter(ledger, "r1", KEY, "0.0.0")
    writer.write([delivery(p, body_size=10) for p in range(3)])
    writer.close()
    committed = tables.commit_run(ledger, "r1")
    again = tables.commit_run(ledger, "r1")  # idempotent on this storage too

    rows = tables.read_arrow(ledger, "messages", run_id="r1").to_pylist()
    assert (committed, again) == (3, 0)
    assert sorted(row["position"] for row in rows) == [0, 1, 2]
    assert {row["source_queue"] for row in rows} == {"orders"}
