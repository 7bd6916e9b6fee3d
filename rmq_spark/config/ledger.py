"""Where the ledger lives: a directory every executor shares, or an object store
(`s3://`, or Azure Blob/ADLS `az://`/`abfss://`) with its options; the secrets only by
the names of the environment variables holding them, resolved at load
(`with_storage_secrets`)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from rmq_spark.config.strict import Strict
from rmq_spark.config.uris import URI_SCHEME, mask_uri
from rmq_spark.errors import ConfigError

# Object stores a ledger may be on (`rmq_spark.ledger.store`).
LEDGER_OBJECT_STORES = ("s3", "az", "abfss")
AZURE_STORES = ("az", "abfss")
# Secret storage options: only the name of the environment variable holding each.
LEDGER_SECRETS = ("access_key_id", "secret_access_key", "session_token", "account_key")
# Which options belong to which store (the others are refused, naming the store).
S3_ONLY = ("region", "access_key_id_env", "secret_access_key_env", "session_token_env")
AZURE_ONLY = ("account_name", "account_key_env")


class LedgerStorageOptions(Strict):
    """How to reach an object-store ledger; credentials by the names of the environment
    variables holding them (without any, the platform's provider chain: environment,
    instance or workload identity)."""

    endpoint: str | None = None
    """S3: an S3-compatible server, `http(s)://host[:port]`; unset: AWS S3. Azure: the
    account's blob service URL, path style for an emulator (Azurite:
    `http://127.0.0.1:10000/devstoreaccount1`); unset: `https://ACCOUNT.blob.core.windows.net`."""
    region: str | None = None
    """S3 only: the bucket's region; unset: the provider chain's."""
    account_name: str | None = None
    """Azure only: the storage account; required for `az://container/prefix`, taken from
    the host of `abfss://container@ACCOUNT.dfs.core.windows.net/prefix` (and must match it
    if given)."""
    account_key_env: str | None = None
    """Azure only: name of the environment variable holding the account's shared key;
    unset: the platform's credential chain (environment, managed or workload identity)."""
    access_key_id_env: str | None = None
    """Name of the environment variable holding the access key id (with
    `secret_access_key_env`)."""
    secret_access_key_env: str | None = None
    """Name of the environment variable holding the secret access key; the key itself
    never goes in the file."""
    session_token_env: str | None = None
    """Name of the environment variable holding a session token, for temporary
    credentials."""

    @model_validator(mode="before")
    @classmethod
    def _no_literal_secrets(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name in LEDGER_SECRETS:
                if name in data:
                    raise ValueError(
                        f"{name} must not be in the config file; put it in an environment "
                        f"variable and name that variable with {name}_env"
                    )
        return data

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, endpoint: str | None) -> str | None:
        if endpoint is None:
            return None
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected http(s)://host[:port][/path], got {mask_uri(endpoint)!r}")
        if parts.password or parts.username:
            raise ValueError(f"{mask_uri(endpoint)!r} carries credentials; use *_env keys")
        return endpoint

    @model_validator(mode="after")
    def _key_pair(self) -> LedgerStorageOptions:
        if (self.access_key_id_env is None) != (self.secret_access_key_env is None):
            raise ValueError("access_key_id_env and secret_access_key_env go together")
        return self


