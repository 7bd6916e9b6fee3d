"""The redrive's engine moves a DLQ the broker filled back to its origin queues (issue 26).

On 3.10 and 4.3, without Spark: the executors' `move_queue` runs one redrive transfer (the
DLQ as its source, `RedriveSpec` as its decider, the rate brake on), and an independent
consumer (plain pika, not the product's reader) checks what each queue holds after it:
exactly the selected messages in their origin queues, in order, with the body and every
property they were first published with (the header policy only moved the broker's
death headers under `rmq-spark-death`); the rest still in the DLQ in their order, no
fence left; the ledger says where each one went and why; the rate is the one asked.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from pika import spec
from pyspark.sql import SparkSession

from rmq_spark.cli import main
from rmq_spark.config import Limits, load_config
from rmq_spark.devtools.local_brokers import LocalNode
from rmq_spark.ledger import tables
from rmq_spark.redrive.decider import RedriveSpec
from rmq_spark.redrive.headers import MOVED_HEADER
from rmq_spark.redrive.preflight import DeadLetterQueue, existing_queues
from rmq_spark.report.html import build_report
from rmq_spark.transfer.executor import ExecutorSettings, move_queue
from tests.support.brokers import Brokers, fresh_vhost, write_config
from tests.support.dead_letters import (
    EXCHANGE,
    ORIGINS,
    Published,
    make_dead_letters,
    read_queue,
)

pytestmark = pytest.mark.parametrize("brokers_of_version", ["3.10", "4.3"], indirect=True)

PER_QUEUE = 50  # 151 messages: 3 s at the rate below
RATE = 50.0
DLQ = "shop.dlq"
ROUTE = "redrive"
WHERE = "last_death.reason = 'rejected' AND headers['tenant'] = 'acme'"


def _decoded(properties: bytes) -> dict[str, Any]:
    """Plain pika's reading of a property block: every property, headers as a dict."""
    found = spec.BasicProperties()
    found.decode(properties)
    return {name: value for name, value in vars(found).items() if value is not None}


def redrive(
    brokers: Brokers,
    vhost: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    *options: str,
) -> tuple[int, str, str]:
    """`rmq-spark redrive` of the vhost's DLQ with these options, as a user runs it: its
    exit code, all it printed (shown by `pytest -rP`) and its RESULT line ("" if none)."""
    config = write_config(
        tmp_path / "job.yaml", brokers, vhosts=[vhost], ledger=tmp_path / "ledger"
    )
    code = main(["redrive", "--config", str(config), "--queue", f"dr:{vhost}:{DLQ}", *options])
    out = capsys.readouterr().out
    print(out)
    results = [line for line in out.splitlines() if line.startswith("RESULT")]
    assert len(results) <= 1, out
    return code, out, results[0] if results else ""


def _selected(message: Published) -> bool:
    return message.reason == "rejected" and message.tenant == "acme"


def test_a_redrive_moves_the_selected_dead_letters_to_their_origins_at_the_rate_asked(
    brokers_of_version: Brokers, version_password_env: str, tmp_path: Path
) -> None:
    node = brokers_of_version.dr
    vhost = fresh_vhost(brokers_of_version, "redrive-move")
    published = make_dead_letters(node, vhost, DLQ, per_queue=PER_QUEUE)
    config = load_config(
        write_config(
            tmp_path / "job.yaml", brokers_of_version, vhosts=[vhost], ledger=tmp_path / "ledger"
        )
    )
    tables.ensure_tables(config.ledger.path)
    existing = existing_queues(config, DeadLetterQueue("dr", vhost, DLQ))
    settings = ExecutorSettings(
        run_id="redrive-1",
        ledger_path=config.ledger.path,
        clusters=dict(config.clusters),
        window_messages=20,
        window_bytes=1 << 24,
        rate_limits={ROUTE: Limits(messages_per_second=RATE)},
        deciders={ROUTE: RedriveSpec(DLQ, existing, where=WHERE)},
    )
    row: dict[str, object] = {
        "route": ROUTE,
        "source_cluster": "dr",
        "source_vhost": vhost,
        "source_queue": DLQ,
        "destination_cluster": "dr",
        "destination_vhost": vhost,
        "destination_queue": DLQ,
        "messages": len(published),
    }

    outcome = move_queue(row, settings, "local")
    tables.commit_run(config.ledger.path, "redrive-1")  # the driver's step, without Spark

    selected = [m for m in published if _selected(m)]
    assert len(selected) == PER_QUEUE  # half of each rejecting origin's
    assert (outcome.status, outcome.error) == ("moved", None)
    assert (outcome.messages, outcome.kept) == (len(selected), len(published) - len(selected))
    assert_redriven(node, vhost, published, config.ledger.path, "redrive-1")


