"""gc_pause: the collector is off inside the blocks, and back as it was after the last."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from rmq_spark.selection.gc_pause import collection_paused


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    was = gc.isenabled()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


def test_the_collector_is_off_inside_and_on_again_after() -> None:
    gc.enable()
    with collection_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_overlapping_blocks_on_two_threads_keep_it_off_until_the_last_ends() -> None:
    gc.enable()
    first_in, second_done = threading.Event(), threading.Event()
    seen: list[bool] = []

    def second() -> None:
        first_in.wait()
        with collection_paused():
            pass
        seen.append(gc.isenabled())  # the first block is still open
        second_done.set()

    thread = threading.Thread(target=second)
    thread.start()
    with collection_paused():
        first_in.set()
        second_done.wait()
    thread.join()
    assert seen == [False]
    assert gc.isenabled()


def test_a_collector_switched_off_before_stays_off() -> None:
    gc.disable()
    with collection_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_an_error_inside_still_restores_the_collector() -> None:
    gc.enable()
    with pytest.raises(RuntimeError), collection_paused():
        raise RuntimeError("decode failed")
    assert gc.isenabled()
