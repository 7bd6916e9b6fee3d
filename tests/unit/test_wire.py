"""Property bytes pass through pika unchanged (the hook in rmq_spark.wire)."""

from __future__ import annotations

import struct

import pytest
from pika import frame, spec

from rmq_spark import wire

_HEADERS_FLAG = 1 << 13
_DELIVERY_MODE_FLAG = 1 << 12


def short_str(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">B", len(raw)) + raw


def raw_properties() -> bytes:
    """headers {'n': short-int 7, 'f': float 1.5}, delivery-mode 2, as a Java client sends them."""
    table = (
        short_str("n")
        + b"s"
        + struct.pack(">h", 7)
        + short_str("f")
        + b"f"
        + struct.pack(">f", 1.5)
    )
    flags = _HEADERS_FLAG | _DELIVERY_MODE_FLAG
    return struct.pack(">H", flags) + struct.pack(">I", len(table)) + table + struct.pack(">B", 2)


def header_frame(properties: bytes, body_size: int = 3) -> bytes:
    payload = struct.pack(">HHQ", spec.BasicProperties.INDEX, 0, body_size) + properties
    return (
        struct.pack(">BHI", spec.FRAME_HEADER, 1, len(payload)) + payload + bytes([spec.FRAME_END])
    )


@pytest.fixture(autouse=True)
def installed() -> None:
    wire.install()


def test_decoded_properties_keep_their_exact_bytes() -> None:
    raw = raw_properties()
    _, decoded = frame.decode_frame(header_frame(raw))
    properties = decoded.properties
    assert properties.headers["n"] == 7  # (pika 1.x even misreads the 32-bit float)
    assert properties.delivery_mode == 2
    assert wire.wire_bytes(properties) == raw


def test_pika_alone_would_change_the_wire_types() -> None:
    raw = raw_properties()
    _, decoded = frame.decode_frame(header_frame(raw))
    reencoded = b"".join(spec.BasicProperties.encode(decoded.properties))
    assert reencoded != raw  # short-int and float come back as other types


def test_forwarded_properties_marshal_to_the_original_bytes() -> None:
    raw = raw_properties()
    _, decoded = frame.decode_frame(header_frame(raw))
    outgoing = frame.Header(1, 3, wire.forward(decoded.properties)).marshal()
    assert outgoing == header_frame(raw)


def test_empty_properties_round_trip() -> None:
    raw = struct.pack(">H", 0)
    _, decoded = frame.decode_frame(header_frame(raw, body_size=0))
    assert wire.wire_bytes(decoded.properties) == raw
    assert frame.Header(1, 0, wire.forward(decoded.properties)).marshal() == header_frame(raw, 0)


def test_properties_not_from_the_wire_are_refused() -> None:
    with pytest.raises(RuntimeError, match="install"):
        wire.wire_bytes(spec.BasicProperties())
