"""Helpers for tests of a ledger on an object store (S3 or Azure Blob): what objects a
ledger prefix holds, and a job config whose ledger block is on the store."""

from __future__ import annotations

from pathlib import Path

import yaml
from pyarrow import fs as pafs

from rmq_spark.ledger.store import StorePath
from tests.support.brokers import Brokers, write_config


def objects_under(uri: str) -> list[str]:
    """Every object's key under the ledger URI, relative to it, sorted."""
    root = StorePath(uri)
    selector_root = root.fs_path
    infos = root.fs.get_file_info(
        pafs.FileSelector(selector_root, recursive=True, allow_not_found=True)
    )
    return sorted(
        info.path[len(selector_root) + 1 :] for info in infos if info.type == pafs.FileType.File
    )


def write_store_config(
    tmp_path: Path,
    brokers: Brokers,
    vhost: str,
    ledger: dict[str, object],
) -> Path:
    """The job config of `write_config` with `ledger` as its ledger block."""
    path = write_config(tmp_path / "job.yaml", brokers, vhosts=[vhost], ledger=tmp_path / "x")
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    config["ledger"] = ledger
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path
