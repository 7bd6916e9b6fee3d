"""removal: many local files removed at once, those already gone skipped.

Objects (bulk requests, and the fall-back to pyarrow) are tested against the S3 and
Azure servers in tests/integration/test_object_store_removal.py.
"""

from __future__ import annotations

from pathlib import Path

from rmq_spark.ledger import removal


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
