"""The ledger on an object store (s3://) with no directory shared by anyone.

Against a real S3 API server the harness starts (`devtools.s3_server`: moto, which
checks every request's signature against the one IAM key it issued). The ledger's
own steps first, without Spark or a broker: rows and intents as objects, the driver's
commit (uncertain rows from a dead task's intents, compaction, idempotency) and the
readers. Then the whole job through spark-submit on local[*] with the ledger on the
store, and the refusals before anything moves.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from rmq_spark.devtools.s3_server import REGION, S3Server
from rmq_spark.errors import LedgerError
from rmq_spark.ledger import store, tables
from rmq_spark.ledger.resume import EarlierFiles
from rmq_spark.ledger.store import StorePath
from rmq_spark.ledger.writer import IntentLog, MessageLedgerWriter
from rmq_spark.model import TransferKey
from tests.support.brokers import (
    Brokers,
    declare,
    depth,
    drain_fingerprints,
    fresh_vhost,
    result_of,
    scheduled_submit,
    seed,
    spark_submit,
    submit_as_scheduled,
)
from tests.support.builders import delivery
from tests.support.faults import expected_fingerprints
from tests.support.killed_driver import started_driver
from tests.support.notebooks import NOTEBOOK, run_notebook
from tests.support.object_store import objects_under, write_store_config
from tests.support.report_rows import run_row

KEY = TransferKey("dr", "/", "orders", "main", "/", "orders")
KEY_ENV, SECRET_ENV = "TEST_LEDGER_S3_KEY_ID", "TEST_LEDGER_S3_SECRET"


def ledger_block(server: S3Server, path: str) -> dict[str, object]:
    return {
        "path": path,
        "storage_options": {
            "endpoint": server.endpoint,
            "region": REGION,
            "access_key_id_env": KEY_ENV,
            "secret_access_key_env": SECRET_ENV,
        },
    }


@pytest.fixture
def s3_keys(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The server's key in the variables the test configs name."""
    monkeypatch.setenv(KEY_ENV, s3.access_key_id)
    monkeypatch.setenv(SECRET_ENV, s3.secret_access_key)
    return s3


@pytest.fixture
def ledger_uri(s3_keys: S3Server) -> str:
    """A fresh ledger prefix in the server's bucket, its options registered here."""
    uri = f"s3://{s3_keys.bucket}/ledger-{secrets.token_hex(4)}"
    store.configure(uri, options(s3_keys, s3_keys.secret_access_key))
    return uri


def options(server: S3Server, secret: str) -> store.StoreOptions:
    return store.StoreOptions(
        endpoint=server.endpoint,
        region=REGION,
        access_key_id=server.access_key_id,
        secret_access_key=secret,
    )


def test_rows_and_intents_are_objects_and_the_commit_reads_them_back(ledger_uri: str) -> None:
    tables.ensure_tables(ledger_uri)
    writer = MessageLedgerWriter(ledger_uri, "r1", KEY, "0.0.0")
    writer.write([delivery(p) for p in range(3)])
    writer.write([delivery(p) for p in range(3, 5)])
    writer.close()
    # A task that died after logging intents for 5..6 and writing no row for them.
    dead = IntentLog(ledger_uri, "r1", KEY, "0.1.0")
    dead.append([delivery(p, confirmed=False) for p in (5, 6)])
    finished = IntentLog(ledger_uri, "r1", KEY, "0.0.0")
    finished.append([delivery(p, confirmed=False) for p in range(5)])
    finished.close(finished=True)

    staged = objects_under(ledger_uri)
    # Each flush was one data object; the finished log's batch is gone, the dead one's stays.
    assert len([o for o in staged if o.startswith("messages/run_id=r1/part-")]) == 2
    assert len([o for o in staged if o.startswith("intents/run_id=r1/")]) == 1
    assert not [o for o in staged if o.startswith("rows/")]  # no streams on a store
    assert EarlierFiles(ledger_uri, "r1").next_position(KEY) == 7

    committed = tables.commit_run(ledger_uri, "r1")
    again = tables.commit_run(ledger_uri, "r1")

    rows = tables.read_arrow(ledger_uri, "messages", run_id="r1").to_pylist()
    assert (committed, again) == (7, 0)
    assert sorted(row["position"] for row in rows) == list(range(7))
    uncertain = sorted(row["position"] for row in rows if row["confirmed_at"] is None)
    assert uncertain == [5, 6]
    # The small executor objects were compacted into one and removed after the commit.
    data = [o for o in objects_under(ledger_uri) if o.startswith("messages/run_id=r1/")]
    assert len(data) == 1
    assert data[0].startswith("messages/run_id=r1/compacted-")
    assert EarlierFiles(ledger_uri, "r1").next_position(KEY) == 7


