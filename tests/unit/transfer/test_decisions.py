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
from rmq_spark.transfer.executor import ExecutorSettings, route_decider
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


def test_a_routes_decider_factory_comes_before_its_select_and_a_plain_route_has_none() -> None:
    built: list[str] = []

    def factory() -> SelectDecider:
        built.append("redrive")
        return SelectDecider(Selection.compile("body_size > 0", where="factory"))

    settings = ExecutorSettings(
        run_id="r",
        ledger_path="/nowhere",
        clusters={},
        window_messages=10,
        window_bytes=1000,
        selections={"redrive": "body_size > 99", "select": "body_size > 99"},
        deciders={"redrive": factory},
    )
    redrive = route_decider(settings, "redrive")
    select = route_decider(settings, "select")
    try:
        assert built == ["redrive"]
        assert isinstance(redrive, SelectDecider)
        assert isinstance(select, SelectDecider)
        assert redrive.selection.expression == "body_size > 0"
        assert select.selection.expression == "body_size > 99"
        assert route_decider(settings, "plain") is None
    finally:
        for decider in (redrive, select):
            if decider is not None:
                decider.close()
