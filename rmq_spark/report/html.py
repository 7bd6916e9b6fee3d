"""A run's report: one self-contained HTML page built from the ledger, without Spark.

`build_report` reads the run's rows of the three ledger tables without a JVM (delta-rs
lists each table's snapshot, pyarrow reads its files: fast, and it works wherever the
ledger's files can be read), draws the plots with matplotlib's Agg renderer and embeds
them as base64 PNG, so the page is a single file with inline CSS and no link to any
other host.

Like `verify`, the figures are computed by Spark-free functions over plain Arrow tables
(`report.figures`: `throughput`, `confirm_latency`, `queue_summary`,
`repeated_checksums`, re-exported here); the notebook `notebooks/ledger_inspection.ipynb`
calls the same functions. This module draws the plots and renders the page, one function
per section.

Example:
    path = build_report("/data/rmq-spark/ledger", "20260101T000000Z-abc123")
    # /data/rmq-spark/ledger/reports/run_id=20260101T000000Z-abc123/report.html
"""

from __future__ import annotations

import base64
import io
import logging
import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from rmq_spark.errors import LedgerError, RmqSparkError
from rmq_spark.ledger import store
from rmq_spark.ledger.brakes import BrakeRecord, read_brakes
from rmq_spark.report.decision_sections import (
    decisions_section,
    parked_section,
    priority_section,
    routed_section,
)
from rmq_spark.report.figures import (
    BUCKET_SECONDS,
    DUPLICATE_COLUMNS,
    MAX_BUCKETS,
    PERCENTILES,
    REPORT_MESSAGE_COLUMNS,
    VERIFICATION_DIR,
    VERIFICATION_FILE,
    Latency,
    RunLedger,
    Throughput,
    VerificationResult,
    bucket_seconds_for,
    confirm_latency,
    format_ms,
    latest_run_id,
    load_run,
    queue_summary,
    read_ledger_table,
    read_verification,
    repeated_checksums,
    throughput,
)
from rmq_spark.report.markup import escape as _e
from rmq_spark.report.markup import size as _size
from rmq_spark.report.parked import ParkedCount, parked_counts

REPORTS_DIR = "reports"
REPORT_FILE = "report.html"
HISTOGRAM_BINS = 60
# Latencies spread over more than this ratio (max / min) are binned on a log axis.
LOG_SCALE_SPREAD = 50.0
# Figures are 1000 x 360 px: wide enough for a long run, short enough to scroll past.
FIGURE_INCHES = (10.0, 3.6)
FIGURE_DPI = 100
_MIN_LOG_MS = 0.001  # a latency of 0 (same microsecond) is drawn at 1 µs on a log axis

log = logging.getLogger(__name__)


# --- plots ----------------------------------------------------------------------------------


def plot_throughput(figures: Throughput) -> Figure:
    """Messages confirmed per second over the run (a step line per bucket)."""
    figure, axes = _new_figure()
    if not figures.counts:
        _say_nothing(axes, "no confirmed messages")
        return figure
    starts = np.arange(len(figures.counts) + 1) * figures.bucket_seconds
    rates = np.array([*figures.rates, figures.rates[-1]])
    axes.fill_between(starts, rates, step="post", alpha=0.25, color="#2b6cb0")
    axes.step(starts, rates, where="post", color="#2b6cb0", linewidth=1.5)
    # The x axis covers the confirms and a short quiet lead-in, not the whole start-up
    # (discovery, Spark's start), which would squeeze the transfer into a corner; the
    # caption says where the confirms fall in the run.
    first, last = figures.busy_seconds
    lead_in = max(figures.bucket_seconds, (last - first) / 10)
    axes.set_xlim(max(first - lead_in, 0), last)
    axes.set_ylim(bottom=0)
    axes.set_xlabel("seconds since the run started")
    width = figures.bucket_seconds
    axes.set_ylabel("messages / second" + (f" (mean of {width} s)" if width > 1 else ""))
    axes.set_title("Messages confirmed per second")
    axes.grid(alpha=0.3)
    return figure


