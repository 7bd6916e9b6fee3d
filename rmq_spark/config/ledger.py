"""Where the ledger lives: a directory every executor shares, or an object store
(`s3://`) with its options; the secrets only by the names of the environment variables
holding them, resolved at load (`with_storage_secrets`)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from rmq_spark.config.strict import Strict
from rmq_spark.config.uris import URI_SCHEME, mask_uri
from rmq_spark.errors import ConfigError

# Object stores a ledger may be on (`rmq_spark.ledger.store`).
LEDGER_OBJECT_STORES = ("s3",)
# Secret storage options: only the name of the environment variable holding each.
LEDGER_SECRETS = ("access_key_id", "secret_access_key", "session_token")


class LedgerStorageOptions(Strict):
    """How to reach an object-store ledger; credentials by the names of the environment
    variables holding them (without any, the platform's provider chain: environment,
    instance or workload identity)."""

    endpoint: str | None = None
    """An S3-compatible server, `http(s)://host[:port]`; unset: AWS S3."""
    region: str | None = None
    """The bucket's region; unset: the provider chain's."""
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
            raise ValueError(f"expected http(s)://host[:port], got {mask_uri(endpoint)!r}")
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
    ReadWriteMany volume on a cluster, /Volumes/... or /dbfs/... on Databricks), or an S3
    bucket, `s3://bucket[/prefix]` (S3-compatible servers through `storage_options`;
    docs/OBJECT_STORE_LEDGER.md). Other URIs are refused."""
    storage_options: LedgerStorageOptions | None = None
    """How to reach an `s3://` ledger: endpoint, region and the names of the environment
    variables holding the keys (none: the platform's provider chain). Refused for a
    directory."""
    # Resolved from storage_options' *_env at load time; excluded from dumps, digests and
    # the schema.
    storage_secrets: SkipJsonSchema[dict[str, SecretStr]] = Field(
        default_factory=dict, exclude=True
    )

    @property
    def on_object_store(self) -> bool:
        scheme = URI_SCHEME.match(self.path)
        return scheme is not None and scheme.group(1).lower() in LEDGER_OBJECT_STORES

    def store_values(self) -> dict[str, str | None]:
        """The object store's options with their secrets (for `ledger.store` only)."""
        options = self.storage_options or LedgerStorageOptions()
        values: dict[str, str | None] = {"endpoint": options.endpoint, "region": options.region}
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
        return self

    @field_validator("path")
    @classmethod
    def _path(cls, path: str) -> str:
        if not path.strip():
            raise ValueError("must not be empty")
        scheme = URI_SCHEME.match(path)
        if scheme and scheme.group(1).lower() in LEDGER_OBJECT_STORES:
            parts = urlsplit(path)
            if not parts.netloc or parts.username or parts.password:
                raise ValueError(
                    f"{mask_uri(path)!r}: expected s3://bucket[/prefix], without credentials"
                )
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
                "of object stores, only s3:// (and S3-compatible servers) is supported yet"
            )
        return path


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