def test_rmq_spark_redrive_moves_the_selected_ones_verified_with_counts_per_destination(
    brokers_of_version: Brokers,
    version_password_env: str,
    tmp_path: Path,
    spark: SparkSession,
    capsys: pytest.CaptureFixture[str],
) -> None:
    node = brokers_of_version.dr
    vhost = fresh_vhost(brokers_of_version, "redrive-cli")
    published = make_dead_letters(node, vhost, DLQ, per_queue=PER_QUEUE)
    code, out, result = redrive(
        brokers_of_version,
        vhost,
        tmp_path,
        capsys,
        *("--where", WHERE, "--messages-per-second", str(RATE), "--run-id", "redrive-cli-1"),
    )

    # docs/redrive.md's example is this output (`pytest -rP` shows it)
    assert code == 0, out
    half, rest = PER_QUEUE // 2, 2 * PER_QUEUE + 1
    assert result.startswith("RESULT verified: "), out
    assert f"examined {len(published)}, moved {PER_QUEUE}, kept {rest}, lost 0," in result
    assert "unproven" not in result
    tables_printed = [line.split() for line in out.splitlines() if line.startswith("  ")]
    # The plan (the dry run's read), then the run's decisions, then each destination.
    # The stray has no x-death, so no last_death: --where is NULL for it, not selected.
    plan = [
        ["moved", "orders", "rejected", str(half)],
        ["moved", "payments", "rejected", str(half)],
    ]
    plan += [["kept", DLQ, "not", "selected", str(rest)]]
    decisions = [line for line in tables_printed if line[0] in ("moved", "kept")]
    assert sorted(map(tuple, decisions)) == sorted(map(tuple, plan * 2)), out
    arrived = [line for line in tables_printed if line[0] in ORIGINS]
    assert arrived == [
        ["orders", str(half), "depth", "0", str(half), "0"],
        ["payments", str(half), "depth", "0", str(half), "0"],
    ], out
    assert_redriven(node, vhost, published, str(tmp_path / "ledger"), "redrive-cli-1")

    # The run's HTML report shows the same counts by destination and reason.
    page = build_report(str(tmp_path / "ledger"), "redrive-cli-1").read_text(encoding="utf-8")
    for where, reason, count in [
        ("orders", "rejected", half),
        ("payments", "rejected", half),
        (DLQ, "not selected", rest),
    ]:
        decision = "kept" if where == DLQ else "moved"
        cells = f"<td>{decision}</td><td>{where}</td><td>{reason}</td>"
        assert f'<tr>{cells}<td class="num">{count}</td></tr>' in page, where


def assert_redriven(
    node: LocalNode, vhost: str, published: list[Published], ledger: str, run_id: str
) -> None:
    """What an independent consumer and the ledger find after the redrive."""
    selected = [m for m in published if _selected(m)]
    rest = [m for m in published if not _selected(m)]

    # Each origin queue holds exactly its selected messages, in order, as first published
    # apart from the broker's death headers, which the default policy moved.
    for queue in ORIGINS:
        arrived = read_queue(node, vhost, queue)
        expected = [m for m in selected if m.origin == queue]
        assert [body for _, body in arrived] == [m.body for m in expected], queue
        for (properties, _), sent in zip(arrived, expected, strict=True):
            found = _decoded(properties)
            history = found["headers"].pop(MOVED_HEADER)
            assert not [name for name in found["headers"] if name.startswith("x-")]
            assert found == _decoded(sent.properties), sent.message_id
            [death] = history["x-death"]
            assert (death["queue"], death["reason"]) == (queue, "rejected")

    # The rest stays in the DLQ in its order, with the exact bytes it had; no fence left.
    left = read_queue(node, vhost, DLQ)
    assert [_decoded(p)["message_id"] for p, _ in left] == [m.message_id for m in rest]
    assert [body for _, body in left] == [m.body for m in rest]

    # The ledger: one confirmed row per examined message, where it went and why.
    rows = tables.read_arrow(ledger, "messages", run_id=run_id).to_pylist()
    assert len(rows) == len(published)
    assert all(r["confirmed_at"] is not None for r in rows)
    by_id = {r["message_id"]: r for r in rows}
    for message in selected:
        r = by_id[message.message_id]
        assert (r["decision"], r["publish_exchange"], r["publish_routing_key"], r["reason"]) == (
            "moved",
            "",
            message.origin,
            "rejected",
        )
    for message in rest:
        r = by_id[message.message_id]
        assert (r["decision"], r["publish_routing_key"], r["reason"]) == (
            "kept",
            None,
            "not selected",  # the stray too: --where is NULL without an x-death
        )

    # The rate brake held every publish (moved and kept) to the rate asked: over the
    # confirms' span, as the ledger recorded it, never more than 10% faster. Slower only
    # by the pauses of a loaded machine, which a brake does not make up with a burst
    # afterwards (44.1/s once, a rehearsal's load average at 10): no lower than 70%.
    confirmed = sorted(r["confirmed_at"] for r in rows)
    measured = (len(confirmed) - 1) / (confirmed[-1] - confirmed[0]).total_seconds()
    print(f"{run_id}: {len(confirmed)} confirms at {measured:.2f} msg/s (asked {RATE})")
    assert 0.7 * RATE <= measured <= 1.1 * RATE, measured


