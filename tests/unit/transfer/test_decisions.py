"""decisions: a route's selection decides a whole batch at once, in the batch's order."""

from __future__ import annotations

from rmq_spark.selection import Selection
from rmq_spark.transfer.decisions import (
    KEPT,
    MOVED,
    NOT_SELECTED,
    SelectDecider,
    batch_messages,
)
from tests.support import amqp_encoding as amqp


def _tenant(name: str | None) -> bytes:
    if name is None:
        return amqp.BasicProperties().encode()
    headers = amqp.table_bytes(("tenant", amqp.long_string(name)))
    return amqp.BasicProperties(headers=headers).encode()


def test_selected_messages_move_and_the_rest_are_kept_in_batch_order() -> None:
    decider = SelectDecider(Selection.compile("headers['tenant'] = 'acme'", where="routes[0]"))
    pending = [
        (1, False, b"a", _tenant("acme")),
        (2, False, b"b", _tenant("other")),
        (3, True, b"c", _tenant(None)),  # NULL: not selected
        (4, False, b"d", _tenant("acme")),
    ]
    decisions = decider.decide(batch_messages(pending))
    assert [d.kind for d in decisions] == [MOVED, KEPT, KEPT, MOVED]
    assert [d.reason for d in decisions] == [None, NOT_SELECTED, NOT_SELECTED, None]
    # Neither kind rewrites the message nor re-routes it: exact bytes, the link's queue.
    assert all(d.properties is None and d.routing_key is None for d in decisions)
    decider.close()


def test_an_empty_batch_has_no_decisions() -> None:
    decider = SelectDecider(Selection.compile("body_size > 0", where="routes[0]"))
    assert decider.decide([]) == []


def test_the_batch_carries_redelivered_body_and_properties() -> None:
    decider = SelectDecider(Selection.compile("redelivered AND body_text = 'x'", where="r"))
    decisions = decider.decide(
        batch_messages([(7, True, b"x", _tenant(None)), (8, False, b"x", _tenant(None))])
    )
    assert [d.kind for d in decisions] == [MOVED, KEPT]
