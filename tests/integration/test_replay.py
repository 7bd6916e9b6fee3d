"""`rmq-spark replay`: a parked run back into queues, byte for byte, in order, once.

Real nodes (3.10 from the host, 4.3 from its root), real Spark, real Delta. A queue is
filled by pika through a direct exchange (test_park's messages: every basic property,
headers of many AMQP types, in the form every version delivers unchanged) and parked;
the replay puts the rows back; an independent pika consumer (the raw content-header
bytes kept, as `drain_fingerprints` does) reads the queue and finds the published
property bytes and bodies (sha256 of each) in the published order. A second replay of
the same parked run publishes nothing; `--where` replays exactly the rows Spark SQL
selects; bad input is one error and publishes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from rmq_spark.cli import main
from rmq_spark.errors import ConfigError, DestinationIncompatibleError
from rmq_spark.ledger import tables
from rmq_spark.park.replay.run import compile_where, run_replay, selected_keys
from rmq_spark.park.replay.targets import parse_template
from rmq_spark.park.run import run_park
from rmq_spark.park.table import read_parked_spark
from tests.support.brokers import Brokers, declare, depth, fresh_vhost
from tests.support.matrix import SOAK
from tests.support.parking import QUEUE, park_config, published, read_queue, seed

MESSAGES = 3_000
WHERE = "headers['tenant'] IN ('tenant-07', 'tenant-21') OR message_id LIKE '%7'"


def ledger_rows(tmp_path: Path, run_id: str) -> list[dict[str, Any]]:
    table = tables.read_arrow(str(tmp_path / "ledger"), "messages", run_id=run_id)
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows


@pytest.mark.parametrize("brokers_of_version", ["3.10", "4.3"], indirect=True)
# Issue 27's size, 100,000, in `make soak` (about 4 min a version; the figures printed).
@pytest.mark.parametrize("messages", [MESSAGES, pytest.param(100_000, marks=SOAK)])
def test_a_parked_queue_replayed_to_its_source_is_byte_identical_in_order_and_only_once(
    brokers_of_version: Brokers,
    version_password_env: str,
    tmp_path: Path,
    spark: SparkSession,
    messages: int,
) -> None:
    brokers = brokers_of_version
    vhost = fresh_vhost(brokers, "replay")
    seed(brokers.dr, vhost, messages)
    config = park_config(tmp_path, brokers, vhost)
    parked = run_park(spark, config, run_id="park-1")
    assert parked.verified
    assert depth(brokers.dr, vhost, QUEUE) == 0

    first = run_replay(
        config, parked_run_id="park-1", target=parse_template("source"), run_id="replay-1"
    )
    print(f"{messages} messages: park {parked.seconds:.1f} s, replay {first.seconds:.1f} s")

    assert first.verified
    assert (first.selected, first.published, first.skipped) == (messages, messages, 0)
    assert depth(brokers.dr, vhost, QUEUE) == messages
    rows = ledger_rows(tmp_path, "replay-1")
    assert sorted(r["position"] for r in rows) == list(range(messages))
    assert {(r["decision"], r["reason"], r["destination_queue"]) for r in rows} == {
        ("replayed", "park-1", QUEUE)
    }
    assert all(r["confirmed_at"] is not None for r in rows)

    again = run_replay(
        config, parked_run_id="park-1", target=parse_template("source"), run_id="replay-2"
    )

    assert again.verified
    assert (again.published, again.skipped) == (0, messages)
    assert depth(brokers.dr, vhost, QUEUE) == messages
    assert ledger_rows(tmp_path, "replay-2") == []
    expected = published(vhost, messages)
    found = read_queue(brokers.dr, vhost, QUEUE)
    assert [m["message_id"] for m in found] == [e["message_id"] for e in expected]
    assert [m["properties_sha256"] for m in found] == [e["properties_sha256"] for e in expected]
    assert [m["body_sha256"] for m in found] == [e["body_sha256"] for e in expected]


@pytest.mark.parametrize("brokers_of_version", ["3.10"], indirect=True)
def test_where_replays_exactly_the_rows_spark_sql_selects_to_one_queue(
    brokers_of_version: Brokers, version_password_env: str, tmp_path: Path, spark: SparkSession
) -> None:
    brokers = brokers_of_version
    vhost = fresh_vhost(brokers, "replay-where")
    seed(brokers.dr, vhost, MESSAGES)
    config = park_config(tmp_path, brokers, vhost)
    assert run_park(spark, config, run_id="park-w").verified
    declare(brokers.dr, vhost, "orders.replayed")
    ledger = str(tmp_path / "ledger")
    by_spark = [
        row["message_id"]
        for row in read_parked_spark(spark, ledger)
        .where(F.col("run_id") == "park-w")
        .where(WHERE)
        .orderBy("position")
        .select("message_id")
        .collect()
    ]
    selection = compile_where(WHERE)
    assert selection is not None

    result = run_replay(
        config,
        parked_run_id="park-w",
        target=parse_template(f"dr:{vhost}:orders.replayed"),
        run_id="replay-w",
        keys=selected_keys(spark, ledger, "park-w", selection),
    )

    assert 0 < len(by_spark) < MESSAGES
    assert result.verified
    assert result.published == len(by_spark)
    assert [m["message_id"] for m in read_queue(brokers.dr, vhost, "orders.replayed")] == by_spark
    assert depth(brokers.dr, vhost, QUEUE) == 0


@pytest.mark.parametrize("brokers_of_version", ["3.10"], indirect=True)
def test_bad_input_is_one_error_and_publishes_nothing(
    brokers_of_version: Brokers,
    version_password_env: str,
    tmp_path: Path,
    spark: SparkSession,
    capsys: pytest.CaptureFixture[str],
) -> None:
    brokers = brokers_of_version
    vhost = fresh_vhost(brokers, "replay-bad")
    seed(brokers.dr, vhost, 50)
    config = park_config(tmp_path, brokers, vhost)
    assert run_park(spark, config, run_id="park-full").verified
    seed(brokers.dr, vhost, 50)
    assert run_park(
        spark,
        park_config(tmp_path, brokers, vhost, park={"exclude_body": True}),
        run_id="park-meta",
    ).verified
    config_file = str(tmp_path / "job.yaml")

    # A parked run id that does not exist, through the CLI: exit 2, one line.
    code = main(["replay", "--config", config_file, "--parked", "park-x", "--to", "source"])
    assert code == 2
    assert "no such parked run in the ledger's parked table (its runs: park-full, park-meta)" in (
        capsys.readouterr().err
    )
    with pytest.raises(ConfigError, match="50 of the 50 selected rows were parked with"):
        run_replay(config, parked_run_id="park-meta", target=parse_template("source"), run_id="r")
    with pytest.raises(DestinationIncompatibleError, match="expected an existing queue"):
        run_replay(
            config,
            parked_run_id="park-full",
            target=parse_template(f"dr:{vhost}:no.such.queue"),
            run_id="r",
        )
    assert depth(brokers.dr, vhost, QUEUE) == 0
    assert ledger_rows(tmp_path, "r") == []
