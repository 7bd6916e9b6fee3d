"""The throughput benchmark's local-shovel contender and layouts: the pure parts."""

from __future__ import annotations

import pytest

from bench.contenders import (
    LOCAL_SHOVEL,
    SHOVEL,
    Run,
    local_shovel_definition,
    not_applicable,
    shovel_definition,
)
from bench.throughput import KIB, Scale, scaled
from bench.throughput_report import figures, peers_markdown
from bench.workload import ONE_NODE, TWO_NODES, destination_vhost

SRC = "amqp://u:p@127.0.0.1:5701/bench"
DEST = "amqp://u:p@127.0.0.1:5701/bench-moved"


def test_local_shovel_definition_uses_the_local_protocol_on_both_sides() -> None:
    value = local_shovel_definition(SRC, DEST, "orders")

    assert value["src-protocol"] == "local"
    assert value["dest-protocol"] == "local"
    assert (value["src-uri"], value["src-queue"]) == (SRC, "orders")
    assert (value["dest-uri"], value["dest-queue"]) == (DEST, "orders")
    # The queues are prepared beforehand: checked, never declared by the shovel.
    assert value["src-predeclared"] is True
    assert value["dest-predeclared"] is True
    # Moves what the queue holds when it starts, acking each message once confirmed.
    assert value["src-delete-after"] == "queue-length"
    assert value["ack-mode"] == "on-confirm"
    # A local shovel has no prefetch; its credit is a node setting.
    assert "src-prefetch-count" not in value


def test_amqp091_shovel_definition_publishes_through_the_default_exchange() -> None:
    value = shovel_definition(SRC, DEST, "orders", 64)

    assert (value["src-protocol"], value["dest-protocol"]) == ("amqp091", "amqp091")
    assert value["src-prefetch-count"] == 64
    assert (value["dest-exchange"], value["dest-exchange-key"]) == ("", "orders")
    assert "dest-queue" not in value  # would re-declare the destination as classic
    assert value["ack-mode"] == "on-confirm"


@pytest.mark.parametrize("version", ["4.3.6", "4.2.0", "5.0.1"])
def test_local_shovel_runs_on_one_node_of_4_2_or_later(version: str) -> None:
    assert not_applicable(LOCAL_SHOVEL, ONE_NODE, version) is None


def test_local_shovel_cannot_move_between_two_clusters() -> None:
    reason = not_applicable(LOCAL_SHOVEL, TWO_NODES, "4.3.6")

    assert reason is not None
    assert "inside one cluster" in reason


@pytest.mark.parametrize("version", ["3.10.8", "4.0.5", "4.1.4"])
def test_local_shovel_needs_rabbitmq_4_2(version: str) -> None:
    reason = not_applicable(LOCAL_SHOVEL, ONE_NODE, version)

    assert reason == f"RabbitMQ {version} has no local shovel (new in 4.2)"


@pytest.mark.parametrize("contender", [SHOVEL, "mover", "job"])
@pytest.mark.parametrize("layout", [ONE_NODE, TWO_NODES])
def test_the_other_contenders_run_in_every_layout(contender: str, layout: str) -> None:
    assert not_applicable(contender, layout, "3.10.8") is None
    assert not_applicable(contender, layout, "4.3.6") is None


def test_one_node_moves_into_a_sibling_vhost_two_nodes_into_the_same() -> None:
    assert destination_vhost(TWO_NODES, "bench") == "bench"
    assert destination_vhost(ONE_NODE, "bench") == "bench-moved"
    assert destination_vhost(ONE_NODE, "{vhost}") == "{vhost}-moved"  # the job's template
    with pytest.raises(ValueError, match="unknown layout 'three_nodes'"):
        destination_vhost("three_nodes", "bench")


def test_scaled_shrinks_counts_and_caps_rounds() -> None:
    scale = scaled(Scale(), fraction=0.5, max_rounds=2)

    assert scale.single_messages == 50_000
    assert scale.size_messages == {100: 50_000, 64 * KIB: 2_000, 1024 * KIB: 128}
    assert scale.window_messages[1] == 1_000
    assert scale.dr_messages == 25_000
    assert (scale.rounds, scale.job_rounds, scale.quorum_job_rounds) == (2, 2, 1)
    assert scale.size_rounds == 2
    # A tiny fraction still moves a message.
    assert scaled(Scale(), fraction=1e-9).size_messages[1024 * KIB] == 1


def test_scaled_refuses_a_fraction_or_rounds_out_of_range() -> None:
    with pytest.raises(ValueError, match=r"fraction must be in \(0, 1\], got 1.5"):
        scaled(Scale(), fraction=1.5)
    with pytest.raises(ValueError, match="rounds must be at least 1, got 0"):
        scaled(Scale(), max_rounds=0)


def _run(contender: str, seconds: float) -> Run:
    return Run(contender, 10_000, 10_000 * KIB, seconds, {"src_and_dst": 1.0})


def test_figures_compare_the_local_shovel_with_the_shovel_and_the_mover() -> None:
    results = {
        "single_classic": {
            SHOVEL: [_run(SHOVEL, 4.0), _run(SHOVEL, 6.0)],
            LOCAL_SHOVEL: [_run(LOCAL_SHOVEL, 1.0), _run(LOCAL_SHOVEL, 2.0)],
            "mover": [_run("mover", 4.0), _run("mover", 4.0)],
        }
    }

    ratios = figures(results)["single_classic"]["ratios"]

    # Paired per round: 4/1 and 6/2 (median 3.5); the mover: 1/4 and 2/4.
    assert ratios["local_shovel_vs_shovel"] == 3.5
    assert ratios["mover_vs_shovel"] == 1.25
    assert ratios["mover_vs_local_shovel"] == 0.375


def test_peer_tables_say_where_a_contender_does_not_apply() -> None:
    mover = _run("mover", 1.0)
    mover.details["broker_cpu_per_100k"] = 10.0
    results = {"single_classic": {SHOVEL: [_run(SHOVEL, 2.0)], "mover": [mover]}}
    reason = not_applicable(LOCAL_SHOVEL, TWO_NODES, "4.3.6")
    section = {
        "versions": {"rabbitmq": "4.3.6"},
        "layouts": {
            TWO_NODES: {"figures": figures(results), "not_applicable": {LOCAL_SHOVEL: reason}}
        },
    }

    lines = peers_markdown("4.3", section)

    assert lines[0] == "RabbitMQ 4.3.6:"
    assert (
        "| two_nodes | single_classic | mover | 10,000 | 1.0 | 10,000 | 9.77 | 10.0 |  | 2.0 |"
        in (lines)
    )
    assert f"| two_nodes | every scenario | local_shovel | not applicable: {reason} |" in lines
