"""The rate limits in the report: the record beside the ledger, the page's section, the
console's lines (no Spark, no broker)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from rmq_spark.config import JobConfig, Limits
from rmq_spark.errors import LedgerError
from rmq_spark.ledger.brakes import BrakeRecord, HeldBack, brakes_dir, read_brakes, write_brakes
from rmq_spark.model import MoveOutcome, TransferKey
from rmq_spark.planning.rate_limits import describe_limits, limits_in_force
from rmq_spark.report.console import MAX_BRAKE_LINES, brake_lines
from rmq_spark.report.html import brakes_section, render_report
from tests.support.fakes import KEY
from tests.support.report_rows import message, queue_row, run_ledger

RECORD = BrakeRecord(
    in_force="job 600 msg/s",
    transfers=(
        HeldBack(TransferKey("dr", "orders", "a", "main", "orders", "a"), "300 msg/s", 12.345),
    ),
)


def test_the_record_is_read_back_as_written_and_absent_without_limits(tmp_path: Path) -> None:
    assert read_brakes(str(tmp_path), "run-1") is None

    write_brakes(str(tmp_path), "run-1", RECORD)

    assert read_brakes(str(tmp_path), "run-1") == RECORD


def test_the_record_names_transfers_by_key_so_slashed_names_stay_apart(tmp_path: Path) -> None:
    # Joined by "/", these two transfers were the same string "dr/a/b/c".
    slashed = TransferKey("dr", "a/b", "c", "main", "a/b", "c")
    split = TransferKey("dr", "a", "b/c", "main", "a", "b/c")
    record = BrakeRecord(
        "job 10 msg/s", (HeldBack(slashed, "5 msg/s", 1.0), HeldBack(split, "5 msg/s", 2.0))
    )

    write_brakes(str(tmp_path), "run-1", record)
    written = json.loads((brakes_dir(str(tmp_path), "run-1") / "limits.json").read_text())

    assert [t["key"]["source_vhost"] for t in written["transfers"]] == ["a/b", "a"]
    read = read_brakes(str(tmp_path), "run-1")
    assert read is not None
    assert [(t.key, t.held_seconds) for t in read.transfers] == [(slashed, 1.0), (split, 2.0)]


def test_a_record_an_earlier_build_wrote_is_read_with_its_names_as_written(
    tmp_path: Path,
) -> None:
    directory = brakes_dir(str(tmp_path), "run-1")
    directory.mkdir(parents=True)
    earlier = {
        "in_force": "job 600 msg/s",
        "transfers": [
            {
                "source": "dr/orders/a",
                "destination": "main/orders/a",
                "limits": "300 msg/s",
                "held_seconds": 12.345,
                "depth_held_seconds": 0.5,
            }
        ],
    }
    (directory / "limits.json").write_text(json.dumps(earlier), encoding="utf-8")

    read = read_brakes(str(tmp_path), "run-1")

    assert read is not None
    (held,) = read.transfers
    assert (held.key, held.source, held.destination) == (None, "dr/orders/a", "main/orders/a")
    assert (held.limits, held.held_seconds, held.depth_held_seconds) == ("300 msg/s", 12.345, 0.5)
    section = brakes_section(read)
    assert "<td>dr/orders/a</td><td>main/orders/a</td><td>300 msg/s</td>" in section


def test_a_transfer_named_neither_way_is_one_clear_error(tmp_path: Path) -> None:
    directory = brakes_dir(str(tmp_path), "run-1")
    directory.mkdir(parents=True)
    entry = {"source": "dr/v/q", "limits": "1 msg/s", "held_seconds": 0.0}
    content = {"in_force": "job 1 msg/s", "transfers": [entry]}
    (directory / "limits.json").write_text(json.dumps(content), encoding="utf-8")

    with pytest.raises(LedgerError, match=r"limits\.json: expected JSON .* key \(or source"):
        read_brakes(str(tmp_path), "run-1")


def test_a_record_changed_by_hand_is_one_clear_error(tmp_path: Path) -> None:
    directory = brakes_dir(str(tmp_path), "run-1")
    directory.mkdir(parents=True)
    (directory / "limits.json").write_text('{"in_force": "job 1 msg/s"}', encoding="utf-8")

    with pytest.raises(LedgerError, match=r"limits\.json: expected JSON with in_force"):
        read_brakes(str(tmp_path), "run-1")


def test_the_page_shows_the_limits_and_the_time_held_back_only_when_limited(
    tmp_path: Path,
) -> None:
    ledger = run_ledger([queue_row("a")], [message(0)])

    limited = render_report(ledger, None, report_dir=tmp_path, brakes=RECORD)
    free = render_report(ledger, None, report_dir=tmp_path)

    assert "<h2>Rate limits</h2>" in limited
    assert "In force: job 600 msg/s." in limited
    assert '<td>300 msg/s</td><td class="num">12.3</td><td class="num">0.0</td>' in limited
    assert "Rate limits" not in free


def test_the_section_escapes_queue_names() -> None:
    key = TransferKey("dr", "v", "<b>", "main", "v", "<b>")
    record = BrakeRecord("job 1 msg/s", (HeldBack(key, "1 msg/s", 0.0),))
    section = brakes_section(record)
    assert "/<b>" not in section
    assert "dr/v/&lt;b&gt;" in section


def test_limits_are_described_in_one_line_for_progress_and_reports() -> None:
    assert describe_limits(Limits()) == "unlimited"
    assert describe_limits(Limits(destination_max_depth=5000)) == "destination depth < 5,000"
    assert describe_limits(Limits(messages_per_second=2500.0)) == "2,500 msg/s"
    assert (
        describe_limits(Limits(messages_per_second=0.5, bytes_per_second=1048576.0))
        == "0.5 msg/s, 1,048,576 B/s"
    )
    config = JobConfig.model_validate(
        {
            "clusters": {"dr": {"amqp": ["amqp://dr"], "management": "http://dr:15672"}},
            "routes": [
                {
                    "name": "slow",
                    "source": {"cluster": "dr"},
                    "destination": {"cluster": "dr", "vhost": "copy"},
                    "limits": {"bytes_per_second": 1000},
                }
            ],
            "ledger": {"path": "/tmp/ledger"},
            "limits": {"messages_per_second": 600},
        }
    )
    assert limits_in_force(config) == "job 600 msg/s; route slow per queue 1,000 B/s"
    assert limits_in_force(config.model_copy(update={"limits": Limits()})) == (
        "route slow per queue 1,000 B/s"
    )


OUTCOME = MoveOutcome(
    key=KEY,
    status="moved",
    error=None,
    messages=10,
    bytes=100,
    first_position=0,
    next_position=10,
    seconds=2.0,
    sessions=1,
)


class _Result:
    """The part of a RunResult that brake_lines reads."""

    def __init__(self, *outcomes: MoveOutcome) -> None:
        self.outcomes = outcomes


def test_the_console_names_each_limited_transfer_and_its_time_held_back() -> None:
    limited = replace(OUTCOME, rate_limits=Limits(messages_per_second=300.0), rate_held_seconds=4.3)

    lines = brake_lines(_Result(OUTCOME, limited))  # type: ignore[arg-type]

    assert lines == [
        f"limits 300 msg/s: held back 4.3 s by the rate, 0.0 s by the depth ({KEY.label()})"
    ]
    assert brake_lines(_Result(OUTCOME)) == []  # type: ignore[arg-type]


def test_the_console_sums_up_many_limited_transfers_in_one_line() -> None:
    many = [
        replace(OUTCOME, rate_limits=Limits(messages_per_second=1.0), rate_held_seconds=float(i))
        for i in range(MAX_BRAKE_LINES + 1)
    ]

    (line,) = brake_lines(_Result(*many))  # type: ignore[arg-type]

    assert line.startswith("limits: 11 transfers limited, held back 55.0 s in all")
    assert f"the most 10.0 s ({KEY.label()})" in line
