"""headers: the redrive's header policy rewrites property bytes and nothing else."""

from __future__ import annotations

import pytest

from rmq_spark.redrive.headers import MOVED_HEADER, HeaderAction, HeaderPolicy, rewrite
from rmq_spark.selection.fields import FieldDecodeError, Typed, read_properties, table_entries
from tests.support import amqp_encoding as amqp


def _death_entry(queue: str, reason: str, expiration: str | None = None) -> amqp.Value:
    items: list[tuple[str, amqp.Value]] = [
        ("count", amqp.long_long(1)),
        ("reason", amqp.long_string(reason)),
        ("queue", amqp.long_string(queue)),
        ("time", amqp.timestamp(1_700_000_000)),
        ("exchange", amqp.long_string("orders.x")),
        ("routing-keys", amqp.array(amqp.long_string("orders.new"))),
    ]
    if expiration is not None:
        items.insert(0, ("original-expiration", amqp.long_string(expiration)))
    return amqp.table(*items)


_BROKER = [
    ("x-first-death-exchange", amqp.long_string("orders.x")),
    ("x-first-death-queue", amqp.long_string("orders")),
    ("x-first-death-reason", amqp.long_string("rejected")),
    ("x-death", amqp.array(_death_entry("orders", "rejected"))),
    ("x-last-death-reason", amqp.long_string("rejected")),
    ("x-delivery-count", amqp.long_long(3)),
]


def _block(*headers: tuple[str, amqp.Value], expiration: str | None = None) -> bytes:
    return amqp.BasicProperties(
        content_type="application/json",
        headers=amqp.table_bytes(*headers) if headers else None,
        delivery_mode=2,
        priority=5,
        correlation_id="c-1",
        expiration=expiration,
        message_id="m-1",
        timestamp=1_700_000_000,
        type="order",
        app_id="shop",
    ).encode()


def test_the_default_moves_broker_headers_under_one_table_and_keeps_every_other_byte() -> None:
    every = amqp.one_of_every_type()
    raw = _block(every[0], *_BROKER[:3], *every[1:], *_BROKER[3:], ("tenant", amqp.short(7)))
    out = rewrite(raw, HeaderPolicy(), None)
    assert out is not None
    expected = _block(
        *every,
        ("tenant", amqp.short(7)),
        (MOVED_HEADER, amqp.table(*_BROKER)),
    )
    assert out == expected
    assert "x-delivery-count" not in read_properties(out).headers


def test_remove_drops_the_broker_headers_and_nothing_else() -> None:
    every = amqp.one_of_every_type()
    raw = _block(*_BROKER[:2], *every, *_BROKER[2:])
    out = rewrite(raw, HeaderPolicy(HeaderAction.REMOVE), None)
    assert out == _block(*every)


def test_headers_left_empty_by_the_policy_leave_the_headers_property_out() -> None:
    raw = _block(*_BROKER)
    assert rewrite(raw, HeaderPolicy(HeaderAction.REMOVE), None) == _block()


def test_keep_without_expiration_changes_nothing_and_reencodes_nothing() -> None:
    assert rewrite(_block(*_BROKER), HeaderPolicy(HeaderAction.KEEP), None) is None


def test_a_block_without_broker_headers_is_not_reencoded() -> None:
    raw = _block(("tenant", amqp.long_string("acme")))
    assert rewrite(raw, HeaderPolicy(), None) is None
    assert rewrite(_block(), HeaderPolicy(HeaderAction.REMOVE), None) is None


def test_a_second_redrive_nests_the_earlier_history_inside_the_new_one() -> None:
    earlier = (MOVED_HEADER, amqp.table(("x-death", amqp.array(_death_entry("a", "expired")))))
    raw = _block(earlier, ("tenant", amqp.short(1)), *_BROKER)
    out = rewrite(raw, HeaderPolicy(), None)
    assert out == _block(("tenant", amqp.short(1)), (MOVED_HEADER, amqp.table(*_BROKER, earlier)))


def test_restoring_the_expiration_sets_it_in_its_place_among_the_properties() -> None:
    raw = _block(("tenant", amqp.short(1)))
    out = rewrite(raw, HeaderPolicy(HeaderAction.KEEP, restore_expiration=True), "60000")
    assert out == _block(("tenant", amqp.short(1)), expiration="60000")
    assert read_properties(out).values["expiration"] == "60000"


def test_an_expiration_the_message_still_has_is_not_overwritten() -> None:
    raw = _block(expiration="5")
    policy = HeaderPolicy(HeaderAction.KEEP, restore_expiration=True)
    assert rewrite(raw, policy, "60000") is None


def test_repeated_header_names_stay_repeated() -> None:
    raw = _block(("a", amqp.short(1)), ("a", amqp.float32(2.5)), *_BROKER)
    out = rewrite(raw, HeaderPolicy(HeaderAction.REMOVE), None)
    assert out is not None
    names = [name for name, _, _ in table_entries(out_headers(out))]
    assert names == ["a", "a"]


def out_headers(block: bytes) -> bytes:
    # content_type (1 + 16 bytes) follows the flags; the headers table follows it.
    start = 2 + 1 + len("application/json")
    size = int.from_bytes(block[start : start + 4], "big")
    return block[start + 4 : start + 4 + size]


def test_a_truncated_block_is_an_error_the_caller_can_keep_the_message_for() -> None:
    raw = _block(*_BROKER)
    with pytest.raises(FieldDecodeError):
        rewrite(raw[:-3], HeaderPolicy(), None)


def test_table_entries_read_values_with_their_types() -> None:
    raw = amqp.table_bytes(("s", amqp.short(-2)), ("f", amqp.float32(0.5)))
    entries = table_entries(raw[4:])  # the entries follow the table's length
    assert [(name, value) for name, _, value in entries] == [
        ("s", Typed("short-int", -2)),
        ("f", Typed("float", 0.5)),
    ]
