"""park/replay: what a replay publishes where, what it skips, and what it refuses.

No broker and no Spark: parked rows are written and committed as a park's executors
and driver do (delta-rs, under tmp_path), the broker is a fake publisher that records
what it was given, and the ledger is read back with delta-rs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from rmq_spark.config import JobConfig, parse_config
from rmq_spark.errors import (
    BrokerUnreachableError,
    ConfigError,
    DestinationIncompatibleError,
    TransferError,
)
from rmq_spark.ledger import tables
from rmq_spark.model import Delivery, TransferKey
from rmq_spark.park.replay import run as replay_run
from rmq_spark.park.replay.command import format_result
from rmq_spark.park.replay.journal import Journal
from rmq_spark.park.replay.plan import plan_replay, position_ranges, possibly_twice
from rmq_spark.park.replay.refusals import TargetFacts
from rmq_spark.park.replay.run import compile_where, run_replay
from rmq_spark.park.replay.targets import OriginTarget, parse_template, route_rows
from rmq_spark.park.table import commit_parked, ensure_parked_table
from rmq_spark.redrive.headers import MOVED_HEADER
from rmq_spark.selection.fields import read_properties
from rmq_spark.transfer import parked_rows
from rmq_spark.transfer.parked_rows import ParkedRowsWriter
from rmq_spark.transfer.parked_table import read_parked
from tests.support import amqp_encoding as amqp

ENV = {"DR_PASSWORD": "secret"}
ORDERS = TransferKey("dr", "shop", "orders", "parked", "shop", "orders")
REFUNDS = TransferKey("dr", "shop", "refunds", "parked", "shop", "refunds")
DLQ = TransferKey("dr", "shop", "shop.dlq", "parked", "shop", "shop.dlq")
PROPERTIES = b"\x10\x00\x02"  # delivery_mode 2: any exact bytes
SOURCE = parse_template("source")


def job_config(ledger: Path) -> JobConfig:
    text = yaml.safe_dump(
        {
            "clusters": {
                "dr": {
                    "amqp": ["amqp://127.0.0.1:5672"],
                    "management": "http://127.0.0.1:15672",
                    "password_env": "DR_PASSWORD",
                }
            },
            "routes": [
                {
                    "name": "park",
                    "source": {"cluster": "dr", "queues": ["orders"]},
                    "destination": {"table": "parked"},
                }
            ],
            "ledger": {"path": str(ledger)},
        }
    )
    return parse_config(text, ENV)


def park(
    ledger: Path,
    run_id: str,
    key: TransferKey,
    bodies: list[bytes],
    *,
    exclude: bool = False,
    blocks: list[bytes] | None = None,
) -> None:
    """Park `bodies` as a run's rows, each with PROPERTIES or its own of `blocks`."""
    ensure_parked_table(str(ledger))
    tables.ensure_tables(str(ledger))
    writer = ParkedRowsWriter(str(ledger), run_id, key, "0.0.0", exclude_body=exclude)
    found = []
    for position, body in enumerate(bodies):
        delivery = Delivery(
            tag=position + 1,
            seq=position + 1,
            position=position,
            redelivered=False,
            body_size=len(body),
            body_sha256="",
            properties_sha256="",
            message_id=None,
            consumed_at=datetime(2026, 1, 1, tzinfo=UTC),
        )
        delivery.body = body
        delivery.properties = PROPERTIES if blocks is None else blocks[position]
        delivery.properties_sha256 = hashlib.sha256(delivery.properties).hexdigest()
        found.append(delivery)
    # Two files in reverse order: the replay orders by position, not by file.
    half = len(found) // 2
    writer.write(found[half:], lambda _tag: ("", key.source_queue))
    writer.write(found[:half], lambda _tag: ("", key.source_queue))
    commit_parked(str(ledger), run_id)