def plot_latency(figures: Latency) -> Figure:
    """Histogram of confirm latencies, with p50/p95/p99 marked."""
    figure, axes = _new_figure()
    values = figures.milliseconds
    if not len(values):
        _say_nothing(axes, "no confirmed messages")
        return figure
    # A log axis shows a long tail (a reconnect, a slow fsync) without squashing the bulk.
    low, high = max(float(values.min()), _MIN_LOG_MS), float(values.max())
    if high / low > LOG_SCALE_SPREAD:
        values = np.maximum(values, low)
        bins = np.geomspace(low, high, HISTOGRAM_BINS + 1)
        axes.set_xscale("log")
        axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    else:
        bins = np.linspace(float(values.min()), max(high, low + 1e-3), HISTOGRAM_BINS + 1)
    axes.hist(values, bins=bins, color="#2f855a", alpha=0.8)
    for percentile, style in zip(PERCENTILES, (":", "--", "-"), strict=True):
        value = figures.percentiles[percentile]
        axes.axvline(
            value, color="#c53030", linestyle=style, label=f"p{percentile} {format_ms(value)}"
        )
    axes.legend(loc="upper right")
    axes.set_xlabel("confirm latency (ms): confirmed_at − consumed_at")
    axes.set_ylabel("messages")
    axes.set_title("Confirm latency distribution")
    axes.grid(alpha=0.3)
    return figure


def figure_png(figure: Figure) -> bytes:
    """The figure as PNG bytes, rendered by Agg (no display, no pyplot state)."""
    buffer = io.BytesIO()
    FigureCanvasAgg(figure).print_png(buffer)
    return buffer.getvalue()


# --- the HTML page, one function per section ----------------------------------------------


def build_report(ledger_path: str, run_id: str, out_path: Path | None = None) -> Path:
    """Write the run's report and return its path.

    Default: <ledger>/reports/run_id=<run>/report.html. Raises LedgerError if the
    ledger or the run is not there.
    """
    ledger = load_run(ledger_path, run_id)
    verification = read_verification(ledger_path, ledger.run)
    parked = parked_counts(ledger_path, run_id, ledger.messages)
    if out_path is None and store.is_object_store(ledger_path):
        # Beside the tables on the store too (one PUT); the page links no local files.
        target = store.root(ledger_path) / REPORTS_DIR / f"run_id={run_id}" / REPORT_FILE
        page = render_report(
            ledger,
            verification,
            report_dir=Path.cwd(),
            brakes=read_brakes(ledger_path, run_id),
            parked=parked,
        )
        try:
            target.write_bytes(page.encode("utf-8"))
        except OSError as exc:
            raise LedgerError(f"report of run {run_id}: cannot write {target} ({exc})") from exc
        return target  # type: ignore[no-any-return]
    out = (
        Path(out_path)
        if out_path is not None
        else Path(ledger_path) / REPORTS_DIR / f"run_id={run_id}" / REPORT_FILE
    ).resolve()
    page = render_report(
        ledger,
        verification,
        report_dir=out.parent,
        brakes=read_brakes(ledger_path, run_id),
        parked=parked,
    )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise LedgerError(f"report of run {run_id}: cannot write {out} ({exc.strerror})") from exc
    return out


def render_report(
    ledger: RunLedger,
    verification: VerificationResult | None,
    *,
    report_dir: Path,
    brakes: BrakeRecord | None = None,
    parked: Sequence[ParkedCount] = (),
) -> str:
    """The whole page as one HTML string; `brakes`: the run's rate limits, if it had any;
    `parked`: a park's or a replay's counts (`report/parked.py`)."""
    run = ledger.run
    rates = throughput(ledger.messages, origin=run["started_at"])
    latency = confirm_latency(ledger.messages)
    queues = queue_summary(ledger, verification)
    sections = [
        header_section(ledger, rates),
        queues_section(queues),
        throughput_section(rates, run["seconds"]),
        *([] if brakes is None else [brakes_section(brakes)]),
        *decisions_section(queues),
        *routed_section(ledger.messages),
        *parked_section(list(parked)),
        *priority_section(queues),
        latency_section(latency),
        verification_section(verification, report_dir),
    ]
    title = _e(f"rmq-spark run {run['run_id']}")
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
        f"<style>{_CSS}</style></head>\n<body>\n" + "\n".join(sections) + "\n</body></html>\n"
    )


