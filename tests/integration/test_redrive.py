"""`rmq-spark redrive` against a DLQ the broker filled itself (tests/support/dead_letters.py).

On 3.10 and 4.3: what x-death says on each (the origin is the newest entry, also after a
second death), the dry run's counts by origin and reason with the DLQ left as it was, and
the bad input refused with exit 2 and nothing moved.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from rmq_spark.cli import main
from rmq_spark.devtools.demo import wait_for_depth
from rmq_spark.devtools.local_brokers import LocalNode
from rmq_spark.redrive.headers import HeaderAction, HeaderPolicy, rewrite
from rmq_spark.redrive.origin import death_entries, origin
from rmq_spark.selection.fields import read_properties
from rmq_spark.transfer.amqp091 import peek, wire
from tests.support.brokers import Brokers, depth, fresh_vhost, seed, write_config
from tests.support.dead_letters import (
    EXPIRING,
    ORIGINS,
    make_dead_letters,
    read_queue,
)

pytestmark = pytest.mark.parametrize("brokers_of_version", ["3.10", "4.3"], indirect=True)

PER_QUEUE = 6
DLQ = "shop.dlq"
WHERE = "last_death.reason = 'rejected' AND headers['tenant'] = 'acme'"


def _message_id(properties: bytes) -> str | None:
    value = read_properties(properties).values.get("message_id")
    return None if value is None else str(value)


def test_the_origin_is_the_newest_x_death_entry_also_after_a_second_death(
    brokers_of_version: Brokers,
) -> None:
    node = brokers_of_version.dr
    vhost = fresh_vhost(brokers_of_version, "redrive-origin")
    published = make_dead_letters(node, vhost, DLQ, per_queue=2)
    first = read_queue(node, vhost, DLQ)
    assert [_message_id(p) for p, _ in first] == [m.message_id for m in published]
    for (properties, _), sent in zip(first, published, strict=True):
        found = origin(read_properties(properties), DLQ)
        read = None if found is None else (found.queue, found.reason)
        assert read == ((sent.origin, sent.reason) if sent.origin else None)

    # A client sends the first rejected message on to the TTL queue, x-death and all (as a
    # retry would); it expires there and dies a second time. 3.10 takes the client's
    # x-death in and adds to it; 4.3 starts a new one (the history is the client's to keep).
    properties, body = first[0]
    assert _message_id(properties) == "orders-0"
    _publish(node, vhost, EXPIRING, _with_expiration(properties, "20"), body)
    [(again, _)] = _wait_for(node, vhost, DLQ, 1)
    kept_history = [("orders", "rejected")] if brokers_of_version.dr.version == "3.10" else []
    assert [(e.queue, e.reason) for e in death_entries(read_properties(again))] == [
        (EXPIRING, "expired"),
        *kept_history,
    ]

    # Two deaths the broker records itself: rejected in one queue, expired in the next.
    _declare(node, vhost, "hop", {"x-message-ttl": 20, "x-dead-letter-routing-key": DLQ})
    _declare(node, vhost, "hop.source", {"x-dead-letter-routing-key": "hop"})
    _publish(node, vhost, "hop.source", published[0].properties, published[0].body)
    _reject_one(node, vhost, "hop.source")
    [(twice, _)] = _wait_for(node, vhost, DLQ, 1)
    assert [(e.queue, e.reason) for e in death_entries(read_properties(twice))] == [
        ("hop", "expired"),
        ("hop.source", "rejected"),
    ]
    found = origin(read_properties(twice), DLQ)
    assert found is not None
    assert found.queue == "hop"


def _publish(node: LocalNode, vhost: str, queue: str, properties: bytes, body: bytes) -> None:
    wire.install()
    connection = node.connect(vhost)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("", queue, body, properties=wire.ForwardedProperties(properties))
    finally:
        connection.close()


def _declare(node: LocalNode, vhost: str, queue: str, arguments: dict[str, object]) -> None:
    connection = node.connect(vhost)
    try:
        connection.channel().queue_declare(
            queue, durable=True, arguments={"x-dead-letter-exchange": "", **arguments}
        )
    finally:
        connection.close()


def _reject_one(node: LocalNode, vhost: str, queue: str) -> None:
    connection = node.connect(vhost)
    try:
        channel = connection.channel()
        for method, _properties, _body in channel.consume(queue, inactivity_timeout=30):
            assert method is not None, f"{queue}: nothing to reject"
            channel.basic_reject(method.delivery_tag, requeue=False)
            break
        channel.cancel()
    finally:
        connection.close()


def _with_expiration(block: bytes, expiration: str) -> bytes:
    restored = rewrite(block, HeaderPolicy(HeaderAction.KEEP, restore_expiration=True), expiration)
    assert restored is not None
    return restored


def _wait_for(node: LocalNode, vhost: str, queue: str, count: int) -> list[tuple[bytes, bytes]]:
    connection = node.connect(vhost)
    try:
        wait_for_depth(connection.channel(), queue, count)
    finally:
        connection.close()
    return read_queue(node, vhost, queue)


def test_dry_run_counts_by_origin_and_reason_and_leaves_the_dlq_as_it_was(
    brokers_of_version: Brokers,
    version_password_env: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    node = brokers_of_version.dr
    vhost = fresh_vhost(brokers_of_version, "redrive-dry-run")
    published = make_dead_letters(node, vhost, DLQ, per_queue=PER_QUEUE)
    config = write_config(
        tmp_path / "job.yaml", brokers_of_version, vhosts=[vhost], ledger=tmp_path / "ledger"
    )

    code = main(
        [
            "redrive",
            "--config",
            str(config),
            "--queue",
            f"dr:{vhost}:{DLQ}",
            "--where",
            WHERE,
            "--dry-run",
        ]
    )

    out = capsys.readouterr().out
    assert code == 0, out
    lines = [line.split() for line in out.splitlines()[2:]]
    half = PER_QUEUE // 2
    assert lines == [
        ["moved", "orders", "rejected", str(half)],
        ["moved", "payments", "rejected", str(half)],
        # The stray has no x-death, so no last_death: the expression is NULL for it.
        ["kept", DLQ, "not", "selected", str(PER_QUEUE + 2 * half + 1)],
    ]
    after = read_queue(node, vhost, DLQ)
    assert [_message_id(p) for p, _ in after] == [m.message_id for m in published]
    assert [body for _, body in after] == [m.body for m in published]
    for origin_queue in ORIGINS:
        assert depth(node, vhost, origin_queue) == 0


def test_bad_input_is_one_error_exit_2_and_nothing_moves(
    brokers_of_version: Brokers,
    version_password_env: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    node = brokers_of_version.dr
    vhost = fresh_vhost(brokers_of_version, "redrive-bad-input")
    seed(node, vhost, "plain", 5)
    config = write_config(
        tmp_path / "job.yaml", brokers_of_version, vhosts=[vhost], ledger=tmp_path / "ledger"
    )
    cases = [
        (["--queue", f"dr:{vhost}:missing.dlq"], "has no queue 'missing.dlq'"),
        (["--queue", f"dr:{vhost}:plain"], "none of its 5 messages has an x-death"),
        (["--queue", f"dr:{vhost}:plain", "--where", "headers['a'] = = 'b'"], "position 16"),
        (["--queue", f"dr:{vhost}:plain", "--where", "tenant = 'a'"], "unknown column 'tenant'"),
    ]
    for arguments, problem in cases:
        code = main(["redrive", "--config", str(config), *arguments])
        err = capsys.readouterr().err
        assert code == 2, arguments
        assert problem in err
        assert len(err.strip().splitlines()) == 1
    assert depth(node, vhost, "plain") == 5


class _Holder(threading.Thread):
    """Another consumer of the DLQ, on its own connection and thread: it takes every
    message and acks none, until `release` is set; then its connection closes and the
    broker puts them back."""

    def __init__(self, node: LocalNode, vhost: str, queue: str, count: int) -> None:
        super().__init__(daemon=True)
        self.node, self.vhost, self.queue, self.count = node, vhost, queue, count
        self.holding, self.release = threading.Event(), threading.Event()
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            connection = self.node.connect(self.vhost)
            channel = connection.channel()
            channel.basic_qos(prefetch_count=self.count)
            deliveries = channel.consume(self.queue, inactivity_timeout=30)
            for held, (method, _, _) in enumerate(deliveries, start=1):
                assert method is not None, f"{held - 1} of {self.count} delivered"
                if held == self.count:
                    break
            self.holding.set()
            while not self.release.is_set():
                connection.process_data_events(time_limit=0.1)  # answers heartbeats
            connection.close()
        except BaseException as exc:  # the test's thread reports it
            self.failure = exc
            self.holding.set()


class _ReleaseWhenWaiting(logging.Handler):
    """Sets `waiting` once the redrive logs that it waits for the other consumer."""

    def __init__(self, waiting: threading.Event) -> None:
        super().__init__()
        self.waiting = waiting

    def emit(self, record: logging.LogRecord) -> None:
        if "other consumer(s); waiting" in record.getMessage():
            self.waiting.set()


def test_a_dlq_another_consumer_holds_is_waited_for_and_refused_if_it_stays(
    brokers_of_version: Brokers,
    version_password_env: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A declare counts ready messages only: the messages another consumer holds (an
    interrupted redrive's, until the broker closes its connection) would be left out."""
    node = brokers_of_version.dr
    vhost = fresh_vhost(brokers_of_version, "redrive-held")
    published = make_dead_letters(node, vhost, DLQ, per_queue=2)
    config = write_config(
        tmp_path / "job.yaml", brokers_of_version, vhosts=[vhost], ledger=tmp_path / "ledger"
    )
    dry_run = ["redrive", "--config", str(config), "--queue", f"dr:{vhost}:{DLQ}", "--dry-run"]

    # A consumer that stays is refused, in one line, with nothing read or moved.
    stays = _Holder(node, vhost, DLQ, len(published))
    stays.start()
    assert stays.holding.wait(60)
    assert stays.failure is None, stays.failure
    monkeypatch.setattr(peek, "OTHER_READER_SECONDS", 1.0)
    assert main(dry_run) == 2
    err = capsys.readouterr().err
    assert "1 other consumer(s) still read it" in err, err
    assert len(err.strip().splitlines()) == 1
    stays.release.set()
    stays.join(30)

    # A consumer that goes while the redrive waits: every message is counted.
    goes = _Holder(node, vhost, DLQ, len(published))
    goes.start()
    assert goes.holding.wait(60)
    assert goes.failure is None, goes.failure
    monkeypatch.setattr(peek, "OTHER_READER_SECONDS", 60.0)
    watcher, logger = _ReleaseWhenWaiting(goes.release), logging.getLogger(peek.__name__)
    level = logger.level
    logger.setLevel(logging.INFO)  # under pytest the root logger passes WARNING up only
    logger.addHandler(watcher)
    try:
        code = main(dry_run)
    finally:
        logger.removeHandler(watcher)
        logger.setLevel(level)
    goes.join(30)
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert goes.release.is_set(), "the redrive did not wait for the other consumer"
    assert out.splitlines()[0] == f"redrive of dr:{vhost}:{DLQ}: {len(published)} messages"
    after = read_queue(node, vhost, DLQ)
    assert sorted(str(_message_id(p)) for p, _ in after) == sorted(m.message_id for m in published)