class FakePublisher:
    """Records each publish; refuses queues it does not hold, or the n-th publish (the
    broker's `refusal`: a nack's TransferError, or the error another failure raises)."""

    def __init__(self, broker: Broker, cluster: str, vhost: str) -> None:
        self.broker, self.cluster, self.vhost = broker, cluster, vhost

    def require_queue(self, queue: str) -> int:
        if queue not in self.broker.queues:
            raise DestinationIncompatibleError(f"queue {queue!r}: none")
        return 0

    def publish(self, queue: str, property_bytes: bytes, body: bytes) -> None:
        broker, published = self.broker, (self.cluster, self.vhost, queue, property_bytes, body)
        if (
            broker.refuse_at is not None
            and broker.refusals_left
            and len(broker.published) == (broker.refuse_at)
        ):
            broker.refusals_left -= 1
            if broker.enqueued_before_refusal:
                broker.published.append(published)  # the broker had it; the confirm was lost
                broker.refuse_at += 1
            raise broker.refusal or TransferError(f"queue {queue!r}: nack")
        broker.published.append(published)

    def close(self) -> None:
        self.broker.closed += 1


class Broker:
    """The fake broker's AMQP side (called: a publisher) and management side (`facts`:
    its queues as classic queues without limits, or the rows given). It refuses the
    publish that would be its `refuse_at`-th, `refusals` times (every time by default);
    with `enqueued_before_refusal` the refused message is in the queue all the same, as
    when a connection is lost between the enqueue and the confirm."""

    def __init__(
        self,
        queues: set[str],
        refuse_at: int | None = None,
        rows: Mapping[str, Mapping[str, Any]] | None = None,
        refusal: BaseException | None = None,
        *,
        refusals: int = 1_000_000,
        enqueued_before_refusal: bool = False,
    ) -> None:
        self.published: list[tuple[str, str, str, bytes, bytes]] = []
        self.queues, self.refuse_at, self.rows = queues, refuse_at, rows or {}
        self.refusal, self.refusals_left = refusal, refusals
        self.enqueued_before_refusal = enqueued_before_refusal
        self.opened = self.closed = 0

    def __call__(self, cluster: str, vhost: str) -> FakePublisher:
        self.opened += 1
        return FakePublisher(self, cluster, vhost)

    def facts(self, cluster: str, vhost: str, queues: Sequence[str]) -> TargetFacts:
        return TargetFacts({q: self.rows.get(q, {"name": q, "type": "classic"}) for q in queues})


def replay(
    config: JobConfig,
    broker: Broker,
    run_id: str,
    *,
    parked: str = "park-1",
    target: Any = SOURCE,
    **options: Any,
) -> replay_run.ReplayResult:
    """`run_replay` of `parked` against the fake broker (its publishers and its facts)."""
    return run_replay(
        config,
        parked_run_id=parked,
        target=target,
        run_id=run_id,
        publisher_for=broker,
        facts_reader=broker.facts,
        **options,
    )


def bodies(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(count)]


def test_the_plan_orders_by_queue_and_position_and_skips_what_was_confirmed() -> None:
    rows = [
        {
            "source_cluster": "dr",
            "source_vhost": "v",
            "source_queue": q,
            "position": p,
            "properties": PROPERTIES,
        }
        for q, p in [("b", 1), ("a", 2), ("b", 0), ("a", 0), ("a", 1)]
    ]

    def routed(template: str) -> list[dict[str, object]]:
        return route_rows(parse_template(template), rows, parked_run_id="p", clusters=["dr"])

    plan = plan_replay(routed("source"), {("dr", "v", "a", 1, "dr", "v", "a")})
    assert [(r["source_queue"], r["position"]) for r in plan.publish] == [
        ("a", 0),
        ("a", 2),
        ("b", 0),
        ("b", 1),
    ]
    assert plan.skipped == 1
    # The same rows to another queue: another replay, nothing skipped.
    other = plan_replay(routed("dr:v:x"), {("dr", "v", "a", 1, "dr", "v", "a")})
    assert other.skipped == 0
    assert other.destinations == [("dr", "v", "x")]


