"""A redrive whose driver is killed mid-move is finished by running it again with its
`--run-id` (issue 26): nothing lost, the copies named, and the witnesses still honest.

The first driver is a real `rmq-spark redrive` process, SIGKILLed (with its Spark
executors: its own process group) once part of the DLQ is back in its origins. The
second run, the same command in-process, finds the run's rows, fence and first readings
in the ledger (`redrive/readings.py`): it publishes no second fence, compares each queue
with what it held before the FIRST driver moved anything, and is verified.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from rmq_spark.cli import main
from rmq_spark.ledger import tables
from tests.support.brokers import Brokers, depth, fresh_vhost, write_config
from tests.support.dead_letters import ORIGINS, STRAY_ID, make_dead_letters, read_queue
from tests.support.killed_driver import started_driver

DLQ = "shop.dlq"
RUN = "redrive-resume-1"


def test_a_killed_redrive_is_resumed_with_its_run_id_and_verified_with_nothing_lost(
    brokers: Brokers,
    password_env: str,
    tmp_path: Path,
    spark: SparkSession,
    capsys: pytest.CaptureFixture[str],
) -> None:
    node = brokers.dr
    vhost = fresh_vhost(brokers, "redrive-resume")
    published = make_dead_letters(node, vhost, DLQ, per_queue=40)
    config = write_config(
        tmp_path / "job.yaml", brokers, vhosts=[vhost], ledger=tmp_path / "ledger"
    )
    # 121 messages at 20 a second: six seconds of moving for the kill to land in.
    arguments = [
        "redrive",
        "--config",
        str(config),
        "--queue",
        f"dr:{vhost}:{DLQ}",
        "--messages-per-second",
        "20",
        "--run-id",
        RUN,
    ]
    command = [str(Path(sys.executable).parent / "rmq-spark"), *arguments]
    with started_driver(command, tmp_path / "first.log") as first:
        first.kill_once(  # the driver dies, and its executors with it
            lambda: depth(node, vhost, "orders") >= 10,
            "ten messages back in orders",
            timeout=180,
        )
    assert depth(node, vhost, "orders") < 40, "the kill came after the move"

    code = main(arguments)

    out = capsys.readouterr().out
    print(out)
    assert code == 0, out
    [result] = [line for line in out.splitlines() if line.startswith("RESULT")]
    assert result.startswith("RESULT verified: "), out
    assert ", lost 0, " in result
    assert "missing" not in out
    rows = tables.read_arrow(str(tmp_path / "ledger"), "messages", run_id=RUN).to_pylist()
    confirmed = [r for r in rows if r["decision"] == "moved" and r["confirmed_at"] is not None]
    # A message the first driver published, whose DLQ ack the kill stopped, comes back
    # redelivered and is published again: the ledger names that copy by a confirmed,
    # redelivered row repeating a confirmed row's content.
    seen: set[tuple[object, ...]] = set()
    repeats = 0
    for r in sorted(confirmed, key=lambda r: r["position"]):
        content = (r["body_sha256"], r["properties_sha256"], r["message_id"])
        repeats += r["redelivered"] and content in seen
        seen.add(content)
    named = (
        len(rows)
        - len({r["position"] for r in rows})
        + sum(1 for r in rows if r["confirmed_at"] is None)
        + repeats
    )
    if repeats:
        assert f", duplicates {repeats} (named in the ledger), " in result, result
    for queue in ORIGINS:
        arrived = Counter(body for _, body in read_queue(node, vhost, queue))
        expected = Counter(m.body for m in published if m.origin == queue)
        assert not expected - arrived, f"{queue}: a dead letter is missing"
        extra = sum((arrived - expected).values())
        assert extra <= named, f"{queue}: {extra} unnamed extra copies"
    assert len({r["message_id"] for r in confirmed}) == len(published) - 1  # all but the stray
    left = read_queue(node, vhost, DLQ)  # the stray, and no fence
    assert [body for _, body in left] == [m.body for m in published if m.message_id == STRAY_ID]

    # Once finished, the run is not started again, though nothing is left to move.
    assert main(arguments) == 2
    assert "recorded as finished" in capsys.readouterr().err
