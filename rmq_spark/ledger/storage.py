"""delta-rs storage options for where the ledger lives.

delta-rs commits a version to a local file system by creating the log entry under a
temporary name and hard-linking it into place, which fails if the entry exists:
that is what makes two concurrent commits safe. FUSE mounts (Databricks' /Volumes
and /dbfs, blobfuse, s3fs, gcsfuse...) do not implement hard links, so every commit
there fails ("Function not implemented", "Operation not permitted"). delta-rs'
documented option for such storage is `allow_unsafe_rename`: a plain rename, which
replaces an entry a concurrent writer made at the same moment. rmq-spark commits
from its driver only, so that needs one run at a time per ledger on such storage
(the Databricks bundle sets max_concurrent_runs: 1); docs/deploying/index.md says so.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

from deltalake import DeltaTable

from rmq_spark.ledger import store

# Databricks mounts these paths with FUSE on every node (Unity Catalog volumes, DBFS).
DATABRICKS_FUSE_ROOTS = ("/Volumes", "/dbfs")
UNSAFE_RENAME = {"allow_unsafe_rename": "true"}
_MOUNTINFO = "/proc/self/mountinfo"


def mounts(mountinfo: str = _MOUNTINFO) -> list[tuple[str, str]]:
    """(mount point, file system type) of this process's mounts; [] where unknown."""
    try:
        with open(mountinfo, encoding="utf-8") as text:
            lines = text.read().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        # "<id> <parent> <maj:min> <root> <mount point> <options> [<tags>...] - <type> ..."
        before, _, after = line.partition(" - ")
        fields = before.split()
        if len(fields) >= 5 and after:
            point = fields[4].encode().decode("unicode_escape")  # \040 is a space
            found.append((point, after.split()[0]))
    return found


def file_system_of(path: str, mounted: Iterable[tuple[str, str]]) -> str | None:
    """The type of the mount holding `path` (the longest mount point above it)."""
    target = Path(path)
    best: tuple[int, str] | None = None
    for point, kind in mounted:
        mount = Path(point)
        if (target == mount or mount in target.parents) and (
            best is None or len(mount.parts) > best[0]
        ):
            best = (len(mount.parts), kind)
    return best[1] if best else None


def needs_unsafe_rename(path: str, mounted: Iterable[tuple[str, str]]) -> bool:
    """Whether a Delta table at `path` is on storage without hard links (FUSE)."""
    absolute = os.path.abspath(path)
    if any(absolute == root or absolute.startswith(root + "/") for root in DATABRICKS_FUSE_ROOTS):
        return True
    kind = file_system_of(os.path.realpath(absolute), mounted)
    return kind is not None and (kind == "fuse" or kind.startswith(("fuse.", "fuseblk")))


def storage_options(path: str, mounted: Iterable[tuple[str, str]] | None = None) -> dict[str, str]:
    """The delta-rs storage options for a Delta table at `path` (a local path, or an
    object-store URI whose options `store.configure` registered)."""
    if store.is_object_store(path):
        return store.delta_options(path)
    chosen = needs_unsafe_rename(path, mounts() if mounted is None else mounted)
    return dict(UNSAFE_RENAME) if chosen else {}


# Object-store tables this thread opened: (path, options) -> the table (`open_table`).
_OPENED = threading.local()


def open_table(path: str) -> DeltaTable:
    """The Delta table at `path`, at its newest version, to read.

    On an object store an open reads the whole log, a round trip a request: a listing,
    the last checkpoint, every commit since; and one run's driver reads the same few
    tables a dozen times (the plan, the commit, verification, the record, the report).
    So each thread keeps the tables it opened there and brings one up to date before
    each read (`update_incremental`: a listing and only the commits after the version
    it holds). A missing table is delta-rs' TableNotFoundError, as on an open. Local
    tables are opened afresh: a read of the log there costs microseconds.
    """
    options = storage_options(path)
    if not store.is_object_store(path):
        return DeltaTable(path, storage_options=options)
    opened: dict[tuple[str, tuple[tuple[str, str], ...]], DeltaTable]
    opened = _OPENED.__dict__.setdefault("tables", {})
    key = (path, tuple(sorted(options.items())))
    table = opened.get(key)
    if table is None:
        table = opened[key] = DeltaTable(path, storage_options=options)
    else:
        table.update_incremental()
    return table


def describe(options: Mapping[str, str]) -> str:
    return ", ".join(f"{key}={value}" for key, value in sorted(options.items())) or "none"