def test_a_replay_publishes_each_queue_in_order_and_a_rerun_publishes_nothing(
    tmp_path: Path,
) -> None:
    park(tmp_path, "park-1", ORDERS, bodies("o", 7))
    park(tmp_path, "park-1", REFUNDS, bodies("r", 3))
    broker = Broker({"orders", "refunds"})
    config = job_config(tmp_path)

    first = replay(config, broker, "replay-1")

    assert first.verified
    assert (first.selected, first.published, first.skipped) == (10, 10, 0)
    assert broker.published == [
        ("dr", "shop", q, PROPERTIES, body)
        for q, body in [("orders", b) for b in bodies("o", 7)]
        + [("refunds", b) for b in bodies("r", 3)]
    ]
    ledger = tables.read_arrow(str(tmp_path), "messages", run_id="replay-1").to_pylist()
    assert sorted((r["destination_queue"], r["position"]) for r in ledger) == sorted(
        [("orders", p) for p in range(7)] + [("refunds", p) for p in range(3)]
    )
    assert {(r["decision"], r["reason"], r["source_cluster"]) for r in ledger} == {
        ("replayed", "park-1", "dr")
    }

    again = replay(config, broker, "replay-2")

    assert again.verified
    assert (again.published, again.skipped) == (0, 10)
    assert len(broker.published) == 10
    assert tables.read_arrow(str(tmp_path), "messages", run_id="replay-2").num_rows == 0
    runs = {r["run_id"]: r for r in tables.read_arrow(str(tmp_path), "runs").to_pylist()}
    assert (runs["replay-2"]["messages"], runs["replay-2"]["verified"]) == (0, True)


def test_a_refused_publish_stops_the_replay_and_the_rerun_publishes_only_the_rest(
    tmp_path: Path,
) -> None:
    park(tmp_path, "park-1", ORDERS, bodies("o", 6))
    config = job_config(tmp_path)
    refusing = Broker({"orders"}, refuse_at=4)

    with pytest.raises(TransferError, match="nack"):
        replay(config, refusing, "r1")

    assert tables.read_arrow(str(tmp_path), "messages", run_id="r1").num_rows == 4
    broker = Broker({"orders"})
    result = replay(config, broker, "r2")
    assert (result.published, result.skipped, result.verified) == (2, 4, True)
    assert [p[4] for p in broker.published] == bodies("o", 6)[4:]


def test_a_replay_to_one_queue_and_of_some_keys(tmp_path: Path) -> None:
    park(tmp_path, "park-1", ORDERS, bodies("o", 5))
    park(tmp_path, "park-1", REFUNDS, bodies("r", 5))
    broker = Broker({"all"})
    result = replay(
        job_config(tmp_path),
        broker,
        "r1",
        target=parse_template("dr:shop:all"),
        keys={("dr", "shop", "refunds", 4), ("dr", "shop", "orders", 1)},
    )
    assert result.verified
    assert [(p[2], p[4]) for p in broker.published] == [("all", b"o-1"), ("all", b"r-4")]


def test_bad_input_is_one_error_and_nothing_is_published(tmp_path: Path) -> None:
    park(tmp_path, "park-1", ORDERS, bodies("o", 3))
    park(tmp_path, "park-meta", ORDERS, bodies("o", 3), exclude=True)
    config = job_config(tmp_path)
    broker = Broker({"orders"})
    cases = [
        ("park-9", SOURCE, ConfigError, r"--parked 'park-9': no such parked run .*park-1"),
        (
            "park-meta",
            SOURCE,
            ConfigError,
            "3 of the 3 selected rows were parked with park.exclude_body",
        ),
        ("park-1", parse_template("dr:shop:gone"), DestinationIncompatibleError, "'gone'"),
    ]
    for parked, target, error, said in cases:
        with pytest.raises(error, match=said):
            replay(config, broker, "r", parked=parked, target=target)
    assert broker.published == []
    assert tables.read_arrow(str(tmp_path), "messages", run_id="r").num_rows == 0


def test_where_refuses_a_column_the_parked_table_does_not_hold() -> None:
    assert compile_where(None) is None
    assert compile_where("headers['tenant'] = 'a'") is not None
    with pytest.raises(ConfigError, match="body_text"):
        compile_where("body_text LIKE '%x%'")


def test_the_brake_spaces_publishes_by_the_rate(tmp_path: Path) -> None:
    park(tmp_path, "park-1", ORDERS, bodies("o", 21))
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    broker = Broker({"orders"})
    replay(
        job_config(tmp_path),
        broker,
        "r1",
        messages_per_second=10,
        clock=lambda: now[0],
        sleep=sleep,
    )
    assert len(broker.published) == 21
    # A publish goes while the bucket (one token, full at the start) is not in debt:
    # two at once, then one every 0.1 s.
    assert now[0] == pytest.approx(1.9)


