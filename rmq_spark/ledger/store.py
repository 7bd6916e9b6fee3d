"""Where the ledger's files live: a directory every node mounts, or an object store.

A ledger path is either a local path (a POSIX directory the driver and every executor
see) or a URI: `s3://bucket/prefix` (AWS S3 or an S3-compatible server), or Azure Blob
Storage/ADLS Gen2 as `az://container/prefix` or
`abfss://container@account.dfs.core.windows.net/prefix`. For a URI the ledger code works
on `StorePath`s: the few pathlib operations it uses (join, name, list one directory by
pattern, read, write whole, remove, size) over pyarrow's S3 or Azure file system, which
executors already import (pyarrow's wheels are built with both). On an object store
there is no append and no fsync: a file is written whole by one PUT (through obstore,
`StorePath.write_bytes`; a multipart upload completed last past 5 MB), and the PUT
having returned is the durability point; there is no rename either, and none is
needed, since an object is complete or absent.

Credentials: the platform's provider chain (environment, instance or workload
identity) unless `ledger.storage_options` names them; secrets there are read from
environment variables the config names (`config.LedgerConfig`), never from the file,
and no `repr` or log line shows them. The driver registers a ledger's options once
(`configure`); executor tasks register the same from their settings before touching
the ledger.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlsplit

import obstore
import pyarrow as pa
import pyarrow.parquet as pq
from obstore.store import AzureStore, S3Store
from pyarrow import fs as pafs

from rmq_spark.config import LedgerConfig
from rmq_spark.config.ledger import AZURE_STORES, LEDGER_OBJECT_STORES, LEDGER_SECRETS

if TYPE_CHECKING:
    from obstore.store import RetryConfig  # in obstore's stubs only

log = logging.getLogger(__name__)

# The schemes and secret option names are the config's (`config/ledger.py`): one list.
OBJECT_STORE_SCHEMES = LEDGER_OBJECT_STORES
# Option names of `ledger.storage_options` (values) and their secret counterparts
# (`*_env`: the variable holding the value).
PLAIN_OPTIONS = ("endpoint", "region", "account_name")
SECRET_OPTIONS = LEDGER_SECRETS
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+)://")


def scheme_of(path: str) -> str | None:
    match = _SCHEME.match(path)
    return match.group(1).lower() if match else None


def is_object_store(path: str) -> bool:
    return scheme_of(path) in OBJECT_STORE_SCHEMES


@dataclass(frozen=True)
class StoreOptions:
    """Resolved options of one object-store ledger (secrets included: never logged)."""

    endpoint: str | None = None
    region: str | None = None
    account_name: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    account_key: str | None = None

    def __repr__(self) -> str:  # the secrets stay out of logs and tracebacks
        account = f", account_name={self.account_name!r}" if self.account_name else ""
        return (
            f"StoreOptions(endpoint={self.endpoint!r}, region={self.region!r}{account}, "
            "secrets=***)"
        )

    @classmethod
    def of(cls, values: Mapping[str, str | None]) -> StoreOptions:
        return cls(**{key: values.get(key) for key in (*PLAIN_OPTIONS, *SECRET_OPTIONS)})

    def filesystem(self, scheme: str = "s3") -> pafs.FileSystem:
        """pyarrow's file system for this store (`scheme`: s3, az or abfss)."""
        if scheme in AZURE_STORES:
            return self._azure_filesystem()
        kwargs: dict[str, Any] = {}
        if self.endpoint:
            parts = urlsplit(self.endpoint)
            kwargs["endpoint_override"] = parts.netloc or self.endpoint
            kwargs["scheme"] = parts.scheme or "https"
        if self.region:
            kwargs["region"] = self.region
        if self.access_key_id:
            kwargs.update(access_key=self.access_key_id, secret_key=self.secret_access_key)
            if self.session_token:
                kwargs["session_token"] = self.session_token
        # No retries beyond the default: a failed PUT fails the flush (and so the ack).
        # allow_delayed_open: an object smaller than a part is one PutObject when the
        # stream closes (apache/arrow#40557); without it every write, however small, was
        # a three-request multipart upload (create, part, complete), three round trips
        # on the path an ack waits on. Durable when `close` returns, as before.
        return pafs.S3FileSystem(allow_delayed_open=True, **kwargs)

    def _azure_filesystem(self) -> pafs.FileSystem:
        kwargs: dict[str, Any] = {"account_name": self.account_name}
        if self.endpoint:
            kwargs.update(azure_authorities(self.endpoint, self.account_name or ""))
        if self.account_key:
            kwargs["account_key"] = self.account_key
        # Without a key, pyarrow's default Azure credential chain.
        return pafs.AzureFileSystem(**kwargs)

    def delta(self, scheme: str = "s3") -> dict[str, str]:
        """delta-rs' storage options (object_store's AWS or Azure keys)."""
        if scheme in AZURE_STORES:
            return self._azure_delta()
        options: dict[str, str] = {}
        if self.endpoint:
            options["AWS_ENDPOINT_URL"] = self.endpoint
            if self.endpoint.startswith("http://"):
                options["AWS_ALLOW_HTTP"] = "true"
        if self.region:
            options["AWS_REGION"] = self.region
        if self.access_key_id:
            options["AWS_ACCESS_KEY_ID"] = self.access_key_id
            options["AWS_SECRET_ACCESS_KEY"] = self.secret_access_key or ""
            if self.session_token:
                options["AWS_SESSION_TOKEN"] = self.session_token
        return options

    def _azure_delta(self) -> dict[str, str]:
        options = {"azure_storage_account_name": self.account_name or ""}
        if self.endpoint:
            options["azure_storage_endpoint"] = self.endpoint.rstrip("/")
            if self.endpoint.startswith("http://"):
                options["azure_allow_http"] = "true"
        if self.account_key:
            options["azure_storage_account_key"] = self.account_key
        return options