def test_a_dry_run_of_a_quorum_dlq_keeps_its_order_and_what_it_costs_is_known(
    brokers_of_version: Brokers,
    version_password_env: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    node = brokers_of_version.dr
    vhost = fresh_vhost(brokers_of_version, "redrive-quorum-dry-run")
    published = make_dead_letters(
        node, vhost, DLQ, per_queue=2, dlq_arguments={"x-queue-type": "quorum"}
    )
    config = write_config(
        tmp_path / "job.yaml", brokers_of_version, vhosts=[vhost], ledger=tmp_path / "ledger"
    )
    for _ in range(2):
        assert (
            main(["redrive", "--config", str(config), "--queue", f"dr:{vhost}:{DLQ}", "--dry-run"])
            == 0
        )
    capsys.readouterr()

    after = read_queue(node, vhost, DLQ)
    assert [_message_id(p) for p, _ in after] == [m.message_id for m in published]
    counts = {
        name: sorted({_header(p, name) for p, _ in after}, key=lambda v: -1 if v is None else v)
        for name in ("x-delivery-count", "x-acquired-count")
    }
    print(brokers_of_version.dr.version, counts)
    if brokers_of_version.dr.version == "3.10":
        # Measured on 3.10: each dry run's return is one delivery of every message.
        assert counts == {"x-delivery-count": [2], "x-acquired-count": [None]}
    else:
        # Measured on 4.3: each dry run is one acquisition of every message, and the
        # delivery count rises too (2 or 3 after two dry runs and this read).
        assert counts["x-acquired-count"] == [2], counts
        assert all(value is not None and value >= 2 for value in counts["x-delivery-count"])


def _header(properties: bytes, name: str) -> int | None:
    found = read_properties(properties).headers.get(name)
    return None if found is None else int(found.value)
