"""A selective move driven through fake links: kept messages go back to the source's
tail on the kept link, the source is acked only past positions settled on both links,
and the fence (not an empty queue) ends the move."""

from __future__ import annotations

from rmq_spark.model import MoveOutcome
from rmq_spark.selection import Selection
from rmq_spark.transfer.decisions import NOT_SELECTED, SelectDecider
from rmq_spark.transfer.selective import FENCE_BODY, fence_properties
from rmq_spark.transfer.session import TICK_SECONDS
from tests.support.fakes import FakeDestinationLink, MoverRig, mover_rig

FENCE = "rmq-spark-fence:run-1:orders"  # what mover_rig names its fence


def selective_rig(
    expression: str = "body_text IN ('a', 'c')", *, examine_limit: int | None = None
) -> MoverRig:
    return mover_rig(
        decider=SelectDecider(Selection.compile(expression, where="routes[0]")),
        examine_limit=examine_limit,
    )


def kept_link(rig: MoverRig) -> FakeDestinationLink:
    return rig.connector.kept_links[-1]


def open_with_fence(rig: MoverRig) -> None:
    """Source, destination and kept link open; the fence is published and confirmed."""
    rig.source.open()
    rig.source.events.on_prefetch_set()
    rig.destination.open()
    assert rig.source.consumes == 0  # not before the fence is in the source
    kept_link(rig).open()
    assert kept_link(rig).published == [FENCE_BODY]
    assert kept_link(rig).sent[0].properties == fence_properties(FENCE)
    kept_link(rig).events.on_confirm(1, multiple=False, ack=True)
    assert rig.source.consumes == 0  # not before the fence is recorded in the ledger
    assert rig.ledger.fences == []
    rig.lanes.finish("ledger")
    assert rig.ledger.fences == [FENCE]
    assert rig.source.consumes == 1


def reach_fence(rig: MoverRig, tag: int) -> None:
    rig.source.deliver(tag, FENCE_BODY, properties=fence_properties(FENCE))


def write_rows(rig: MoverRig) -> None:
    """Every ledger write, including those a finished one starts (one at a time)."""
    while rig.lanes.waiting("ledger"):
        rig.lanes.finish("ledger")


def end(rig: MoverRig) -> MoveOutcome:
    rig.timers.advance(TICK_SECONDS)
    rig.timers.run_due()  # the three links report closed
    rig.lanes.finish("ledger")
    rig.lanes.finish("intents")  # the spent intent log goes on its lane
    (outcome,) = rig.results
    assert isinstance(outcome, MoveOutcome)
    return outcome


def test_selected_go_to_the_destination_the_rest_back_to_the_source_in_order() -> None:
    rig = selective_rig()
    open_with_fence(rig)
    rig.receive(b"a", b"b", b"c", b"d", b"e")
    assert rig.destination.published == [b"a", b"c"]
    assert kept_link(rig).published == [FENCE_BODY, b"b", b"d", b"e"]  # their order kept

    rig.confirm(2)
    kept_link(rig).events.on_confirm(4, multiple=True, ack=True)  # the fence was 1
    write_rows(rig)
    assert rig.source.acked_tags == [1, 2, 3, 4, 5]
    rows = sorted(rig.ledger.rows, key=lambda row: row.position)
    assert [(row.position, row.decision) for row in rows] == [
        (0, "moved"),
        (1, "kept"),
        (2, "moved"),
        (3, "kept"),
        (4, "kept"),
    ]
    assert {row.detail.reason for row in rows if row.decision == "kept"} == {NOT_SELECTED}

    reach_fence(rig, 6)
    rig.source.deliver(7, b"b")  # a kept message, past the fence: not examined
    rig.timers.advance(TICK_SECONDS)
    assert rig.source.acks[-1].tag == 6
    assert rig.source.acks[-1].multiple
    outcome = end(rig)
    assert (outcome.status, outcome.messages, outcome.kept, outcome.bytes) == ("moved", 2, 3, 2)
    assert 7 not in rig.source.acked_tags  # it goes back with the channel
    assert rig.source.depth_asks == 0  # no drain to empty: kept ones re-enter the queue


def test_the_source_is_acked_only_past_positions_settled_on_both_links() -> None:
    rig = selective_rig()
    open_with_fence(rig)
    rig.receive(b"a", b"b", b"c")
    rig.confirm(2)  # a and c confirmed by the destination
    rig.lanes.finish("ledger")
    assert rig.source.acked_tags == [1]  # b (tag 2) waits for the kept link's confirm
    assert rig.source.acks[-1].multiple

    kept_link(rig).events.on_confirm(2, multiple=False, ack=True)  # b
    rig.timers.advance(TICK_SECONDS)
    write_rows(rig)
    assert rig.source.acked_tags == [1, 2, 3]


