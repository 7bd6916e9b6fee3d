"""Recognition: which of a resumed session's first redeliveries an earlier session moved."""

from __future__ import annotations

from collections.abc import Callable
from hashlib import sha256

from rmq_spark.model import MoveOutcome
from rmq_spark.transfer.recognition import EarlierRow, Recognition, recognition_for
from tests.support.fakes import NO_PROPERTIES, mover_rig


def checksums(body: bytes) -> tuple[str, str]:
    return (sha256(body).hexdigest(), sha256(NO_PROPERTIES).hexdigest())


def row(
    position: int,
    body: bytes,
    *,
    confirmed: bool = True,
    attempt: str = "3.0.0",
    session: int = 0,
    publish_attempts: int = 1,
    decision: str | None = "moved",
) -> EarlierRow:
    return EarlierRow(
        position, checksums(body), confirmed, attempt, session, publish_attempts, decision
    )


def killed_session(confirmed: bytes, unconfirmed: bytes) -> list[EarlierRow]:
    """A session killed with rows for `confirmed` and intents only for `unconfirmed`
    (one byte a message)."""
    rows = [row(p, bytes([b])) for p, b in enumerate(confirmed)]
    start = len(confirmed)
    rows += [row(start + p, bytes([b]), confirmed=False) for p, b in enumerate(unconfirmed)]
    # A confirmed row's intent is in the ledger too, at the same position.
    rows += [row(p, bytes([b]), confirmed=False) for p, b in enumerate(confirmed)]
    return rows


def matches(recognition: Recognition, deliveries: list[tuple[bool, bytes]]) -> list[int | None]:
    """The earlier position each delivery is, or None."""
    found: list[int | None] = []
    for redelivered, body in deliveries:
        matched = recognition.match(redelivered, checksums(body))
        found.append(None if matched is None else recognition.last_position)
    return found


def test_the_unacked_confirmed_rows_are_recognised_in_order_then_the_unconfirmed_are_not() -> None:
    recognition = recognition_for(killed_session(b"abcdef", b"xy"))
    assert recognition is not None
    found = matches(recognition, [(True, b"d"), (True, b"e"), (True, b"f"), (True, b"x")])
    assert found == [3, 4, 5, None]
    assert recognition.recognised == 3
    assert not recognition.active


def test_a_redelivery_with_other_property_bytes_matches_by_a_body_no_other_row_has() -> None:
    # A quorum queue re-encodes a redelivery's properties: the body tells it apart.
    recognition = recognition_for(killed_session(b"abc", b"x"))
    assert recognition is not None
    reencoded = (sha256(b"b").hexdigest(), sha256(b"with x-delivery-count").hexdigest())
    assert recognition.match(True, reencoded) == checksums(b"b")  # the earlier row's
    assert recognition.last_position == 1
    # A body seen at two positions (other properties each time) tells nothing apart.
    twins = [
        EarlierRow(0, (checksums(b"b")[0], "other"), True, "2.0.0", 0, 1, "moved"),
        *(
            EarlierRow(1 + e.position, e.checksums, e.confirmed, e.attempt, 0, 1, "moved")
            for e in killed_session(b"abc", b"x")
        ),
    ]
    recognition = recognition_for(twins)
    assert recognition is not None
    assert recognition.match(True, reencoded) is None
    recognition = recognition_for(twins)
    assert recognition is not None
    assert recognition.match(True, checksums(b"b")) == checksums(b"b")  # both checksums


def test_without_unconfirmed_publishes_nothing_proves_a_match() -> None:
    # No intent past the last row: a message never logged could be the next redelivery.
    assert recognition_for(killed_session(b"abc", b"")) is None


def test_nothing_is_recognised_after_the_first_delivery_that_does_not_fit() -> None:
    recognition = recognition_for(killed_session(b"abcdef", b"xy"))
    assert recognition is not None
    assert matches(recognition, [(True, b"d"), (True, b"f"), (True, b"e")]) == [3, None, None]


def test_a_first_delivery_that_is_not_redelivered_stops_recognition() -> None:
    recognition = recognition_for(killed_session(b"abcdef", b"xy"))
    assert recognition is not None
    assert matches(recognition, [(False, b"d"), (True, b"e")]) == [None, None]


