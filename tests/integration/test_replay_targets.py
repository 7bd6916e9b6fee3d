"""`rmq-spark replay --to origin` and `--to` templates, and the targets a replay refuses.

Real nodes (3.10 from the host, 4.3 from its root), real Spark (the park, `--where`),
real Delta. For `origin` the DLQ is filled by the broker itself (tests/support/
dead_letters.py: rejected in `orders` and `payments`, expired in `invoices`, one stray
without `x-death`), parked, and replayed; an independent consumer (plain pika, the raw
property bytes kept) reads each origin queue. Bad targets are refused through the CLI
with exit 2 and one error, and nothing is published.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from pika import spec
from pyspark.sql import SparkSession

from rmq_spark.cli import main
from rmq_spark.ledger import tables
from rmq_spark.park.replay.run import compile_where, run_replay, selected_keys
from rmq_spark.park.replay.targets import OriginTarget
from rmq_spark.park.run import run_park
from rmq_spark.redrive.headers import MOVED_HEADER
from tests.support.brokers import Brokers, declare, depth, fresh_vhost, result_of
from tests.support.dead_letters import ORIGINS, make_dead_letters, read_queue
from tests.support.parking import QUEUE, park_config, published, seed

pytestmark = pytest.mark.parametrize("brokers_of_version", ["3.10", "4.3"], indirect=True)

PER_QUEUE = 20
DLQ = "shop.dlq"
MESSAGES = 40


def _decoded(properties: bytes) -> dict[str, Any]:
    """Plain pika's reading of a property block: every property, headers as a dict."""
    found = spec.BasicProperties()
    found.decode(properties)
    return {name: value for name, value in vars(found).items() if value is not None}


def _replayed_rows(ledger: str) -> list[dict[str, Any]]:
    """Every replay's rows in the ledger's `messages` table (the park's are `moved`)."""
    rows: list[dict[str, Any]] = tables.read_arrow(ledger, "messages").to_pylist()
    return [r for r in rows if r["decision"] == "replayed"]


def test_origin_replays_each_row_to_the_queue_its_x_death_names_and_never_guesses(
    brokers_of_version: Brokers,
    version_password_env: str,
    tmp_path: Path,
    spark: SparkSession,
    capsys: pytest.CaptureFixture[str],
) -> None:
    node = brokers_of_version.dr
    vhost = fresh_vhost(brokers_of_version, "replay-origin")
    sent = make_dead_letters(node, vhost, DLQ, per_queue=PER_QUEUE)
    config = park_config(tmp_path, brokers_of_version, vhost, queue=DLQ)
    assert run_park(spark, config, run_id="park-dlq").verified
    assert depth(node, vhost, DLQ) == 0
    ledger = str(tmp_path / "ledger")

    # Every row: the stray has no x-death, so the replay refuses before publishing.
    code = main(
        ["replay", "--config", str(tmp_path / "job.yaml"), "--parked", "park-dlq", "--to", "origin"]
    )
    said = capsys.readouterr().err
    assert code == 2
    assert (
        f"--to origin: 1 of the {len(sent)} selected rows of parked run 'park-dlq' have no "
        "x-death naming a queue other than the one they were parked from"
    ) in said
    assert "replay them with --to source or a queue, or leave them out with --where" in said
    assert [depth(node, vhost, queue) for queue in ORIGINS] == [0, 0, 0]
    assert _replayed_rows(ledger) == []

    # The rows with an x-death, chosen by Spark SQL: each to its origin queue.
    selection = compile_where("last_death IS NOT NULL")
    assert selection is not None
    keys = selected_keys(spark, ledger, "park-dlq", selection)
    result = run_replay(
        config, parked_run_id="park-dlq", target=OriginTarget(), run_id="replay-o", keys=keys
    )

    assert result.verified
    assert (result.selected, result.published) == (3 * PER_QUEUE, 3 * PER_QUEUE)
    assert dict(result.by_queue) == {("dr", vhost, queue): PER_QUEUE for queue in ORIGINS}
    rows = _replayed_rows(ledger)
    for queue in ORIGINS:
        arrived = read_queue(node, vhost, queue)
        expected = [m for m in sent if m.origin == queue]
        assert [body for _, body in arrived] == [m.body for m in expected], queue
        for (properties, _), message in zip(arrived, expected, strict=True):
            found = _decoded(properties)
            history = found["headers"].pop(MOVED_HEADER)
            assert not [name for name in found["headers"] if name.startswith("x-")]
            first = _decoded(message.properties)
            first.pop("expiration", None)  # the broker took the TTL; not restored by default
            assert found == first, message.message_id
            [death] = history["x-death"]
            assert (death["queue"], death["reason"]) == (queue, message.reason)
        ledger_digests = [
            r["properties_sha256"]
            for r in sorted(rows, key=lambda r: r["position"])
            if r["destination_queue"] == queue
        ]
        assert len(ledger_digests) == PER_QUEUE
        if node.version == "3.10":  # delivers the bytes as published (4.x re-encodes them)
            arrived_digests = [hashlib.sha256(p).hexdigest() for p, _ in arrived]
            assert ledger_digests == arrived_digests, queue

    again = run_replay(
        config, parked_run_id="park-dlq", target=OriginTarget(), run_id="replay-o2", keys=keys
    )
    assert (again.published, again.skipped, again.verified) == (0, 3 * PER_QUEUE, True)
    assert [depth(node, vhost, queue) for queue in ORIGINS] == [0, 0, 0]  # read_queue took them


