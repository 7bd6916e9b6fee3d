"""Pre-flight on the executors: their Python has the dependencies, and they share the
driver's ledger directory.

Checked on the driver alone, a ledger path that is local to each executor (a path
that exists on every host, but is not one shared mount) would let movers ack source
messages with their ledger rows on disks the driver never reads. So before anything
moves, Spark runs small probe tasks: each writes a sentinel file under the ledger path
and reports what it wrote; the driver then reads every sentinel back.

The probe runs in the executors' Python before any dependency is known to be there,
so this module imports the standard library only (the package's `__init__` too):
an executor without pika still answers, and the driver can say what is missing. The
probe runs as the movers do (`partition_tasks.run_tasks`): on classic Spark an RDD
task, which a bare Python answers; over Spark Connect a `DataFrame.mapInArrow` task,
whose worker needs pyarrow before it runs any code of ours: a server without it fails
the probe with Spark's ModuleNotFoundError, which `check_executors` turns into the
same clear error.

Spark places tasks, not this module: `probe_tasks` asks for at least one task per
core the cluster offers and per registered executor, so every executor running when
the job starts gets one in practice, but Spark does not promise it. An executor that
joins later (dynamic allocation) is not probed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import socket
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rmq_spark.compat import installed_version, pika_problem
from rmq_spark.errors import (
    ExecutorEnvironmentError,
    LedgerNotSharedError,
    PreflightError,
    RmqSparkError,
)
from rmq_spark.partition_tasks import default_parallelism, is_connect, missing_arrow, run_tasks
from rmq_spark.planning.python_start import python_start_error

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# What executor tasks import (executor.py, mover.py, ledger/writer.py) beyond pyspark:
# requirements-executor.lock's top level (deltalake commits on the driver only).
EXECUTOR_MODULES = ("duckdb", "pika", "pyarrow", "pydantic", "requests", "sqlglot", "yaml")
SENTINEL_DIR = "_preflight"
ARCHIVE_HINT = (
    "ship the environment archive: make package, then "
    "./spark-submit.sh --env-archive dist/rmq-spark-executor-env-*.tar.gz ..."
)


@dataclass(frozen=True)
class ProbeReport:
    """What one probe task found on its executor."""

    host: str
    pid: int
    python: str
    python_version: str
    missing: tuple[str, ...]
    sentinel: str  # the file it wrote ("" when it could not write)
    token: str  # written into the sentinel; the driver expects the same back
    write_error: str = ""
    pika_version: str | None = None

    @property
    def where(self) -> str:
        return f"executor on host {self.host} (pid {self.pid}, Python {self.python})"


def probe(
    partition: Iterable[Any],
    *,
    sentinel_dir: str,
    modules: Sequence[str] = EXECUTOR_MODULES,
    store_values: dict[str, str | None] | None = None,
) -> Iterator[dict[str, object]]:
    """Runs on an executor (a Spark task): check imports, write one sentinel, report.

    Returns plain dicts: a dataclass would have to be unpickled from this module on the
    driver, which is fine, but dicts keep the wire format independent of it. With
    `store_values` (an object-store ledger's options, a plain dict so that it unpickles
    without pyarrow) the sentinel is an object, written through `ledger.store`.
    """
    index = next(iter(partition), 0)  # the partition's single element: its number
    missing = tuple(name for name in modules if importlib.util.find_spec(name) is None)
    token = secrets.token_hex(8)
    host, pid = socket.gethostname(), os.getpid()
    sentinel = os.path.join(sentinel_dir, f"{host}-{pid}-{index}-{token}.json")
    write_error = ""
    content = json.dumps({"host": host, "pid": pid, "token": token})
    try:
        if store_values is not None:
            _put_object(sentinel, content, store_values)
        else:
            os.makedirs(sentinel_dir, exist_ok=True)
            with open(sentinel, "w", encoding="utf-8") as out:
                out.write(content)
                out.flush()
                os.fsync(out.fileno())
    except (OSError, ImportError) as exc:
        write_error, sentinel = f"{type(exc).__name__}: {exc}", ""
    yield {
        "host": host,
        "pid": pid,
        "python": sys.executable,
        "python_version": ".".join(map(str, sys.version_info[:3])),
        "missing": list(missing),
        "sentinel": sentinel,
        "token": token,
        "write_error": write_error,
        "pika_version": installed_version("pika"),
    }


def _put_object(uri: str, content: str, store_values: dict[str, str | None]) -> None:
    from rmq_spark.ledger import store  # pyarrow: only for an object-store ledger

    store.configure(uri, store.StoreOptions.of(store_values))
    store.StorePath(uri).write_bytes(content.encode())


def read_object_token(uri: str) -> str | None:
    """The token in an object-store sentinel as the driver reads it, or None."""
    from rmq_spark.ledger import store

    try:
        token = json.loads(store.StorePath(uri).read_bytes()).get("token")
    except (OSError, ValueError):
        return None
    return token if isinstance(token, str) else None


def read_token(path: str) -> str | None:
    """The token in a sentinel as the driver sees it, or None if it cannot read it."""
    try:
        with open(path, encoding="utf-8") as text:
            token = json.load(text).get("token")
    except (OSError, ValueError):
        return None
    return token if isinstance(token, str) else None


def problems_of(
    reports: Sequence[ProbeReport],
    ledger_path: str,
    read: Callable[[str], str | None] = read_token,
) -> list[RmqSparkError]:
    """Pure: one error per executor whose Python lacks modules or whose sentinel the
    driver cannot read back (`read` is how the driver reads one)."""
    problems: list[RmqSparkError] = []
    seen: set[tuple[str, int]] = set()
    for report in reports:
        if (report.host, report.pid) in seen:
            continue  # several tasks on one executor: one line for it
        seen.add((report.host, report.pid))
        if report.missing:
            problems.append(
                ExecutorEnvironmentError(
                    f"{report.where} lacks the Python module(s) {', '.join(report.missing)}: "
                    f"{ARCHIVE_HINT}"
                )
            )
        elif "pika" in EXECUTOR_MODULES and (problem := pika_problem(report.pika_version)):
            problems.append(ExecutorEnvironmentError(f"{report.where}: {problem}"))
        if report.write_error:
            need = (
                "every executor must reach the object store with the ledger's storage options"
                if "://" in ledger_path
                else "the driver and every executor must see it as one shared directory"
            )
            problems.append(
                LedgerNotSharedError(
                    f"ledger.path {ledger_path}: the {report.where} cannot write under it "
                    f"({report.write_error}); {need}"
                )
            )
        elif read(report.sentinel) != report.token and "://" in ledger_path:
            problems.append(
                LedgerNotSharedError(
                    f"ledger.path {ledger_path}: the {report.where} wrote {report.sentinel}, "
                    "which the driver cannot read back; the driver and every executor must "
                    "reach the same object store with the ledger's storage options"
                )
            )
        elif read(report.sentinel) != report.token:
            problems.append(
                LedgerNotSharedError(
                    f"ledger.path {ledger_path} is not shared: the {report.where} wrote "
                    f"{report.sentinel}, which the driver does not see; the driver and every "
                    "executor must see it as one shared directory (an NFS or ReadWriteMany "
                    "mount, /dbfs or /Volumes on Databricks)"
                )
            )
    return problems


def probe_tasks(spark: SparkSession) -> int:
    """How many probe tasks: one per core offered and per executor registered."""
    executors = 1
    if not is_connect(spark):  # Spark Connect shows no executors: the cores count
        try:
            # The driver's block manager is in the map too; on local[*] it is the only one.
            status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus()  # type: ignore[union-attr]
            executors = max(1, status.size() - 1)
        except Exception:  # py4j: the call is a JVM detail; the parallelism still counts
            executors = 1
    return max(default_parallelism(spark), executors)


def probe_schema() -> Any:
    """The Arrow schema of probe()'s rows (pyarrow imported on the driver only)."""
    import pyarrow as pa

    return pa.schema(
        [
            ("host", pa.string()),
            ("pid", pa.int64()),
            ("python", pa.string()),
            ("python_version", pa.string()),
            ("missing", pa.list_(pa.string())),
            ("sentinel", pa.string()),
            ("token", pa.string()),
            ("write_error", pa.string()),
            ("pika_version", pa.string()),
        ]
    )


