"""The management client pages the queue listing of a real broker (3.10 and 4.3):
every queue of a vhost of more than two pages, and none of an empty vhost."""

from __future__ import annotations

import time

import pytest
from pydantic import SecretStr

from rmq_spark.broker import paging
from rmq_spark.broker.management import ManagementClient
from rmq_spark.config import ClusterConfig
from tests.support.brokers import Brokers, fresh_vhost, queue_names

QUEUES = 2 * paging.PAGE_SIZE + 3
LISTED_TIMEOUT_SECONDS = 60.0


def client(brokers: Brokers) -> ManagementClient:
    node = brokers.dr
    cluster = ClusterConfig(
        amqp=[node.amqp_uri],
        management=node.management_url,
        username=node.username,
        password=SecretStr(node.password),
    )
    return ManagementClient("dr", cluster, timeout=30)


@pytest.mark.parametrize("brokers_of_version", ["3.10", "4.3"], indirect=True)
def test_a_vhost_of_three_pages_is_listed_whole_and_an_empty_one_as_nothing(
    brokers_of_version: Brokers,
) -> None:
    brokers = brokers_of_version
    vhost = fresh_vhost(brokers, "paged-listing")
    empty = fresh_vhost(brokers, "paged-listing-empty")
    names = sorted(f"q.{index:05d}" for index in range(QUEUES))
    connection = brokers.dr.connect(vhost)
    try:
        channel = connection.channel()
        for name in names:
            channel.queue_declare(name, durable=True)
    finally:
        connection.close()
    # The API lists a new queue once its stats are in (every few seconds on 3.10).
    deadline = time.monotonic() + LISTED_TIMEOUT_SECONDS
    while len(queue_names(brokers.dr, vhost)) < QUEUES:
        assert time.monotonic() < deadline, "the management API never listed every queue"
        time.sleep(0.5)
    management = client(brokers)
    try:
        listed = management.queues(vhost)
        assert [row["name"] for row in listed] == names
        # An idle new queue may have no message counts yet: only what every row has.
        assert {"name", "type", "durable", "arguments"} <= set(listed[0])
        assert "message_stats" not in listed[0]  # columns= kept the answer small
        assert management.queues(empty) == []
    finally:
        management.close()