def test_a_table_read_again_sees_each_commit_and_reads_only_the_new_ones(
    s3_keys: S3Server, ledger_uri: str
) -> None:
    """A driver thread keeps the tables it opened on a store (`storage.open_table`) and
    catches up before each read: a read after another commit sees its rows, and asks the
    server for no commit it already read. Read off the server's own log."""
    tables.ensure_tables(ledger_uri)
    tables.append_rows(ledger_uri, "runs", [run_row(run_id="a")])
    assert [r["run_id"] for r in tables.read_arrow(ledger_uri, "runs").to_pylist()] == ["a"]
    tables.append_rows(ledger_uri, "runs", [run_row(run_id="b")])  # commits the next version
    logged_before = s3_keys.log_path.read_text(encoding="utf-8", errors="replace")

    rows = tables.read_arrow(ledger_uri, "runs").to_pylist()

    assert sorted(r["run_id"] for r in rows) == ["a", "b"]
    requests = s3_keys.log_path.read_text(encoding="utf-8", errors="replace")[len(logged_before) :]
    commits_read = re.findall(r'"GET \S*/runs/_delta_log/(\d+)\.json', requests)
    # delta-rs may GET the new commit twice; what matters is that versions 0 and 1 are
    # not read again.
    assert set(commits_read) == {"00000000000000000002"}, commits_read


def test_a_ledger_row_flush_is_one_put_request_not_a_multipart_upload(
    s3_keys: S3Server, ledger_uri: str
) -> None:
    """The ack waits on this write: one PutObject, where pyarrow's default made every
    object a create, a part and a complete (three round trips), and sent by obstore,
    where pyarrow's AWS SDK waits a round trip for `Expect: 100-continue`. Read off the
    server's own request log."""
    tables.ensure_tables(ledger_uri)
    writer = MessageLedgerWriter(ledger_uri, "r1", KEY, "0.0.0")
    logged_before = s3_keys.log_path.read_text(encoding="utf-8", errors="replace")
    writer.write([delivery(p) for p in range(3)])
    requests = s3_keys.log_path.read_text(encoding="utf-8", errors="replace")[len(logged_before) :]
    flush = [line for line in requests.splitlines() if "/messages/run_id=r1/part-" in line]
    assert len(flush) == 1, flush
    assert '"PUT ' in flush[0]
    assert "uploadId" not in flush[0]
    assert '"object_store/' in flush[0], flush  # the client, last on the server's line


def test_the_commit_reads_each_small_object_in_one_get_and_never_asks_its_size(
    s3_keys: S3Server, ledger_uri: str
) -> None:
    """Behind a 20 ms round trip each request counts: a small executor object costs
    the commit one GET of the whole object, made by obstore, and no HEAD; the compacted
    ones are removed in one bulk request. Read off the server's own log."""
    tables.ensure_tables(ledger_uri)
    keys = [TransferKey("dr", "/", f"q{n}", "main", "/", f"q{n}") for n in range(6)]
    for key in keys:
        writer = MessageLedgerWriter(ledger_uri, "r1", key, "0.0.0")
        writer.write([delivery(p) for p in range(4)])
        writer.close()
    executor_objects = {
        o for o in objects_under(ledger_uri) if o.startswith("messages/run_id=r1/part-")
    }
    assert len(executor_objects) == len(keys)
    logged_before = s3_keys.log_path.read_text(encoding="utf-8", errors="replace")

    assert tables.commit_run(ledger_uri, "r1") == 4 * len(keys)

    requests = s3_keys.log_path.read_text(encoding="utf-8", errors="replace")[len(logged_before) :]
    request_line = re.compile(r'"(?:\x1b\[[0-9;]*m)*([A-Z]+) /[^/]+/[^/]+/(\S+) HTTP.*"(\S+)"$')
    per_object: dict[str, list[tuple[str, str]]] = {name: [] for name in executor_objects}
    for line in requests.splitlines():
        found = request_line.search(line)
        if found and found.group(2) in per_object:
            per_object[found.group(2)].append((found.group(1), found.group(3).split("/")[0]))
    for name, made in per_object.items():
        assert made == [("GET", "object_store")], (name, made)
    # Removed after the commit, all in one DeleteObjects request (`ledger/removal.py`).
    assert requests.count(f"POST /{s3_keys.bucket}?delete HTTP") == 1
    assert not set(executor_objects) & set(objects_under(ledger_uri))


