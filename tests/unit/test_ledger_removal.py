"""removal: many local files removed at once, those already gone skipped.

Objects (bulk requests, and the fall-back to pyarrow) are tested against the S3 and
Azure servers in tests/integration/test_object_store_removal.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rmq_spark.ledger import removal
from rmq_spark.ledger.store import StorePath


def test_local_files_are_removed_and_missing_ones_skipped(tmp_path: Path) -> None:
    files = [tmp_path / f"batch-{n}.arrows" for n in range(40)]
    for file in files[:35]:
        file.write_bytes(b"x")  # the last five were removed by an earlier attempt
    kept = tmp_path / "not-named.arrows"
    kept.write_bytes(b"x")

    removal.remove_all(files, at_once=8)
    assert list(tmp_path.iterdir()) == [kept]
    removal.remove_all(files[:1])
    removal.remove_all([])
    assert list(tmp_path.iterdir()) == [kept]


class FlakyObject(StorePath):
    """An object whose store closes the connection on its first `failures` removals."""

    def __init__(self, failures: int) -> None:
        super().__init__("s3://bucket/ledger/messages/part-0.parquet")
        self.failures = failures
        self.calls = 0

    def unlink(self, *, missing_ok: bool = False) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise OSError("connection closed before getting the full response")


def test_an_object_removed_one_by_one_is_tried_again_after_a_store_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(removal, "RETRY_SECONDS", 0.0)
    recovers = FlakyObject(failures=removal.ATTEMPTS_ONE_BY_ONE - 1)
    removal._remove_one_by_one([recovers], at_once=4)
    assert recovers.calls == removal.ATTEMPTS_ONE_BY_ONE

    never = FlakyObject(failures=removal.ATTEMPTS_ONE_BY_ONE)
    with pytest.raises(OSError, match="connection closed"):
        removal._remove_one_by_one([never, FlakyObject(failures=0)], at_once=4)
    assert never.calls == removal.ATTEMPTS_ONE_BY_ONE


def test_a_local_file_that_cannot_be_removed_is_an_error_not_skipped(tmp_path: Path) -> None:
    directory = tmp_path / "not-a-file"
    directory.mkdir()  # a directory cannot be unlinked: no retry makes it a file
    with pytest.raises(IsADirectoryError):
        removal.remove_all([directory])
    assert directory.exists()