def test_origin_publishes_each_row_to_its_x_death_queue_rewritten_and_says_so_in_the_ledger(
    tmp_path: Path,
) -> None:
    def dead(origin: str) -> bytes:
        headers = amqp.table_bytes(("x-death", amqp.array(amqp.death_entry(origin, "rejected"))))
        return amqp.BasicProperties(headers=headers, message_id=f"from-{origin}").encode()

    blocks = [dead("orders"), dead("refunds"), dead("orders")]
    park(tmp_path, "park-1", DLQ, bodies("d", 3), blocks=blocks)
    broker = Broker({"orders", "refunds"})
    config = job_config(tmp_path)

    result = replay(config, broker, "r1", target=OriginTarget())

    assert result.verified
    assert [(p[2], p[4]) for p in broker.published] == [
        ("orders", b"d-0"),
        ("refunds", b"d-1"),
        ("orders", b"d-2"),
    ]
    for (_, _, _, sent, _), parked in zip(broker.published, blocks, strict=True):
        assert sent != parked
        assert "x-death" not in read_properties(sent).headers
        assert MOVED_HEADER in read_properties(sent).headers
    ledger = tables.read_arrow(str(tmp_path), "messages", run_id="r1").to_pylist()
    by_position = {r["position"]: r for r in ledger}
    assert [by_position[p]["properties_sha256"] for p in range(3)] == [
        hashlib.sha256(p[3]).hexdigest() for p in broker.published
    ]
    parked = read_parked(str(tmp_path), "park-1").to_pylist()
    assert {r["properties_sha256"] for r in parked} == {
        hashlib.sha256(b).hexdigest() for b in blocks
    }
    again = replay(config, broker, "r2", target=OriginTarget())
    assert (again.published, again.skipped, again.verified) == (0, 3, True)


def test_a_target_without_room_or_of_another_schema_version_publishes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    park(tmp_path, "park-1", ORDERS, bodies("o", 5))
    full = {"name": "orders", "type": "quorum", "arguments": {"x-max-length": 4}}
    broker = Broker({"orders"}, rows={"orders": full})
    config = job_config(tmp_path)
    with pytest.raises(DestinationIncompatibleError, match="holds at most 4 messages"):
        replay(config, broker, "r1")
    monkeypatch.setattr(parked_rows, "SCHEMA_VERSION", parked_rows.SCHEMA_VERSION + 1)
    park(tmp_path, "park-2", ORDERS, bodies("o", 2))
    monkeypatch.undo()
    roomy = Broker({"orders"})
    with pytest.raises(ConfigError, match="its rows are of parked-table schema version 2, this"):
        replay(config, roomy, "r2", parked="park-2")
    assert broker.published == roomy.published == []
    assert tables.read_arrow(str(tmp_path), "messages").num_rows == 0


LOST = BrokerUnreachableError(
    "cluster dr vhost 'shop' queue 'orders': the connection was lost while a replayed "
    "message awaited its confirm (StreamLostError: Transport indicated EOF)"
)


def test_a_connection_that_stays_lost_is_one_error_that_says_what_is_recorded_and_to_run_again(
    tmp_path: Path,
) -> None:
    """Reopened `mover.reconnect_attempts` times (5) after the backoff, then given up."""
    park(tmp_path, "park-1", ORDERS, bodies("o", 6))
    config = job_config(tmp_path)
    lost = Broker({"orders"}, refuse_at=4, refusal=LOST)
    slept: list[float] = []

    with pytest.raises(BrokerUnreachableError) as raised:
        replay(config, lost, "r1", sleep=slept.append)

    assert str(raised.value) == (
        "replay r1 of parked run park-1 stopped: cluster dr vhost 'shop' queue 'orders': the "
        "connection was lost while a replayed message awaited its confirm (StreamLostError: "
        f"Transport indicated EOF); 5 reconnect(s) failed, the last: {LOST}. The 4 row(s) it "
        "confirmed are in the ledger; run the same replay again when the broker is back: it "
        "skips them and publishes the rest (the row in flight, position 4 of dr:shop:orders, "
        "was not confirmed and is published again, so its queue may hold it twice)"
    )
    assert raised.value.__cause__ is not None
    assert raised.value.__cause__.__cause__ is LOST
    assert slept == [0.5, 1.0, 2.0, 4.0, 8.0]  # mover.backoff_seconds, doubled
    assert (lost.opened, lost.closed) == (6, 6)  # each lost connection closed before the next
    assert tables.read_arrow(str(tmp_path), "messages", run_id="r1").num_rows == 4
    broker = Broker({"orders"})
    again = replay(config, broker, "r2")
    assert (again.published, again.skipped, again.verified) == (2, 4, True)
    assert [p[4] for p in broker.published] == bodies("o", 6)[4:]


