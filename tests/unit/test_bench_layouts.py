"""The throughput benchmark's CPU layouts: which cores, broker cost per message, the
share of the broker-bound limit, and the targets each layout is held to."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from bench.contenders import SHOVEL, Run, job_config
from bench.cpu_layout import (
    SEPARATED,
    SHARED,
    applied,
    broker_bound_limit,
    broker_cost,
    placement,
)
from bench.throughput import _names
from bench.throughput_report import figures, markdown, targets
from bench.workload import DESTINATION, SOURCE, Brokers
from rmq_spark.devtools.local_brokers import LocalNode

KIB = 1024


def test_separated_gives_the_brokers_the_first_half_and_the_client_the_rest() -> None:
    two = placement(SEPARATED, [0, 1])
    assert (two.broker_cpus, two.client_cpus) == (frozenset({0}), frozenset({1}))
    eight = placement(SEPARATED, range(8))
    assert eight.broker_cpus == frozenset(range(4))
    assert eight.client_cpus == frozenset(range(4, 8))
    assert eight.broker_cores() == 4


def test_shared_pins_nothing() -> None:
    shared = placement(SHARED, [0, 1])
    assert shared.broker_cpus is None
    assert shared.client_cpus is None
    assert shared.to_json() == {"layout": SHARED, "broker_cpus": "all", "client_cpus": "all"}


def test_separated_needs_two_cpus_and_unknown_layouts_are_refused() -> None:
    with pytest.raises(ValueError, match="needs at least 2 CPUs; this process may use \\[3\\]"):
        placement(SEPARATED, [3])
    with pytest.raises(ValueError, match="unknown CPU layout 'split'"):
        placement("split", [0, 1])


def test_applied_restores_this_process_affinity() -> None:
    before = os.sched_getaffinity(0)
    where = placement(SEPARATED)
    assert where.client_cpus is not None
    with applied(where, []):
        assert os.sched_getaffinity(0) == where.client_cpus
    assert os.sched_getaffinity(0) == before


def test_broker_cost_takes_out_what_the_idle_brokers_spend() -> None:
    # 12 CPU-s in 10 s, idle VMs spend 0.2 CPU-s/s: 10 CPU-s for 200k messages.
    assert broker_cost(12.0, 10.0, 200_000, 0.2) == pytest.approx(5.0)
    assert broker_bound_limit(5.0, 1) == pytest.approx(20_000)
    assert broker_bound_limit(0.0, 1) is None
    with pytest.raises(ValueError, match="moved 0 messages"):
        broker_cost(1.0, 1.0, 0, 0.0)


def _run(contender: str, seconds: float, cost: float, *, cores: int | None = 1) -> Run:
    details: dict[str, float] = {"broker_cpu_per_100k": cost}
    if cores is not None:
        details["broker_cores"] = cores
    return Run(contender, 100_000, 100_000 * KIB, seconds, {"src": 1.0}, 2.5, details=details)


def _results(*, cores: int | None) -> dict[str, dict[str, list[Run]]]:
    return {
        scenario: {
            SHOVEL: [_run(SHOVEL, 10.0, 10.0, cores=cores)],
            # 100k in 6.25 s: 16,000 msg/s against a limit of 100k / 6 CPU-s.
            "mover": [_run("mover", 6.25, 6.0, cores=cores)],
        }
        for scenario in ("single_classic", "single_quorum")
    }


def test_separated_figures_give_the_share_of_the_broker_bound_limit() -> None:
    mover = figures(_results(cores=1))["single_classic"]["mover"]
    assert mover["median_broker_cpu_per_100k"] == 6.0
    assert mover["broker_bound_limit_rate"] == 16_667
    assert mover["share_of_broker_bound_limit"] == 0.96


def test_separated_targets_check_the_limit_the_ratio_and_the_broker_cost() -> None:
    summary = figures(_results(cores=1))
    found = {t["target"]: t for t in targets(summary, SEPARATED, 1000)}
    share = found["mover share of its broker-bound limit, 1 KiB classic->quorum"]
    assert (share["measured"], share["met"]) == (0.96, True)
    speed = found["mover vs Shovel, 1 KiB classic->classic (x faster)"]
    assert (speed["measured"], speed["goal"], speed["met"]) == (1.6, ">= 1.25", True)
    cost = found["broker CPU per 100k: mover / Shovel, 1 KiB classic->classic"]
    assert (cost["measured"], cost["met"]) == (0.6, True)
    client = found["mover client CPU-s per 100k 1 KiB messages (ledger on)"]
    assert (client["measured"], client["met"]) == (2.5, True)
    # Scenarios that did not run here (DR, the far destination) set no target.
    assert not any("DR" in name or "20 ms" in name for name in found)


def test_the_destination_40_ms_away_is_held_to_one_and_a_half_times_the_shovel() -> None:
    results = {
        scenario: {
            SHOVEL: [_run(SHOVEL, 10.0, 10.0)],
            "mover": [_run("mover", seconds, 6.0)],
        }
        for scenario, seconds in (("farther_single", 8.0), ("farther_single_window_5000", 5.0))
    }
    found = {t["target"]: t for t in targets(figures(results), SEPARATED, 5000)}
    at_1000 = found["40 ms each way: mover vs Shovel, 1 KiB, window 1000 for both (x faster)"]
    assert (at_1000["measured"], at_1000["goal"], at_1000["met"]) == (1.25, ">= 1.5", False)
    at_5000 = found["40 ms each way, window 5000 for both: mover vs Shovel, 1 KiB (x faster)"]
    assert (at_5000["measured"], at_5000["met"]) == (2.0, True)
    assert not any("20 ms" in name for name in found)


def test_shared_targets_have_no_limit_and_a_lower_speed_bar() -> None:
    summary = figures(_results(cores=None))
    assert "share_of_broker_bound_limit" not in summary["single_classic"]["mover"]
    found = {t["target"]: t for t in targets(summary, SHARED, 1000)}
    assert not any("limit" in name for name in found)
    assert found["mover vs Shovel, 1 KiB classic->classic (x faster)"]["goal"] == ">= 1.05"


def test_a_missed_target_is_marked_in_the_table() -> None:
    results = _results(cores=1)
    results["single_classic"]["mover"] = [_run("mover", 12.0, 8.0)]
    summary = figures(results)
    report = {
        "layouts": {
            SEPARATED: {"figures": summary, "placement": placement(SEPARATED, [0, 1]).to_json()}
        },
        "targets": targets(summary, SEPARATED, 1000),
    }
    table = markdown(report)
    missed = "broker CPU per 100k: mover / Shovel, 1 KiB classic->classic | 0.8 | <= 0.7"
    assert f"| separated | {missed} | **missed** |" in table
    assert (
        "| single_classic | mover | 100,000 | 12.0 | 8,333 | 8.14 | 2.5 | 8.0 | 67% | 0.833 |"
        in table
    )


def test_layout_and_scenario_lists_name_what_is_wrong() -> None:
    parse = _names(["shared", "separated"])
    assert parse("separated, shared") == ["separated", "shared"]
    with pytest.raises(
        Exception, match="unknown 'split'; expected a comma-separated list of shared, separated"
    ):
        parse("shared,split")


def _node(label: str, amqp_port: int, tmp_path: Path) -> LocalNode:
    return LocalNode(
        label=label,
        node_name=f"rmqspark-{label}@localhost",
        amqp_port=amqp_port,
        management_port=amqp_port + 1,
        dist_port=amqp_port + 2,
        base_dir=tmp_path / label,
        username="admin",
        password="secret",
    )


def test_far_contenders_reach_the_destination_through_the_proxy_port(tmp_path: Path) -> None:
    pair = Brokers(_node("src", 40001, tmp_path), _node("dst", 40011, tmp_path), 1, 2)
    far = replace(pair, dst_amqp_port=45000)

    config = job_config(
        far,
        vhosts=["bench"],
        ledger=tmp_path / "ledger",
        destination_type="classic",
        window=1000,
        max_active=1,
        queues=["q"],
    )

    dst = config["clusters"][DESTINATION]
    assert dst["amqp"] == ["amqp://127.0.0.1:45000"]
    # Co-location must not find the node's own port in its listeners and go around.
    assert dst["nodes"] == {"rmqspark-dst@localhost": "amqp://127.0.0.1:45000"}
    assert config["clusters"][SOURCE]["amqp"] == ["amqp://127.0.0.1:40001"]
    # Checks and seeding keep the node's own port.
    assert far.dst.amqp_port == 40011
