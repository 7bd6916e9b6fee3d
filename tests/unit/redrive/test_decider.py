"""decider: moved to the origin queue only when selected, with a known and existing origin."""

from __future__ import annotations

import pickle

from rmq_spark.redrive.decider import (
    NO_X_DEATH,
    ORIGIN_GONE,
    UNREADABLE,
    RedriveDecider,
    RedriveSpec,
    plan_counts,
)
from rmq_spark.redrive.headers import MOVED_HEADER, HeaderAction, HeaderPolicy
from rmq_spark.selection import Message, Selection
from rmq_spark.selection.fields import read_properties
from rmq_spark.transfer.decisions import KEPT, MOVED, NOT_SELECTED
from tests.support import amqp_encoding as amqp

DLQ = "shop.dlq"


def _message(queue: str | None, reason: str = "rejected", tenant: str = "acme") -> Message:
    headers: list[tuple[str, amqp.Value]] = [("tenant", amqp.long_string(tenant))]
    if queue is not None:
        entry = amqp.table(
            ("count", amqp.long_long(1)),
            ("reason", amqp.long_string(reason)),
            ("queue", amqp.long_string(queue)),
            ("exchange", amqp.long_string("shop")),
            ("routing-keys", amqp.array(amqp.long_string(f"{queue}.key"))),
            ("original-expiration", amqp.long_string("60000")),
        )
        headers.append(("x-death", amqp.array(entry)))
    block = amqp.BasicProperties(headers=amqp.table_bytes(*headers), message_id="m").encode()
    return Message("", "", False, block, b"body")


def test_each_message_goes_to_its_origin_through_the_default_exchange() -> None:
    decider = RedriveDecider(DLQ, existing={"orders", "payments"})
    found = decider.decide([_message("orders"), _message("payments", "expired")])
    assert [(d.kind, d.exchange, d.routing_key, d.reason) for d in found] == [
        (MOVED, "", "orders", "rejected"),
        (MOVED, "", "payments", "expired"),
    ]
    rewritten = found[0].properties
    assert rewritten is not None
    headers = read_properties(rewritten).headers
    assert "x-death" not in headers
    assert headers[MOVED_HEADER].type == "table"


def test_to_exchange_reroutes_with_the_recorded_exchange_and_routing_key() -> None:
    decider = RedriveDecider(DLQ, existing={"orders"}, to_exchange=True)
    [decision] = decider.decide([_message("orders")])
    assert (decision.exchange, decision.routing_key) == ("shop", "orders.key")


def test_messages_without_origin_or_with_a_gone_origin_or_unselected_stay() -> None:
    selection = Selection.compile("headers['tenant'] = 'acme'", where="--where")
    decider = RedriveDecider(DLQ, existing={"orders"}, selection=selection)
    broken = Message("", "", False, b"\x20\x00\x00\x00\x00\x09", b"")
    found = decider.decide(
        [
            _message(None),
            _message("gone"),
            _message("orders", tenant="globex"),
            broken,
            _message("orders"),
        ]
    )
    assert [(d.kind, d.reason) for d in found] == [
        (KEPT, NO_X_DEATH),
        (KEPT, ORIGIN_GONE),
        (KEPT, NOT_SELECTED),
        (KEPT, UNREADABLE),
        (MOVED, "rejected"),
    ]
    assert all(d.properties is None for d in found if d.kind == KEPT)
    unselected = RedriveDecider(DLQ, existing={"orders"}).decide([broken])
    assert [(d.kind, d.reason) for d in unselected] == [(KEPT, UNREADABLE)]


def test_keep_policy_forwards_the_exact_bytes() -> None:
    decider = RedriveDecider(DLQ, existing={"orders"}, policy=HeaderPolicy(HeaderAction.KEEP))
    [decision] = decider.decide([_message("orders")])
    assert decision.kind == MOVED
    assert decision.properties is None


def test_restore_expiration_puts_the_origin_entrys_ttl_back() -> None:
    policy = HeaderPolicy(HeaderAction.KEEP, restore_expiration=True)
    [decision] = RedriveDecider(DLQ, existing={"orders"}, policy=policy).decide(
        [_message("orders")]
    )
    assert decision.properties is not None
    assert read_properties(decision.properties).values["expiration"] == "60000"


def test_plan_counts_group_by_decision_destination_and_reason() -> None:
    decider = RedriveDecider(DLQ, existing={"orders"})
    counts = plan_counts(decider, [_message("orders"), _message("orders"), _message(None)])
    assert counts == {
        (MOVED, "orders", "rejected"): 2,
        (KEPT, DLQ, NO_X_DEATH): 1,
    }


def test_a_spec_pickled_as_for_an_executor_builds_a_decider_that_decides_alike() -> None:
    """The driver ships a RedriveSpec in the movers' closure; the executor's decider must
    decide as the one the dry run used (selection, header policy, route)."""
    spec = RedriveSpec(
        DLQ,
        frozenset({"orders"}),
        where="headers['tenant'] = 'acme'",
        broker_headers="remove",
        to_exchange=True,
    )
    shipped = pickle.loads(pickle.dumps(spec))
    here = RedriveDecider(
        DLQ,
        existing={"orders"},
        selection=Selection.compile("headers['tenant'] = 'acme'", where="--where"),
        policy=HeaderPolicy(HeaderAction.REMOVE),
        to_exchange=True,
    )
    batch = [_message("orders"), _message("orders", tenant="globex"), _message("gone")]
    there = shipped()
    try:
        assert there.decide(batch) == here.decide(batch)
        [moved, *_] = there.decide(batch)
        assert (moved.exchange, moved.routing_key) == ("shop", "orders.key")
        assert moved.properties is not None
        assert MOVED_HEADER not in read_properties(moved.properties).headers
    finally:
        there.close()
        here.close()