def azure_authorities(endpoint: str, account: str) -> dict[str, str]:
    """pyarrow's blob/dfs authorities and scheme for an Azure endpoint: path style
    (`http://host:port/ACCOUNT`, an emulator) or `https://ACCOUNT.blob.<suffix>`."""
    parts = urlsplit(endpoint)
    if parts.path.strip("/"):
        blob = dfs = parts.netloc  # path style: pyarrow appends /ACCOUNT itself
    elif parts.netloc.startswith(f"{account}."):
        blob = parts.netloc[len(account) :]  # ".blob.core.windows.net": a host suffix
        dfs = blob.replace(".blob.", ".dfs.", 1)
    else:
        raise ValueError(
            f"ledger.storage_options.endpoint {endpoint!r}: expected "
            f"http(s)://host[:port]/{account} (an emulator) or https://{account}.blob.<domain>"
        )
    return {
        "blob_storage_authority": blob,
        "dfs_storage_authority": dfs,
        "blob_storage_scheme": parts.scheme,
        "dfs_storage_scheme": parts.scheme,
    }


_OPTIONS: dict[str, StoreOptions] = {}
_FILESYSTEMS: dict[str, pafs.FileSystem] = {}


def bucket_key(uri: str) -> str:
    """`scheme://bucket` (or the container's authority): options and clients are per bucket."""
    parts = urlsplit(uri)
    return f"{parts.scheme.lower()}://{parts.netloc}"


def configure(uri: str, options: StoreOptions) -> None:
    """Register the options of the ledger at `uri` (for its whole bucket) in this process."""
    key = bucket_key(uri)
    if _OPTIONS.get(key) != options:
        _OPTIONS[key] = options
        _FILESYSTEMS.pop(key, None)


def options_of(uri: str) -> StoreOptions:
    return _OPTIONS.get(bucket_key(uri), StoreOptions())


def filesystem_of(uri: str) -> pafs.FileSystem:
    key = bucket_key(uri)
    found = _FILESYSTEMS.get(key)
    if found is None:
        found = _FILESYSTEMS[key] = options_of(uri).filesystem(scheme_of(uri) or "s3")
    return found


def delta_options(uri: str) -> dict[str, str]:
    return options_of(uri).delta(scheme_of(uri) or "s3")


# obstore (the Rust object_store crate delta-rs commits through) makes the requests
# pyarrow's file systems make worse: a PUT in one round trip (pyarrow's AWS SDK sends
# `Expect: 100-continue` and waits a round trip for the answer before the body) and
# removals in bulk (`removal`). Its retries are bounded like pyarrow's (three tries),
# so an unreachable store fails pre-flight in seconds, not object_store's 3 minutes.
OBSTORE_RETRIES: RetryConfig = {"max_retries": 2, "retry_timeout": timedelta(seconds=20)}
_OBSTORES: dict[tuple[str, StoreOptions], Any] = {}
# Buckets (with their options) where obstore failed in this process: pyarrow from then
# on. Its credential chain is not pyarrow's (it reads no ~/.aws profiles, for one), and
# pyarrow reached these ledgers before obstore was used.
_OBSTORE_FAILED: set[tuple[str, StoreOptions]] = set()


