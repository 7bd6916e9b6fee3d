"""Executor pre-flight, Spark-free: the probe a task runs, and the driver's verdict."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pika
import pytest

from rmq_spark.config import LedgerConfig
from rmq_spark.errors import ExecutorEnvironmentError, LedgerNotSharedError, PreflightError
from rmq_spark.planning.executor_preflight import (
    ProbeReport,
    probe,
    problems_of,
    raise_problems,
    read_token,
)


def report(**changes: object) -> ProbeReport:
    fields: dict[str, object] = {
        "host": "worker-1",
        "pid": 4242,
        "python": "/usr/bin/python3",
        "python_version": "3.11.7",
        "missing": (),
        "sentinel": "/ledger/_preflight/x/worker-1-4242-0-t.json",
        "token": "t0k3n",
        "pika_version": "1.4.4",
    }
    return ProbeReport(**{**fields, **changes})  # type: ignore[arg-type]


def test_the_probe_writes_a_sentinel_the_driver_reads_back(tmp_path: Path) -> None:
    (row,) = probe(iter([3]), sentinel_dir=str(tmp_path / "s"), modules=("json", "no_such_mod"))

    assert row["missing"] == ["no_such_mod"]
    assert row["write_error"] == ""
    assert row["pika_version"] == pika.__version__
    sentinel = Path(str(row["sentinel"]))
    assert sentinel.parent == tmp_path / "s"
    assert sentinel.name.endswith(f"-3-{row['token']}.json")
    assert json.loads(sentinel.read_text())["token"] == row["token"]
    assert read_token(str(sentinel)) == row["token"]


def test_a_probe_that_cannot_write_says_why(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    (row,) = probe(iter([0]), sentinel_dir=str(blocker / "s"), modules=())

    assert row["sentinel"] == ""
    assert str(row["write_error"]).startswith(("FileExistsError", "NotADirectoryError"))


def test_the_probe_module_imports_the_standard_library_only() -> None:
    # An executor without the dependencies must still run the probe and answer.
    code = (
        "import sys; import rmq_spark.planning.executor_preflight; "
        "heavy = {'pika', 'pyarrow', 'deltalake', 'pydantic', 'pyspark', 'yaml', 'requests'}; "
        "print(sorted(heavy & set(sys.modules)))"
    )
    seen = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert seen.stdout.strip() == "[]"


def test_a_shared_directory_passes() -> None:
    assert problems_of([report(), report(pid=4343)], "/ledger", read=lambda _: "t0k3n") == []


def test_a_sentinel_the_driver_does_not_see_refuses_the_path() -> None:
    (problem,) = problems_of([report()], "/data/ledger", read=lambda _: None)

    assert isinstance(problem, LedgerNotSharedError)
    message = str(problem)
    assert "ledger.path /data/ledger is not shared" in message
    assert "executor on host worker-1 (pid 4242" in message
    assert "/ledger/_preflight/x/worker-1-4242-0-t.json" in message


def test_an_object_store_sentinel_the_driver_cannot_read_names_the_store() -> None:
    uri = "s3://bucket/ledger"
    (problem,) = problems_of([report()], uri, read=lambda _: None)

    assert isinstance(problem, LedgerNotSharedError)
    assert f"ledger.path {uri}: the executor on host worker-1" in str(problem)
    assert "cannot read back" in str(problem)
    assert "same object store" in str(problem)
    assert "NFS" not in str(problem)


def test_an_executor_that_cannot_write_to_the_store_is_told_what_it_needs() -> None:
    failed = report(write_error="OSError: AWS Error ACCESS_DENIED", sentinel="")
    (problem,) = problems_of([failed], "s3://bucket/ledger", read=lambda _: None)

    assert "cannot write under it (OSError: AWS Error ACCESS_DENIED)" in str(problem)
    assert "reach the object store with the ledger's storage options" in str(problem)


def test_another_files_token_is_not_a_shared_directory() -> None:
    # The same path on another disk can hold an older sentinel: the token tells.
    (problem,) = problems_of([report()], "/data/ledger", read=lambda _: "0ld")
    assert isinstance(problem, LedgerNotSharedError)


def test_missing_modules_name_the_executor_and_the_archive() -> None:
    reports = [report(missing=("pika", "deltalake")), report(missing=("pika", "deltalake"))]
    (problem,) = problems_of(reports, "/ledger", read=lambda _: "t0k3n")  # one per executor

    assert isinstance(problem, ExecutorEnvironmentError)
    assert "lacks the Python module(s) pika, deltalake" in str(problem)
    assert "Python /usr/bin/python3" in str(problem)
    assert "--env-archive" in str(problem)


def test_an_executors_unsupported_pika_is_named() -> None:
    (problem,) = problems_of([report(pika_version="1.3.2")], "/ledger", read=lambda _: "t0k3n")
    assert isinstance(problem, ExecutorEnvironmentError)
    assert "executor on host worker-1" in str(problem)
    assert "pika 1.3.2 is installed" in str(problem)


def test_problems_of_both_kinds_are_one_preflight_error() -> None:
    problems = problems_of(
        [report(missing=("pika",)), report(pid=1, write_error="PermissionError: denied")],
        "/ledger",
        read=lambda _: "t0k3n",
    )
    with pytest.raises(PreflightError) as raised:
        raise_problems(problems)
    assert raised.value.problems == tuple(problems)
    lines = str(raised.value).splitlines()
    assert lines[0] == "executor pre-flight refused the run; nothing was moved:"
    assert len(lines) == 3
    assert "cannot write under it (PermissionError: denied)" in lines[2]


def test_no_problem_raises_nothing() -> None:
    raise_problems([])


@pytest.mark.parametrize("path", ["dbfs:/ledger", "gs://b", "hdfs://nn/l"])
def test_a_uri_ledger_path_is_refused_with_what_is_supported(path: str) -> None:
    with pytest.raises(ValueError, match="is a URI") as raised:
        LedgerConfig(path=path)
    assert "a path of a directory they all mount" in str(raised.value)
    assert "s3:// (and S3-compatible servers), az:// and abfss://" in str(raised.value)
    if path.startswith("dbfs"):
        assert "/dbfs/..." in str(raised.value)


@pytest.mark.parametrize(
    ("path", "expected"), [("s3://bucket/ledger", "s3://bucket/ledger"), ("S3://b/", "S3://b")]
)
def test_an_s3_ledger_path_is_accepted(path: str, expected: str) -> None:
    assert LedgerConfig(path=path).path == expected
    assert LedgerConfig(path=path).on_object_store


def test_an_abfss_ledger_path_is_accepted_with_its_account() -> None:
    ledger = LedgerConfig(path="abfss://c@acct.dfs.core.windows.net/l/")
    assert (ledger.path, ledger.store_scheme) == ("abfss://c@acct.dfs.core.windows.net/l", "abfss")
    assert ledger.store_values()["account_name"] == "acct"


@pytest.mark.parametrize("path", ["s3:///no-bucket", "s3://key:secret@bucket/l"])
def test_an_s3_ledger_path_needs_a_bucket_and_no_credentials(path: str) -> None:
    with pytest.raises(ValueError, match="expected s3://bucket"):
        LedgerConfig(path=path)


@pytest.mark.parametrize("path", ["/data/ledger", "relative/ledger", "C:\\ledger", "./a:b"])
def test_file_system_paths_stay_accepted(path: str) -> None:
    assert LedgerConfig(path=path).path == path
