"""Telling a broker's channel closes apart: too large, consumer timeout, anything else."""

from __future__ import annotations

from datetime import UTC, datetime

from rmq_spark.model import DeliveryState
from rmq_spark.transfer.refusals import Oversize, consumer_timed_out, oversize
from rmq_spark.transfer.window import TransferWindow

# The reply texts RabbitMQ 3.10.8, 4.0.5 and 4.3.6 send (rabbit_channel.erl).
CONFIGURED = "PRECONDITION_FAILED - message size 8192 is larger than configured max size 4096"
DEFAULT = "PRECONDITION_FAILED - message size 20000000 is larger than max size 16777216"
TIMEOUT = (
    "PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out. Timeout value "
    "used: 5000 ms. This timeout value can be configured, see consumers doc guide to learn more"
)


def test_oversize_reads_the_size_and_the_limit() -> None:
    assert oversize(406, CONFIGURED) == Oversize(8192, 4096)
    assert oversize(406, DEFAULT) == Oversize(20_000_000, 16_777_216)
    assert oversize(406, TIMEOUT) is None
    assert oversize(404, CONFIGURED) is None
    assert oversize(406, "PRECONDITION_FAILED - inequivalent arg 'x-queue-type'") is None


def test_consumer_timeout_is_told_apart() -> None:
    assert consumer_timed_out(406, TIMEOUT)
    assert not consumer_timed_out(406, CONFIGURED)
    assert not consumer_timed_out(404, TIMEOUT)


def test_the_oversized_publish_is_refused_and_the_others_stay_unconfirmed() -> None:
    window = TransferWindow(10, clock=lambda: datetime(2026, 1, 1, tzinfo=UTC))
    small, big, after = (
        window.on_publish(
            tag,
            redelivered=False,
            body_size=size,
            body_sha256=f"b{tag}",
            properties_sha256="p",
            message_id=None,
            consumed_at=datetime(2026, 1, 1, tzinfo=UTC),
        )
        for tag, size in ((1, 100), (2, 8192), (3, 8192))
    )
    refused = window.refuse_oversized(8192, "too large")
    assert refused is big
    assert big.state is DeliveryState.REFUSED
    assert window.unconfirmed == 2
    assert window.refuse_oversized(5, "too large") is None
    uncertain = window.mark_uncertain()
    assert uncertain == [small, after]
    assert window.refused() == [big]  # never acked: it stays in the source
