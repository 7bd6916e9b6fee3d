"""Removing many ledger objects at once (`ledger/removal.py`), on the S3 server and Azurite.

The counts are read off the S3 server's own request log: behind a 20 ms round trip
each request is time on the path, and pyarrow's removal was three a file.
"""

from __future__ import annotations

import logging
import re
import secrets

import obstore
import obstore.exceptions
import pytest

from rmq_spark.devtools.azurite_server import AzuriteServer
from rmq_spark.devtools.s3_server import REGION, S3Server
from rmq_spark.ledger import removal, store
from rmq_spark.ledger.store import StorePath
from tests.support.object_store import objects_under

# A request line of the server's log, colour codes and all: method, path and query.
REQUEST_LINE = re.compile(r'"(?:\x1b\[[0-9;]*m)*([A-Z]+) (/\S*) HTTP')


def s3_prefix(server: S3Server) -> str:
    uri = f"s3://{server.bucket}/removal-{secrets.token_hex(4)}"
    store.configure(
        uri,
        store.StoreOptions(
            endpoint=server.endpoint,
            region=REGION,
            access_key_id=server.access_key_id,
            secret_access_key=server.secret_access_key,
        ),
    )
    return uri


def write_objects(prefix: StorePath, names: list[str]) -> None:
    for name in names:
        (prefix / name).write_bytes(b"spent")


def requests_since(server: S3Server, logged_before: int) -> list[tuple[str, str]]:
    text = server.log_path.read_text(encoding="utf-8", errors="replace")[logged_before:]
    found = (REQUEST_LINE.search(line) for line in text.splitlines())
    return [(line[1], line[2]) for line in found if line]


def test_objects_on_s3_are_removed_in_one_request_and_missing_ones_skipped(s3: S3Server) -> None:
    prefix = StorePath(s3_prefix(s3))
    names = [f"intents/part-{n:04d}.arrows" for n in range(40)]
    write_objects(prefix, [*names[:35], "intents/part-kept.arrows"])  # five already gone
    logged_before = len(s3.log_path.read_text(encoding="utf-8", errors="replace"))

    removal.remove_all([prefix / name for name in names])

    made = requests_since(s3, logged_before)
    assert made == [("POST", f"/{s3.bucket}?delete")], made  # no HEAD, no marker PUT
    assert objects_under(prefix.uri) == ["intents/part-kept.arrows"]


def test_a_failed_bulk_removal_falls_back_to_one_by_one_and_says_so(
    s3: S3Server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """obstore's credential chain is not pyarrow's (no ~/.aws profiles): whatever fails
    the bulk request, pyarrow removes the objects as before, and serves the store from
    then on."""
    prefix = StorePath(s3_prefix(s3))
    names = [f"rows/part-{n:04d}.parquet" for n in range(6)]
    write_objects(prefix, names)

    def refused(store: object, paths: object) -> None:
        raise obstore.exceptions.GenericError("the bulk request was refused")

    monkeypatch.setattr(obstore, "delete", refused)
    monkeypatch.setattr(store, "_OBSTORE_FAILED", set())  # this test's alone
    with caplog.at_level(logging.WARNING, logger=store.__name__):
        removal.remove_all([prefix / name for name in names])

    assert objects_under(prefix.uri) == []
    assert "a bulk removal through obstore failed" in caplog.text
    assert "GenericError" in caplog.text
    assert store.obstore_of(prefix.uri) is None  # pyarrow from now on, in this process


def test_blobs_on_azure_are_removed_in_batches_and_missing_ones_skipped(
    azurite: AzuriteServer,
) -> None:
    """More than one batch (256 a request), and a missing blob, which fails its batch on
    Azure: the batch is then removed blob by blob."""
    uri = (
        f"abfss://{azurite.container}@{azurite.account}.dfs.core.windows.net/"
        f"removal-{secrets.token_hex(4)}"
    )
    store.configure(
        uri,
        store.StoreOptions(
            endpoint=azurite.endpoint,
            account_name=azurite.account,
            account_key=azurite.account_key,
        ),
    )
    prefix = StorePath(uri)
    names = [f"messages/part-{n:04d}.parquet" for n in range(300)]
    gone = {names[3], names[280]}
    write_objects(prefix, [*(n for n in names if n not in gone), "messages/compacted-kept.parquet"])

    removal.remove_all([prefix / name for name in names])

    assert objects_under(uri) == ["messages/compacted-kept.parquet"]
