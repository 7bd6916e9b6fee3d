"""The throughput benchmark's contenders on one RabbitMQ 4.3 node, vhost -> vhost.

The local shovel (RabbitMQ 4.2+) runs only inside one cluster: on one node it moves
a queue into the sibling vhost; between two clusters the benchmark refuses it before
anything moves. The Shovel and the mover take the same one-node layout.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.contenders import (
    LOCAL_SHOVEL,
    SHOVEL,
    BenchError,
    run_local_shovel,
    run_mover,
    run_shovel,
)
from bench.workload import (
    ONE_NODE,
    ONE_VM,
    TWO_NODES,
    Workload,
    declare_destination,
    depths_after,
    seed_queue,
    vm_pid,
)
from bench.workload import Brokers as BenchBrokers
from tests.support.brokers import Brokers

MESSAGES = 2_000
VERSION_4_3 = pytest.mark.parametrize("brokers_of_version", ["4.3"], indirect=True)


def one_node(brokers: Brokers, vhost: str) -> BenchBrokers:
    node = brokers.dr
    pair = BenchBrokers(
        src=node, dst=node, src_pid=vm_pid(node), dst_pid=vm_pid(node), layout=ONE_NODE
    )
    node.add_vhost(vhost)
    node.add_vhost(pair.destination_vhost(vhost))
    return pair


def shovel_parameters(pair: BenchBrokers, vhost: str) -> list[object]:
    return list(pair.src.management("GET", f"/api/parameters/shovel/{vhost}", timeout=10))


@VERSION_4_3
@pytest.mark.parametrize("contender", [LOCAL_SHOVEL, SHOVEL, "mover"])
def test_each_contender_moves_a_queue_into_the_sibling_vhost(
    brokers_of_version: Brokers, contender: str, tmp_path: Path
) -> None:
    vhost = f"bench-{contender.replace('_', '-')}"
    pair = one_node(brokers_of_version, vhost)
    workload = Workload(MESSAGES, 1024)
    seed_queue(pair, vhost, "q", workload, seed="local-shovel-test")
    declare_destination(pair, vhost, "q", "quorum")

    if contender == LOCAL_SHOVEL:
        run = run_local_shovel(pair, vhost, "q", workload, credit=100)
        assert run.details == {"credit": 100}
    elif contender == SHOVEL:
        run = run_shovel(pair, vhost, "q", workload, prefetch=100)
    else:
        run = run_mover(
            pair, vhost, "q", workload, window=100, ledger=tmp_path / "ledger", run_id="one-node"
        )

    assert (run.contender, run.messages, run.bytes) == (contender, MESSAGES, MESSAGES * 1024)
    assert run.seconds > 0
    # One Erlang VM holds both sides: its CPU is counted once.
    assert list(run.broker_cpu_seconds) == [ONE_VM]
    assert depths_after(pair, vhost, ["q"]) == {"left_in_source": 0, "at_destination": MESSAGES}
    # A shovel's parameter is gone once it has moved what the queue held.
    assert shovel_parameters(pair, vhost) == []


@VERSION_4_3
def test_local_shovel_between_two_clusters_is_refused_before_anything_moves(
    brokers_of_version: Brokers,
) -> None:
    src, dst = brokers_of_version.dr, brokers_of_version.main
    vhost = "bench-two-clusters"
    for node in (src, dst):
        node.add_vhost(vhost)
    pair = BenchBrokers(
        src=src, dst=dst, src_pid=vm_pid(src), dst_pid=vm_pid(dst), layout=TWO_NODES
    )
    workload = Workload(10, 100)
    seed_queue(pair, vhost, "q", workload, seed="refused")
    declare_destination(pair, vhost, "q", "classic")

    with pytest.raises(BenchError, match=r"local shovel on two_nodes: .*inside one cluster"):
        run_local_shovel(pair, vhost, "q", workload, credit=100)

    assert depths_after(pair, vhost, ["q"]) == {"left_in_source": 10, "at_destination": 0}
    assert shovel_parameters(pair, vhost) == []
