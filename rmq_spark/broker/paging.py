"""Reading a management API listing in pages.

One unpaged answer for 10,000 queues is a single large JSON document the broker
builds in one go, with every queue's stats; pages (`?page=N&page_size=M`, RabbitMQ
3.x and 4.x alike) keep each answer small, and `columns=` keeps only the fields the
caller reads (it filters the items; the paging fields are always there).

Pages are read in name order. A queue created or deleted between two pages shifts
the page boundaries and could hide a queue from the listing: a listing whose total
changed between pages, or whose pages do not add up to it, is read again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from rmq_spark.errors import DiscoveryError

log = logging.getLogger(__name__)

# The largest page the management API serves (rabbit_mgmt_util refuses more than 500).
PAGE_SIZE = 500
# A listing that changed while it was paged is read again this many times at most.
ATTEMPTS = 3


def page_query(page: int, page_size: int = PAGE_SIZE) -> str:
    """The query string of one page, in name order."""
    return f"page={page}&page_size={page_size}&sort=name"


def listing(pages: list[Any]) -> list[dict[str, Any]] | None:
    """The items of a paged listing, or None if it changed while it was paged.

    A page is `{"items": [...], "page": n, "page_count": k, "total_count": t,
    "filtered_count": f, ...}`; an API that ignores paging answers a plain list,
    taken as it is.
    """
    if len(pages) == 1 and isinstance(pages[0], list):
        return list(pages[0])
    items = [item for page in pages for item in page["items"]]
    totals = {(page["total_count"], page["filtered_count"]) for page in pages}
    if len(totals) != 1 or len(items) != pages[0]["filtered_count"]:
        return None
    return items


def is_last(page: Any) -> bool:
    return not isinstance(page, dict) or int(page["page"]) >= int(page["page_count"])


def read_all(fetch: Callable[[int], Any], what: str) -> list[dict[str, Any]]:
    """Every item of a listing, `fetch(page)` answering one page (1-based)."""
    for _attempt in range(ATTEMPTS):
        pages = [fetch(1)]
        while not is_last(pages[-1]):
            pages.append(fetch(int(pages[-1]["page"]) + 1))
        items = listing(pages)
        if items is not None:
            return items
        log.info("%s: the listing changed while it was paged; reading it again", what)
    raise DiscoveryError(
        f"{what}: the listing changed while it was paged, {ATTEMPTS} times in a row; "
        "expected it to hold still for a moment (are queues being created or deleted?)"
    )
