"""The job's configuration: one YAML file, validated on load.

`${VAR}` and `${VAR:-default}` in the file are replaced from the environment before
parsing, so ports and hosts can come from the deployment. Passwords never live in
the file: each cluster names the environment variable that holds its password.
Unknown keys and bad values raise one ConfigError naming the key.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from rmq_spark.errors import ConfigError

_ENV_REF = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}")
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
QUEUE_TYPES = ("classic", "quorum", "stream")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TlsConfig(_Strict):
    """TLS for AMQP and management connections (amqps:// and https:// URIs)."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    verify: bool = True


class ClusterConfig(_Strict):
    """One RabbitMQ cluster: where to reach it and who to be."""

    amqp: Annotated[list[str], Field(min_length=1)]
    management: str
    username: str = "guest"
    password_env: str | None = None
    tls: TlsConfig = TlsConfig()
    # Node name -> AMQP URI, for connecting to the node that hosts a queue; by default
    # discovered from the cluster's listeners (see rmq_spark.broker.colocation).
    nodes: dict[str, str] = {}
    # Resolved from password_env at load time; excluded from dumps and digests.
    password: SecretStr = Field(default=SecretStr(""), exclude=True)

    @field_validator("nodes")
    @classmethod
    def _node_uris(cls, nodes: dict[str, str]) -> dict[str, str]:
        cls._amqp_uris(list(nodes.values()))
        return nodes

    @field_validator("amqp")
    @classmethod
    def _amqp_uris(cls, uris: list[str]) -> list[str]:
        for uri in uris:
            parts = urlsplit(uri)
            if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
                raise ValueError(
                    f"expected amqp://host[:port][/vhost] or amqps://..., got {mask_uri(uri)!r}"
                )
            if parts.password is not None:
                raise ValueError(
                    f"{mask_uri(uri)!r} carries a password; put it in the variable named by "
                    "password_env so it stays out of config files and logs"
                )
        return uris

    @field_validator("management")
    @classmethod
    def _management_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected http(s)://host:port, got {mask_uri(url)!r}")
        if parts.password is not None:
            raise ValueError(f"{mask_uri(url)!r} carries a password; use password_env")
        return url.rstrip("/")


class SourceSelector(_Strict):
    """Which queues of the source cluster a route moves."""

    cluster: str
    # Vhost names; "*" selects every vhost the user can see.
    vhosts: Annotated[list[str], Field(min_length=1)] = ["/"]
    # Exact queue names; each must exist in every listed vhost. Instead of the patterns.
    queues: Annotated[list[str], Field(min_length=1)] | None = None
    queue_pattern: str = ".*"
    policy_pattern: str | None = None
    queue_types: list[Literal["classic", "quorum", "stream"]] = ["classic", "quorum"]
    min_messages: int = Field(default=1, ge=0)

    @field_validator("queue_pattern", "policy_pattern")
    @classmethod
    def _regex(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {pattern!r} ({exc})") from exc
        return pattern

    @field_validator("queues")
    @classmethod
    def _queue_names(cls, names: list[str] | None) -> list[str] | None:
        if names is not None:
            if any(not name for name in names):
                raise ValueError("queue names must not be empty")
            repeated = sorted({name for name in names if names.count(name) > 1})
            if repeated:
                raise ValueError(f"each queue may be named once, got {repeated} more than once")
        return names

    @model_validator(mode="after")
    def _queues_are_exact(self) -> SourceSelector:
        if self.queues is None:
            return self
        patterns = sorted({"queue_pattern", "policy_pattern"} & self.model_fields_set)
        if patterns:
            raise ValueError(
                f"queues names exact queues; remove {' and '.join(patterns)} "
                "(use either queues or the patterns)"
            )
        if "*" in self.vhosts:
            raise ValueError(
                'queues needs explicit vhosts, not "*" (each named queue must exist in '
                "every listed vhost)"
            )
        return self


class DestinationSpec(_Strict):
    """Where a route's messages go. `queue` is a template over {vhost} and {queue}."""

    cluster: str
    vhost: str = "{vhost}"
    queue: str = "{queue}"
    create_missing: bool = True
    # Type of the destination queues; default: the source queue's type. Setting it
    # allows moving into another type (classic -> quorum); pre-flight checks it.
    queue_type: Literal["classic", "quorum"] | None = None
    # keep: a priority source needs a destination with at least its x-max-priority.
    # drop: any destination may take it (messages keep their priority property, the
    # destination ignores it); classic -> quorum migration of priority queues uses it.
    priorities: Literal["keep", "drop"] = "keep"
    # none: only the destination queues (created with the source's type, priority,
    # message TTL and queue mode). copy: a blue-green move; each destination is
    # created with all its source's arguments and gets the exchanges its source is
    # bound from, its bindings and its policy, translated for the destination's
    # RabbitMQ version (see rmq_spark.planning.topology_rules); federation keys are
    # never copied.
    topology: Literal["none", "copy"] = "none"
    # True when other publishers send to the destination queues while the job runs
    # (a queue already in use): verification then counts their messages as
    # live_arrivals instead of failing on a destination that rose above the ledger.
    shared: bool = False

    @field_validator("vhost", "queue")
    @classmethod
    def _template(cls, template: str) -> str:
        try:
            template.format(vhost="v", queue="q")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                f"template {template!r} may only use {{vhost}} and {{queue}} ({exc})"
            ) from exc
        return template


class Limits(_Strict):
    """A brake for live destinations: publishes per second, body bytes per second, and
    a bound on each destination queue's depth.

    Unset (None) is unlimited. For the whole job (`limits`), the rates are shared among
    the transfers that can run at once; on a route (`routes[].limits`), they hold for
    each of the route's queues. The depth bound is per destination queue either way.
    A transfer keeps to the smaller of the two (`rate_limit.transfer_limits`).
    """

    messages_per_second: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    bytes_per_second: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    # Publishing pauses while the destination queue holds this many ready messages,
    # and goes on once it is a tenth below (depth_bound.py).
    destination_max_depth: int | None = Field(default=None, ge=1)

    @field_validator(
        "messages_per_second", "bytes_per_second", "destination_max_depth", mode="before"
    )
    @classmethod
    def _not_a_switch(cls, value: Any) -> Any:
        # YAML reads `true` as a bool, which would pass for 1 per second.
        if isinstance(value, bool):
            raise ValueError(f"expected a number, got {value}")
        return value

    @property
    def unlimited(self) -> bool:
        return (
            self.messages_per_second is None
            and self.bytes_per_second is None
            and self.destination_max_depth is None
        )


class RouteConfig(_Strict):
    """Queues selected on a source cluster, and where each one goes."""

    name: str
    source: SourceSelector
    destination: DestinationSpec
    # Per queue of this route; the smaller of this and the queue's share of the job's.
    limits: Limits = Limits()


class WindowConfig(_Strict):
    """In-flight limits per queue transfer: unacked deliveries and their bytes.

    A transfer is bound by round trips (deliver, publish, confirm, durable row, ack),
    so its rate grows with the window until the brokers are busy: on the benchmark's
    machine 1000 gave about three quarters of the rate of 5000 (`make bench`, the
    window curve). The byte limit keeps memory bounded whatever the message sizes.
    """

    messages: int = Field(default=5000, ge=1, le=65535)
    bytes: int = Field(default=64 * 1024 * 1024, ge=1024)


class MoverConfig(_Strict):
    """How a queue transfer rides out refusals, alarms and lost connections."""

    # A nacked publish is sent again after a backoff, at most this many times.
    nack_retries: int = Field(default=5, ge=0)
    # First backoff; doubled on each retry up to max_backoff_seconds.
    backoff_seconds: float = Field(default=0.5, gt=0)
    max_backoff_seconds: float = Field(default=30.0, gt=0)
    # A lost connection is reopened this many times before the task gives up (Spark
    # then retries the whole task).
    reconnect_attempts: int = Field(default=5, ge=0)
    # How long a connection may stay blocked (memory or disk alarm) before it counts
    # as lost.
    blocked_timeout_seconds: float = Field(default=300.0, gt=0)
    # An executor task moves up to this many of its queues at once on one I/O loop
    # (a loop mostly waits for confirms, so one thread keeps several queues busy).
    # max_active still caps the queues moving at once across the whole job.
    queues_per_task: int = Field(default=2, ge=1)


# A scheme of two letters or more: `C:\\ledger` (one letter) stays a path.
_URI_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):")