def header_section(ledger: RunLedger, rates: Throughput) -> str:
    """The verdict, the run's figures as tiles, then where the run came from."""
    run = ledger.run
    verdict = (
        '<span class="badge ok">verified</span>'
        if run["verified"]
        else '<span class="badge bad">NOT verified</span>'
    )
    # (name, value, note): the value is short enough for a tile, the note says more.
    facts = [
        ("started", _when(run["started_at"]), ""),
        ("finished", _when(run["finished_at"]), ""),
        ("seconds", f"{run['seconds']:,.1f}", ""),
        ("queues", f"{run['queues']:,}", ""),
        ("messages", f"{run['messages']:,}", ""),
        ("bytes", _size(run["bytes"]), f"{run['bytes']:,} bytes"),
        ("lost", f"{run['lost']:,}", ""),
        ("duplicates", f"{run['duplicates']:,}", ""),
        ("unexpected", f"{run['unexpected']:,}", ""),
        ("uncertain rows", f"{rates.uncertain:,}", ""),
    ]
    problems = {"lost", "duplicates", "unexpected", "uncertain rows"}
    tiles = "".join(
        f'<div class="fact{" warn" if name in problems and value != "0" else ""}">'
        f"<span>{_e(name)}</span><b>{_e(value)}</b>"
        + (f"<small>{_e(note)}</small>" if note else "")
        + "</div>"
        for name, value, note in facts
    )
    # Long identifiers: one line each, never cut into a tile.
    about = [
        ("ledger", ledger.ledger_path),
        ("Spark application", run["spark_app_id"]),
        ("config sha256 (first 16)", run["config_digest"][:16]),
    ]
    if ledger.records > 1:
        about.append(("recorded", f"{ledger.records} times (run id re-run); the last shown"))
    items = "".join(f"<dt>{_e(name)}</dt><dd>{_e(value)}</dd>" for name, value in about)
    return (
        f"<header><h1>Run {_e(run['run_id'])} {verdict}</h1>"
        f'<div class="facts">{tiles}</div><dl class="about">{items}</dl></header>'
    )


_QUEUE_HEADERS: tuple[tuple[str, str], ...] = (
    ("source", "source"),
    ("destination", "destination"),
    ("status", "status"),
    ("source_depth", "source depth\nbefore → after"),
    ("destination_depth", "destination depth\nbefore → after"),
    ("ledger_rows", "ledger rows"),
    ("moved", "moved"),
    ("kept", "kept in\nthe source"),
    ("uncertain_rows", "uncertain"),
    ("duplicates", "duplicates"),
    ("lost", "lost"),
    ("unexpected", "unexpected"),
    ("passed", "verdict"),
    ("error", "error"),
)
_COUNTS = {"uncertain_rows", "duplicates", "lost", "unexpected"}


def queues_section(rows: Sequence[Mapping[str, Any]]) -> str:
    # An error column only when some queue has an error, a kept one only when a selective
    # move kept messages: an empty column reads as missing.
    headers = [
        (name, label)
        for name, label in _QUEUE_HEADERS
        if name not in ("error", "kept") or any(row[name] for row in rows)
    ]
    head = "".join(
        "<th>" + "<br>".join(_e(part) for part in label.split("\n")) + "</th>"
        for _, label in headers
    )
    body = "".join(
        "<tr>" + "".join(_queue_cell(name, row) for name, _ in headers) + "</tr>" for row in rows
    )
    return (
        f"<section><h2>Queues ({len(rows)})</h2>"
        "<p>Depths are the brokers' exact ready counts before and after the run. "
        "Uncertain rows were published but never confirmed (connection lost); "
        "duplicates are copies that reached the destination twice. Moved counts each "
        "message once; kept are those a selective move published back to its source.</p>"
        f'<div class="wide"><table class="queues"><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table></div></section>"
    )


def _queue_cell(name: str, row: Mapping[str, Any]) -> str:
    """One cell of the queues table (a queue_summary row), styled by what it says."""
    css = ""
    if name in ("source_depth", "destination_depth"):
        value: Any = f"{row[name + '_before']:,} → {row[name + '_after']:,}"
        css = "num"
    else:
        value = row[name]
    if name == "passed":
        value, css = {True: ("ok", "ok"), False: ("failed", "bad")}.get(value, ("—", ""))
    elif name == "status":
        css = "ok" if value == "moved" else "bad"
    elif name == "error":
        css = "error"
    elif name in _COUNTS and value:
        css = "warn"
    elif isinstance(value, int):
        css = "num"
    text = "" if value is None else f"{value:,}" if isinstance(value, int) else str(value)
    return f'<td class="{css}">{_e(text)}</td>' if css else f"<td>{_e(text)}</td>"