def obstore_of(uri: str) -> Any | None:
    """obstore's store for the bucket or container of `uri`, with the ledger's options
    (delta-rs' keys, which obstore takes); None once obstore failed there."""
    options = options_of(uri)
    cached = (bucket_key(uri), options)
    if cached in _OBSTORE_FAILED:
        return None
    found = _OBSTORES.get(cached)
    if found is None:
        scheme = scheme_of(uri) or "s3"
        container = fs_path_of(uri).partition("/")[0]
        # delta-rs' keys (AWS_ENDPOINT_URL, azure_storage_account_key, ...): obstore
        # takes object_store's aliases at run time, not in its TypedDicts.
        config: Any = options.delta(scheme)
        make = AzureStore if scheme in AZURE_STORES else S3Store
        found = _OBSTORES[cached] = make(container, config=config, retry_config=OBSTORE_RETRIES)
    return found


def obstore_failed(uri: str, doing: str, error: Exception) -> None:
    """Use pyarrow for this bucket from now on in this process, and say so once."""
    cached = (bucket_key(uri), options_of(uri))
    if cached not in _OBSTORE_FAILED:
        _OBSTORE_FAILED.add(cached)
        log.warning(
            "ledger: %s through obstore failed on %s (%s); pyarrow's file system serves "
            "this store from now on",
            doing,
            bucket_key(uri),
            type(error).__name__,
        )


def object_key(uri: str) -> str:
    """The key of `uri` in its bucket or container (obstore's path)."""
    return fs_path_of(uri).partition("/")[2]


def fs_path_of(uri: str) -> str:
    """A URI's path on pyarrow's file system: `bucket/key`, or `container/key` for
    `abfss://container@account.dfs.core.windows.net/key` and `az://container/key`."""
    parts = urlsplit(uri)
    if parts.scheme.lower() == "abfss" and parts.username:
        return f"{parts.username}{parts.path}"
    return f"{parts.netloc}{parts.path}"


class FileStat(NamedTuple):
    st_size: int
    st_mtime: float


class StorePath:
    """A file or "directory" (key prefix) of an object-store ledger: the pathlib subset
    the ledger code uses. Directories exist as long as an object is under them."""

    def __init__(self, uri: str) -> None:
        self.uri = uri.rstrip("/")
        self.fs_path = fs_path_of(self.uri)  # bucket/key, as pyarrow names it

    @property
    def fs(self) -> pafs.FileSystem:
        return filesystem_of(self.uri)

    def __truediv__(self, name: str) -> StorePath:
        return StorePath(f"{self.uri}/{name}")

    def __str__(self) -> str:
        return self.uri

    def __repr__(self) -> str:
        return f"StorePath({self.uri!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StorePath) and other.uri == self.uri

    def __hash__(self) -> int:
        return hash(self.uri)

    def __lt__(self, other: StorePath) -> bool:
        return self.uri < other.uri

    @property
    def name(self) -> str:
        return self.uri.rsplit("/", 1)[-1]

    @property
    def parent(self) -> StorePath:
        return StorePath(self.uri.rsplit("/", 1)[0])

    def _info(self) -> pafs.FileInfo:
        return self.fs.get_file_info(self.fs_path)

    def is_dir(self) -> bool:
        return bool(self._info().type == pafs.FileType.Directory)

    def is_file(self) -> bool:
        return bool(self._info().type == pafs.FileType.File)

    def exists(self) -> bool:
        return bool(self._info().type != pafs.FileType.NotFound)

    def iterdir(self) -> Iterator[StorePath]:
        selector = pafs.FileSelector(self.fs_path, allow_not_found=True)
        for info in self.fs.get_file_info(selector):
            yield self / info.base_name

    def glob(self, pattern: str) -> Iterator[StorePath]:
        """The entries of this directory whose name matches `pattern` (no recursion)."""
        return (path for path in self.iterdir() if fnmatch.fnmatchcase(path.name, pattern))

    def mkdir(self, *, parents: bool = False, exist_ok: bool = False) -> None:
        """Nothing to do: a key prefix exists once an object is under it."""

    def unlink(self, *, missing_ok: bool = False) -> None:
        try:
            self.fs.delete_file(self.fs_path)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def stat(self) -> FileStat:
        info = self._info()
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(self.uri)
        mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
        return FileStat(int(info.size or 0), mtime)

    def read_bytes(self) -> bytes:
        """The whole object in one GET through obstore (pyarrow's input stream asks for
        its size first, a second round trip); through pyarrow if obstore fails. A
        missing object is FileNotFoundError either way."""
        client = obstore_of(self.uri)
        if client is not None:
            try:
                return bytes(obstore.get(client, object_key(self.uri)).bytes())
            except FileNotFoundError:
                raise
            except Exception as exc:  # pyarrow's chain may still reach it, or say why not
                obstore_failed(self.uri, "a read", exc)
        with self.fs.open_input_stream(self.fs_path) as source:
            return bytes(source.read())

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def write_bytes(self, content: bytes) -> None:
        """One PUT: the object is complete and durable when this returns, or absent.

        Through obstore (one round trip; a multipart upload, completed last, past 5 MB);
        if obstore fails, through pyarrow, whose error is the one raised (`obstore_of`).
        """
        client = obstore_of(self.uri)
        if client is not None:
            try:
                obstore.put(client, object_key(self.uri), content)
                return
            except Exception as exc:  # pyarrow's chain may still reach it, or say why not
                obstore_failed(self.uri, "a write", exc)
        with self.fs.open_output_stream(self.fs_path) as sink:
            sink.write(content)


