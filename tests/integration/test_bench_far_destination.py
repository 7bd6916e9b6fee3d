"""The throughput benchmark's far destination and separated layout, on real nodes.

Both contenders reach the destination through `bench.delay_proxy` (20 ms each way)
while the brokers' VMs are pinned apart from the client, and the pins are undone
after. The proxy carries every byte of the AMQP sessions: what arrives is counted
on the destination node itself, not through the proxy.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from bench.contenders import SHOVEL, run_mover, run_shovel
from bench.cpu_layout import SEPARATED, applied, placement, threads
from bench.delay_proxy import DelayProxy
from bench.workload import (
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
ONE_WAY_DELAY = 0.020


def pair_of(brokers: Brokers, vhost: str) -> BenchBrokers:
    src, dst = brokers.dr, brokers.main
    for node in (src, dst):
        node.add_vhost(vhost)
    return BenchBrokers(
        src=src, dst=dst, src_pid=vm_pid(src), dst_pid=vm_pid(dst), layout=TWO_NODES
    )


def affinities(pids: list[int]) -> dict[int, set[int]]:
    return {tid: os.sched_getaffinity(tid) for pid in pids for tid in threads(pid)}


@pytest.mark.parametrize("contender", [SHOVEL, "mover"])
def test_each_contender_moves_a_queue_through_the_delay_proxy_while_separated(
    brokers: Brokers, contender: str, tmp_path: Path
) -> None:
    vhost = f"bench-far-{contender}"
    pair = pair_of(brokers, vhost)
    workload = Workload(MESSAGES, 1024)
    seed_queue(pair, vhost, "q", workload, seed="far")
    declare_destination(pair, vhost, "q", "classic")
    pids = pair.broker_pids()
    before = affinities(pids)
    where = placement(SEPARATED)

    with (
        applied(where, pids),
        DelayProxy(pair.dst.amqp_port, ONE_WAY_DELAY) as proxy,
    ):
        assert where.broker_cpus is not None
        assert where.client_cpus is not None
        assert all(cpus == where.broker_cpus for cpus in affinities(pids).values())
        assert os.sched_getaffinity(0) == where.client_cpus
        far = replace(pair, dst_amqp_port=proxy.port)
        cpu_before = proxy.cpu_seconds()
        if contender == SHOVEL:
            run = run_shovel(far, vhost, "q", workload, prefetch=100)
        else:
            run = run_mover(
                far, vhost, "q", workload, window=100, ledger=tmp_path / "ledger", run_id="far"
            )
        relayed = proxy.cpu_seconds() - cpu_before

    assert (run.contender, run.messages) == (contender, MESSAGES)
    assert depths_after(pair, vhost, ["q"]) == {"left_in_source": 0, "at_destination": MESSAGES}
    # 2,000 messages in windows of 100 cross the 40 ms round trip at least 20 times.
    assert run.seconds >= 20 * 2 * ONE_WAY_DELAY
    assert relayed > 0, "the proxy spent no CPU: the contender did not go through it"
    # Every thread still running has its affinity back.
    after = affinities(pids)
    assert {tid: after[tid] for tid in before if tid in after} == {
        tid: cpus for tid, cpus in before.items() if tid in after
    }
