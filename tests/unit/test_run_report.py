"""The run report's figures and page, from small inline Arrow tables (no Spark, no broker)."""

from __future__ import annotations

import re
import time
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from rmq_spark.errors import LedgerError
from rmq_spark.ledger import schema
from rmq_spark.report.html import (
    VerificationResult,
    bucket_seconds_for,
    confirm_latency,
    load_run,
    plot_throughput,
    queue_summary,
    render_report,
    repeated_checksums,
    throughput,
)
from tests.support.report_rows import (
    T0,
    message,
    messages,
    queue_row,
    run_ledger,
    run_row,
    seconds,
)

# --- throughput ---------------------------------------------------------------------------


def test_throughput_counts_confirms_per_second_and_uncertain_rows_apart() -> None:
    table = messages(
        message(0, confirmed_at=seconds(0.1)),
        message(1, confirmed_at=seconds(0.5)),
        message(2, confirmed_at=seconds(1.2)),
        message(3, confirmed_at=seconds(3.9)),
        message(4, confirmed_at=None),
    )

    rates = throughput(table, origin=T0)

    assert rates.bucket_seconds == 1
    assert rates.counts == (2, 1, 0, 1)
    assert rates.uncertain == 1
    assert rates.confirmed == 4
    assert rates.peak_rate == 2.0
    assert rates.busy_seconds == (0, 4)
    assert rates.mean_rate == 1.0


def test_throughput_counts_from_the_origin_so_the_start_shows_as_idle() -> None:
    table = messages(message(0, confirmed_at=seconds(5.5)), message(1, confirmed_at=seconds(6.0)))

    rates = throughput(table, origin=T0)

    assert rates.counts == (0, 0, 0, 0, 0, 1, 1)
    assert rates.busy_seconds == (5, 7)
    assert rates.mean_rate == 1.0


def test_throughput_starts_at_the_first_confirm_without_an_origin() -> None:
    table = messages(message(0, confirmed_at=seconds(5.5)), message(1, confirmed_at=seconds(7.0)))

    assert throughput(table).counts == (1, 1)


def test_throughput_widens_its_buckets_for_a_long_run() -> None:
    table = messages(
        message(0, confirmed_at=seconds(0)),
        message(1, confirmed_at=seconds(59)),
        message(2, confirmed_at=seconds(3 * 3600)),
    )

    rates = throughput(table, origin=T0)

    assert rates.bucket_seconds == 60  # 3 h in at most 300 buckets
    assert rates.counts[0] == 2
    assert rates.counts[-1] == 1
    assert rates.rates[0] == pytest.approx(2 / 60)


@pytest.mark.parametrize(
    ("span", "width"),
    [(0, 1), (300, 1), (301, 2), (1500, 5), (10_000, 60), (10**7, 3600)],
)
def test_bucket_width_is_the_narrowest_giving_at_most_300_buckets(span: float, width: int) -> None:
    assert bucket_seconds_for(span) == width


def test_throughput_of_a_run_with_no_confirm_is_empty() -> None:
    rates = throughput(messages(message(0, confirmed_at=None), message(1, confirmed_at=None)))

    assert (rates.counts, rates.uncertain, rates.peak_rate, rates.mean_rate) == ((), 2, 0.0, 0.0)


def test_throughput_plot_spans_the_confirms_and_a_short_lead_in() -> None:
    # Confirms from second 25 to 46 of the run: the first 25 s are start-up.
    table = messages(
        *(message(i, confirmed_at=seconds(25 + i * 0.5)) for i in range(42)),
    )
    rates = throughput(table, origin=T0)
    assert rates.busy_seconds == (25, 46)

    (axes,) = plot_throughput(rates).axes

    assert axes.get_xlim() == pytest.approx((22.9, 46.0))  # lead-in: a tenth of 21 s


def test_throughput_plot_of_an_immediate_start_begins_at_zero() -> None:
    rates = throughput(messages(message(0, confirmed_at=seconds(0.5))), origin=T0)

    (axes,) = plot_throughput(rates).axes

    assert axes.get_xlim() == (0.0, 1.0)


# --- latency ------------------------------------------------------------------------------


