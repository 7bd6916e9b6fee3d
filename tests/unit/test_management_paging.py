"""The management API's queue listing, read in pages: every page is read, in name
order, only the needed columns, and a listing that changed while paged is read again."""

from __future__ import annotations

from typing import Any

import pytest

from rmq_spark.broker import paging
from rmq_spark.errors import DiscoveryError


def pages_of(names: list[str], size: int, *, total: int | None = None) -> list[dict[str, Any]]:
    """What the API answers for a listing of `names`, `size` per page."""
    count = max(1, -(-len(names) // size))
    return [
        {
            "items": [{"name": name} for name in names[(n - 1) * size : n * size]],
            "page": n,
            "page_count": count if names else 0,
            "page_size": size,
            "total_count": len(names) if total is None else total,
            "filtered_count": len(names),
            "item_count": len(names[(n - 1) * size : n * size]),
        }
        for n in range(1, count + 1)
    ]


class Api:
    """Answers `fetch(page)` from a sequence of listings (one per reading of it)."""

    def __init__(self, *listings: list[dict[str, Any]]) -> None:
        self.listings = list(listings)
        self.fetched: list[int] = []

    def fetch(self, page: int) -> Any:
        self.fetched.append(page)
        listing = self.listings[0]
        if page == len(listing):
            self.listings = self.listings[1:] or self.listings  # the next reading differs
        return listing[page - 1]


def test_every_page_is_read_once_in_order() -> None:
    names = [f"q{i:04d}" for i in range(1203)]
    api = Api(pages_of(names, 500))

    items = paging.read_all(api.fetch, "vhost v")

    assert [item["name"] for item in items] == names
    assert api.fetched == [1, 2, 3]


def test_an_empty_vhost_is_one_page_of_nothing() -> None:
    api = Api(pages_of([], 500))

    assert paging.read_all(api.fetch, "vhost v") == []
    assert api.fetched == [1]


def test_a_plain_list_answer_is_taken_as_it_is() -> None:
    assert paging.read_all(lambda page: [{"name": "a"}], "vhost v") == [{"name": "a"}]


def test_a_listing_that_changed_while_paged_is_read_again() -> None:
    before = [f"q{i}" for i in range(10)]
    # A queue deleted between pages: page 2 reports 9 and the boundary shifted.
    torn = pages_of(before, 5)[:1] + pages_of(before[1:], 5)[1:]
    api = Api(torn, pages_of(before[1:], 5))

    items = paging.read_all(api.fetch, "vhost v")

    assert [item["name"] for item in items] == before[1:]
    assert api.fetched == [1, 2, 1, 2]


def test_a_listing_that_never_holds_still_is_one_clear_error() -> None:
    names = [f"q{i}" for i in range(10)]
    torn = pages_of(names, 5)[:1] + pages_of(names[1:], 5)[1:]
    api = Api(torn, torn, torn)

    with pytest.raises(DiscoveryError, match=r"vhost v: the listing changed while it was paged, 3"):
        paging.read_all(api.fetch, "vhost v")


def test_pages_ask_for_the_largest_page_in_name_order() -> None:
    assert paging.page_query(2) == "page=2&page_size=500&sort=name"
