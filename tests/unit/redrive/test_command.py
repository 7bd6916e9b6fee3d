"""command: the redrive's arguments, checked before anything connects."""

from __future__ import annotations

from pathlib import Path

import pytest

from rmq_spark.cli import build_parser, main
from rmq_spark.config import load_config
from rmq_spark.errors import ConfigError
from rmq_spark.redrive.header_options import BROKER_HEADER_ACTIONS
from rmq_spark.redrive.headers import HeaderAction
from rmq_spark.redrive.preflight import compile_where, parse_queue

CONFIG = """
clusters:
  main: {amqp: ["amqp://127.0.0.1:1/"], management: "http://127.0.0.1:1"}
routes:
  - name: r
    source: {cluster: main}
    destination: {cluster: main, vhost: other}
ledger: {path: LEDGER}
"""


def test_the_header_choices_are_the_policys_with_move_first() -> None:
    assert tuple(action.value for action in HeaderAction) == BROKER_HEADER_ACTIONS
    assert BROKER_HEADER_ACTIONS[0] == HeaderAction.MOVE


def test_the_queue_is_cluster_vhost_queue_and_the_vhost_may_hold_colons(tmp_path: Path) -> None:
    config_file = tmp_path / "c.yaml"
    config_file.write_text(CONFIG.replace("LEDGER", str(tmp_path / "ledger")))
    config = load_config(str(config_file))
    dlq = parse_queue("main:a:b:orders.dlq", config)
    assert (dlq.cluster, dlq.vhost, dlq.queue) == ("main", "a:b", "orders.dlq")
    with pytest.raises(ConfigError, match="no cluster 'dr'"):
        parse_queue("dr:/:q", config)
    with pytest.raises(ConfigError, match="expected CLUSTER:VHOST:QUEUE"):
        parse_queue("main:q", config)


def test_a_bad_where_names_its_position_and_the_dlx_routing_columns_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"--where.*position 19.*unknown column 'tenant'"):
        compile_where("body_size > 1 AND tenant = 'acme'")
    with pytest.raises(ConfigError, match=r"last_death\.exchange"):
        compile_where("exchange = 'shop'")
    assert compile_where(None) is None


def test_bad_input_exits_2_before_any_connection(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = tmp_path / "c.yaml"
    config_file.write_text(CONFIG.replace("LEDGER", str(tmp_path / "ledger")))
    code = main(
        ["redrive", "--config", str(config_file), "--queue", "main:/:dlq", "--where", "nope("]
    )
    assert code == 2
    assert "--where" in capsys.readouterr().err
    assert (
        build_parser().parse_args(["redrive", "--config", "c", "--queue", "q"]).broker_headers
        == "move"
    )
