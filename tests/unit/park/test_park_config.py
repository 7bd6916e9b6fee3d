"""A config that parks: `destination: {table: parked}`, `park`, and what it refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from rmq_spark.cli import main
from rmq_spark.config import ParkedDestination, parse_config
from rmq_spark.errors import ConfigError

ENV = {"DR_PASSWORD": "secret"}


def config_text(*routes: dict[str, Any], **top: Any) -> str:
    return yaml.safe_dump(
        {
            "clusters": {
                "dr": {
                    "amqp": ["amqp://127.0.0.1:5672"],
                    "management": "http://127.0.0.1:15672",
                    "password_env": "DR_PASSWORD",
                }
            },
            "routes": list(routes),
            "ledger": {"path": "/tmp/ledger"},
            **top,
        }
    )


def parked_route(name: str = "park-dlq", **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "source": {"cluster": "dr", "queues": ["orders.dlq"]},
        "destination": {"table": "parked"},
        **extra,
    }


def test_a_route_parks_into_the_table_and_the_body_may_be_excluded() -> None:
    config = parse_config(config_text(parked_route(), park={"exclude_body": True}), ENV)
    assert config.parks
    assert isinstance(config.routes[0].destination, ParkedDestination)
    assert config.park.exclude_body


def test_a_parking_config_refuses_the_commands_that_move() -> None:
    config = parse_config(config_text(parked_route()), ENV)
    with pytest.raises(ConfigError, match=r"routes\[0\] \(park-dlq\).*rmq-spark park"):
        config.require_moves()
    with pytest.raises(ConfigError, match=r"route 'park-dlq'.*parked table"):
        _ = config.routes[0].queue_destination


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            config_text(
                parked_route(),
                {"name": "move", "source": {"cluster": "dr"}, "destination": {"cluster": "dr"}},
            ),
            r"routes\[1\] \(move\): destination is a queue, but routes\[0\] \(park-dlq\) parks",
        ),
        (
            config_text(parked_route(limits={"destination_max_depth": 10})),
            r"routes\[0\] \(park-dlq\): limits.destination_max_depth",
        ),
        (
            config_text(parked_route(destination={"table": "messages"})),
            r"routes.0.destination.table: Input should be 'parked'",
        ),
        (
            config_text(parked_route(destination={"table": "parked", "cluster": "dr"})),
            r"routes.0.destination.cluster: unknown key",
        ),
    ],
    ids=["mixed", "depth bound", "another table", "table and cluster"],
)
def test_bad_park_config_is_one_error_naming_the_route_and_key(text: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        parse_config(text, ENV)


def test_a_park_may_pause_federation_as_a_move_does() -> None:
    config = parse_config(config_text(parked_route(), federation="pause"), ENV)
    assert config.federation == "pause"
    assert config.routes[0].parks


def test_a_cluster_named_like_the_table_is_refused_in_a_park() -> None:
    raw = yaml.safe_load(config_text(parked_route()))
    raw["clusters"]["parked"] = raw["clusters"]["dr"]
    with pytest.raises(ConfigError, match="clusters: 'parked' names the parked table"):
        parse_config(yaml.safe_dump(raw), ENV)


def test_the_cli_refuses_a_parking_config_for_plan_and_a_moving_one_for_park(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DR_PASSWORD", "secret")
    parking = tmp_path / "park.yaml"
    parking.write_text(config_text(parked_route()), encoding="utf-8")
    moving = tmp_path / "move.yaml"
    moving.write_text(
        config_text(
            {"name": "move", "source": {"cluster": "dr"}, "destination": {"cluster": "dr"}}
        ),
        encoding="utf-8",
    )
    assert main(["plan", "--config", str(parking)]) == 2
    assert "this config parks, run it with rmq-spark park" in capsys.readouterr().err
    assert main(["park", "--config", str(moving)]) == 2  # before any Spark session
    assert "rmq-spark park needs routes whose destination is" in capsys.readouterr().err
