"""Keeping message properties as the exact bytes they arrived in.

pika decodes a content header into `BasicProperties` and re-encodes it on publish.
Values survive that, AMQP field-table wire types do not: a short-int header comes
back as a long-int, a float as a double. The Shovel keeps the bytes; so do we.

The hook is one small, documented place in pika: `pika.frame.decode_frame` builds
the properties object with `pika.spec.props[class_id]()` and calls its `decode`
on the raw property bytes; `pika.frame.Header.marshal` calls `encode()` on the
object it is given. `install()` swaps the registered class for a subclass that
also keeps the raw bytes; `ForwardedProperties` hands those bytes back unchanged.
Decoding still happens (we need message_id, and users may log properties), but
nothing is ever re-encoded.
"""

from __future__ import annotations

from typing import Any

from pika import spec

_BASIC_CLASS_ID = spec.BasicProperties.INDEX


class WireBasicProperties(spec.BasicProperties):  # type: ignore[misc]
    """BasicProperties that remember the property bytes they were decoded from."""

    wire: bytes = b""

    def decode(self, encoded: bytes, offset: int = 0) -> Any:
        self.wire = bytes(encoded[offset:])
        return super().decode(encoded, offset)


class ForwardedProperties(spec.BasicProperties):  # type: ignore[misc]
    """Properties that encode to exactly the bytes they are given."""

    def __init__(self, wire: bytes) -> None:
        super().__init__()
        self.wire = wire

    def encode(self) -> list[bytes]:
        return [self.wire]


def install() -> None:
    """Make pika keep raw property bytes on every delivery decoded in this process.

    Idempotent. The subclass behaves exactly like BasicProperties otherwise, so
    other pika users in the same process are unaffected.
    """
    spec.props[_BASIC_CLASS_ID] = WireBasicProperties


def wire_bytes(properties: spec.BasicProperties) -> bytes:
    """The property bytes a delivery arrived with (requires `install()`)."""
    if not isinstance(properties, WireBasicProperties):
        raise RuntimeError(
            "delivery properties carry no wire bytes: rmq_spark.wire.install() must run "
            "before the connection receives messages"
        )
    return properties.wire


def forward(properties: spec.BasicProperties) -> ForwardedProperties:
    """Properties to publish that encode to the delivery's original bytes."""
    return ForwardedProperties(wire_bytes(properties))
