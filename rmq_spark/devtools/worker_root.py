"""A Debian root for a stand-in Spark worker: Java 17 and no Python at all.

The standalone-cluster test runs its workers under ``chroot`` in this root, so they see
what a YARN node would: neither the builder's interpreter (a pyenv install under
root's home), nor the checkout, nor any Python 3.11. Only the executor archive gives
them a Python. ``mmdebstrap --variant=apt --include=openjdk-17-jre-headless bookworm``
from the host's own mirror, cached beside the RabbitMQ roots
(``~/.cache/rmq-spark/roots/spark-worker``), built in a temporary sibling and renamed
into place when complete; ~1 min and ~400 MB, once per machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from rmq_spark.devtools.rabbitmq_roots import (
    BUILD_TIMEOUT_SECONDS,
    RabbitMQRootError,
    _build_lock,
    _remove_stale,
    host_mirror,
    refresh_hosts,
    roots_dir,
)

NAME = "spark-worker"
SUITE = "bookworm"
PACKAGES = ("openjdk-17-jre-headless",)
JAVA_HOME = "/usr/lib/jvm/java-17-openjdk-amd64"
#: Where the test binds the pyspark package (Spark's jars and bin/) inside the root.
SPARK_HOME = "/opt/spark"
INFO_FILE = "rmq-spark-root.json"
#: Where a Python would be; the build fails if the root has one.
PYTHON_GLOBS = ("usr/bin/python*", "usr/local/bin/python*", "bin/python*")


def pythons_in(fs_root: Path) -> list[Path]:
    """Every python* executable name in the root's usual bin directories."""
    return sorted(path for pattern in PYTHON_GLOBS for path in fs_root.glob(pattern))


def ensure_worker_root(cache_dir: Path | None = None) -> Path:
    """The cached worker root, built first when missing (idempotent, locked)."""
    parent = (cache_dir or roots_dir()).absolute()
    target = parent / NAME
    if (target / INFO_FILE).is_file():
        return target
    parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(parent, NAME):
        if (target / INFO_FILE).is_file():
            return target
        for stale in [*parent.glob(f".{NAME}.build-*"), target]:
            if stale.exists():
                _remove_stale(stale)
        work = Path(tempfile.mkdtemp(prefix=f".{NAME}.build-", dir=parent))
        try:
            _build(work / "root", host_mirror())
            os.rename(work / "root", target)
        finally:
            _remove_stale(work)
    return target


def _build(fs_root: Path, mirror: str) -> None:
    mmdebstrap = shutil.which("mmdebstrap")
    if mmdebstrap is None:
        raise RabbitMQRootError("the Spark worker root needs mmdebstrap (make setup installs it)")
    t0 = time.monotonic()
    cmd = [mmdebstrap, "--variant=apt", f"--include={','.join(PACKAGES)}", "--quiet"]
    cmd += [SUITE, str(fs_root), f"deb {mirror} {SUITE} main"]
    res = subprocess.run(
        cmd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_SECONDS,
        check=False,
    )
    if res.returncode != 0:
        tail = "\n  ".join((res.stderr or res.stdout).strip().splitlines()[-15:])
        raise RabbitMQRootError(
            f"building the Spark worker root: mmdebstrap exited {res.returncode}:\n  {tail}"
        )
    found = pythons_in(fs_root)
    if found:
        raise RabbitMQRootError(f"the Spark worker root must have no Python, but has {found}")
    if not (fs_root / JAVA_HOME.lstrip("/") / "bin" / "java").exists():
        raise RabbitMQRootError(f"the Spark worker root has no Java at {JAVA_HOME}")
    fs_root.chmod(0o755)
    refresh_hosts(fs_root)
    (fs_root / SPARK_HOME.lstrip("/")).mkdir(parents=True, exist_ok=True)
    info = {"suite": SUITE, "packages": PACKAGES, "build_seconds": round(time.monotonic() - t0, 1)}
    (fs_root / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    print(ensure_worker_root())
