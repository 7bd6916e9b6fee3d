"""fields: property blocks read with every header's AMQP type kept."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

import pytest

from rmq_spark.selection.fields import FieldDecodeError, Typed, read_properties
from tests.support import amqp_encoding as amqp


def test_every_field_type_keeps_its_amqp_type_and_value() -> None:
    block = amqp.BasicProperties(headers=amqp.table_bytes(*amqp.one_of_every_type())).encode()
    headers = read_properties(block).headers
    assert headers["t"] == Typed("boolean", True)
    assert headers["b"] == Typed("short-short-int", -128)
    assert headers["B"] == Typed("short-short-uint", 255)
    assert headers["s"] == Typed("short-int", -32768)
    assert headers["u"] == Typed("short-uint", 65535)
    assert headers["I"] == Typed("long-int", -(2**31))
    assert headers["i"] == Typed("long-uint", 2**32 - 1)
    assert headers["l"] == Typed("long-long-int", -(2**63))
    assert headers["L"] == Typed("long-long-int", 2**63 - 1)
    assert headers["f"] == Typed("float", 1.5)
    assert headers["d"] == Typed("double", -0.1)
    assert headers["D"] == Typed("decimal", Decimal("1.500"))
    assert headers["T"] == Typed("timestamp", datetime(2023, 11, 14, 22, 13, 20))
    assert headers["S"] == Typed("long-string", "héllo wörld".encode())


def test_nested_arrays_and_tables_and_void() -> None:
    block = amqp.BasicProperties(
        headers=amqp.table_bytes(
            ("a", amqp.array(amqp.short(1), amqp.long_string("x"))),
            ("t", amqp.table(("inner", amqp.boolean(False)))),
            ("v", amqp.void()),
        )
    ).encode()
    headers = read_properties(block).headers
    assert headers["a"] == Typed("array", [Typed("short-int", 1), Typed("long-string", b"x")])
    assert headers["t"] == Typed("table", {"inner": Typed("boolean", False)})
    assert headers["v"] == Typed("void", None)


def test_basic_properties_by_name() -> None:
    block = amqp.BasicProperties(
        content_type="text/plain",
        delivery_mode=2,
        priority=7,
        message_id=b"\xffid",
        timestamp=0,
        cluster_id="c",
    ).encode()
    values = read_properties(block).values
    assert values == {
        "content_type": "text/plain",
        "delivery_mode": 2,
        "priority": 7,
        "message_id": "\\xffid",
        "timestamp": datetime(1970, 1, 1),
        "cluster_id": "c",
    }


def test_a_block_without_properties_has_none() -> None:
    found = read_properties(amqp.BasicProperties().encode())
    assert found.values == {}
    assert found.headers == {}


@pytest.mark.parametrize(
    ("block", "problem"),
    [
        (b"\x80", "ends at byte 1"),
        (b"\x80\x00\x09short", "ends at byte"),
        (
            amqp.BasicProperties(
                headers=amqp.table_bytes(("q", amqp.raw_value(b"Z", b"")))
            ).encode(),
            "unknown field type tag b'Z'",
        ),
    ],
)
def test_a_malformed_block_is_an_error_that_says_why(block: bytes, problem: str) -> None:
    with pytest.raises(FieldDecodeError, match=problem):
        read_properties(block)
