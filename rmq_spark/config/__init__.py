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
    Discriminator,
    Field,
    SecretStr,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from rmq_spark.config.ledger import (
    LEDGER_OBJECT_STORES as LEDGER_OBJECT_STORES,
)
from rmq_spark.config.ledger import (
    LedgerConfig as LedgerConfig,
)
from rmq_spark.config.ledger import (
    LedgerStorageOptions as LedgerStorageOptions,
)
from rmq_spark.config.ledger import (
    with_storage_secrets,
)
from rmq_spark.config.mover import (
    DEFAULT_START_MESSAGES as DEFAULT_START_MESSAGES,
)
from rmq_spark.config.mover import (
    MoverConfig as MoverConfig,
)
from rmq_spark.config.mover import (
    WindowConfig as WindowConfig,
)
from rmq_spark.config.park import (
    PARKED as PARKED,
)
from rmq_spark.config.park import (
    QUEUE_TAG,
    TABLE_TAG,
    check_parks_or_moves,
    destination_kind,
    without_tags,
)
from rmq_spark.config.park import (
    ParkConfig as ParkConfig,
)
from rmq_spark.config.park import (
    ParkedDestination as ParkedDestination,
)
from rmq_spark.config.strict import Strict as _Strict
from rmq_spark.config.uris import mask_uri as mask_uri
from rmq_spark.errors import ConfigError

_ENV_REF = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}")
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
QUEUE_TYPES = ("classic", "quorum", "stream")


class TlsConfig(_Strict):
    """TLS for AMQP and management connections (amqps:// and https:// URIs)."""

    ca_file: Path | None = None
    """CA certificate file (PEM) that signs the brokers' certificates; wins over
    REQUESTS_CA_BUNDLE in the environment."""
    cert_file: Path | None = None
    """Client certificate (PEM), if the broker asks for one."""
    key_file: Path | None = None
    """The client certificate's private key (PEM)."""
    verify: bool = True
    """Check the broker's certificate and host name."""


class ClusterConfig(_Strict):
    """One RabbitMQ cluster: where to reach it and who to be."""

    amqp: Annotated[list[str], Field(min_length=1)]
    """AMQP URIs of the cluster's nodes, tried in order (amqps:// for TLS); no password
    in them."""
    management: str
    """Management HTTP API base URL, http(s)://host:port."""
    username: str = "guest"
    """The user rmq-spark connects as."""
    password_env: str | None = None
    """The environment variable holding the user's password (passwords are never in the
    file). Unset with the user guest: the password guest."""
    tls: TlsConfig = TlsConfig()
    """TLS for amqps:// and https:// endpoints."""
    nodes: dict[str, str] = {}
    """Node name -> AMQP URI, for connecting to the node that hosts a queue; by default
    discovered from the cluster's listeners (see rmq_spark.broker.colocation)."""
    # Resolved from password_env at load time; excluded from dumps, digests and the schema.
    password: SkipJsonSchema[SecretStr] = Field(default=SecretStr(""), exclude=True)

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
    """The source cluster (a key of clusters)."""
    vhosts: Annotated[list[str], Field(min_length=1)] = ["/"]
    """Vhost names; "*" selects every vhost the user can see."""
    queues: Annotated[list[str], Field(min_length=1)] | None = None
    """Exact queue names instead of the patterns; each must exist in every listed vhost
    (explicit vhosts, not "*"), or pre-flight fails naming it."""
    queue_pattern: str = ".*"
    """Regular expression the whole queue name must match."""
    policy_pattern: str | None = None
    """Only queues whose applied policy's name matches this regular expression (e.g. the
    federation policy); default: any policy or none."""
    queue_types: list[Literal["classic", "quorum", "stream"]] = ["classic", "quorum"]
    """Queue types the route moves; a named queue of another type is a pre-flight error."""
    min_messages: int = Field(default=1, ge=0)
    """Skip queues with fewer ready messages than this."""

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
    """The destination cluster (a key of clusters)."""
    vhost: str = "{vhost}"
    """Destination vhost, a template over {vhost} and {queue}."""
    queue: str = "{queue}"
    """Destination queue, a template over {vhost} and {queue}."""
    create_missing: bool = True
    """Declare a missing destination queue like its source."""
    queue_type: Literal["classic", "quorum"] | None = None
    """The type destinations must have, and are created with; default: the source
    queue's type. Set it to move classic queues into quorum queues; pre-flight checks it."""
    priorities: Literal["keep", "drop"] = "keep"
    """keep: a source with x-max-priority needs a destination with at least as many
    priorities. drop: any destination may take it (each message keeps its priority
    property, the queue ignores it); classic -> quorum migration of priority queues
    uses it."""
    topology: Literal["none", "copy"] = "none"
    """none: a created destination gets its source's type, x-max-priority,
    x-message-ttl and x-queue-mode. copy (a blue-green upgrade): a created destination
    gets all its source's arguments, and every destination gets the exchanges its source
    is bound from, its bindings and the policy that applied to it; arguments and policy
    keys are translated for the destination's RabbitMQ version (mirroring keys dropped on
    4.x, ...; each logged), federation keys never copied; an existing exchange or policy
    of the same name that differs is a pre-flight error. A re-run writes nothing."""
    shared: bool = False
    """True when other publishers send to the destination queues during the run:
    verification counts their messages as live_arrivals instead of failing on
    unexplained copies."""

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
    A transfer keeps to the smaller of the two (`planning.rate_limits.transfer_limits`).
    """

    messages_per_second: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Publishes per second: for the whole job, split evenly among the transfers that can
    move at once (min(max_active rounded down to whole tasks, queues in the plan)); on a
    route, for each of its queues. Default: unlimited."""
    bytes_per_second: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Body bytes per second, shared or per queue like messages_per_second."""
    destination_max_depth: int | None = Field(default=None, ge=1)
    """Per destination queue: the mover stops publishing while the queue holds this many
    ready messages and goes on a tenth below (depth_bound.py); the smaller of the job's
    and the route's applies. Default: no bound."""

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
    """Unique route name; shows in logs and the ledger."""
    source: SourceSelector
    """Which queues of which cluster the route moves."""
    destination: Annotated[
        Annotated[DestinationSpec, Tag(QUEUE_TAG)] | Annotated[ParkedDestination, Tag(TABLE_TAG)],
        Discriminator(destination_kind),
    ]
    """Where each selected queue's messages go: a queue (`cluster`, `vhost`, `queue`,
    ...) for `rmq-spark transfer`, or `table: parked` for `rmq-spark park`."""
    limits: Limits = Limits()
    """A rate for each queue of the route; a queue keeps to the smaller of this and its
    share of the job's limits."""
    select: str | None = None
    """Move only the messages this Spark SQL boolean expression selects (a WHERE clause
    without the keyword, over the message columns of docs/selection.md, e.g.
    `headers['tenant'] = 'acme'`); the others are published back to the tail of their
    source queue, in their order, each with a ledger row saying "kept". Exactly the
    messages present when the move starts are examined. Unset: every message moves."""

    @property
    def parks(self) -> bool:
        """The route's destination is the parked table (`rmq-spark park`)."""
        return isinstance(self.destination, ParkedDestination)

    @property
    def queue_destination(self) -> DestinationSpec:
        """The destination queue's spec; a ConfigError for a route that parks."""
        if isinstance(self.destination, ParkedDestination):
            raise ConfigError(
                f"route {self.name!r}: its destination is the parked table "
                f"(table: {self.destination.table}); run it with rmq-spark park"
            )
        return self.destination