def throughput_section(rates: Throughput, run_seconds: float) -> str:
    first, last = rates.busy_seconds
    caption = (
        f"{rates.confirmed:,} confirmed messages; peak {rates.peak_rate:,.0f} msg/s, "
        f"mean {rates.mean_rate:,.0f} msg/s while moving"
    )
    if rates.bucket_seconds > 1:
        caption += f" ({rates.bucket_seconds} s buckets)"
    caption += (
        f". Confirms came from second {first:,} to {last:,} of the run's {run_seconds:,.1f} s "
        "(before: discovery and Spark start; after: commit and verification). "
        f"{rates.uncertain:,} uncertain row(s) have no confirm time and are not plotted."
    )
    return _figure_section("Throughput", plot_throughput(rates), "throughput", caption)


def brakes_section(record: BrakeRecord) -> str:
    """The rate limits in force, and how long each limited transfer was held back."""
    rows = "".join(
        f"<tr><td>{_e(t.source)}</td><td>{_e(t.destination)}</td><td>{_e(t.limits)}</td>"
        f'<td class="num">{t.held_seconds:,.1f}</td>'
        f'<td class="num">{t.depth_held_seconds:,.1f}</td></tr>'
        for t in record.transfers
    )
    return (
        "<section><h2>Rate limits</h2>"
        f"<p>In force: {_e(record.in_force)}. A transfer keeps to the smaller of its "
        "route's rate and its share of the job's (the job's divided by the transfers "
        "that can move at once), and publishes only while its destination queue is "
        "below the depth bound; held back is the time its publishes waited.</p>"
        '<div class="wide"><table class="queues"><thead><tr><th>source</th>'
        "<th>destination</th><th>limits per transfer</th><th>held back by<br>the rate (s)</th>"
        "<th>held back by<br>the depth (s)</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></div></section>"
    )


def latency_section(latency: Latency) -> str:
    return _figure_section(
        "Confirm latency",
        plot_latency(latency),
        "confirm latency histogram",
        "From the delivery reaching the mover to the destination's publisher confirm "
        f"(includes time in the window and the intent-log fsync). {latency.caption()}.",
    )


def verification_section(verification: VerificationResult | None, report_dir: Path) -> str:
    if verification is None:
        return (
            "<section><h2>Verification</h2>"
            '<p class="bad">No verification.json was found for this run.</p></section>'
        )
    verdict = (
        '<p class="ok">Every expectation passed.</p>'
        if verification.verified
        else '<p class="bad">Verification failed.</p>'
    )
    failures = ""
    if verification.failed_expectations:
        items = "".join(f"<li>{_e(line)}</li>" for line in verification.failed_expectations)
        failures = f'<h3>Failed expectations</h3><ul class="failures">{items}</ul>'
    links = f"<li>results: <code>{_e(str(verification.path))}</code></li>"
    if verification.data_docs is not None:
        relative = os.path.relpath(verification.data_docs, report_dir)
        href = quote(Path(relative).as_posix(), safe="/=.-_")
        links += f'<li>Great Expectations Data Docs: <a href="{_e(href)}">{_e(relative)}</a></li>'
    return f"<section><h2>Verification</h2>{verdict}{failures}<ul>{links}</ul></section>"


def _figure_section(title: str, figure: Figure, alt: str, caption: str) -> str:
    encoded = base64.b64encode(figure_png(figure)).decode("ascii")
    return (
        f"<section><h2>{_e(title)}</h2><figure>"
        f'<img src="data:image/png;base64,{encoded}" alt="{_e(alt)}">'
        f"<figcaption>{_e(caption)}</figcaption></figure></section>"
    )


def _new_figure() -> tuple[Figure, Any]:
    figure = Figure(figsize=FIGURE_INCHES, dpi=FIGURE_DPI, layout="constrained")
    return figure, figure.add_subplot()