@pytest.mark.parametrize("enqueued", [True, False], ids=["enqueued", "not enqueued"])
def test_a_lost_connection_is_reopened_and_the_row_in_flight_sent_again_and_named(
    enqueued: bool, tmp_path: Path
) -> None:
    """Twice lost at position 4: the replay reconnects and finishes; the row is named
    (it may be in the queue twice) and its ledger row says it was sent three times."""
    park(tmp_path, "park-1", ORDERS, bodies("o", 6))
    config = job_config(tmp_path)
    flaky = Broker(
        {"orders"}, refuse_at=4, refusal=LOST, refusals=2, enqueued_before_refusal=enqueued
    )
    slept: list[float] = []

    result = replay(config, flaky, "r1", sleep=slept.append)

    assert (result.published, result.verified, result.missing, result.duplicates) == (
        6,
        True,
        0,
        0,
    )
    assert result.reconnected == (("dr", "shop", "orders", 4, "dr", "shop", "orders"),)
    assert slept == [0.5, 1.0]
    sent = [p[4] for p in flaky.published]
    copies = 3 if enqueued else 1
    assert sent == bodies("o", 6)[:4] + [b"o-4"] * copies + [b"o-5"]
    ledger = tables.read_arrow(str(tmp_path), "messages", run_id="r1").to_pylist()
    attempts = {row["position"]: row["publish_attempts"] for row in ledger}
    assert attempts == {0: 1, 1: 1, 2: 1, 3: 1, 4: 3, 5: 1}
    shown = format_result(result)
    assert (
        "  1 row(s) were in flight when a connection was lost and were sent again after "
        "reconnecting: each may be in its queue twice\n"
        "    dr:shop:orders positions 4 -> dr:shop:orders"
    ) in shown
    assert '"reconnected": 1' in shown.splitlines()[-1]


def test_the_cli_says_a_lost_connection_in_one_line_and_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from rmq_spark.cli import main

    park(tmp_path, "park-1", ORDERS, bodies("o", 3))
    config_file = tmp_path / "job.yaml"
    config_file.write_text(
        yaml.safe_dump(
            {
                "clusters": {
                    "dr": {
                        "amqp": ["amqp://127.0.0.1:5672"],
                        "management": "http://127.0.0.1:15672",
                        "password_env": "DR_PASSWORD",
                    }
                },
                "routes": [
                    {
                        "name": "park",
                        "source": {"cluster": "dr", "queues": ["orders"]},
                        "destination": {"table": "parked"},
                    }
                ],
                "ledger": {"path": str(tmp_path)},
                # No reconnect: the connection that stays lost is not waited out.
                "mover": {"reconnect_attempts": 0},
            }
        )
    )
    monkeypatch.setenv("DR_PASSWORD", "secret")
    lost = Broker({"orders"}, refuse_at=1, refusal=LOST)
    monkeypatch.setattr(replay_run, "ConfirmedPublisher", lambda c, _cfg, v: lost(c, v))
    monkeypatch.setattr(replay_run, "management_reader", lambda _config: lost.facts)

    code = main(["replay", "--config", str(config_file), "--parked", "park-1", "--to", "source"])

    err = capsys.readouterr().err
    assert code == 2
    [line] = err.strip().splitlines()
    assert line.startswith("rmq-spark: error: replay replay-")
    assert "queue 'orders': the connection was lost" in line
    assert "run the same replay again" in line