def test_latency_percentiles_are_over_confirmed_rows_in_milliseconds() -> None:
    rows = [
        message(i, consumed_at=T0, confirmed_at=T0 + timedelta(milliseconds=i + 1))
        for i in range(100)
    ]
    rows.append(message(100, consumed_at=T0, confirmed_at=None))

    latency = confirm_latency(messages(*rows))

    assert len(latency.milliseconds) == 100
    assert latency.uncertain == 1
    assert latency.percentiles == pytest.approx({50: 50.5, 95: 95.05, 99: 99.01})
    assert latency.maximum == 100.0
    assert latency.caption() == (
        "100 confirmed messages: p50 50.5 ms, p95 95.0 ms, p99 99.0 ms, max 100.0 ms; "
        "1 uncertain row(s) have no confirm time"
    )


def test_latency_keeps_microseconds() -> None:
    latency = confirm_latency(
        messages(message(0, consumed_at=T0, confirmed_at=T0 + timedelta(microseconds=1500)))
    )

    assert latency.percentiles[50] == 1.5


def test_latency_of_a_run_with_no_confirm_says_so() -> None:
    latency = confirm_latency(messages(message(0, confirmed_at=None)))

    assert latency.percentiles == {}
    assert latency.caption() == "no confirmed messages; 1 uncertain row(s)"


# --- duplicates and the per-queue summary -------------------------------------------------


def test_repeated_checksums_lists_every_copy_within_one_transfer() -> None:
    other_queue = {"source_queue": "b", "destination_queue": "b"}
    table = messages(
        message(0, body_sha256="x"),
        message(1, body_sha256="y"),
        message(2, body_sha256="x", redelivered=True),
        message(3, body_sha256="z", confirmed_at=None),
        message(0, body_sha256="x", **other_queue),  # same body, another queue: no repeat
    )

    repeated = repeated_checksums(table)

    assert repeated.column("position").to_pylist() == [0, 2]
    assert repeated.column("redelivered").to_pylist() == [False, True]
    assert repeated.column("copies").to_pylist() == [2, 2]
    assert set(repeated.column("source_queue").to_pylist()) == {"a"}


def test_repeated_checksums_of_distinct_messages_is_empty() -> None:
    assert repeated_checksums(messages(message(0), message(1))).num_rows == 0


def test_queue_summary_counts_uncertain_rows_and_takes_the_verdict_per_queue() -> None:
    ledger = run_ledger(
        [queue_row("b"), queue_row("a")],
        [
            message(0),
            message(1, confirmed_at=None),
            message(0, source_queue="b", destination_queue="b"),
        ],
    )
    key_a = ("dr", "orders", "a", "main", "orders", "a")
    verification = VerificationResult(
        path=Path("/v.json"),
        verified=False,
        failed_expectations=(),
        data_docs=None,
        passed_by_transfer={key_a: False},
    )

    rows = queue_summary(ledger, verification)

    assert [row["source"] for row in rows] == ["dr/orders/a", "dr/orders/b"]
    assert [row["uncertain_rows"] for row in rows] == [1, 0]
    assert [row["passed"] for row in rows] == [False, None]
    assert rows[0]["destination"] == "main/orders/a"


def test_queue_summary_and_page_show_what_a_selective_move_moved_and_kept(
    tmp_path: Path,
) -> None:
    ledger = run_ledger(
        [queue_row("a"), queue_row("b")],
        [message(0), message(0, source_queue="b", destination_queue="b")],
    )
    key_a = ("dr", "orders", "a", "main", "orders", "a")
    key_b = ("dr", "orders", "b", "main", "orders", "b")
    verification = VerificationResult(
        path=tmp_path / "verification.json",
        verified=True,
        failed_expectations=(),
        data_docs=None,
        passed_by_transfer={key_a: True, key_b: True},
        decisions_by_transfer={key_a: (3, 5), key_b: (7, 0)},
    )

    rows = queue_summary(ledger, verification)
    page = render_report(ledger, verification, report_dir=tmp_path)
    plain = render_report(ledger, None, report_dir=tmp_path)

    assert [(row["moved"], row["kept"]) for row in rows] == [(3, 5), (7, 0)]
    assert "<th>kept in<br>the source</th>" in page
    assert "<h2>Decisions</h2>" in page
    assert '<td>kept</td><td>dr/orders/a</td><td class="num">5</td>' in page
    assert '<td>moved</td><td>main/orders/b</td><td class="num">7</td>' in page
    assert 'dr/orders/b</td><td class="num">0' not in page  # nothing kept: no row
    assert "Decisions" not in plain
    assert "kept in" not in plain