# Object stores a ledger may be on (`rmq_spark.ledger.store`).
LEDGER_OBJECT_STORES = ("s3",)
# Secret storage options: only the name of the environment variable holding each.
LEDGER_SECRETS = ("access_key_id", "secret_access_key", "session_token")


class LedgerStorageOptions(_Strict):
    """How to reach an object-store ledger; credentials by the names of the environment
    variables holding them (without any, the platform's provider chain: environment,
    instance or workload identity)."""

    endpoint: str | None = None  # an S3-compatible server: http(s)://host[:port]
    region: str | None = None
    access_key_id_env: str | None = None
    secret_access_key_env: str | None = None
    session_token_env: str | None = None

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


class LedgerConfig(_Strict):
    """Where the Delta ledger tables (runs, queues, messages) live."""

    path: str
    storage_options: LedgerStorageOptions | None = None
    # Resolved from storage_options' *_env at load time; excluded from dumps and digests.
    storage_secrets: dict[str, SecretStr] = Field(default_factory=dict, exclude=True)

    @property
    def on_object_store(self) -> bool:
        scheme = _URI_SCHEME.match(self.path)
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
        scheme = _URI_SCHEME.match(path)
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


class JobConfig(_Strict):
    """The whole job."""

    clusters: Annotated[dict[str, ClusterConfig], Field(min_length=1)]
    routes: Annotated[list[RouteConfig], Field(min_length=1)]
    window: WindowConfig = WindowConfig()
    mover: MoverConfig = MoverConfig()
    max_active: int = Field(default=4, ge=1)
    ledger: LedgerConfig
    management_timeout_seconds: float = Field(default=10.0, gt=0)
    # pause: the moved queues' federation links are stopped while the movers run
    # (their consumers would make federated queues pull from upstream) by a temporary
    # override policy, deleted afterwards; see federation.py.
    federation: Literal["keep", "pause"] = "keep"
    # For the whole job: split evenly among the transfers that can move at once.
    limits: Limits = Limits()

    @model_validator(mode="after")
    def _routes_name_known_clusters(self) -> JobConfig:
        for index, route in enumerate(self.routes):
            for role, name in (
                ("source", route.source.cluster),
                ("destination", route.destination.cluster),
            ):
                if name not in self.clusters:
                    raise ValueError(
                        f"routes[{index}] ({route.name}): {role}.cluster {name!r} is not one of "
                        f"the clusters {sorted(self.clusters)}"
                    )
        names = [route.name for route in self.routes]
        if len(set(names)) != len(names):
            raise ValueError(f"route names must be unique, got {names}")
        return self

    def digest(self) -> str:
        """sha256 of the validated config; passwords are excluded by the model."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()


def load_config(path: str | Path, environ: dict[str, str] | None = None) -> JobConfig:
    """Read, interpolate, validate; resolve each cluster's password from its variable.

    >>> cfg = load_config("conf/demo.yaml")  # doctest: +SKIP
    """
    env = dict(os.environ if environ is None else environ)
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"config file {source}: cannot read it ({exc.strerror})") from exc
    return parse_config(text, env, origin=str(source))


def parse_config(text: str, environ: dict[str, str], *, origin: str = "<config>") -> JobConfig:
    """Validate config text; `origin` names the file in error messages."""
    try:
        parsed = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {origin}: not valid YAML: {exc}") from exc
    if not isinstance(parsed, dict):
        raise ConfigError(f"config file {origin}: expected a mapping at the top level")
    missing: set[str] = set()
    raw = _interpolate(parsed, environ, missing)
    if missing:
        raise ConfigError(
            f"config file {origin}: environment variable(s) {', '.join(sorted(missing))} "
            "are referenced but not set"
        )
    try:
        config = JobConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"config file {origin}: {_describe(exc, raw)}") from None
    return _with_passwords(config, environ, origin)


def _interpolate(value: Any, environ: dict[str, str], missing: set[str]) -> Any:
    """Replace ${VAR} / ${VAR:-default} in string values (never in keys or comments)."""
    if isinstance(value, dict):
        return {key: _interpolate(item, environ, missing) for key, item in value.items()}
    if isinstance(value, list):
        return [_interpolate(item, environ, missing) for item in value]
    if not isinstance(value, str):
        return value

    def replace(match: re.Match[str]) -> str:
        name, default = match.group("name"), match.group("default")
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        missing.add(name)
        return ""

    return _ENV_REF.sub(replace, value)


def _with_passwords(config: JobConfig, environ: dict[str, str], origin: str) -> JobConfig:
    clusters: dict[str, ClusterConfig] = {}
    for name, cluster in config.clusters.items():
        password = ""
        if cluster.password_env is not None:
            if cluster.password_env not in environ:
                raise ConfigError(
                    f"config file {origin}: clusters.{name}.password_env names "
                    f"{cluster.password_env}, which is not set in the environment"
                )
            password = environ[cluster.password_env]
        elif cluster.username == "guest":
            password = "guest"
        clusters[name] = cluster.model_copy(update={"password": SecretStr(password)})
    return config.model_copy(
        update={
            "clusters": clusters,
            "ledger": _with_storage_secrets(config.ledger, environ, origin),
        }
    )


def _with_storage_secrets(
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


def _describe(exc: ValidationError, raw: Any = None) -> str:
    """One line per problem, each naming the dotted key (and a route by its name)."""
    problems = []
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"]) or "(top level)"
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "unknown key"
        elif error["type"] == "missing":
            message = "required key is missing"
        route = _route_name(raw, error["loc"])
        where = "" if route is None else f" (route {route!r})"
        problems.append(f"{key}: {message}{where}")
    return "; ".join(problems)


def _route_name(raw: Any, loc: tuple[int | str, ...]) -> str | None:
    """The name of the route a problem is in, when the file gave it one."""
    if len(loc) < 2 or loc[0] != "routes" or not isinstance(loc[1], int):
        return None
    routes = raw.get("routes") if isinstance(raw, dict) else None
    if not isinstance(routes, list) or not 0 <= loc[1] < len(routes):
        return None
    route = routes[loc[1]]
    name = route.get("name") if isinstance(route, dict) else None
    return name if isinstance(name, str) else None


def mask_uri(uri: str) -> str:
    """The URI with any password replaced by ***, for logs and errors."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def validate_run_id(run_id: str) -> str:
    """Run ids name Delta partitions and files, so they are kept to safe characters."""
    if not _RUN_ID.match(run_id):
        raise ConfigError(
            f"run id {run_id!r}: expected 1-128 of letters, digits, '_', '.', '-' "
            "starting with a letter or digit"
        )
    return run_id


def dump_public(config: JobConfig) -> dict[str, Any]:
    """The config as plain data with no secrets, for reports."""
    return config.model_dump(mode="json")
