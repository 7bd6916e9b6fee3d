"""routes[].select: checked before any broker is asked; a bad one names the route and
the position in the expression (a ConfigError: exit 2, nothing moved)."""

from __future__ import annotations

import pytest

from rmq_spark.config import JobConfig, parse_config
from rmq_spark.errors import ConfigError
from rmq_spark.planning.selections import route_selections

ROUTES = """
clusters:
  dr: {amqp: ["amqp://dr-host"], management: "http://dr-host:15672"}
  main: {amqp: ["amqp://main-host"], management: "http://main-host:15672"}
routes:
  - name: everything
    source: {cluster: dr, vhosts: ["/"], queues: ["audit"]}
    destination: {cluster: main}
  - name: acme-out
    source: {cluster: dr, vhosts: ["/"], queues: ["orders"]}
    destination: {cluster: main}
    select: SELECT_HERE
ledger: {path: /tmp/ledger}
"""


def config_with(select: str) -> JobConfig:
    return parse_config(ROUTES.replace("SELECT_HERE", repr(select)), {})


def test_only_routes_with_a_select_are_named_with_their_expression() -> None:
    assert route_selections(config_with("headers['tenant'] = 'acme'")) == {
        "acme-out": "headers['tenant'] = 'acme'"
    }


@pytest.mark.parametrize(
    ("select", "problem"),
    [
        ("headers['tenant'] = 'acme' AND tenant = 'x'", "at position 32: unknown column 'tenant'"),
        ("body_size >", "select expression 'body_size >'"),
        ("body_size + 1", "not a boolean"),
        ("routing_key = 'orders.eu'", "cannot read routing_key"),
    ],
)
def test_a_bad_select_is_one_config_error_naming_the_route(select: str, problem: str) -> None:
    with pytest.raises(ConfigError) as raised:
        route_selections(config_with(select))
    message = str(raised.value)
    assert message.startswith("routes[1] (acme-out): select expression")
    assert problem in message