def check_executors(spark: SparkSession, ledger_path: str) -> None:
    """Probe the executors; raise one error listing every problem, or return.

    `ledger_path` is the absolute path every task will write under. The sentinels are
    removed again (what the driver can see of them).
    """
    on_store = "://" in ledger_path  # config accepts URIs of object stores only
    store_values = _store_values(ledger_path) if on_store else None
    sentinel_dir = os.path.join(ledger_path, SENTINEL_DIR, secrets.token_hex(8))
    tasks = probe_tasks(spark)
    task = partial(probe, sentinel_dir=sentinel_dir, store_values=store_values)
    try:
        try:
            raw = run_tasks(spark, tasks, task, probe_schema())
        except Exception as exc:  # py4j's or Spark Connect's task failure: only its text says why
            if (cannot_start := python_start_error(exc)) is not None:
                raise_problems([cannot_start], cause=exc)
            if not missing_arrow(exc):
                raise
            raise ExecutorEnvironmentError(
                "executor pre-flight refused the run; nothing was moved:\n  the executors' "
                "Python lacks the Python module(s) pyarrow (Spark Connect's Arrow tasks, which "
                f"run the movers, need it): {ARCHIVE_HINT}"
            ) from None
        reports = [
            ProbeReport(
                host=str(row["host"]),
                pid=int(row["pid"]),
                python=str(row["python"]),
                python_version=str(row["python_version"]),
                missing=tuple(row["missing"]),
                sentinel=str(row["sentinel"]),
                token=str(row["token"]),
                write_error=str(row["write_error"]),
                pika_version=row.get("pika_version"),
            )
            for row in raw
        ]
        problems = problems_of(reports, ledger_path, read_object_token if on_store else read_token)
    finally:
        if on_store:
            _remove_objects(sentinel_dir)
        else:
            shutil.rmtree(sentinel_dir, ignore_errors=True)
            parent = Path(sentinel_dir).parent
            if parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
    raise_problems(problems)


def _store_values(ledger_path: str) -> dict[str, str | None]:
    from dataclasses import asdict

    from rmq_spark.ledger import store

    return asdict(store.options_of(ledger_path))


def _remove_objects(sentinel_dir: str) -> None:
    from rmq_spark.ledger import store

    try:
        for sentinel in store.StorePath(sentinel_dir).iterdir():
            sentinel.unlink(missing_ok=True)
    except OSError:
        pass  # a store the driver cannot list: the problems say so


def raise_problems(problems: Sequence[RmqSparkError], cause: BaseException | None = None) -> None:
    if not problems:
        return
    message = "\n  ".join(
        ["executor pre-flight refused the run; nothing was moved:"]
        + [str(problem) for problem in problems]
    )
    kinds = {type(problem) for problem in problems}
    error_class = kinds.pop() if len(kinds) == 1 else PreflightError
    error = error_class(message)
    error.problems = tuple(problems)
    raise error from cause
