"""The ledger on Azure Blob Storage (az://, abfss://) with no directory shared by anyone.

Against Azurite, Microsoft's emulator, which the harness starts with an account of its
own and a random shared key (`devtools.azurite_server`): the ledger's own steps through
the commit on an `abfss://` path, the whole job through spark-submit on an `az://` path,
and the refusals of a missing container and of a wrong key before anything moves.
"""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path

import pytest

from rmq_spark.devtools.azurite_server import AzuriteServer
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
    fresh_vhost,
    result_of,
    seed,
    spark_submit,
)
from tests.support.builders import delivery
from tests.support.object_store import objects_under, write_store_config

KEY = TransferKey("dr", "/", "orders", "main", "/", "orders")
KEY_ENV = "TEST_LEDGER_AZURE_KEY"


@pytest.fixture
def azure_key(azurite: AzuriteServer, monkeypatch: pytest.MonkeyPatch) -> AzuriteServer:
    """The account's key in the variable the test configs name."""
    monkeypatch.setenv(KEY_ENV, azurite.account_key)
    return azurite


def abfss(server: AzuriteServer, container: str, prefix: str) -> str:
    return f"abfss://{container}@{server.account}.dfs.core.windows.net/{prefix}"


def options(server: AzuriteServer, key: str) -> store.StoreOptions:
    return store.StoreOptions(
        endpoint=server.endpoint, account_name=server.account, account_key=key
    )


def ledger_block(server: AzuriteServer, path: str) -> dict[str, object]:
    return {
        "path": path,
        "storage_options": {
            "endpoint": server.endpoint,
            "account_name": server.account,
            "account_key_env": KEY_ENV,
        },
    }


def test_rows_and_intents_are_blobs_and_the_commit_reads_them_back(
    azurite: AzuriteServer,
) -> None:
    uri = abfss(azurite, azurite.container, f"steps-{secrets.token_hex(4)}")
    store.configure(uri, options(azurite, azurite.account_key))
    tables.ensure_tables(uri)
    writer = MessageLedgerWriter(uri, "r1", KEY, "0.0.0")
    writer.write([delivery(p) for p in range(3)])
    writer.write([delivery(p) for p in range(3, 5)])
    writer.close()
    # A task that died after logging intents for 5..6 and writing no row for them.
    IntentLog(uri, "r1", KEY, "0.1.0").append([delivery(p, confirmed=False) for p in (5, 6)])

    staged = objects_under(uri)
    assert len([o for o in staged if o.startswith("messages/run_id=r1/part-")]) == 2
    assert len([o for o in staged if o.startswith("intents/run_id=r1/")]) == 1
    assert EarlierFiles(uri, "r1").next_position(KEY) == 7

    committed = tables.commit_run(uri, "r1")
    again = tables.commit_run(uri, "r1")

    rows = tables.read_arrow(uri, "messages", run_id="r1").to_pylist()
    assert (committed, again) == (7, 0)
    assert sorted(row["position"] for row in rows) == list(range(7))
    assert sorted(row["position"] for row in rows if row["confirmed_at"] is None) == [5, 6]
    data = [o for o in objects_under(uri) if o.startswith("messages/run_id=r1/")]
    assert [o.split("/")[-1].split("-")[0] for o in data] == ["compacted"]


def test_a_wrong_key_is_refused_naming_the_account_and_container(
    azurite: AzuriteServer,
) -> None:
    uri = abfss(azurite, azurite.container, f"wrong-{secrets.token_hex(4)}")
    wrong = "A" * 20 + azurite.account_key[20:]
    store.configure(uri, options(azurite, wrong))
    with pytest.raises(LedgerError) as caught:
        tables.ensure_tables(uri)
    message = str(caught.value)
    assert f"ledger.path {uri}" in message
    assert f"account {azurite.account}, container {azurite.container}" in message
    assert azurite.endpoint in message
    assert wrong not in message


def test_the_job_moves_verifies_and_reports_with_the_ledger_on_azure(
    brokers: Brokers, password_env: str, azure_key: AzuriteServer, tmp_path: Path
) -> None:
    vhost = fresh_vhost(brokers, "azure-ledger")
    seed(brokers.dr, vhost, "orders", 300)
    seed(brokers.dr, vhost, "billing", 200)
    uri = f"az://{azure_key.container}/job-{secrets.token_hex(4)}"
    config = write_store_config(tmp_path, brokers, vhost, ledger_block(azure_key, uri))

    completed = spark_submit(config, "az-1")

    assert completed.returncode == 0, completed.stderr[-5000:]
    result = result_of(completed.stdout)
    assert (result["queues"], result["messages"], result["verified"]) == (2, 500, True)
    assert (depth(brokers.dr, vhost, "orders"), depth(brokers.main, vhost, "orders")) == (0, 300)
    assert depth(brokers.main, vhost, "billing") == 200
    # Every table, the verification and the report are blobs, read from there.
    store.configure(uri, options(azure_key, azure_key.account_key))
    assert tables.read_arrow(uri, "messages", run_id="az-1").num_rows == 500
    assert tables.read_rows(uri, "runs", "az-1")[0]["verified"] is True
    on_store = objects_under(uri)
    verification = StorePath(uri) / "verification/run_id=az-1/verification.json"
    assert json.loads(verification.read_bytes())["run_id"] == "az-1"
    report = StorePath(uri) / "reports/run_id=az-1/report.html"
    assert result["report"] == str(report)
    assert "az-1" in report.read_text()
    assert not [o for o in on_store if o.startswith(("intents/", "_preflight/"))]
    assert azure_key.account_key not in completed.stdout + completed.stderr


# (container or None for the server's, whether the key is wrong, what the error says)
REFUSALS = {
    "missing-container": ("rmq-spark-no-such-container", False, "ContainerNotFound"),
    "wrong-key": (None, True, "AuthorizationFailure|403"),
}


@pytest.mark.usefixtures("password_env")
@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_the_job_refuses_an_unusable_container_before_moving(
    brokers: Brokers,
    azure_key: AzuriteServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
) -> None:
    container, wrong_key, expected = REFUSALS[case]
    vhost = fresh_vhost(brokers, "azure-refused")
    seed(brokers.dr, vhost, "orders", 20)
    declare(brokers.main, vhost, "orders")
    uri = f"az://{container or azure_key.container}/refused-{secrets.token_hex(4)}"
    wrong = "B" * 20 + azure_key.account_key[20:]
    if wrong_key:
        monkeypatch.setenv(KEY_ENV, wrong)
    config = write_store_config(tmp_path, brokers, vhost, ledger_block(azure_key, uri))

    completed = spark_submit(config, "az-refused")

    output = completed.stdout + completed.stderr
    assert completed.returncode == 2, output[-5000:]
    assert f"ledger.path {uri}" in output
    assert azure_key.endpoint in output
    assert re.search(expected, output), output[-3000:]
    assert (depth(brokers.dr, vhost, "orders"), depth(brokers.main, vhost, "orders")) == (20, 0)
    assert azure_key.account_key not in output
    assert wrong not in output