def test_the_fence_is_not_acked_before_everything_ahead_of_it_is_settled() -> None:
    rig = selective_rig()
    open_with_fence(rig)
    rig.receive(b"a", b"b")
    reach_fence(rig, 3)
    rig.timers.advance(TICK_SECONDS * 4)
    assert rig.source.acks == []  # nothing confirmed yet
    assert rig.results == []
    rig.confirm(1)
    kept_link(rig).events.on_confirm(2, multiple=True, ack=True)
    rig.timers.advance(TICK_SECONDS)
    write_rows(rig)
    rig.timers.advance(TICK_SECONDS)
    assert rig.source.acked_tags == [1, 2, 3]
    assert end(rig).kept == 1


def test_a_session_after_a_lost_one_reuses_the_fence_it_published() -> None:
    rig = selective_rig()
    open_with_fence(rig)
    rig.receive(b"a", b"b")
    rig.source.lose()  # before any confirm: both come back
    rig.timers.run_due()
    rig.timers.advance(60.0)  # the backoff; a new session
    assert len(rig.connector.kept_links) == 2
    rig.source.open()
    rig.source.events.on_prefetch_set()
    rig.destination.open()
    kept_link(rig).open()
    assert kept_link(rig).published == []  # no second fence
    assert rig.source.consumes == 1


def test_a_task_attempt_after_a_dead_one_publishes_no_second_fence() -> None:
    """The earlier attempt recorded its fence (`ledger/fences.py`): this one stops at it."""
    rig = mover_rig(
        decider=SelectDecider(Selection.compile("body_text = 'a'", where="routes[0]")),
        fence_recorded=True,
    )
    rig.source.open()
    rig.source.events.on_prefetch_set()
    rig.destination.open()
    kept_link(rig).open()
    assert kept_link(rig).published == []
    assert rig.source.consumes == 1
    rig.receive(b"a", b"b")
    reach_fence(rig, 3)
    rig.confirm(1)
    kept_link(rig).events.on_confirm(1, multiple=False, ack=True)  # b: its numbers from 1
    rig.timers.advance(TICK_SECONDS)
    write_rows(rig)
    rig.timers.advance(TICK_SECONDS)
    assert rig.source.acks[-1].tag == 3
    assert rig.ledger.fences == []  # nothing new to record
    outcome = end(rig)
    assert (outcome.status, outcome.messages, outcome.kept) == ("moved", 1, 1)


def test_a_fence_the_ledger_cannot_record_fails_the_move_before_it_consumes() -> None:
    rig = selective_rig()
    rig.source.open()
    rig.source.events.on_prefetch_set()
    rig.destination.open()
    kept_link(rig).open()
    kept_link(rig).events.on_confirm(1, multiple=False, ack=True)
    rig.lanes.fail_with["ledger"] = OSError("disk full")
    rig.lanes.finish("ledger")
    assert rig.source.consumes == 0
    rig.timers.advance(TICK_SECONDS)
    rig.lanes.fail_with.clear()
    outcome = end(rig)
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert "cannot record the selective move's fence" in outcome.error


def test_a_stale_fence_of_another_run_is_dropped_never_moved_or_kept() -> None:
    rig = selective_rig()
    open_with_fence(rig)
    rig.source.deliver(1, FENCE_BODY, properties=fence_properties("rmq-spark-fence:old:orders"))
    rig.receive(b"a", first_tag=2)
    assert rig.destination.published == [b"a"]
    assert kept_link(rig).published == [FENCE_BODY]  # only ours
    assert [d.position for d in rig.intents.logged] == [0]


def test_a_plain_move_opens_no_kept_link_and_publishes_no_fence() -> None:
    rig = mover_rig()
    rig.open_session()
    rig.receive(b"a")
    assert rig.connector.kept_links == []
    assert rig.destination.published == [b"a"]


def test_a_fence_taken_by_another_consumer_fails_the_move_instead_of_looping() -> None:
    rig = selective_rig(examine_limit=3)
    open_with_fence(rig)
    rig.receive(b"b", b"d", b"b")  # kept ones come round again: the fence never comes
    rig.receive(b"d", first_tag=4)  # one past the limit: not examined
    assert kept_link(rig).published == [FENCE_BODY, b"b", b"d", b"b"]
    assert rig.source.cancels == 1  # the transfer stops taking messages
    kept_link(rig).events.on_confirm(4, multiple=True, ack=True)
    rig.source.events.on_cancel_ok()
    rig.timers.advance(TICK_SECONDS)
    write_rows(rig)
    rig.timers.advance(TICK_SECONDS)
    outcome = end(rig)
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert "another consumer" in outcome.error
    assert 4 not in rig.source.acked_tags  # it stays in the source
    assert rig.source.acked_tags == [1, 2, 3]