class OriginConsumer(threading.Thread):
    """The origin queue's application: a plain pika consumer that takes (acks) whatever
    arrives, on its own thread and connection, until told to stop."""

    def __init__(self, node: LocalNode, vhost: str, queue: str) -> None:
        super().__init__(daemon=True)
        self.bodies: list[bytes] = []
        self.ready, self.stop = threading.Event(), threading.Event()
        self._node, self._vhost, self._queue = node, vhost, queue

    def run(self) -> None:
        connection = self._node.connect(self._vhost)
        try:
            channel = connection.channel()
            channel.basic_consume(
                self._queue, lambda _ch, _m, _p, body: self.bodies.append(body), auto_ack=True
            )
            self.ready.set()
            while not self.stop.is_set():
                connection.process_data_events(time_limit=0.05)
        finally:
            connection.close()


def test_an_origin_with_a_consumer_is_reported_unproven_never_clean_nor_missing(
    brokers_of_version: Brokers,
    version_password_env: str,
    tmp_path: Path,
    spark: SparkSession,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Origin queues have their application's consumers: the depth cannot witness what
    arrived, so the run is verified on the DLQ's side and names the origin unproven."""
    node = brokers_of_version.dr
    vhost = fresh_vhost(brokers_of_version, "redrive-consumed")
    published = make_dead_letters(node, vhost, DLQ, per_queue=4)
    consumer = OriginConsumer(node, vhost, "orders")
    consumer.start()
    assert consumer.ready.wait(10)
    try:
        code, out, result = redrive(brokers_of_version, vhost, tmp_path, capsys)
        expected = [m.body for m in published if m.origin == "orders"]
        deadline = time.monotonic() + 10
        while len(consumer.bodies) < len(expected) and time.monotonic() < deadline:
            time.sleep(0.05)  # polling for a condition (every arrival), bounded
    finally:
        consumer.stop.set()
        consumer.join(10)

    assert code == 0, out
    assert consumer.bodies == expected
    assert result.startswith("RESULT verified: "), out
    assert result.endswith("destinations unproven (confirms only): orders"), out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("  ")}
    assert rows["orders"][1:3] == ["4", "confirms"]
    assert rows["payments"][1:] == ["4", "depth", "0", "4", "0"]
    assert rows["invoices"][1:] == ["4", "depth", "0", "4", "0"]
    left = read_queue(node, vhost, DLQ)
    assert [_decoded(p)["message_id"] for p, _ in left] == ["stray"]  # no x-death: kept


