"""Small HTML helpers the report's section modules share."""

from __future__ import annotations

import html


def escape(text: object) -> str:
    """`text` as HTML text or an attribute value (quotes escaped too)."""
    return html.escape(str(text), quote=True)


def size(count: float) -> str:
    """Bytes in binary units.

    >>> size(1536), size(12)
    ('1.5 KiB', '12 B')
    """
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024:
            return f"{count:,.1f} {unit}" if unit != "B" else f"{count:,.0f} B"
        count /= 1024
    return f"{count:,.1f} TiB"