def test_wrong_credentials_are_refused_naming_the_store(s3_keys: S3Server) -> None:
    uri = f"s3://{s3_keys.bucket}/wrong-{secrets.token_hex(4)}"
    store.configure(uri, options(s3_keys, "not-the-secret"))
    with pytest.raises(LedgerError) as caught:
        tables.ensure_tables(uri)
    message = str(caught.value)
    assert f"ledger.path {uri}" in message
    assert s3_keys.endpoint in message
    assert "not-the-secret" not in message


def write_s3_config(
    tmp_path: Path, brokers: Brokers, vhost: str, server: S3Server, ledger: str
) -> Path:
    return write_store_config(tmp_path, brokers, vhost, ledger_block(server, ledger))


def test_the_job_moves_verifies_and_reports_with_the_ledger_on_s3(
    brokers: Brokers, password_env: str, s3_keys: S3Server, ledger_uri: str, tmp_path: Path
) -> None:
    vhost = fresh_vhost(brokers, "s3-ledger")
    seed(brokers.dr, vhost, "orders", 300)
    seed(brokers.dr, vhost, "billing", 200)
    config = write_s3_config(tmp_path, brokers, vhost, s3_keys, ledger_uri)

    completed = spark_submit(config, "s3-1")

    assert completed.returncode == 0, completed.stderr[-5000:]
    result = result_of(completed.stdout)
    assert (result["queues"], result["messages"], result["verified"]) == (2, 500, True)
    assert (depth(brokers.dr, vhost, "orders"), depth(brokers.main, vhost, "orders")) == (0, 300)
    assert depth(brokers.main, vhost, "billing") == 200
    # Every table, the verification and the report are on the store, read from there.
    messages = tables.read_arrow(ledger_uri, "messages", run_id="s3-1")
    assert messages.num_rows == 500
    assert tables.read_rows(ledger_uri, "runs", "s3-1")[0]["verified"] is True
    on_store = objects_under(ledger_uri)
    assert "verification/run_id=s3-1/verification.json" in on_store
    verification = json.loads(
        (StorePath(ledger_uri) / "verification/run_id=s3-1/verification.json").read_bytes()
    )
    assert verification["run_id"] == "s3-1"
    report = StorePath(ledger_uri) / "reports/run_id=s3-1/report.html"
    assert result["report"] == str(report)
    assert "s3-1" in report.read_text()
    # Nothing of the run was left staged: intents removed, rows committed.
    assert not [o for o in on_store if o.startswith(("intents/", "rows/", "_preflight/"))]
    # The secret never reached the output.
    assert s3_keys.secret_access_key not in completed.stdout + completed.stderr
    # The analysts' notebook reads the same objects (pyarrow, polars, DuckDB), given only
    # the job's config: its storage options and the variables holding the keys.
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    text = run_notebook(
        notebook,
        tmp_path,
        Path(sys.executable),
        {
            **os.environ,
            "RMQ_SPARK_CONFIG": str(config),
            "RMQ_SPARK_MESSAGE_ID": f"{vhost}/orders/7",
        },
    )
    assert f"ledger {ledger_uri}, run s3-1, Spark off" in text
    assert "run s3-1: 2 queues, 500 messages" in text
    assert "0 of 500 rows share their checksums" in text
    assert f"message_id '{vhost}/orders/7': 1 row(s) in 1 run(s)" in text
    assert "run s3-1 is the ledger's first run" in text


