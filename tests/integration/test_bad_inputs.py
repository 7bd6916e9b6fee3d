"""Bad inputs against real brokers: one clear error, exit 2, and nothing moved.

Each case spoils one thing (credentials, a host, a vhost, a queue, a destination,
the ledger path), runs the command line, and checks that stderr holds exactly one
error naming the cluster/vhost/queue, no password, and that the source still holds
every message and no destination queue appeared. The config-only bad inputs are in
tests/unit/test_bad_config.py.
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import yaml
from pyspark.sql import SparkSession

from rmq_spark.cli import EXIT_ERROR, EXIT_UNVERIFIED, transfer_main
from rmq_spark.devtools.demo import demo_messages, seed_queue, wait_for_depth
from tests.support.brokers import (
    PASSWORD_ENV,
    Brokers,
    cluster_block,
    drain_fingerprints,
    fresh_vhost,
    queue_depth,
    queue_names,
    seed_declared,
)

SOURCE_MESSAGES = 5
LIMITED_USER = "rmq-spark-limited"  # administrator, but may not publish or declare
UNTAGGED_USER = "rmq-spark-untagged"  # may not use the management API
# Pre-flight of an unreachable cluster must answer quickly, not after minutes of retries.
UNREACHABLE_SECONDS = 15
DEFAULT_MAX_MESSAGE_SIZE = 134217728


@dataclass(frozen=True)
class Setup:
    """What a case runs against: its vhost and the values the config may use."""

    brokers: Brokers
    vhost: str
    closed_port: int
    tmp_path: Path


@dataclass(frozen=True)
class BadInput:
    """One bad input: how it is made, and the fragments the one error must contain."""

    name: str
    expected: tuple[str, ...]
    source: dict[str, Any] = field(default_factory=dict)
    destination: dict[str, Any] = field(default_factory=dict)
    # Changes to the cluster blocks, e.g. a wrong port; gets (setup, blocks).
    clusters: Callable[[Setup, Blocks], None] | None = None
    # Broker state beyond the seeded source queue, e.g. an incompatible destination.
    prepare: Callable[[Setup], None] | None = None
    ledger: Callable[[Setup], Path] | None = None
    password: str | None = None  # what the password variable holds, if not the password
    # Destination queues that exist on purpose (any other one must not appear).
    destination_queues: tuple[str, ...] = ()


Blocks = dict[str, dict[str, Any]]


def _declare(
    queue: str, arguments: dict[str, Any] | None = None, *, durable: bool = True
) -> Callable[[Setup], None]:
    """A destination queue on main, declared before the run."""

    def prepare(setup: Setup) -> None:
        connection = setup.brokers.main.connect(setup.vhost)
        try:
            connection.channel().queue_declare(queue, durable=durable, arguments=arguments)
        finally:
            connection.close()

    return prepare


def _port(label: str, kind: str, port: Callable[[Setup], int]) -> Callable[[Setup, Blocks], None]:
    def change(setup: Setup, blocks: Blocks) -> None:
        if kind == "amqp":
            blocks[label]["amqp"] = [f"amqp://127.0.0.1:{port(setup)}"]
        else:
            blocks[label]["management"] = f"http://127.0.0.1:{port(setup)}"

    return change


def _user(label: str, username: str) -> Callable[[Setup, Blocks], None]:
    def change(_setup: Setup, blocks: Blocks) -> None:
        blocks[label]["username"] = username

    return change


def _file_in_the_way(setup: Setup) -> Path:
    blocker = setup.tmp_path / "not-a-directory"
    blocker.write_text("a file where the ledger directory should be", encoding="utf-8")
    return blocker


BAD_INPUTS = [
    BadInput(
        "wrong password",
        ("cluster dr management API (127.0.0.1:", "username or password was refused"),
        password="not-the-password",
    ),
    BadInput(
        "unknown user",
        ("cluster main management API", "username or password was refused", "'nobody'"),
        clusters=_user("main", "nobody"),
    ),
    BadInput(
        "user without a management tag",
        ("cluster dr management API", f"user {UNTAGGED_USER!r} may not use the management"),
        clusters=_user("dr", UNTAGGED_USER),
    ),
    BadInput(
        "management API unreachable (closed port)",
        ("cluster main management API (127.0.0.1:{closed_port})", "connection refused"),
        clusters=_port("main", "management", lambda s: s.closed_port),
    ),
    BadInput(
        "AMQP unreachable (closed port)",
        ("cluster dr (127.0.0.1:{closed_port}) vhost '{vhost}'", "connection refused"),
        clusters=_port("dr", "amqp", lambda s: s.closed_port),
    ),
    BadInput(
        "management URL on the AMQP port",
        ("cluster main management API (127.0.0.1:", "is it the management port?"),
        clusters=_port("main", "management", lambda s: s.brokers.main.amqp_port),
    ),
    BadInput(
        "missing source vhost",
        ("cluster dr vhost 'bad-no-such-vhost': source vhost not found",),
        source={"vhosts": ["{vhost}", "bad-no-such-vhost"]},
    ),
    BadInput(
        "missing source queue",
        ("cluster dr vhost '{vhost}' queue 'absent': source queue not found",),
        source={"queues": ["orders", "absent"]},
    ),
    BadInput(
        "missing destination vhost",
        ("cluster main vhost 'bad-nowhere': the destination vhost does not exist",),
        destination={"vhost": "bad-nowhere"},
    ),
    BadInput(
        "missing destination, create_missing false",
        ("cluster main vhost '{vhost}' queue 'orders': missing, and create_missing is false",),
        destination={"create_missing": False},
    ),
    BadInput(
        "destination of another queue type",
        ("cluster main vhost '{vhost}' queue 'orders': is a quorum queue, expected classic",),
        prepare=_declare("orders", {"x-queue-type": "quorum"}),
        destination_queues=("orders",),
    ),
    BadInput(
        "destination without the source's priorities",
        (
            "cluster main vhost '{vhost}' queue 'prio': expected x-max-priority >= 5 "
            "like the source, found none",
        ),
        source={"queues": ["prio"]},
        prepare=_declare("prio"),
        destination_queues=("prio",),
    ),
    BadInput(
        "priorities into a quorum queue (destination.queue_type)",
        ("cluster main vhost '{vhost}' queue 'prio': cannot be created as a quorum queue",),
        source={"queues": ["prio"]},
        destination={"queue_type": "quorum"},
    ),
    BadInput(
        "destination too short (max-length, reject-publish)",
        (
            "cluster main vhost '{vhost}' queue 'orders': holds at most 3 messages",
            f"expected room for the source's {SOURCE_MESSAGES}",
        ),
        prepare=_declare("orders", {"x-max-length": 3, "x-overflow": "reject-publish"}),
        destination_queues=("orders",),
    ),
    BadInput(
        "transient destination for a durable source",
        ("cluster main vhost '{vhost}' queue 'orders': is not durable but the source is",),
        prepare=_declare("orders", durable=False),
        destination_queues=("orders",),
    ),
    BadInput(
        "destination is the source",
        ("cluster dr vhost '{vhost}' queue 'orders': route 'test-route' moves it onto itself",),
        destination={"cluster": "dr"},
    ),
    BadInput(
        "no permission to publish or declare",
        (
            f"cluster main vhost '{{vhost}}': user {LIMITED_USER!r} may not publish to "
            "queue(s) 'orders'; expected a write permission matching 'amq.default'",
            f"cluster main vhost '{{vhost}}' queue 'orders': missing, and user {LIMITED_USER!r}"
            " may not declare it",
        ),
        clusters=_user("main", LIMITED_USER),
    ),
    BadInput(
        "unwritable ledger path",
        ("ledger.path {tmp_path}/not-a-directory: expected a directory",),
        ledger=_file_in_the_way,
    ),
    BadInput(
        "several problems at once",
        (
            "pre-flight found 2 problems",
            "cluster dr vhost '{vhost}' queue 'absent': source queue not found",
            "cluster main vhost '{vhost}' queue 'orders': is a quorum queue",
        ),
        source={"queues": ["orders", "absent"]},
        prepare=_declare("orders", {"x-queue-type": "quorum"}),
        destination_queues=("orders",),
    ),
]


@pytest.fixture(scope="module")
def users(brokers: Brokers) -> Iterator[None]:
    """Two extra users on both nodes: one limited administrator, one without tags."""
    made = []
    for node in (brokers.dr, brokers.main):
        for name, tags in ((LIMITED_USER, "administrator"), (UNTAGGED_USER, "")):
            node.management(
                "PUT",
                f"/api/users/{name}",
                json={"password": node.password, "tags": tags},
                timeout=10,
            )
            made.append((node, name))
    yield
    for node, name in made:
        node.management("DELETE", f"/api/users/{name}", timeout=10)


@pytest.fixture
def cli_spark(monkeypatch: pytest.MonkeyPatch, spark: SparkSession) -> None:
    """transfer_main reuses the running Spark session (the shared `spark` fixture).

    A command that finds a session running leaves it running, as in a notebook; the
    stop is stubbed anyway so no case can end the session the others share. Without
    it, every case would start (and time) a Spark session of its own: pre-flight's
    answer must be quick, Spark's start is not what these cases measure. Python
    workers must run this interpreter, which has the project's dependencies
    (spark-submit.sh arranges the same with PYSPARK_PYTHON).
    """
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setattr(spark, "stop", lambda: None)
    monkeypatch.setattr(spark.sparkContext, "pythonExec", sys.executable)


@pytest.mark.usefixtures("users", "password_env", "cli_spark")
@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c.name for c in BAD_INPUTS])
def test_bad_input_gives_one_error_and_moves_nothing(
    case: BadInput,
    brokers: Brokers,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    vhost = fresh_vhost(brokers, f"bad-{BAD_INPUTS.index(case):02d}")
    setup = Setup(brokers, vhost, _closed_port(), tmp_path)
    seed_declared(brokers.dr, vhost, "orders", SOURCE_MESSAGES, None)
    seed_declared(brokers.dr, vhost, "prio", SOURCE_MESSAGES, {"x-max-priority": 5})
    _grant(brokers, vhost)
    if case.prepare:
        case.prepare(setup)
    if case.password is not None:
        monkeypatch.setenv(PASSWORD_ENV, case.password)
    config = _write_config(case, setup)
    before = queue_names(brokers.main, vhost)
    started = time.monotonic()

    exit_code = transfer_main(["--config", str(config), "--run-id", "bad-input"])

    seconds = time.monotonic() - started
    err = capsys.readouterr().err
    assert exit_code == EXIT_ERROR, err
    assert err.count("rmq-spark: error:") == 1, err
    for fragment in case.expected:
        expected = fragment.format(vhost=vhost, closed_port=setup.closed_port, tmp_path=tmp_path)
        assert expected in err, f"{expected!r} not in:\n{err}"
    assert brokers.dr.password not in err
    assert seconds < UNREACHABLE_SECONDS, f"took {seconds:.1f}s"
    for queue in ("orders", "prio"):
        assert _depth(brokers, "dr", vhost, queue) == SOURCE_MESSAGES
    assert queue_names(brokers.main, vhost) == before  # nothing declared
    for queue in case.destination_queues:
        assert _depth(brokers, "main", vhost, queue) == 0


def test_message_too_big_for_the_destination_stays_in_the_source(
    brokers: Brokers,
    password_env: str,
    cli_spark: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Only the run can find it: the destination closes the channel (406) at publish."""
    vhost = fresh_vhost(brokers, "bad-oversized")
    connection = brokers.dr.connect(vhost)
    try:
        channel = connection.channel()
        seed_queue(channel, vhost, "orders", 3)  # 1 KiB bodies
        big = next(demo_messages(vhost, "big", 1, body_bytes=8192))
        channel.basic_publish("", "orders", big.body, big.properties)
        wait_for_depth(channel, "orders", 4)
    finally:
        connection.close()
    config = _write_config(BadInput("oversized", ()), Setup(brokers, vhost, 0, tmp_path))
    brokers.main.rabbitmqctl("eval", "application:set_env(rabbit, max_message_size, 4096).")
    try:
        exit_code = transfer_main(["--config", str(config), "--run-id", "oversized-1"])
    finally:
        brokers.main.rabbitmqctl(
            "eval", f"application:set_env(rabbit, max_message_size, {DEFAULT_MAX_MESSAGE_SIZE})."
        )

    out, err = capsys.readouterr()
    assert exit_code in (EXIT_UNVERIFIED, EXIT_ERROR), out + err
    assert f"{vhost}/orders" in out + err
    assert "406" in out + err or "larger than" in out + err
    assert password_env not in out + err
    # Nothing lost: every message is in the source or in the destination, and the
    # one the destination refused is in the source.
    in_source = drain_fingerprints(lambda: brokers.dr.connect(vhost), "orders")
    in_destination = drain_fingerprints(lambda: brokers.main.connect(vhost), "orders")
    big_fingerprint = _fingerprint(big.body, big.properties)
    assert in_source[big_fingerprint] == 1
    assert big_fingerprint not in in_destination
    seeded = {_fingerprint(m.body, m.properties) for m in demo_messages(vhost, "orders", 3)}
    assert seeded <= set(in_source) | set(in_destination)
    assert set(in_destination) <= seeded


