"""Transfers whose "/"-joined names collide keep separate identities (real brokers, Spark).

RabbitMQ allows "/" inside vhost and queue names: vhost "slash-a/b" + queue "c" and
vhost "slash-a" + queue "b/c" both read "dr/slash-a/b/c". Each must move, be
ledgered, verified and recorded as itself.
"""

from __future__ import annotations

import json
from collections import Counter
from functools import partial
from pathlib import Path

import pyarrow.compute as pc
from pyspark.sql import SparkSession

from rmq_spark.config import load_config
from rmq_spark.ledger import tables
from rmq_spark.pipeline import run_transfer
from tests.support.brokers import (
    Brokers,
    declare,
    depth,
    drain_fingerprints,
    fresh_vhost,
    seed,
    write_config,
)
from tests.support.faults import expected_fingerprints

# (vhost, queue) -> messages; distinct counts, so a swapped or merged figure shows.
TRANSFERS = {("slash-a/b", "c"): 30, ("slash-a", "b/c"): 70}


def test_transfers_whose_joined_names_collide_move_and_verify_separately(
    brokers: Brokers, password_env: str, tmp_path: Path, spark: SparkSession
) -> None:
    for vhost, _queue in TRANSFERS:
        fresh_vhost(brokers, vhost)
    for (vhost, queue), count in TRANSFERS.items():
        seed(brokers.dr, vhost, queue, count)
        declare(brokers.main, vhost, queue)
    ledger = tmp_path / "ledger"
    config = load_config(
        write_config(
            tmp_path / "job.yaml",
            brokers,
            vhosts=sorted({vhost for vhost, _ in TRANSFERS}),
            ledger=ledger,
            # One queue at a time: the second mover starts after the first's ledger
            # files exist, where a shared file prefix would make it number on from them.
            max_active=1,
        )
    )

    result = run_transfer(spark, config, run_id="slash-1")

    assert result.verification.verified, result.verification.failed_expectations
    assert {(t.source_vhost, t.source_queue) for t in result.transfers} == set(TRANSFERS)
    outcomes = {(o.key.source_vhost, o.key.source_queue): o for o in result.outcomes}
    assert {k: (o.status, o.messages) for k, o in outcomes.items()} == {
        k: ("moved", n) for k, n in TRANSFERS.items()
    }
    messages = tables.read_arrow(str(ledger), "messages", run_id="slash-1")
    queue_rows = {
        (row["source_vhost"], row["source_queue"]): row
        for row in tables.read_rows(str(ledger), "queues", "slash-1")
    }
    assert len(queue_rows) == len(TRANSFERS)
    verification = json.loads(Path(result.verification.results_path).read_text())
    verdicts = {(q["source_vhost"], q["source_queue"]): q for q in verification["queues"]}
    for (vhost, queue), count in TRANSFERS.items():
        expected = expected_fingerprints(vhost, queue, count)
        found = drain_fingerprints(partial(brokers.main.connect, vhost), queue)
        assert found == expected, f"{vhost!r} {queue!r}: destination differs from its source"
        assert depth(brokers.dr, vhost, queue) == 0
        rows = messages.filter(
            pc.and_(
                pc.equal(messages["source_vhost"], vhost),
                pc.equal(messages["source_queue"], queue),
            )
        )
        # Each transfer numbers its own drain order from 0.
        assert sorted(rows["position"].to_pylist()) == list(range(count))
        assert (
            Counter(
                zip(
                    rows["body_sha256"].to_pylist(),
                    rows["properties_sha256"].to_pylist(),
                    strict=True,
                )
            )
            == expected
        )
        row = queue_rows[(vhost, queue)]
        assert (row["status"], row["ledger_rows"], row["destination_queue"]) == (
            "moved",
            count,
            queue,
        )
        assert (row["source_depth_before"], row["destination_depth_after"]) == (count, count)
        verdict = verdicts[(vhost, queue)]
        assert (verdict["destination_vhost"], verdict["destination_queue"]) == (vhost, queue)
        assert (verdict["distinct_messages"], verdict["passed"]) == (count, True)