# --- the page -----------------------------------------------------------------------------


def test_page_escapes_names_and_errors_and_embeds_its_plots(tmp_path: Path) -> None:
    hostile = "<script>alert('q')</script>"
    ledger = run_ledger(
        [queue_row(hostile, status="failed", error="refused: a & b <b>")],
        [
            message(0, source_queue=hostile, destination_queue=hostile),
            message(1, source_queue=hostile, destination_queue=hostile, confirmed_at=None),
        ],
        verified=False,
    )
    verification = VerificationResult(
        path=tmp_path / "verification.json",
        verified=False,
        failed_expectations=("queue_summary: expect_column_values_to_be_in_set(status) <x>",),
        data_docs=tmp_path / "data docs" / "index.html",
        passed_by_transfer={},
    )

    page = render_report(ledger, verification, report_dir=tmp_path / "reports")

    assert hostile not in page
    assert "&lt;script&gt;alert(&#x27;q&#x27;)&lt;/script&gt;" in page
    assert "refused: a &amp; b &lt;b&gt;" in page
    assert "set(status) &lt;x&gt;" in page
    assert "NOT verified" in page
    assert "Verification failed." in page
    assert page.count('<img src="data:image/png;base64,') == 2
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    assert 'href="../data%20docs/index.html"' in page


def test_header_tiles_hold_figures_and_long_names_get_lines_of_their_own(
    tmp_path: Path,
) -> None:
    ledger = run_ledger([queue_row("a")], [message(0)], bytes=61_440_000, lost=2)

    page = render_report(ledger, None, report_dir=tmp_path)

    tiles = dict(re.findall(r'<div class="fact[^"]*"><span>([^<]+)</span><b>([^<]+)</b>', page))
    assert tiles["bytes"] == "58.6 MiB"
    assert "<b>58.6 MiB</b><small>61,440,000 bytes</small>" in page
    assert tiles["started"] == "2026-01-01 12:00:00 UTC"
    assert "ledger" not in tiles
    assert '<div class="fact warn"><span>lost</span><b>2</b>' in page
    assert "<dt>ledger</dt><dd>/ledger</dd>" in page
    assert "<dt>Spark application</dt><dd>local-1</dd>" in page
    assert f"<dt>config sha256 (first 16)</dt><dd>{'ab' * 8}</dd>" in page


def test_error_column_only_when_a_queue_has_an_error(tmp_path: Path) -> None:
    clean = render_report(run_ledger([queue_row("a")], [message(0)]), None, report_dir=tmp_path)
    failed = render_report(
        run_ledger([queue_row("a"), queue_row("b", status="failed", error="refused")], []),
        None,
        report_dir=tmp_path,
    )

    assert "<th>error</th>" not in clean
    assert clean.count("<th>") == failed.count("<th>") - 1
    assert "<th>error</th>" in failed
    assert '<td class="error">refused</td>' in failed
    assert '<td class="error"></td>' in failed  # queue a: no error, an empty cell


def test_page_without_confirms_or_verification_still_renders(tmp_path: Path) -> None:
    ledger = run_ledger([queue_row("a")], [message(0, confirmed_at=None)])

    page = render_report(ledger, None, report_dir=tmp_path)

    assert "No verification.json was found for this run." in page
    assert "no confirmed messages; 1 uncertain row(s)" in page


# --- reading the ledger ---------------------------------------------------------------------


def test_an_unknown_run_is_one_error_naming_the_run_and_the_ledger(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    write_deltalake(
        str(ledger / "runs"),
        pa.Table.from_pylist([run_row()], schema=schema.arrow_schema(schema.RUNS)),
    )

    with pytest.raises(LedgerError) as error:
        load_run(str(ledger), "run-2")

    assert str(error.value) == (
        f"run 'run-2' is not in the ledger at {ledger}: its runs table has 1 run(s), the "
        "latest 'run-1' (the runs table has a row for each run whose verification ended)"
    )


def test_a_path_without_a_ledger_is_one_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match=f"ledger table {tmp_path}/runs does not exist"):
        load_run(str(tmp_path), "run-1")


