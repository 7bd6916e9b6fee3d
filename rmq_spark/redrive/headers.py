"""The header policy of a redrive: what a redriven message carries of its death.

A dead-lettered message carries headers its broker owns: `x-death` (one entry per queue and
reason), the `x-first-death-*` and `x-last-death-*` summaries, and `x-delivery-count` /
`x-acquired-count` (quorum queues, 3.13+ and 4.x). Sent back as they are, they mislead:
consumers that count deliveries (Rebus, MassTransit, NServiceBus retry policies) read an
inherited count as "already failed", and on 4.x a client-carried `x-death` is taken over by
the broker at the next dead-lettering. So the policy, per message:

- `move` (the default): the broker-owned headers leave the `x-` namespace; they travel as one
  field table header named `rmq-spark-death` (their entries inside it byte for byte, in
  their order), so the history is readable and no consumer or broker treats it as its own.
  A message redriven before already has `rmq-spark-death`: the older one goes inside the
  new one under the same name, so nothing of the history is lost.
- `remove`: they are dropped (the ledger still keeps the death history).
- `keep`: they stay as they are.

`original-expiration` (the per-message TTL the broker removed when the message expired) is
restored into the `expiration` property only when asked (`restore_expiration`); by default a
redriven message has no TTL, since the one it had has already run out once.

The rewrite works on the property block's bytes (AMQP 0-9-1 section 4.2, as `fields.py`
reads them): every other property and every other header keeps its exact bytes, wire type
and order. A block the policy does not change is returned as None and never re-encoded.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import StrEnum

from rmq_spark.selection.fields import PROPERTY_LAYOUT, FieldDecodeError, table_entries

MOVED_HEADER = "rmq-spark-death"
_HEADERS_FLAG = 1 << 13
_EXPIRATION_FLAG = 1 << 8


class HeaderAction(StrEnum):
    """What happens to the broker-owned headers of a redriven message."""

    MOVE = "move"
    REMOVE = "remove"
    KEEP = "keep"


def is_broker_owned(name: str) -> bool:
    """`x-death`, `x-first-death-*`, `x-last-death-*`, `x-delivery-count`, `x-acquired-count`."""
    return (
        name in {"x-death", "x-delivery-count", "x-acquired-count"}
        or name.startswith("x-first-death-")
        or name.startswith("x-last-death-")
    )


@dataclass(frozen=True)
class HeaderPolicy:
    """The broker-owned headers' fate and whether the TTL comes back (defaults: the safe ones)."""

    broker_headers: HeaderAction = HeaderAction.MOVE
    restore_expiration: bool = False

    @property
    def changes_nothing(self) -> bool:
        return self.broker_headers is HeaderAction.KEEP and not self.restore_expiration


@dataclass
class _Block:
    """A property block split into its flags and each present property's exact bytes."""

    flags: int
    fields: dict[int, bytes]  # flag bit -> the property's bytes (length prefix included)

    def encode(self) -> bytes:
        present = [flag for _, flag, _ in PROPERTY_LAYOUT if flag in self.fields]
        flags = 0
        for flag in present:
            flags |= flag
        return struct.pack(">H", flags) + b"".join(self.fields[flag] for flag in present)


_WIDTH = {"octet": 1, "timestamp": 8}


def _split(raw: bytes) -> _Block:
    if len(raw) < 2:
        raise FieldDecodeError("a property block needs at least its two flag bytes")
    (flags,) = struct.unpack(">H", raw[:2])
    if flags & 1:
        raise FieldDecodeError("property flags continue past one word (not the basic class)")
    at = 2
    fields: dict[int, bytes] = {}
    for _, flag, kind in PROPERTY_LAYOUT:
        if not flags & flag:
            continue
        if kind == "shortstr":
            size = 1 + raw[at] if at < len(raw) else 1
        elif kind == "table":
            size = 4 + (struct.unpack(">I", raw[at : at + 4])[0] if at + 4 <= len(raw) else 0)
        else:
            size = _WIDTH[kind]
        if at + size > len(raw):
            raise FieldDecodeError(
                f"the block ends at byte {len(raw)}; a property needs {at + size}"
            )
        fields[flag] = raw[at : at + size]
        at += size
    return _Block(flags, fields)


def _short_string(value: str) -> bytes:
    raw = value.encode()
    if len(raw) > 255:
        raise FieldDecodeError(f"a short string of {len(raw)} bytes does not fit")
    return struct.pack(">B", len(raw)) + raw


def _long(raw: bytes) -> bytes:
    return struct.pack(">I", len(raw)) + raw


def rewrite(raw: bytes, policy: HeaderPolicy, original_expiration: str | None) -> bytes | None:
    """The property block with the policy applied, or None when it changes nothing.

    `original_expiration` is the origin `x-death` entry's `original-expiration` (None when
    the message did not die of its TTL). Raises `FieldDecodeError` on a block that does not
    follow the grammar; the caller keeps such a message where it is.

    >>> rewrite(b"\\x80\\x00\\x04text", HeaderPolicy(), None) is None
    True
    """
    if policy.changes_nothing:
        return None
    block = _split(raw)
    changed = False
    headers = block.fields.get(_HEADERS_FLAG)
    if headers is not None and policy.broker_headers is not HeaderAction.KEEP:
        entries = table_entries(headers[4:])
        owned = [entry for name, entry, _ in entries if is_broker_owned(name)]
        if owned:
            changed = True
            rest = [entry for name, entry, _ in entries if not is_broker_owned(name)]
            if policy.broker_headers is HeaderAction.MOVE:
                earlier = [entry for name, entry, _ in entries if name == MOVED_HEADER]
                rest = [
                    entry
                    for name, entry, _ in entries
                    if not is_broker_owned(name) and name != MOVED_HEADER
                ]
                history = b"".join(owned + earlier)
                rest.append(_short_string(MOVED_HEADER) + b"F" + _long(history))
            if rest:
                block.fields[_HEADERS_FLAG] = _long(b"".join(rest))
            else:
                del block.fields[_HEADERS_FLAG]
    if (
        policy.restore_expiration
        and original_expiration is not None
        and _EXPIRATION_FLAG not in block.fields
    ):
        block.fields[_EXPIRATION_FLAG] = _short_string(original_expiration)
        changed = True
    return block.encode() if changed else None
