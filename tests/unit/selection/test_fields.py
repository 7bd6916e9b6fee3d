"""fields: property blocks read with every header's AMQP type kept."""

from __future__ import annotations

import struct
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


def test_a_repeated_header_entry_is_decoded_once_and_shared() -> None:
    # Two messages of a queue: same tenant and tags, different sequence numbers.
    def block(sequence: int) -> bytes:
        return amqp.BasicProperties(
            headers=amqp.table_bytes(
                ("tenant", amqp.long_string("t-07")),
                ("tags", amqp.array(amqp.long_string("a"), amqp.short(2))),
                ("sequence", amqp.long_long(sequence)),
            )
        ).encode()

    first, second, third = (read_properties(block(n)).headers for n in (1, 2, 3))
    assert third["tags"] == Typed("array", [Typed("long-string", b"a"), Typed("short-int", 2)])
    # Kept decoded from the second sighting on; the first only noted its bytes.
    assert third["tags"] is second["tags"]
    assert third["tenant"] is second["tenant"]
    assert first["tags"] == second["tags"]
    assert [headers["sequence"] for headers in (first, second, third)] == [
        Typed("long-long-int", n) for n in (1, 2, 3)
    ]


def test_a_long_header_entry_is_not_kept_and_decodes_each_time() -> None:
    block = amqp.BasicProperties(
        headers=amqp.table_bytes(("trace", amqp.long_string("x" * 1000)))
    ).encode()
    first, second, third = (read_properties(block).headers for _ in range(3))
    assert first == second == third == {"trace": Typed("long-string", b"x" * 1000)}
    assert third["trace"] is not second["trace"]


def test_a_header_named_twice_keeps_the_last_also_when_seen_before() -> None:
    block = amqp.BasicProperties(
        headers=amqp.table_bytes(("k", amqp.short(1)), ("k", amqp.short(2)))
    ).encode()
    for _ in range(2):
        assert read_properties(block).headers == {"k": Typed("short-int", 2)}


def test_an_entry_longer_than_its_table_is_still_an_error_after_a_whole_one() -> None:
    read_properties(
        amqp.BasicProperties(headers=amqp.table_bytes(("name", amqp.long_string("value")))).encode()
    )
    # The same name and value, its length saying 10 bytes where the table holds 5.
    cut = amqp.raw_value(b"S", struct.pack(">I", 10) + b"value")
    block = amqp.BasicProperties(headers=amqp.table_bytes(("name", cut))).encode()
    with pytest.raises(FieldDecodeError, match="ends at byte"):
        read_properties(block)