# -- helpers ----------------------------------------------------------------------------


def _write_config(case: BadInput, setup: Setup) -> Path:
    blocks = {"dr": cluster_block(setup.brokers.dr), "main": cluster_block(setup.brokers.main)}
    if case.clusters:
        case.clusters(setup, blocks)
    source = {"cluster": "dr", "vhosts": ["{vhost}"], **case.source}
    source["vhosts"] = [v.format(vhost=setup.vhost) for v in source["vhosts"]]
    if "queues" not in source:
        source["queue_pattern"] = "orders"
    destination = {"cluster": "main", **case.destination}
    ledger = case.ledger(setup) if case.ledger else setup.tmp_path / "ledger"
    config = {
        "clusters": blocks,
        "routes": [{"name": "test-route", "source": source, "destination": destination}],
        "ledger": {"path": str(ledger)},
        "management_timeout_seconds": 5,
    }
    path = setup.tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def _grant(brokers: Brokers, vhost: str) -> None:
    """The limited user may read everything but neither publish nor declare; the
    untagged one has full AMQP rights (only the management API refuses it)."""
    for node in (brokers.dr, brokers.main):
        vq = quote(vhost, safe="")
        limited = {"configure": "", "write": "^only-this$", "read": ".*"}
        node.management("PUT", f"/api/permissions/{vq}/{LIMITED_USER}", json=limited, timeout=10)
        full = {"configure": ".*", "write": ".*", "read": ".*"}
        node.management("PUT", f"/api/permissions/{vq}/{UNTAGGED_USER}", json=full, timeout=10)


def _depth(brokers: Brokers, label: str, vhost: str, queue: str) -> int:
    connection = (brokers.dr if label == "dr" else brokers.main).connect(vhost)
    try:
        return queue_depth(connection, queue)
    finally:
        connection.close()


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def _fingerprint(body: bytes, properties: Any) -> tuple[str, str]:
    import hashlib

    return (
        hashlib.sha256(body).hexdigest(),
        hashlib.sha256(b"".join(properties.encode())).hexdigest(),
    )