class LedgerConfig(Strict):
    """Where the Delta ledger tables (runs, queues, messages) live."""

    path: str
    """Where the Delta tables (runs/, queues/, messages/, plans/) live. A file system
    path the driver and every executor see (a local path for local[*], an NFS or
    ReadWriteMany volume on a cluster, /Volumes/... or /dbfs/... on Databricks), an S3
    bucket, `s3://bucket[/prefix]` (S3-compatible servers through `storage_options`), or
    an Azure Blob/ADLS container, `az://container[/prefix]` or
    `abfss://container@account.dfs.core.windows.net[/prefix]`
    (docs/OBJECT_STORE_LEDGER.md). Other URIs are refused."""
    storage_options: LedgerStorageOptions | None = None
    """How to reach an object-store ledger: endpoint, region or account, and the names of
    the environment variables holding the keys (none: the platform's provider chain).
    Refused for a directory."""
    # Resolved from storage_options' *_env at load time; excluded from dumps, digests and
    # the schema.
    storage_secrets: SkipJsonSchema[dict[str, SecretStr]] = Field(
        default_factory=dict, exclude=True
    )

    @property
    def on_object_store(self) -> bool:
        return self.store_scheme is not None

    @property
    def store_scheme(self) -> str | None:
        """`s3`, `az` or `abfss` for an object-store ledger; None for a directory."""
        scheme = URI_SCHEME.match(self.path)
        name = scheme.group(1).lower() if scheme else None
        return name if name in LEDGER_OBJECT_STORES else None

    def store_values(self) -> dict[str, str | None]:
        """The object store's options with their secrets (for `ledger.store` only)."""
        options = self.storage_options or LedgerStorageOptions()
        values: dict[str, str | None] = {
            "endpoint": options.endpoint,
            "region": options.region,
            "account_name": options.account_name or azure_account(self.path),
        }
        for name, secret in self.storage_secrets.items():
            values[name] = secret.get_secret_value()
        return values

    @model_validator(mode="after")
    def _options_need_a_store(self) -> LedgerConfig:
        if self.storage_options is not None and not self.on_object_store:
            raise ValueError(
                f"storage_options are for a ledger on an object store (s3://...); "
                f"path {self.path!r} is a directory"
            )
        if self.storage_options is not None:
            _options_fit(self.path, self.store_scheme or "", self.storage_options)
        if self.store_scheme == "az" and not (
            self.storage_options and self.storage_options.account_name
        ):
            raise ValueError(
                f"{self.path!r}: an az:// ledger needs ledger.storage_options.account_name "
                "(or write it as abfss://container@ACCOUNT.dfs.core.windows.net/prefix)"
            )
        return self

    @field_validator("path")
    @classmethod
    def _path(cls, path: str) -> str:
        if not path.strip():
            raise ValueError("must not be empty")
        scheme = URI_SCHEME.match(path)
        if scheme and scheme.group(1).lower() in LEDGER_OBJECT_STORES:
            _check_store_uri(path, scheme.group(1).lower())
            return path.rstrip("/")
        if scheme:
            # Left alone, `s3://b/x` would become a local folder named `s3:`.
            hint = {"dbfs": " (on Databricks: /dbfs/... or /Volumes/...)"}.get(
                scheme.group(1).lower(), ""
            )
            raise ValueError(
                f"{path!r} is a URI ({scheme.group(1)}:); the ledger is written with file "
                "system calls by the driver and every executor, so it must be a path of a "
                f"directory they all mount{hint}: a local path for local[*], an NFS or "
                "ReadWriteMany volume on a cluster, /Volumes/... or /dbfs/... on Databricks; "
                "of object stores, s3:// (and S3-compatible servers), az:// and abfss:// "
                "are supported (not gs:// or hdfs:// yet)"
            )
        return path


_URI_FORMS = {
    "s3": "s3://bucket[/prefix]",
    "az": "az://container[/prefix]",
    "abfss": "abfss://container@account.dfs.core.windows.net[/prefix]",
}


def _check_store_uri(path: str, scheme: str) -> None:
    parts = urlsplit(path)
    expected = f"{mask_uri(path)!r}: expected {_URI_FORMS[scheme]}, without credentials"
    if not parts.netloc or parts.password:
        raise ValueError(expected)
    if scheme == "abfss":
        if not parts.username or not parts.hostname or "." not in parts.hostname:
            raise ValueError(expected)
    elif parts.username:
        raise ValueError(expected)


def azure_account(path: str) -> str | None:
    """The account of `abfss://container@ACCOUNT.dfs.core.windows.net/...` (None else)."""
    parts = urlsplit(path)
    if parts.scheme.lower() != "abfss" or not parts.hostname:
        return None
    return parts.hostname.split(".", 1)[0]


def _options_fit(path: str, scheme: str, options: LedgerStorageOptions) -> None:
    azure = scheme in AZURE_STORES
    foreign = AZURE_ONLY if not azure else S3_ONLY
    given = [name for name in foreign if getattr(options, name) is not None]
    if given:
        raise ValueError(
            f"storage_options {', '.join(given)} are not options of a {scheme}:// ledger "
            f"(path {mask_uri(path)!r})"
        )
    account = azure_account(path)
    if azure and options.endpoint:
        parts = urlsplit(options.endpoint)
        name = options.account_name or account or ""
        if not parts.path.strip("/") and not parts.netloc.startswith(f"{name}."):
            raise ValueError(
                f"storage_options.endpoint {options.endpoint!r}: expected an account's blob "
                f"service, http(s)://host[:port]/{name} (an emulator such as Azurite) or "
                f"https://{name}.blob.<domain>"
            )
    if account and options.account_name and options.account_name != account:
        raise ValueError(
            f"storage_options.account_name {options.account_name!r} differs from the "
            f"account {account!r} in path {mask_uri(path)!r}"
        )


def with_storage_secrets(
    ledger: LedgerConfig, environ: dict[str, str], origin: str
) -> LedgerConfig:
    if ledger.storage_options is None:
        return ledger
    secrets: dict[str, SecretStr] = {}
    for name in LEDGER_SECRETS:
        variable = getattr(ledger.storage_options, f"{name}_env")
        if variable is None:
            continue
        if variable not in environ:
            raise ConfigError(
                f"config file {origin}: ledger.storage_options.{name}_env names "
                f"{variable}, which is not set in the environment"
            )
        secrets[name] = SecretStr(environ[variable])
    return ledger.model_copy(update={"storage_secrets": secrets})