def _say_nothing(axes: Any, text: str) -> None:
    axes.text(0.5, 0.5, text, ha="center", va="center", transform=axes.transAxes)
    axes.set_axis_off()


def _when(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2rem;
       color: #1a202c; max-width: 1400px; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.2rem; margin-top: 2rem;
     border-bottom: 1px solid #e2e8f0; padding-bottom: .3rem; }
.badge { font-size: .9rem; padding: .15rem .6rem; border-radius: 1rem; vertical-align: middle; }
.badge.ok { background: #c6f6d5; color: #22543d; }
.badge.bad { background: #fed7d7; color: #822727; }
.facts { display: grid; grid-template-columns: repeat(auto-fill, minmax(240px, 1fr)); gap: .5rem; }
.fact { background: #f7fafc; border: 1px solid #e2e8f0; border-radius: .4rem;
        padding: .4rem .6rem; }
.fact span, .fact small { display: block; font-size: .75rem; color: #4a5568; }
.fact b { display: block; white-space: nowrap; font-variant-numeric: tabular-nums; }
.fact.warn { background: #fffaf0; border-color: #ed8936; }
dl.about { display: grid; grid-template-columns: max-content 1fr; gap: .15rem 1rem;
           margin: .8rem 0 0; font-size: .85rem; }
dl.about dt { color: #4a5568; } dl.about dd { margin: 0; font-family: monospace;
                                              overflow-wrap: anywhere; }
table.queues { border-collapse: collapse; font-size: .85rem; width: 100%; }
table.queues th, table.queues td { border: 1px solid #e2e8f0; padding: .25rem .45rem; }
table.queues th { background: #edf2f7; text-align: left; font-size: .8rem; }
table.queues tbody tr:nth-child(even) { background: #f7fafc; }
.wide { overflow-x: auto; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.error { min-width: 10rem; max-width: 32rem; overflow-wrap: anywhere; color: #9b2c2c; }
td.warn { text-align: right; background: #feebc8; font-weight: bold; }
.ok { color: #22543d; } .bad { color: #9b2c2c; font-weight: bold; }
figure { margin: 0; } figure img { max-width: 100%; height: auto; border: 1px solid #e2e8f0; }
figcaption { font-size: .85rem; color: #4a5568; margin-top: .3rem; }
code { font-size: .85rem; }
"""

__all__ = [
    "BUCKET_SECONDS",
    "DUPLICATE_COLUMNS",
    "FIGURE_DPI",
    "FIGURE_INCHES",
    "HISTOGRAM_BINS",
    "LOG_SCALE_SPREAD",
    "MAX_BUCKETS",
    "PERCENTILES",
    "REPORTS_DIR",
    "REPORT_FILE",
    "REPORT_MESSAGE_COLUMNS",
    "VERIFICATION_DIR",
    "VERIFICATION_FILE",
    "Latency",
    "RunLedger",
    "Throughput",
    "VerificationResult",
    "bucket_seconds_for",
    "build_report",
    "confirm_latency",
    "figure_png",
    "latest_run_id",
    "load_run",
    "plot_latency",
    "plot_throughput",
    "queue_summary",
    "read_ledger_table",
    "read_verification",
    "render_report",
    "repeated_checksums",
    "throughput",
]


def write_reports(ledger_path: str, run_ids: Sequence[str]) -> list[Path]:
    """Each run's HTML report beside the ledger (`rmq-spark report`'s page), its path
    printed (`build_reports`, then `print_report_paths`)."""
    return print_report_paths(build_reports(ledger_path, run_ids))


def build_reports(ledger_path: str, run_ids: Sequence[str]) -> list[Path]:
    """Each run's HTML report beside the ledger, nothing printed: a caller may build
    them on a thread while Spark stops. The run is recorded whether or not its report
    can be written, so a report that cannot be is logged, and the exit code stays the
    run's."""
    written = []
    for run_id in run_ids:
        try:
            written.append(build_report(ledger_path, run_id))
        except RmqSparkError as exc:
            log.error("the report of run %s could not be written: %s", run_id, exc)
    return written


def print_report_paths(paths: Sequence[Path]) -> list[Path]:
    for path in paths:
        print(f"report: {path}", flush=True)
    return list(paths)