def test_possibly_twice_names_rows_left_to_publish_an_earlier_attempt_may_have_sent() -> None:
    def row(queue: str, position: int, to: str = "q") -> dict[str, Any]:
        return {
            "source_cluster": "dr",
            "source_vhost": "v",
            "source_queue": queue,
            "position": position,
            "_to": ("dr", "v", to),
        }

    def key(queue: str, position: int, to: str = "q") -> tuple[str, str, str, int, str, str, str]:
        return ("dr", "v", queue, position, "dr", "v", to)

    publish = [row("a", p) for p in range(4, 10)] + [row("b", p) for p in range(3)]
    killed = ("killed", {key("a", p) for p in range(3, 7)})  # a3 confirmed since: not named

    interrupted, rows = possibly_twice(publish, [killed])
    assert interrupted == ("killed",)
    assert [(r["source_queue"], r["position"]) for r in rows] == [("a", 4), ("a", 5), ("a", 6)]
    # Two attempts naming the same rows: both named, each row once, in replay order.
    stopped = ("stopped", {key("b", 1), key("a", 5)})
    interrupted, rows = possibly_twice(publish, [stopped, killed])
    assert interrupted == ("killed", "stopped")
    assert [(r["source_queue"], r["position"]) for r in rows] == [
        ("a", 4),
        ("a", 5),
        ("a", 6),
        ("b", 1),
    ]
    # The same rows sent to another queue are another replay's: none.
    assert possibly_twice(publish, [("other", {key("a", 4, to="x")})]) == ((), ())
    # Nothing left to publish: nothing named, though the attempt never ended.
    assert possibly_twice([], [killed]) == ((), ())
    assert position_ranges([9, 0, 1, 2, 4, 3, 7, 10]) == "0-4, 7, 9-10"


class Killed(BaseException):
    """A SIGKILL stands in: no except clause catches it, the ledger append still runs."""


def test_a_rerun_after_a_killed_replay_names_the_rows_it_intended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replay_run, "LEDGER_BATCH", 3)
    # A SIGKILL writes nothing more: no record of the row in flight.
    monkeypatch.setattr(Journal, "stopped", lambda self, key: None)
    park(tmp_path, "park-1", ORDERS, bodies("o", 12))
    config = job_config(tmp_path)
    killed = Broker({"orders"}, refuse_at=6, refusal=Killed())
    with pytest.raises(Killed):
        replay(config, killed, "r1")
    assert tables.read_arrow(str(tmp_path), "messages", run_id="r1").num_rows == 6
    broker = Broker({"orders"})

    result = replay(config, broker, "r2")

    assert (result.published, result.skipped, result.verified) == (6, 6, True)
    assert result.interrupted == ("r1",)
    # Its last batch's intent: 6 to 8, of which 6 was in flight and 7, 8 never sent.
    assert result.possibly_twice == tuple(
        ("dr", "shop", "orders", p, "dr", "shop", "orders") for p in (6, 7, 8)
    )
    text = format_result(result)
    assert (
        "  3 row(s) published again may be in their queue twice: r1 stopped without "
        "recording its end, and may have published them after its last ledger append\n"
        "    dr:shop:orders positions 6-8 -> dr:shop:orders\n"
    ) in text
    assert '"possibly_twice": 3, "interrupted": ["r1"]' in text
    # Finished now: a third replay publishes nothing and names nothing.
    third = replay(config, broker, "r3")
    assert (third.published, third.interrupted, third.possibly_twice) == (0, (), ())
    assert "twice:" not in format_result(third)
    assert '"possibly_twice": 0, "interrupted": []' in format_result(third)


def test_a_replay_killed_before_its_first_append_is_named_by_the_rerun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replay_run, "LEDGER_BATCH", 3)
    monkeypatch.setattr(Journal, "stopped", lambda self, key: None)
    park(tmp_path, "park-1", ORDERS, bodies("o", 12))
    config = job_config(tmp_path)
    with pytest.raises(Killed):
        replay(config, Broker({"orders"}, refuse_at=0, refusal=Killed()), "r1")
    assert tables.read_arrow(str(tmp_path), "messages", run_id="r1").num_rows == 0

    result = replay(config, Broker({"orders"}), "r2")

    assert (result.published, result.skipped, result.verified) == (12, 0, True)
    assert result.interrupted == ("r1",)
    assert [key[3] for key in result.possibly_twice] == [0, 1, 2]


def test_a_rerun_after_a_failed_publish_names_only_the_row_in_flight(tmp_path: Path) -> None:
    park(tmp_path, "park-1", ORDERS, bodies("o", 12))
    config = job_config(tmp_path)
    with pytest.raises(Killed):
        replay(config, Broker({"orders"}, refuse_at=6, refusal=Killed()), "r1")

    result = replay(config, Broker({"orders"}), "r2")

    assert (result.published, result.skipped, result.verified) == (6, 6, True)
    assert result.interrupted == ("r1",)
    assert result.possibly_twice == (("dr", "shop", "orders", 6, "dr", "shop", "orders"),)
