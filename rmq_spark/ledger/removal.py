"""Removing many ledger files at once: local files on threads, objects in bulk.

The ledger removes files by the thousand: a finished transfer's spent intent objects
(`writer.IntentLog.close`) and the executor files a commit compacted
(`compaction.remove`), about two of each per queue. pyarrow's file systems remove one
object in three requests (on S3: a HEAD, the DELETE, and a PUT of the parent's
directory marker), which made removals over half of a small queue's requests on the
store (docs/OBJECT_STORE_LEDGER.md). obstore, the Rust object_store crate delta-rs
commits through, removes them in bulk: S3's DeleteObjects takes 1,000 keys a request,
Azure's blob batch 256.

obstore's store is the ledger's (`store.obstore_of`: delta-rs' options). When a bulk
removal fails for any reason but a missing object, obstore is given up for that store
in this process (`store.obstore_failed`: its credential chain is not pyarrow's) and what
is left is removed one by one through pyarrow, as before: a ledger pyarrow can write to
is still cleaned, and a removal that fails there too raises. A missing file or object
is never an error: a removal that died half way is repeated.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import obstore

from rmq_spark.ledger import store
from rmq_spark.ledger.store import StorePath, scheme_of

# Files removed at once one by one (local files, and objects when bulk removal fails):
# each is a round trip or three on an object store, and they are independent.
REMOVALS_AT_ONCE = 32
# An object removed one by one is tried this many times, RETRY_SECONDS more apart each
# time: pyarrow's Azure file system does not retry a connection closed mid-answer.
ATTEMPTS_ONE_BY_ONE = 3
RETRY_SECONDS = 0.2
# Keys per bulk request: S3's DeleteObjects takes 1,000, Azure's blob batch 256. Azure
# fails a whole batch that names a missing blob, and that batch is then removed blob by
# blob, so we hand obstore one request's worth at a time.
KEYS_PER_BULK_REMOVAL = {"s3": 1000, "az": 256, "abfss": 256}


def remove_all(paths: Sequence[Any], at_once: int = REMOVALS_AT_ONCE) -> None:
    """Remove these local files or objects; those already gone are skipped."""
    one_by_one = [path for path in paths if not isinstance(path, StorePath)]
    by_container: dict[str, list[StorePath]] = defaultdict(list)
    for path in paths:
        if isinstance(path, StorePath):
            by_container[store.bucket_key(path.uri)].append(path)
    for objects in by_container.values():
        one_by_one.extend(_remove_in_bulk(objects))
    _remove_one_by_one(one_by_one, at_once)


def _remove_in_bulk(objects: Sequence[StorePath]) -> list[StorePath]:
    """Remove these objects of one bucket or container in bulk; those left to remove
    one by one."""
    uri = objects[0].uri
    at_once = KEYS_PER_BULK_REMOVAL[scheme_of(uri) or "s3"]
    left: list[StorePath] = []
    for start in range(0, len(objects), at_once):
        client = store.obstore_of(uri)
        if client is None:
            return [*left, *objects[start:]]
        chunk = objects[start : start + at_once]
        try:
            obstore.delete(client, [store.object_key(path.uri) for path in chunk])
        except FileNotFoundError:
            # Azure fails a batch that names a missing blob (S3 does not); the rest of
            # the chunk may or may not be gone.
            left.extend(chunk)
        except Exception as exc:  # any other failure: pyarrow's chain may still reach it
            store.obstore_failed(uri, "a bulk removal", exc)
            return [*left, *objects[start:]]
    return left


def _remove_one_by_one(paths: Sequence[Any], at_once: int) -> None:
    def remove(path: Any) -> None:
        for attempt in range(1, ATTEMPTS_ONE_BY_ONE + 1):
            try:
                path.unlink()
                return
            except FileNotFoundError:
                return
            except OSError:
                # A store's connection closed mid-answer (Azure under load); removing
                # again is safe, and one object's hiccup should not fail the removal.
                if attempt == ATTEMPTS_ONE_BY_ONE or not isinstance(path, StorePath):
                    raise
                time.sleep(RETRY_SECONDS * attempt)

    if len(paths) == 1:
        remove(paths[0])
    elif paths:
        with ThreadPoolExecutor(min(at_once, len(paths))) as pool:
            list(pool.map(remove, paths))