def test_to_exchange_routes_through_the_recorded_exchange_and_key_so_every_bound_queue_gets_one(
    brokers_of_version: Brokers,
    version_password_env: str,
    tmp_path: Path,
    spark: SparkSession,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--to-exchange`: each selected message is published to the exchange and routing key
    its x-death recorded (`shop`, the origin's name), so a second queue bound with that key
    receives a copy too, which the default (the origin through the default exchange) never
    sends (test_a_redrive_moves_the_selected...: the origin alone)."""
    node = brokers_of_version.dr
    vhost = fresh_vhost(brokers_of_version, "redrive-exchange")
    published = make_dead_letters(node, vhost, DLQ, per_queue=6)
    connection = node.connect(vhost)
    try:  # an audit queue bound to orders' key on the origin's exchange
        channel = connection.channel()
        channel.queue_declare("orders.audit", durable=True)
        channel.queue_bind("orders.audit", EXCHANGE, routing_key="orders")
    finally:
        connection.close()
    code, out, result = redrive(
        brokers_of_version,
        vhost,
        tmp_path,
        capsys,
        *("--where", WHERE, "--to-exchange", "--run-id", "redrive-exchange-1"),
    )

    assert code == 0, out
    assert result.startswith("RESULT verified: "), out
    selected = [m for m in published if _selected(m)]
    for queue, origin in [
        ("orders", "orders"),
        ("orders.audit", "orders"),
        ("payments", "payments"),
    ]:
        arrived = read_queue(node, vhost, queue)
        expected = [m for m in selected if m.origin == origin]
        assert [body for _, body in arrived] == [m.body for m in expected], queue
    assert read_queue(node, vhost, "invoices") == []  # expired, not selected
    rows = tables.read_arrow(str(tmp_path / "ledger"), "messages", run_id="redrive-exchange-1")
    moved = [r for r in rows.to_pylist() if r["decision"] == "moved"]
    assert sorted((r["publish_exchange"], r["publish_routing_key"]) for r in moved) == sorted(
        (EXCHANGE, m.origin) for m in selected
    )
    left = read_queue(node, vhost, DLQ)
    assert [_decoded(p)["message_id"] for p, _ in left] == [
        m.message_id for m in published if not _selected(m)
    ]


def test_dead_letters_whose_origin_queue_is_gone_stay_in_the_dlq_in_order_with_the_reason(
    brokers_of_version: Brokers,
    version_password_env: str,
    tmp_path: Path,
    spark: SparkSession,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`payments` was deleted after its messages died: they stay, in order, kept with the
    reason `origin queue gone`; the others go back to their origins."""
    node = brokers_of_version.dr
    vhost = fresh_vhost(brokers_of_version, "redrive-gone")
    published = make_dead_letters(node, vhost, DLQ, per_queue=4)
    connection = node.connect(vhost)
    try:
        connection.channel().queue_delete("payments")
    finally:
        connection.close()
    code, out, _result = redrive(brokers_of_version, vhost, tmp_path, capsys, "--run-id", "gone-1")

    assert code == 0, out
    for queue in ("orders", "invoices"):
        arrived = read_queue(node, vhost, queue)
        assert [body for _, body in arrived] == [m.body for m in published if m.origin == queue]
    stayed = [m for m in published if m.origin in ("payments", None)]
    left = read_queue(node, vhost, DLQ)
    assert [_decoded(p)["message_id"] for p, _ in left] == [m.message_id for m in stayed]
    rows = tables.read_arrow(str(tmp_path / "ledger"), "messages", run_id="gone-1").to_pylist()
    reasons = {r["message_id"]: (r["decision"], r["reason"]) for r in rows}
    for message in stayed:
        expected = "origin queue gone" if message.origin else "no x-death"
        assert reasons[message.message_id] == ("kept", expected), message.message_id


def test_an_origin_whose_ttl_drops_what_arrived_is_unproven_naming_it_never_missing(
    brokers_of_version: Brokers,
    version_password_env: str,
    tmp_path: Path,
    spark: SparkSession,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A policy gives `orders` a message TTL of 0: what the redrive delivers there expires
    at once (and dies back into the DLQ, behind the fence), so its depth never rises.
    The broker confirmed each one into the queue: the run is verified, `orders` unproven
    with its TTL named, never a false `missing`."""
    node = brokers_of_version.dr
    vhost = fresh_vhost(brokers_of_version, "redrive-ttl")
    published = make_dead_letters(node, vhost, DLQ, per_queue=4)
    node.management(
        "PUT",
        f"/api/policies/{quote(vhost, safe='')}/orders-ttl",
        json={"pattern": "^orders$", "definition": {"message-ttl": 0}, "apply-to": "queues"},
    )
    code, out, result = redrive(brokers_of_version, vhost, tmp_path, capsys, "--run-id", "ttl-1")

    assert code == 0, out
    assert result.startswith("RESULT verified: "), out
    assert result.endswith("destinations unproven (confirms only): orders (message-ttl)"), out
    assert "missing" not in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("  ")}
    assert rows["orders"][1:3] == ["4", "confirms"]
    assert rows["payments"][1:] == ["4", "depth", "0", "4", "0"]
    arrived = read_queue(node, vhost, "payments")
    assert [body for _, body in arrived] == [m.body for m in published if m.origin == "payments"]