def test_checksums_seen_at_two_positions_are_never_matched() -> None:
    # Two byte-identical messages: which one comes back cannot be told.
    recognition = recognition_for(killed_session(b"abcb", b"x"))
    assert recognition is not None
    assert matches(recognition, [(True, b"b")]) == [None]
    recognition = recognition_for(killed_session(b"abcb", b"x"))
    assert recognition is not None
    assert matches(recognition, [(True, b"a"), (True, b"b")]) == [0, None]


def test_only_the_last_session_of_the_transfer_is_matched() -> None:
    first = [row(p, bytes([b]), attempt="3.0.0") for p, b in enumerate(b"abc")]
    last = [row(3 + p, bytes([b]), attempt="3.0.1") for p, b in enumerate(b"def")]
    last.append(row(6, b"x", attempt="3.0.1", confirmed=False))
    recognition = recognition_for(first + last)
    assert recognition is not None
    assert matches(recognition, [(True, b"c")]) == [None]
    recognition = recognition_for(first + last)
    assert recognition is not None
    assert matches(recognition, [(True, b"e"), (True, b"f")]) == [4, 5]


def test_a_session_that_retried_or_kept_a_publish_is_not_matched() -> None:
    nacked = killed_session(b"abc", b"x")
    nacked[1] = row(1, b"b", publish_attempts=2)
    assert recognition_for(nacked) is None
    kept = killed_session(b"abc", b"x")
    kept[1] = row(1, b"b", decision="kept")
    assert recognition_for(kept) is None
    late = killed_session(b"abc", b"x")
    late.append(row(5, b"z"))  # confirmed after an unconfirmed publish: acks not in order
    assert recognition_for(late) is None


def test_nothing_earlier_recognises_nothing() -> None:
    assert recognition_for([]) is None


def test_a_resumed_mover_acks_recognised_redeliveries_without_publishing_them() -> None:
    relists: list[bool] = []

    def recognise(relist: bool) -> Recognition | None:
        relists.append(relist)
        return recognition_for(killed_session(b"abc", b"x"))

    rig = mover_rig(first_position=4, recognise=recognise)
    rig.open_session()
    for tag, body in enumerate((b"b", b"c", b"x", b"n"), start=1):
        rig.source.deliver(tag, body, redelivered=body != b"n")
    rig.timers.run_due()
    assert relists == [False]  # the task's listing: the session is its first
    rig.lanes.finish("ledger")  # the recognised rows are durable...
    assert rig.source.acked_tags == [1, 2]  # ...so they are acked, with nothing published
    rig.lanes.finish("intents")
    assert rig.destination.published == [b"x", b"n"]
    rig.confirm(2)
    rig.lanes.finish("ledger")
    assert rig.source.acked_tags == [1, 2, 3, 4]
    recognised = [r for r in rig.ledger.rows if r.decision == "recognised"]
    assert [(r.position, r.seq, r.attempts, r.reason) for r in recognised] == [
        (4, 0, 0, "moved earlier at position 1"),
        (5, 0, 0, "moved earlier at position 2"),
    ]
    assert all(r.confirmed_at == r.consumed_at for r in recognised)
    rig.drain_to_the_end()
    (outcome,) = rig.results
    assert isinstance(outcome, MoveOutcome)
    assert (outcome.messages, outcome.recognised, outcome.next_position) == (2, 2, 8)


def recording(relists: list[bool]) -> Callable[[bool], Recognition | None]:
    """A mover's `recognise` that recognises nothing and records when it was asked."""

    def recognise(relist: bool) -> Recognition | None:
        relists.append(relist)
        return None

    return recognise


def test_a_fresh_transfer_reads_nothing_earlier() -> None:
    relists: list[bool] = []
    rig = mover_rig(recognise=recording(relists))
    rig.open_session()
    rig.receive(b"a")
    assert rig.destination.published == [b"a"]
    assert relists == []


def test_a_session_after_a_lost_one_lists_the_ledger_again() -> None:
    relists: list[bool] = []
    rig = mover_rig(recognise=recording(relists))
    rig.open_session()
    rig.receive(b"a")
    rig.confirm(1)
    rig.lanes.finish("ledger")
    rig.source.lose()
    rig.timers.run_due()
    rig.timers.advance(5.0)
    assert relists == [True]
