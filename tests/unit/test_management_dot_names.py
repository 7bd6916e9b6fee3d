"""Queues named `.` and `..` through the management client: read from listings, never
addressed by a URL path (whose dot segments would name another resource)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import SecretStr

from rmq_spark.broker.management import ManagementClient, addressable
from rmq_spark.config import ClusterConfig
from rmq_spark.errors import DiscoveryError

LISTINGS: dict[str, Any] = {
    "/api/queues/v": [{"name": "."}, {"name": ".."}, {"name": "orders"}],
    "/api/bindings/v": [
        {"source": "", "destination": ".", "destination_type": "queue"},
        {"source": "x", "destination": ".", "destination_type": "queue", "routing_key": "k"},
        {"source": "x", "destination": "..", "destination_type": "queue"},
        {"source": "x", "destination": ".", "destination_type": "exchange"},
    ],
    "/api/exchanges/v": [{"name": "."}, {"name": "x"}],
}


class ListingOnly(ManagementClient):
    """A client whose API answers only the listings; any other path fails the test."""

    def __init__(self) -> None:
        cluster = ClusterConfig(
            amqp=["amqp://127.0.0.1"], management="http://127.0.0.1:1", password=SecretStr("p")
        )
        super().__init__("main", cluster, timeout=1)
        self.paths: list[str] = []

    def _request(self, method: str, path: str, **_kwargs: Any) -> Any:
        self.paths.append(path)
        return LISTINGS[path.split("?", maxsplit=1)[0]]


@pytest.mark.parametrize(
    ("name", "expected"), [(".", False), ("..", False), ("...", True), ("a.", True)]
)
def test_only_dot_segments_are_not_addressable(name: str, expected: bool) -> None:
    assert addressable(name) is expected


def test_queue_named_dot_is_read_from_the_vhost_listing() -> None:
    client = ListingOnly()
    assert client.queue("v", ".") == {"name": "."}
    assert client.queue("v", "..") == {"name": ".."}
    assert client.queue_details("v", ".") == {"name": "."}
    assert all(
        path.startswith("/api/queues/v?") or path == "/api/queues/v" for path in client.paths
    )


def test_bindings_of_a_queue_named_dot_are_its_own_only() -> None:
    client = ListingOnly()
    assert client.queue_bindings("v", ".") == [
        {"source": "x", "destination": ".", "destination_type": "queue", "routing_key": "k"}
    ]
    assert client.exchange("v", ".") == {"name": "."}
    assert client.exchange_bindings_in("v", ".") == [
        {"source": "x", "destination": ".", "destination_type": "exchange"}
    ]


@pytest.mark.parametrize("name", [".", ".."])
def test_writes_naming_a_dot_segment_are_refused_before_any_request(name: str) -> None:
    client = ListingOnly()
    with pytest.raises(DiscoveryError, match=f"cannot name {name!r} in a URL path"):
        client.declare_queue("v", name, durable=True, arguments={})
    with pytest.raises(DiscoveryError, match="cluster main vhost 'v'"):
        client.delete_queue("v", name)
    with pytest.raises(DiscoveryError):
        client.bind_queue("v", "x", name, "k", {})
    assert client.paths == []