def test_a_run_recorded_twice_is_read_from_its_last_record(tmp_path: Path) -> None:
    # Re-running a run id after it was recorded appends a second runs row and a second
    # set of queues rows; the last describes the run.
    ledger = tmp_path / "ledger"
    for finished, depth_after in ((seconds(30), 5), (seconds(90), 0)):
        write_deltalake(
            str(ledger / "runs"),
            pa.Table.from_pylist(
                [run_row(finished_at=finished)], schema=schema.arrow_schema(schema.RUNS)
            ),
            mode="append",
        )
        write_deltalake(
            str(ledger / "queues"),
            pa.Table.from_pylist(
                [queue_row("a", source_depth_after=depth_after), queue_row("b")],
                schema=schema.arrow_schema(schema.QUEUES),
            ),
            mode="append",
        )
        time.sleep(0.01)  # file modification times are in milliseconds
    write_deltalake(
        str(ledger / "messages"), messages(message(0)), partition_by=["run_id"], mode="append"
    )

    run = load_run(str(ledger), "run-1")

    assert run.records == 2
    assert run.run["finished_at"] == seconds(90)
    queues = run.queues.to_pylist()
    depths_after = {row["source_queue"]: row["source_depth_after"] for row in queues}
    assert depths_after == {"a": 0, "b": 0}
    assert run.messages.num_rows == 1
    assert run.messages["run_id"].to_pylist() == ["run-1"]


def test_ledger_doc_describes_every_column_of_every_table() -> None:
    # docs/LEDGER.md follows schema.py; a new column without its description fails here.
    doc = (Path(__file__).resolve().parents[2] / "docs" / "LEDGER.md").read_text()
    sections = dict(re.findall(r"^### `?([a-z_]+)`?\n(.*?)(?=^#)", doc, flags=re.S | re.M))
    shared = doc.split("### The columns every table but `runs` shares", 1)[1].split("###")[0]
    for table, columns in schema.TABLES.items():
        assert table in sections, f"docs/LEDGER.md has no section for table {table}"
        for column in columns:
            where = shared if column.name in schema.TRANSFER_KEY and table != "runs" else None
            described = f"| `{column.name}` |" in (where or sections[table])
            assert described, f"docs/LEDGER.md does not describe {table}.{column.name}"


# --- priority order ---------------------------------------------------------------------------


def test_the_page_names_transfers_whose_destination_reorders_by_priority(tmp_path: Path) -> None:
    ledger = run_ledger(
        [
            queue_row("into-quorum", reordered_by_priority=3),
            queue_row("into-classic", reordered_by_priority=0),
            queue_row("unknown", reordered_by_priority=None),
        ],
        [message(0)],
    )

    page = render_report(ledger, None, report_dir=tmp_path)

    section = page.split("<h2>Priority order</h2>", 1)[1].split("</section>", 1)[0]
    assert '/into-quorum</td><td class="num">3</td></tr>' in section
    assert "into-classic" not in section
    assert "unknown" not in section


def test_no_priority_section_when_nothing_is_reordered(tmp_path: Path) -> None:
    ledger = run_ledger([queue_row("a", reordered_by_priority=0)], [message(0)])
    assert "Priority order" not in render_report(ledger, None, report_dir=tmp_path)


def test_a_ledger_written_before_the_priority_column_still_reads(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    write_deltalake(
        str(ledger / "runs"),
        pa.Table.from_pylist([run_row()], schema=schema.arrow_schema(schema.RUNS)),
    )
    earlier = tuple(c for c in schema.QUEUES if c.name != "reordered_by_priority")
    write_deltalake(
        str(ledger / "queues"),
        pa.Table.from_pylist([queue_row("a")], schema=schema.arrow_schema(earlier)),
    )
    write_deltalake(
        str(ledger / "messages"), messages(message(0)), partition_by=["run_id"], mode="append"
    )

    run = load_run(str(ledger), "run-1")

    assert run.queues.to_pylist()[0]["reordered_by_priority"] is None
    assert queue_summary(run)[0]["reordered_by_priority"] is None
    assert "Priority order" not in render_report(run, None, report_dir=tmp_path)
