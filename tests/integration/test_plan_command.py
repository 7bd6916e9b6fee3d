"""`rmq-spark plan`: discovery and pre-flight only; it prints the plan and moves nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rmq_spark.cli import main
from tests.support.brokers import Brokers, declare, depth, fresh_vhost, seed, write_config


def test_plan_prints_every_queue_and_creates_and_moves_nothing(
    brokers: Brokers, password_env: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vhost = fresh_vhost(brokers, "plan-dry-run")
    seed(brokers.dr, vhost, "big", 300)
    seed(brokers.dr, vhost, "small", 20)
    declare(brokers.main, vhost, "big")
    config = write_config(
        tmp_path / "job.yaml", brokers, vhosts=[vhost], ledger=tmp_path / "ledger", max_active=4
    )

    exit_code = main(["plan", "--config", str(config), "--json"])

    assert exit_code == 0
    plan = json.loads(capsys.readouterr().out)
    # Matched on the separate names; "source"/"destination" are for reading.
    queues = {
        (q["source_cluster"], q["source_vhost"], q["source_queue"]): q for q in plan["queues"]
    }
    assert set(queues) == {("dr", vhost, "big"), ("dr", vhost, "small")}
    big, small = queues[("dr", vhost, "big")], queues[("dr", vhost, "small")]
    assert big["messages"] == 300
    assert big["destination_created"] is False
    assert small["destination_created"] is True
    assert (
        small["destination_cluster"],
        small["destination_vhost"],
        small["destination_queue"],
    ) == ("main", vhost, "small")
    assert (small["source"], small["destination"]) == (f"dr/{vhost}/small", f"main/{vhost}/small")
    # max_active 4, two queues per task (the default): two tasks, one queue each.
    assert {q["partition"] for q in plan["queues"]} == {0, 1}
    assert plan["messages"] == 320
    # Nothing was created, nothing moved, no ledger written.
    assert depth(brokers.dr, vhost, "big") == 300
    assert depth(brokers.dr, vhost, "small") == 20
    assert depth(brokers.main, vhost, "big") == 0
    assert not queue_exists(brokers, vhost, "small")
    assert not (tmp_path / "ledger").exists()


def queue_exists(brokers: Brokers, vhost: str, queue: str) -> bool:
    found = brokers.main.management(
        "GET", f"/api/queues/{vhost}/{queue}", timeout=10, missing_ok=True
    )
    return found is not None


def test_plan_with_problems_lists_them_and_exits_2(
    brokers: Brokers, password_env: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vhost = fresh_vhost(brokers, "plan-problems")
    seed(brokers.dr, vhost, "orders", 5)
    config = write_config(
        tmp_path / "job.yaml",
        brokers,
        vhosts=[vhost],
        ledger=tmp_path / "ledger",
        destination={"create_missing": False},
    )

    exit_code = main(["plan", "--config", str(config), "--json"])

    captured = capsys.readouterr()
    assert exit_code == 2
    problems = json.loads(captured.out)["problems"]
    assert any(f"vhost '{vhost}' queue 'orders'" in p for p in problems)
    assert "rmq-spark: error:" in captured.err
    assert depth(brokers.dr, vhost, "orders") == 5
