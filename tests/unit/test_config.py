"""Config validation: good files load, bad ones give one error naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from rmq_spark.config import WindowConfig, load_config, mask_uri, parse_config, validate_run_id
from rmq_spark.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]

VALID = """
clusters:
  dr:
    amqp: ["amqp://dr-host:${DR_PORT:-5672}"]
    management: "http://dr-host:15672/"
    username: mover
    password_env: DR_PASSWORD
  main:
    amqp: ["amqps://main-host:5671"]
    management: "https://main-host:15671"
routes:
  - name: back
    source: {cluster: dr, vhosts: ["*"], queue_pattern: "orders\\\\..*"}
    destination: {cluster: main, queue: "{queue}-moved"}
ledger: {path: /tmp/ledger}
"""

ENV = {"DR_PASSWORD": "s3cret-value"}


def test_valid_config_loads_with_defaults_and_resolved_password() -> None:
    config = parse_config(VALID, ENV)
    dr = config.clusters["dr"]
    assert dr.amqp == ["amqp://dr-host:5672"]
    assert dr.management == "http://dr-host:15672"
    assert dr.password.get_secret_value() == "s3cret-value"
    assert config.clusters["main"].password.get_secret_value() == "guest"
    assert config.window.messages == 20000  # the bound the window may grow to
    assert config.window.first_messages == 5000  # where it starts
    assert config.max_active == 4
    assert config.routes[0].queue_destination.queue == "{queue}-moved"


def test_password_never_shows_in_repr_dump_or_digest() -> None:
    config = parse_config(VALID, ENV)
    assert "s3cret-value" not in repr(config)
    assert "s3cret-value" not in str(config.model_dump())
    other = parse_config(VALID, {"DR_PASSWORD": "different"})
    assert config.digest() == other.digest()


def test_environment_interpolation_uses_the_variable_when_set() -> None:
    config = parse_config(VALID, {**ENV, "DR_PORT": "25000"})
    assert config.clusters["dr"].amqp == ["amqp://dr-host:25000"]


def test_shipped_example_and_demo_configs_are_valid() -> None:
    env = {
        "RMQ_DR_PASSWORD": "x",
        "RMQ_MAIN_PASSWORD": "y",
        "RMQ_SPARK_DEMO_PASSWORD": "z",
        "RMQ_SPARK_DEMO_DR_AMQP_PORT": "1",
        "RMQ_SPARK_DEMO_DR_HTTP_PORT": "2",
        "RMQ_SPARK_DEMO_MAIN_AMQP_PORT": "3",
        "RMQ_SPARK_DEMO_MAIN_HTTP_PORT": "4",
    }
    assert load_config(REPO / "conf" / "example.yaml", env).routes[0].name == "dr-failback"
    assert load_config(REPO / "conf" / "demo.yaml", env).clusters["dr"].username == "rmqspark"


@pytest.mark.parametrize(
    ("mutation", "expected"),
    [
        (
            lambda t: t.replace("max_active", "max_activ") + "\nmax_activ: 3\n",
            r"max_activ: unknown key",
        ),
        (
            lambda t: t + "\nwindow: {messages: 0}\n",
            r"window\.messages: .*greater than or equal to 1",
        ),
        (lambda t: t + "\nwindow: {mesages: 10}\n", r"window\.mesages: unknown key"),
        (
            lambda t: t.replace("amqp://dr-host", "http://dr-host"),
            r"clusters\.dr\.amqp: .*expected amqp://",
        ),
        (
            lambda t: t.replace("amqp://dr-host", "amqp://u:hunter2@dr-host"),
            r"carries a password",
        ),
        (lambda t: t.replace("cluster: main", "cluster: mian"), r"destination\.cluster 'mian'"),
        (
            lambda t: t.replace('"orders\\\\..*"', '"orders[("'),
            r"queue_pattern: .*regular expression",
        ),
        (lambda t: t.replace("{queue}-moved", "{name}"), r"may only use \{vhost\} and \{queue\}"),
        (
            lambda t: t.replace('queue: "{queue}-moved"', 'queue: "{queue}-moved", topology: all'),
            r"routes\.0\.destination\.topology: Input should be 'none' or 'copy'",
        ),
        (
            lambda t: t.replace("ledger: {path: /tmp/ledger}", ""),
            r"ledger: required key is missing",
        ),
        (lambda t: t + "\n  - oops", r"not valid YAML"),
        (lambda t: "- just\n- a list\n", r"expected a mapping"),
    ],
)
def test_bad_config_names_the_key(mutation: object, expected: str) -> None:
    text = mutation(VALID)  # type: ignore[operator]
    with pytest.raises(ConfigError, match=expected) as info:
        parse_config(text, ENV, origin="bad.yaml")
    assert "bad.yaml" in str(info.value)
    assert "hunter2" not in str(info.value)


def test_missing_password_variable_is_named() -> None:
    with pytest.raises(ConfigError, match=r"clusters\.dr\.password_env names DR_PASSWORD"):
        parse_config(VALID, {})


def test_unset_interpolated_variable_is_named() -> None:
    with pytest.raises(ConfigError, match="NOPE are referenced but not set"):
        parse_config(VALID.replace("${DR_PORT:-5672}", "${NOPE}"), ENV)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read it"):
        load_config(tmp_path / "absent.yaml", ENV)


def test_mask_uri_hides_only_the_password() -> None:
    assert mask_uri("amqp://u:p4ss@h:5672/v") == "amqp://u:***@h:5672/v"
    assert mask_uri("amqp://h:5672") == "amqp://h:5672"


@pytest.mark.parametrize("run_id", ["", "../etc", "a/b", "x" * 200, "-lead"])
def test_unsafe_run_ids_are_refused(run_id: str) -> None:
    with pytest.raises(ConfigError, match="run id"):
        validate_run_id(run_id)


def test_safe_run_id_passes() -> None:
    assert validate_run_id("20260101T000000Z-abc123") == "20260101T000000Z-abc123"


def test_exact_source_queues_and_destination_type_load() -> None:
    text = VALID.replace(
        'vhosts: ["*"], queue_pattern: "orders\\\\..*"}', "vhosts: [a, b], queues: [q1, q2]}"
    ).replace('queue: "{queue}-moved"}', "queue_type: quorum}")
    route = parse_config(text, ENV).routes[0]
    assert route.source.queues == ["q1", "q2"]
    assert route.queue_destination.queue_type == "quorum"
    defaults = parse_config(VALID, ENV).routes[0]
    assert defaults.source.queues is None
    assert defaults.queue_destination.queue_type is None  # the source's type


@pytest.mark.parametrize(
    ("window", "first"),
    [
        ({}, 5000),  # the default start under the default bound
        ({"messages": 1000}, 1000),  # a bound below the default start: a fixed window
        ({"messages": 30000, "start_messages": 1000}, 1000),
        ({"messages": 8000, "start_messages": 8000}, 8000),
    ],
)
def test_the_window_starts_at_start_messages_within_messages(
    window: dict[str, int], first: int
) -> None:
    assert WindowConfig.model_validate(window).first_messages == first