def root(ledger_path: str) -> Any:
    """The ledger's root as a pathlib.Path (local) or a StorePath (object store): both
    have the operations the ledger code uses, so it is typed Any where either goes."""
    return StorePath(ledger_path) if is_object_store(ledger_path) else Path(ledger_path)


def arrow_source(path: Any) -> tuple[str, pafs.FileSystem | None]:
    """(path, filesystem) for pyarrow's readers: a StorePath's bucket/key and file system."""
    if isinstance(path, StorePath):
        return path.fs_path, path.fs
    return str(path), None


def entries(directory: Any) -> list[Any]:
    """A directory's entries (none if it is missing): one listing, local or object store."""
    if isinstance(directory, StorePath):
        return list(directory.iterdir())
    if not directory.is_dir():
        return []
    with os.scandir(directory) as found:
        return [Path(entry.path) for entry in found]


def sized_entries(directory: Any) -> list[tuple[Any, int]]:
    """A directory's files with their sizes (none if it is missing), from one listing:
    no request per file on an object store."""
    if isinstance(directory, StorePath):
        selector = pafs.FileSelector(directory.fs_path, allow_not_found=True)
        return [
            (directory / info.base_name, int(info.size or 0))
            for info in directory.fs.get_file_info(selector)
            if info.type == pafs.FileType.File
        ]
    if not directory.is_dir():
        return []
    with os.scandir(directory) as found:
        return [(Path(entry.path), entry.stat().st_size) for entry in found if entry.is_file()]


def read_parquet(path: Any, **options: Any) -> pa.Table:
    """A local or object-store Parquet file (pq.read_table's options)."""
    where, filesystem = arrow_source(path)
    return pq.read_table(where, filesystem=filesystem, **options)


def sized_dataset(files: Sequence[tuple[Any, int]], schema: pa.Schema) -> Any:
    """A Parquet dataset of these local or object-store files (all on one store), each
    with its size as listed: pyarrow then reads each file's footer and rows without
    asking its size first, a request a file on an object store."""
    import pyarrow.dataset as ds

    parquet = ds.ParquetFileFormat()
    filesystem: pafs.FileSystem = pafs.LocalFileSystem()
    if files and isinstance(files[0][0], StorePath):
        filesystem = files[0][0].fs
    fragments = [
        parquet.make_fragment(arrow_source(path)[0], filesystem=filesystem, file_size=size)
        for path, size in files
    ]
    return ds.FileSystemDataset(fragments, schema, parquet, filesystem)


def read_metadata(path: Any) -> pq.FileMetaData:
    where, filesystem = arrow_source(path)
    return pq.read_metadata(where, filesystem=filesystem)


def describe_store(uri: str) -> str:
    """The store and its endpoint, for errors (never a credential)."""
    options = options_of(uri)
    endpoint = options.endpoint or "the provider's default endpoint"
    keyed = options.access_key_id or options.account_key
    credentials = "keys from ledger.storage_options" if keyed else "default chain"
    scheme = scheme_of(uri)
    if scheme in AZURE_STORES:
        container = fs_path_of(uri).split("/", 1)[0]
        return (
            f"{scheme} at {endpoint}, account {options.account_name}, "
            f"container {container}, {credentials}"
        )
    return f"{scheme} at {endpoint}, bucket {urlsplit(uri).netloc}, {credentials}"


def use_ledger(ledger: LedgerConfig) -> str:
    """Register the config's object-store options in this process (nothing for a local
    ledger); the path every node uses: the URI, or the local path made absolute."""
    if not is_object_store(ledger.path):
        return str(Path(ledger.path).resolve())
    configure(ledger.path, StoreOptions.of(ledger.store_values()))
    return ledger.path
