"""executor.Endpoints: a task's connection parameters, made once per vhost, side and node."""

from __future__ import annotations

from pydantic import SecretStr

from rmq_spark.config import ClusterConfig
from rmq_spark.transfer.executor import Endpoints, ExecutorSettings


def settings() -> ExecutorSettings:
    cluster = ClusterConfig(
        amqp=["amqp://lb:5672", "amqp://b:5672"], management="http://lb:15672"
    ).model_copy(update={"password": SecretStr("pw")})
    return ExecutorSettings(
        run_id="r",
        ledger_path="/nowhere",
        clusters={"main": cluster},
        window_messages=10,
        window_bytes=1000,
        node_uris={"main": {"rabbit@b": "amqp://b:5672"}},
    )


def test_the_queues_of_one_vhost_and_side_share_one_parameter_set() -> None:
    endpoints = Endpoints(settings())
    first = endpoints.of("main", "v", "q1", node="", role="consumer")
    second = endpoints.of("main", "v", "q2", node="", role="consumer")
    assert (first.queue, second.queue) == ("q1", "q2")
    assert first.parameters is second.parameters
    assert [p.host for p in first.parameters] == ["lb", "b"]
    assert first.parameters[0].virtual_host == "v"


def test_another_vhost_side_or_hosting_node_gets_its_own() -> None:
    endpoints = Endpoints(settings())
    base = endpoints.of("main", "v", "q", node="", role="consumer")
    other_vhost = endpoints.of("main", "w", "q", node="", role="consumer")
    publisher = endpoints.of("main", "v", "q", node="", role="publisher")
    on_b = endpoints.of("main", "v", "q", node="rabbit@b", role="consumer")
    assert other_vhost.parameters[0].virtual_host == "w"
    props = publisher.parameters[0].client_properties
    assert props is not None
    assert props["connection_name"] == "rmq-spark r publisher vhost v"
    assert [p.host for p in on_b.parameters] == ["b", "lb"]  # the hosting node first
    made = {id(e.parameters) for e in (base, other_vhost, publisher, on_b)}
    assert len(made) == 4
