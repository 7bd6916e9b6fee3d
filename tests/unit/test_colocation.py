"""Co-location: which AMQP address to try first for a queue's node."""

from __future__ import annotations

from pydantic import SecretStr

from rmq_spark.broker.colocation import listener_uris, preferred_uri
from rmq_spark.broker.connection import connection_parameters
from rmq_spark.config import ClusterConfig


def test_listeners_map_node_names_to_uris() -> None:
    listeners = [
        {"node": "rabbit@a", "protocol": "amqp", "ip_address": "10.0.0.1", "port": 5672},
        {"node": "rabbit@a", "protocol": "amqp/ssl", "ip_address": "10.0.0.1", "port": 5671},
        {"node": "rabbit@b", "protocol": "amqp", "ip_address": "::", "port": 5672},
        {"node": "rabbit@c", "protocol": "http", "ip_address": "10.0.0.3", "port": 15672},
        {"node": "rabbit@d", "protocol": "amqp", "ip_address": "fd00::4", "port": 5672},
    ]
    assert listener_uris(listeners) == {
        "rabbit@a": "amqps://10.0.0.1:5671",  # TLS preferred when the node has both
        "rabbit@b": "amqp://b:5672",  # bound everywhere: the node's host name
        "rabbit@d": "amqp://[fd00::4]:5672",
    }


def test_the_hosting_node_is_tried_before_the_cluster_uris() -> None:
    cluster = ClusterConfig(
        amqp=["amqp://lb:5672", "amqp://b:5672"], management="http://lb:15672"
    ).model_copy(update={"password": SecretStr("pw")})
    uris = {"main": {"rabbit@b": "amqp://b:5672"}}

    prefer = preferred_uri(uris, "main", "rabbit@b")
    params = connection_parameters("main", cluster, "/", purpose="t", prefer=prefer)

    assert [(p.host, p.port) for p in params] == [("b", 5672), ("lb", 5672)]  # no repeat
    assert preferred_uri(uris, "main", "rabbit@unknown") is None
    assert preferred_uri(uris, "main", "") is None
    plain = connection_parameters("main", cluster, "/", purpose="t")
    assert [p.host for p in plain] == ["lb", "b"]