# (bucket or None for the server's, secret or None for the right one, what the error says)
REFUSALS = {
    "missing-bucket": ("rmq-spark-no-such-bucket", None, "NO_SUCH_BUCKET|does not exist"),
    "wrong-credentials": (None, "not-the-secret", "SIGNATURE_DOES_NOT_MATCH|ACCESS_DENIED"),
}


@pytest.mark.usefixtures("password_env")
@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_the_job_refuses_an_unusable_store_before_moving(
    brokers: Brokers,
    s3_keys: S3Server,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
) -> None:
    bucket, secret, expected = REFUSALS[case]
    vhost = fresh_vhost(brokers, "s3-refused")
    seed(brokers.dr, vhost, "orders", 20)
    declare(brokers.main, vhost, "orders")
    uri = f"s3://{bucket or s3_keys.bucket}/refused-{secrets.token_hex(4)}"
    if secret is not None:
        monkeypatch.setenv(SECRET_ENV, secret)
    config = write_s3_config(tmp_path, brokers, vhost, s3_keys, uri)

    completed = spark_submit(config, "s3-refused")

    output = completed.stdout + completed.stderr
    assert completed.returncode == 2, output[-5000:]
    assert f"ledger.path {uri}" in output
    assert s3_keys.endpoint in output
    assert re.search(expected, output), output[-3000:]
    assert (depth(brokers.dr, vhost, "orders"), depth(brokers.main, vhost, "orders")) == (20, 0)
    assert s3_keys.secret_access_key not in output
    if secret is not None:
        assert secret not in output


RESUME_MESSAGES, RESUME_WINDOW = 4000, 200


@pytest.mark.usefixtures("password_env")
def test_a_killed_driver_resumes_the_run_from_the_objects(
    brokers: Brokers, s3_keys: S3Server, ledger_uri: str, tmp_path: Path
) -> None:
    vhost = fresh_vhost(brokers, "s3-resume")
    seed(brokers.dr, vhost, "orders", RESUME_MESSAGES)
    declare(brokers.main, vhost, "orders")
    config = write_s3_config(tmp_path, brokers, vhost, s3_keys, ledger_uri)
    settings = yaml.safe_load(config.read_text(encoding="utf-8"))
    settings["window"] = {"messages": RESUME_WINDOW}
    config.write_text(yaml.safe_dump(settings), encoding="utf-8")
    arguments = ("--run-id", "s3-resume")

    command, environment = scheduled_submit(config, arguments, {}, tmp_path / "first")
    with started_driver(command, tmp_path / "first.log", env=environment) as first:
        first.kill_once(  # the driver dies, and its executors with it
            lambda: depth(brokers.main, vhost, "orders") >= RESUME_MESSAGES // 4,
            "a quarter of the messages to arrive",
            timeout=180,
        )
    staged = objects_under(ledger_uri)
    assert [o for o in staged if o.startswith("messages/run_id=s3-resume/part-")]

    second = submit_as_scheduled(config, arguments, {}, tmp_path / "second")
    stdout, stderr = second.communicate(timeout=600)

    assert second.returncode == 0, stdout[-4000:] + stderr[-4000:]
    result = result_of(stdout)
    assert (result["verified"], result["messages"]) == (True, RESUME_MESSAGES)
    assert (result["lost"], result["unexpected"]) == (0, 0)
    duplicates = result["duplicates"]
    assert isinstance(duplicates, int)
    assert duplicates <= RESUME_WINDOW
    found = drain_fingerprints(lambda: brokers.main.connect(vhost), "orders")
    expected = expected_fingerprints(vhost, "orders", RESUME_MESSAGES)
    assert not expected - found, "a message is missing from the destination"
    assert depth(brokers.dr, vhost, "orders") == 0
    runs = tables.read_arrow(ledger_uri, "runs").to_pylist()
    assert [run["run_id"] for run in runs] == ["s3-resume"]