class JobConfig(_Strict):
    """The whole job."""

    clusters: Annotated[dict[str, ClusterConfig], Field(min_length=1)]
    """Name -> how to reach one RabbitMQ cluster."""
    routes: Annotated[list[RouteConfig], Field(min_length=1)]
    """Each route selects source queues and maps their destination."""
    window: WindowConfig = WindowConfig()
    """In-flight limits per queue transfer."""
    mover: MoverConfig = MoverConfig()
    """Riding out refusals, alarms and lost connections."""
    max_active: int = Field(default=4, ge=1)
    """At most this many queue transfers run at once in the whole job; Spark runs
    max_active // mover.queues_per_task mover tasks (at least one)."""
    ledger: LedgerConfig
    """Where the ledger lives."""
    management_timeout_seconds: float = Field(default=10.0, gt=0)
    """Timeout per management API call (retried with backoff; connecting is capped at
    5 s, and pre-flight's first call per cluster retries once)."""
    federation: Literal["keep", "pause"] = "keep"
    """pause: the moved (or parked) queues' federation links are stopped while the movers
    run (their consumers would make federated queues pull from upstream) by a temporary
    override policy, deleted afterwards, also when the move failed (see federation.py)."""
    limits: Limits = Limits()
    """A brake for live destinations, for the whole job: rates split evenly among the
    transfers that can move at once, the depth bound per destination queue."""
    park: ParkConfig = ParkConfig()
    """What `rmq-spark park` keeps of each message."""

    @property
    def parks(self) -> bool:
        """Every route parks (`table: parked`): a config for `rmq-spark park`."""
        return self.routes[0].parks

    def require_moves(self) -> None:
        """A ConfigError for a config that parks (given to a command that moves)."""
        if self.parks:
            raise ConfigError(
                f"routes[0] ({self.routes[0].name}): destination is the parked table "
                "(table: parked); this config parks, run it with rmq-spark park --config FILE"
            )

    def require_parks(self) -> None:
        """A ConfigError for a config that moves (given to `rmq-spark park`)."""
        if not self.parks:
            raise ConfigError(
                f"routes[0] ({self.routes[0].name}): destination is a queue; rmq-spark park "
                "needs routes whose destination is {table: parked} (docs/parking.md)"
            )

    @model_validator(mode="after")
    def _routes_name_known_clusters(self) -> JobConfig:
        check_parks_or_moves(self)
        for index, route in enumerate(self.routes):
            roles = [("source", route.source.cluster)]
            if not route.parks:
                roles.append(("destination", route.queue_destination.cluster))
            for role, name in roles:
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
            "ledger": with_storage_secrets(config.ledger, environ, origin),
        }
    )


def _describe(exc: ValidationError, raw: Any = None) -> str:
    """One line per problem, each naming the dotted key (and a route by its name)."""
    problems = []
    for error in exc.errors():
        key = ".".join(str(part) for part in without_tags(error["loc"])) or "(top level)"
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


def json_schema() -> dict[str, Any]:
    """The config file's JSON Schema (`rmq-spark config-schema`), from the models above.

    Editors with the YAML language server validate and complete a config file that
    starts with `# yaml-language-server: $schema=<path or URL of the schema>`.
    """
    schema = _one_line_descriptions(JobConfig.model_json_schema(mode="validation"))
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **schema,
        "title": "rmq-spark configuration",
        "description": (
            "One YAML file, validated on load: unknown keys and bad values stop the job "
            "with one error naming the key. ${VAR} and ${VAR:-default} in values come from "
            "the environment before validation."
        ),
    }


def _one_line_descriptions(node: Any) -> Any:
    """The docstrings' line breaks out of every description, for editors' hovers."""
    if isinstance(node, dict):
        return {
            key: " ".join(value.split())
            if key == "description" and isinstance(value, str)
            else _one_line_descriptions(value)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_one_line_descriptions(item) for item in node]
    return node
