"""Bad config files through the command line: one error naming the key, exit 2, no Spark.

The broker-side bad inputs (credentials, hosts, vhosts, queues, destinations, the
ledger path) are in tests/integration/test_bad_inputs.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from rmq_spark.cli import EXIT_ERROR, EXIT_INTERNAL, transfer_main

SECRET = "pa55-not-for-logs"
ENV = {"DR_PASSWORD": SECRET, "MAIN_PASSWORD": SECRET}

GOOD = """\
clusters:
  dr:
    amqp: ["amqp://dr-host:5672"]
    management: "http://dr-host:15672"
    username: mover
    password_env: DR_PASSWORD
  main:
    amqp: ["amqp://main-host:5672"]
    management: "http://main-host:15672"
    username: mover
    password_env: MAIN_PASSWORD
routes:
  - name: back
    source:
      cluster: dr
      vhosts: [orders]
      queue_pattern: "orders\\\\..*"
    destination: {cluster: main}
ledger: {path: /tmp/rmq-spark-bad-config-ledger}
"""


@dataclass(frozen=True)
class BadConfig:
    """One bad input: how the good file is spoiled, and what the error must say."""

    name: str
    spoil: Callable[[str], str]
    expected: tuple[str, ...]
    environ: dict[str, str] | None = None
    run_id: str | None = None


def _replace(old: str, new: str) -> Callable[[str], str]:
    def spoil(text: str) -> str:
        assert old in text, f"test bug: {old!r} is not in the good config"
        return text.replace(old, new)

    return spoil


def _append(extra: str) -> Callable[[str], str]:
    return lambda text: text + extra


BAD_CONFIGS = [
    BadConfig("bad YAML", _append("  - [unclosed\n"), ("not valid YAML",)),
    BadConfig(
        "a job rate limit of zero",
        _append("limits: {messages_per_second: 0}\n"),
        ("job.yaml: limits.messages_per_second: Input should be greater than 0",),
    ),
    BadConfig(
        "a rate limit that is a switch",
        _append("limits: {bytes_per_second: true}\n"),
        ("limits.bytes_per_second: Value error, expected a number, got True",),
    ),
    BadConfig(
        "a route rate limit that is not a number",
        _replace(
            "destination: {cluster: main}",
            "destination: {cluster: main}\n    limits: {messages_per_second: fast}",
        ),
        ("routes.0.limits.messages_per_second: Input should be a valid number", "(route 'back')"),
    ),
    BadConfig(
        "a destination depth bound of zero",
        _append("limits: {destination_max_depth: 0}\n"),
        ("limits.destination_max_depth: Input should be greater than or equal to 1",),
    ),
    BadConfig(
        "an unknown rate limit key",
        _append("limits: {messages_per_minute: 60}\n"),
        ("limits.messages_per_minute: unknown key",),
    ),
    BadConfig("not a mapping", lambda _t: "- a\n- list\n", ("expected a mapping",)),
    BadConfig(
        "unknown key",
        _replace("queue_pattern:", "queue_patern:"),
        ("routes.0.source.queue_patern: unknown key",),
    ),
    BadConfig(
        "unknown top-level key",
        _append("max_activ: 3\n"),
        ("max_activ: unknown key",),
    ),
    BadConfig(
        "AMQP URI with the wrong scheme",
        _replace("amqp://dr-host:5672", "http://dr-host:5672"),
        ("clusters.dr.amqp", "expected amqp://host"),
    ),
    BadConfig(
        "AMQP URI carrying a password",
        _replace("amqp://dr-host:5672", f"amqp://mover:{SECRET}@dr-host:5672"),
        ("clusters.dr.amqp", "carries a password"),
    ),
    BadConfig(
        "management URL that is not http(s)",
        _replace("http://main-host:15672", "main-host:15672"),
        ("clusters.main.management", "expected http(s)://host:port"),
    ),
    BadConfig(
        "route naming an unknown cluster",
        _replace("destination: {cluster: main}", "destination: {cluster: mian}"),
        ("destination.cluster 'mian'", "is not one of the clusters"),
    ),
    BadConfig(
        "password variable not set",
        lambda text: text,
        ("clusters.main.password_env names MAIN_PASSWORD", "not set"),
        environ={"DR_PASSWORD": SECRET},
    ),
    BadConfig(
        "unset ${VAR} without a default",
        _replace("dr-host:5672", "dr-host:${DR_AMQP_PORT}"),
        ("DR_AMQP_PORT", "referenced but not set"),
    ),
    BadConfig(
        "queue_pattern that is not a regex",
        _replace('"orders\\\\..*"', '"orders[("'),
        ("routes.0.source.queue_pattern", "not a regular expression"),
    ),
    BadConfig(
        "source.queues together with queue_pattern",
        _replace("      vhosts: [orders]\n", "      vhosts: [orders]\n      queues: [a, b]\n"),
        ("routes.0.source", "remove queue_pattern"),
    ),
    BadConfig(
        'source.queues with vhosts "*"',
        _replace(
            '      vhosts: [orders]\n      queue_pattern: "orders\\\\..*"\n',
            '      vhosts: ["*"]\n      queues: [a]\n',
        ),
        ("routes.0.source", 'queues needs explicit vhosts, not "*"'),
    ),
    BadConfig(
        "source.queues empty",
        _replace('      queue_pattern: "orders\\\\..*"\n', "      queues: []\n"),
        ("routes.0.source.queues",),
    ),
    BadConfig(
        "source.queues naming a queue twice",
        _replace('      queue_pattern: "orders\\\\..*"\n', "      queues: [a, a]\n"),
        ("routes.0.source.queues", "more than once"),
    ),
    BadConfig(
        "destination.queue_type not a queue type",
        _replace("destination: {cluster: main}", "destination: {cluster: main, queue_type: qq}"),
        ("routes.0.destination.queue_type",),
    ),
    BadConfig(
        "destination template with an unknown field",
        _replace("destination: {cluster: main}", "destination: {cluster: main, queue: '{q}'}"),
        ("routes.0.destination.queue", "may only use {vhost} and {queue}"),
    ),
    BadConfig(
        "window.messages out of range",
        _append("window: {messages: 0}\n"),
        ("window.messages", "greater than or equal to 1"),
    ),
    BadConfig(
        "window.start_messages above window.messages",
        _append("window: {messages: 1000, start_messages: 2000}\n"),
        ("window", "window.start_messages (2000) is larger than window.messages (1000)"),
    ),
    BadConfig(
        "ledger.path missing",
        _replace("ledger: {path: /tmp/rmq-spark-bad-config-ledger}\n", ""),
        ("ledger: required key is missing",),
    ),
    BadConfig(
        "ledger.path that is a URI of an unsupported store",
        _replace("path: /tmp/rmq-spark-bad-config-ledger", "path: gs://bucket/ledger"),
        ("ledger.path", "'gs://bucket/ledger' is a URI (gs:)", "not gs:// or hdfs:// yet"),
    ),
    BadConfig(
        "ledger secret written in the file",
        _replace(
            "path: /tmp/rmq-spark-bad-config-ledger",
            f"path: s3://b/l, storage_options: {{secret_access_key: {SECRET}}}",
        ),
        ("ledger.storage_options", "secret_access_key must not be in the config file"),
    ),
    BadConfig(
        "ledger URI carrying credentials",
        _replace("path: /tmp/rmq-spark-bad-config-ledger", f"path: s3://key:{SECRET}@b/l"),
        ("ledger.path", "expected s3://bucket[/prefix], without credentials"),
    ),
    BadConfig(
        "ledger secret variable not set",
        _replace(
            "path: /tmp/rmq-spark-bad-config-ledger",
            "path: s3://b/l, storage_options: "
            "{access_key_id_env: NO_SUCH_KEY_ID, secret_access_key_env: NO_SUCH_SECRET}",
        ),
        ("ledger.storage_options.access_key_id_env names NO_SUCH_KEY_ID", "not set"),
    ),
    BadConfig(
        "ledger storage options for a directory",
        _replace(
            "path: /tmp/rmq-spark-bad-config-ledger",
            "path: /tmp/l, storage_options: {region: eu-west-1}",
        ),
        ("ledger", "storage_options are for a ledger on an object store"),
    ),
    BadConfig(
        "duplicate route names",
        lambda text: text.replace("routes:\n", "routes:\n" + _route_block("back")),
        ("route names must be unique",),
    ),
    BadConfig("run id that is not safe", lambda text: text, ("run id '../x'",), run_id="../x"),
]


def _route_block(name: str) -> str:
    return (
        f"  - name: {name}\n"
        "    source: {cluster: dr, vhosts: [other]}\n"
        "    destination: {cluster: main}\n"
    )


@pytest.fixture(autouse=True)
def _no_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    """A config error must stop the command before Spark (or any broker) is touched."""

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the command built a Spark session for a bad config")

    monkeypatch.setattr("rmq_spark.spark_session.build_session", refuse)


@pytest.mark.parametrize("case", BAD_CONFIGS, ids=[c.name for c in BAD_CONFIGS])
def test_bad_config_exits_2_with_one_error_naming_the_key(
    case: BadConfig,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name in (*ENV, "DR_AMQP_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in (ENV if case.environ is None else case.environ).items():
        monkeypatch.setenv(name, value)
    config = tmp_path / "job.yaml"
    config.write_text(case.spoil(GOOD), encoding="utf-8")
    argv = ["--config", str(config), "--run-id", case.run_id or "bad-config-1"]

    exit_code = transfer_main(argv)

    err = capsys.readouterr().err
    assert exit_code == EXIT_ERROR
    assert err.count("rmq-spark: error:") == 1, err
    for fragment in case.expected:
        assert fragment in err, f"{fragment!r} not in {err!r}"
    assert SECRET not in err


def test_the_good_config_passes_validation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The table spoils a valid file: without a spoiler it gets as far as Spark (whose
    refusal here is an unexpected exception to the command: exit 3)."""
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    config = tmp_path / "job.yaml"
    config.write_text(GOOD, encoding="utf-8")

    assert transfer_main(["--config", str(config), "--run-id", "good-1"]) == EXIT_INTERNAL
    assert "AssertionError: the command built a Spark session" in capsys.readouterr().err


def test_missing_config_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    absent = tmp_path / "absent.yaml"

    exit_code = transfer_main(["--config", str(absent)])

    err = capsys.readouterr().err
    assert exit_code == EXIT_ERROR
    assert err.count("rmq-spark: error:") == 1
    assert f"config file {absent}: cannot read it" in err