def test_targets_that_would_refuse_are_refused_first_and_a_template_replays_beside_the_source(
    brokers_of_version: Brokers,
    version_password_env: str,
    tmp_path: Path,
    spark: SparkSession,
    capsys: pytest.CaptureFixture[str],
) -> None:
    brokers = brokers_of_version
    node = brokers.dr
    vhost = fresh_vhost(brokers, "replay-targets")
    seed(node, vhost, MESSAGES)
    config = park_config(tmp_path, brokers, vhost)
    assert run_park(spark, config, run_id="park-t").verified
    config_file = str(tmp_path / "job.yaml")
    ledger = str(tmp_path / "ledger")
    declare(node, vhost, "capped", **{"x-max-length": MESSAGES - 1, "x-overflow": "reject-publish"})
    declare(node, vhost, "policy.capped")
    node.management(
        "PUT",
        f"/api/policies/{quote(vhost, safe='')}/replay-cap",
        json={
            "pattern": r"^policy\.capped$",
            "definition": {"max-length": 10},
            "apply-to": "queues",
        },
    )
    declare(node, vhost, "log", **{"x-queue-type": "stream"})

    for to, said in [
        (
            f"dr:{vhost}:capped",
            f"holds at most {MESSAGES - 1} messages (max-length, overflow reject-publish) and "
            f"has 0; expected room for the {MESSAGES} rows replayed to it",
        ),
        (f"dr:{vhost}:policy.capped", "holds at most 10 messages (max-length, overflow drop-head)"),
        (f"dr:{vhost}:log", "is a stream, expected a classic or quorum queue"),
        ("dr:{vhost}:{queue}.missing", "expected an existing queue to replay into, found none"),
        ("dr:/:{source_queue}", "unknown placeholder {source_queue}"),
        ("source", None),  # the header policy's options are origin's
    ]:
        extra = ["--broker-headers", "keep"] if said is None else []
        code = main(["replay", "--config", config_file, "--parked", "park-t", "--to", to, *extra])
        error = capsys.readouterr().err
        with capsys.disabled():  # `pytest -rP` shows each refusal as a user sees it
            print(f"$ rmq-spark replay --parked park-t --to {to} {' '.join(extra)}\n{error}")
        assert code == 2, to
        assert (said or "apply to --to origin only") in error, error
    assert [depth(node, vhost, q) for q in (QUEUE, "capped", "policy.capped")] == [0, 0, 0]
    assert _replayed_rows(ledger) == []

    # A template: each row beside its source, on the other cluster.
    replayed = f"{QUEUE}.replayed"
    declare(brokers.main, vhost, replayed)
    code = main(
        [
            "replay",
            "--config",
            config_file,
            "--parked",
            "park-t",
            "--to",
            "main:{vhost}:{queue}.replayed",
            "--run-id",
            "replay-t",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    result = result_of(out)
    assert (result["to"], result["published"], result["verified"]) == (
        "main:{vhost}:{queue}.replayed",
        MESSAGES,
        True,
    )
    expected = published(vhost, MESSAGES)
    found = read_queue(brokers.main, vhost, replayed)
    assert [hashlib.sha256(p).hexdigest() for p, _ in found] == [
        e["properties_sha256"] for e in expected
    ]
    assert [hashlib.sha256(b).hexdigest() for _, b in found] == [e["body_sha256"] for e in expected]
    assert {(r["destination_cluster"], r["destination_queue"]) for r in _replayed_rows(ledger)} == {
        ("main", replayed)
    }
