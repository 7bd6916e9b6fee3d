"""What a run's report shows, read from the ledger and computed without Spark.

Reading: the run's rows of the three ledger tables (delta-rs lists each table's
snapshot, pyarrow reads its files) and the verification written beside the ledger.
Figures: Spark-free functions over plain Arrow tables (`throughput`,
`confirm_latency`, `queue_summary`, `repeated_checksums`), like `verify`'s summaries.
`report.html` renders them; the notebook `notebooks/ledger_inspection.ipynb` calls
them through `rmq_spark.report.html`, which re-exports every public name here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from rmq_spark.errors import LedgerError
from rmq_spark.ledger import store, tables
from rmq_spark.ledger.schema import TRANSFER_KEY
from rmq_spark.ledger.storage import open_table

VERIFICATION_DIR = "verification"
VERIFICATION_FILE = "verification.json"

# What the report reads of the run's message rows: which transfer, and its two times.
REPORT_MESSAGE_COLUMNS: tuple[str, ...] = (*TRANSFER_KEY, "consumed_at", "confirmed_at")
# Read too where the table has them (older ledgers do not): where a decision sent each
# message and why (a redrive's origin queues and death reasons, a selection's kept ones).
DECISION_COLUMNS: tuple[str, ...] = (
    "decision",
    "publish_exchange",
    "publish_routing_key",
    "reason",
)
# What a duplicate listing shows of each row.
DUPLICATE_COLUMNS: tuple[str, ...] = (
    *TRANSFER_KEY,
    "body_sha256",
    "properties_sha256",
    "position",
    "publish_seq",
    "redelivered",
    "message_id",
    "consumed_at",
    "confirmed_at",
    "task_attempt",
    "session",
)

# Bucket widths the throughput plot may use; the smallest that keeps the plot readable.
BUCKET_SECONDS: tuple[int, ...] = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600)
MAX_BUCKETS = 300
PERCENTILES: tuple[int, ...] = (50, 95, 99)
_US_PER_SECOND = 1_000_000
_US_PER_MS = 1_000
# A queue transfer within one run (verification.json's queues carry no run id).
_QUEUE_KEY: tuple[str, ...] = tuple(name for name in TRANSFER_KEY if name != "run_id")
# pyarrow's dataset field naming the data file a row was read from.
_FILENAME = "__filename"


# --- reading the ledger -------------------------------------------------------------------


@dataclass(frozen=True)
class RunLedger:
    """One run's rows of the three tables, as Arrow tables (the runs row as a dict)."""

    ledger_path: str
    run: dict[str, Any]
    queues: pa.Table
    messages: pa.Table  # REPORT_MESSAGE_COLUMNS, or more when the caller asked
    records: int = 1  # runs rows of this run id: more than 1 if it was re-run after recording


def read_ledger_table(
    ledger_path: str,
    table: str,
    *,
    run_id: str | None = None,
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """A ledger table (or one run's rows of it) as an Arrow table, without Spark."""
    return tables.read_arrow(ledger_path, table, run_id=run_id, columns=columns)


def _snapshot(
    ledger_path: str, table: str, run_id: str | None = None
) -> tuple[ds.Dataset, dict[str, int]]:
    """The table's snapshot as a pyarrow dataset, and when each data file was written."""
    dataset = tables.arrow_dataset(ledger_path, table, run_id)
    path = tables.table_path(ledger_path, table)
    actions = pa.table(open_table(path).get_add_actions(flatten=True))
    written = {
        Path(unquote(relative)).name: modified
        for relative, modified in zip(
            actions["path"].to_pylist(), actions["modification_time"].to_pylist(), strict=True
        )
    }
    return dataset, written


def load_run(
    ledger_path: str, run_id: str, *, message_columns: Sequence[str] = REPORT_MESSAGE_COLUMNS
) -> RunLedger:
    """The run's runs row, queues rows and message rows; LedgerError if the run is unknown."""
    runs = read_ledger_table(ledger_path, "runs", run_id=run_id)
    if runs.num_rows == 0:
        known = read_ledger_table(ledger_path, "runs", columns=["run_id"])["run_id"].to_pylist()
        hint = f"its runs table has {len(known)} run(s)"
        if known:
            hint += f", the latest {latest_run_id(ledger_path)!r}"
        raise LedgerError(
            f"run {run_id!r} is not in the ledger at {ledger_path}: {hint} "
            "(the runs table has a row for each run whose verification ended)"
        )
    # A run id re-run after it was recorded is recorded again; the last record holds.
    run = max(runs.to_pylist(), key=lambda row: row["finished_at"])
    return RunLedger(
        ledger_path=ledger_path,
        run=run,
        queues=_last_record(ledger_path, "queues", run_id),
        messages=read_ledger_table(
            ledger_path,
            "messages",
            run_id=run_id,
            columns=[*message_columns, *_present(ledger_path, DECISION_COLUMNS, message_columns)],
        ),
        records=runs.num_rows,
    )


def _present(ledger_path: str, wanted: Sequence[str], already: Sequence[str]) -> list[str]:
    """Those of `wanted` the messages table has and `already` does not name."""
    names = tables.arrow_dataset(ledger_path, "messages").schema.names
    return [name for name in wanted if name in names and name not in already]


def routed_decisions(messages: pa.Table) -> list[tuple[str, str, str, int]]:
    """(decision, destination, reason, confirmed rows) where the rows say more than
    moved to the transfer's destination: a redrive's origin queues (`exchange/key`
    through another exchange) with their death reasons, kept ones with why; sorted,
    moved first. Empty for a plain move's run and a ledger without the columns.

    >>> table = pa.table({"decision": ["moved"], "publish_exchange": [""],
    ...     "publish_routing_key": ["orders"], "reason": ["rejected"], "confirmed_at": [1],
    ...     "source_queue": ["shop.dlq"]})
    >>> routed_decisions(table)
    [('moved', 'orders', 'rejected', 1)]
    """
    if "reason" not in messages.column_names:
        return []
    counts: dict[tuple[str, str, str], int] = {}
    wanted = [*DECISION_COLUMNS, "confirmed_at", "source_queue"]
    for row in messages.select(wanted).to_pylist():
        if row["reason"] is None or row["confirmed_at"] is None:
            continue
        decision = row["decision"] or "moved"
        if decision == "replayed":
            continue  # a replay's own section counts them (`report/parked.py`)
        key, exchange = row["publish_routing_key"], row["publish_exchange"] or ""
        if decision != "moved" or key is None:
            where = row["source_queue"]
        else:
            where = key if not exchange else f"{exchange}/{key}"
        counts[(decision, where, row["reason"])] = (
            counts.get((decision, where, row["reason"]), 0) + 1
        )
    return sorted(
        ((d, w, r, n) for (d, w, r), n in counts.items()),
        key=lambda x: (x[0] != "moved", x[1], x[2]),
    )


def _last_record(ledger_path: str, table: str, run_id: str) -> pa.Table:
    """The run's rows in the newest data file of `table` that holds any.

    The driver records a run's queues rows in one append (one file); a run id re-run
    after it was recorded appends a second set, and the newest describes the run.
    """
    dataset, written = _snapshot(ledger_path, table)
    rows = dataset.to_table(
        columns=[*dataset.schema.names, _FILENAME], filter=ds.field("run_id") == run_id
    )
    files = set(rows[_FILENAME].to_pylist())
    if len(files) > 1:
        newest = max(files, key=lambda file: written.get(Path(file).name, 0))
        rows = rows.filter(pc.equal(rows[_FILENAME], newest))
    return rows.drop_columns([_FILENAME])


def latest_run_id(ledger_path: str) -> str:
    """The run id with the latest start in the runs table; LedgerError if there is none."""
    runs = read_ledger_table(ledger_path, "runs", columns=["run_id", "started_at"])
    if runs.num_rows == 0:
        raise LedgerError(f"the ledger at {ledger_path} has no runs yet")
    latest = runs.take([pc.index(runs["started_at"], pc.max(runs["started_at"])).as_py()])
    return str(latest["run_id"][0].as_py())


# --- the figures (Spark-free, over plain Arrow tables) ------------------------------------


@dataclass(frozen=True)
class Throughput:
    """Messages confirmed per time bucket since `origin`; uncertain rows counted apart."""

    bucket_seconds: int
    counts: tuple[int, ...]  # confirmed rows per bucket, bucket i starts at i * bucket_seconds
    uncertain: int  # rows with no confirm time: not placed in any bucket

    @property
    def confirmed(self) -> int:
        return sum(self.counts)

    @property
    def rates(self) -> tuple[float, ...]:
        """Messages per second in each bucket."""
        return tuple(count / self.bucket_seconds for count in self.counts)

    @property
    def peak_rate(self) -> float:
        return max(self.rates, default=0.0)

    @property
    def busy_seconds(self) -> tuple[int, int]:
        """Start of the first and end of the last bucket with a confirm, from the origin."""
        busy = [index for index, count in enumerate(self.counts) if count]
        if not busy:
            return (0, 0)
        return (busy[0] * self.bucket_seconds, (busy[-1] + 1) * self.bucket_seconds)

    @property
    def mean_rate(self) -> float:
        """Confirmed messages per second between the first and the last busy bucket."""
        first, last = self.busy_seconds
        return self.confirmed / (last - first) if last > first else 0.0


def bucket_seconds_for(span_seconds: float, max_buckets: int = MAX_BUCKETS) -> int:
    """The narrowest bucket in BUCKET_SECONDS that cuts `span_seconds` into few enough."""
    for width in BUCKET_SECONDS:
        if span_seconds / width <= max_buckets:
            return width
    return BUCKET_SECONDS[-1]


def throughput(
    messages: pa.Table, *, origin: datetime | None = None, bucket_seconds: int | None = None
) -> Throughput:
    """Confirmed messages per bucket of `confirmed_at`, counted from `origin`.

    `origin` defaults to the first confirm (the report passes the run's start, so the
    x axis reads "seconds since the run started"); `bucket_seconds` defaults to the
    narrowest width that gives at most MAX_BUCKETS buckets.
    """
    confirmed_us = _epoch_us(messages["confirmed_at"])
    uncertain = messages.num_rows - len(confirmed_us)
    if len(confirmed_us) == 0:
        return Throughput(bucket_seconds=bucket_seconds or 1, counts=(), uncertain=uncertain)
    start_us = int(confirmed_us.min())
    if origin is not None:
        start_us = min(start_us, _datetime_us(origin))
    span_seconds = (int(confirmed_us.max()) - start_us) / _US_PER_SECOND
    width = bucket_seconds or bucket_seconds_for(span_seconds)
    buckets = (confirmed_us - start_us) // (width * _US_PER_SECOND)
    counts = np.bincount(buckets)
    return Throughput(
        bucket_seconds=width, counts=tuple(int(c) for c in counts), uncertain=uncertain
    )


@dataclass(frozen=True)
class Latency:
    """Confirm latency (confirmed_at - consumed_at) of the confirmed rows, in ms."""

    milliseconds: npt.NDArray[np.float64]
    percentiles: dict[int, float] = field(default_factory=dict)  # PERCENTILES -> ms
    uncertain: int = 0  # rows with no confirm time: no latency

    def caption(self) -> str:
        if not self.percentiles:
            return f"no confirmed messages; {self.uncertain} uncertain row(s)"
        parts = ", ".join(f"p{p} {format_ms(self.percentiles[p])}" for p in PERCENTILES)
        text = (
            f"{len(self.milliseconds):,} confirmed messages: {parts}, max {format_ms(self.maximum)}"
        )
        if self.uncertain:
            text += f"; {self.uncertain} uncertain row(s) have no confirm time"
        return text

    @property
    def maximum(self) -> float:
        return float(self.milliseconds.max()) if len(self.milliseconds) else 0.0


def confirm_latency(messages: pa.Table) -> Latency:
    """Time from the delivery reaching the mover to the destination's confirm, per row."""
    confirmed = messages.filter(pc.is_valid(messages["confirmed_at"]))
    uncertain = messages.num_rows - confirmed.num_rows
    latency_us = _epoch_us(confirmed["confirmed_at"]) - _epoch_us(confirmed["consumed_at"])
    milliseconds = latency_us.astype(np.float64) / _US_PER_MS
    if len(milliseconds) == 0:
        return Latency(milliseconds=milliseconds, uncertain=uncertain)
    values = np.percentile(milliseconds, PERCENTILES)
    return Latency(
        milliseconds=milliseconds,
        percentiles={p: float(v) for p, v in zip(PERCENTILES, values, strict=True)},
        uncertain=uncertain,
    )


def queue_summary(
    ledger: RunLedger, verification: VerificationResult | None = None
) -> list[dict[str, Any]]:
    """One row per queue transfer: the queues table's figures, the uncertain rows counted
    from the messages, and the verdict from verification.json when there is one."""
    uncertain = _uncertain_per_transfer(ledger.messages)
    passed = verification.passed_by_transfer if verification else {}
    decisions = verification.decisions_by_transfer if verification else {}
    rows = []
    for row in sorted(ledger.queues.to_pylist(), key=_transfer_key):
        key = _transfer_key(row)
        rows.append(
            {
                "source": f"{row['source_cluster']}/{row['source_vhost']}/{row['source_queue']}",
                "destination": (
                    f"{row['destination_cluster']}/{row['destination_vhost']}/"
                    f"{row['destination_queue']}"
                ),
                "status": row["status"],
                "source_depth_before": row["source_depth_before"],
                "source_depth_after": row["source_depth_after"],
                "destination_depth_before": row["destination_depth_before"],
                "destination_depth_after": row["destination_depth_after"],
                "ledger_rows": row["ledger_rows"],
                "uncertain_rows": uncertain.get(key, 0),
                "duplicates": row["duplicates"],
                "lost": row["lost"],
                "unexpected": row["unexpected"],
                "passed": passed.get(key),
                # None without verification.json: the ledger rows alone do not say which
                # were duplicates.
                "moved": decisions[key][0] if key in decisions else None,
                "kept": decisions[key][1] if key in decisions else None,
                "error": row["error"],
                # Null in ledgers written before the column existed.
                "reordered_by_priority": row.get("reordered_by_priority"),
            }
        )
    return rows


def repeated_checksums(messages: pa.Table) -> pa.Table:
    """Every row whose (body, properties) checksums occur more than once in its transfer.

    Such a message was published more than once: the first copy, then a redelivered
    repeat (a crash between its ledger row and the source ack) or an uncertain row (a
    lost connection before its confirm). Sorted by transfer, checksum and position, with
    `copies`: how many rows share the checksums. Needs TRANSFER_KEY, body_sha256 and
    properties_sha256; other columns are carried along.
    """
    keys = [*TRANSFER_KEY, "body_sha256", "properties_sha256"]
    copies = messages.group_by(keys).aggregate([([], "count_all")])
    copies = copies.rename_columns([*keys, "copies"]).filter(pc.greater(copies["count_all"], 1))
    repeated = messages.join(copies, keys=keys, join_type="inner")
    return repeated.sort_by([(key, "ascending") for key in [*keys, "position"]])


# --- the verification beside the ledger ---------------------------------------------------


@dataclass(frozen=True)
class VerificationResult:
    """What verification.json says about the run."""

    path: Path
    verified: bool
    failed_expectations: tuple[str, ...]
    data_docs: Path | None
    passed_by_transfer: dict[tuple[str, ...], bool]
    # Per transfer: the distinct messages moved to the destination and those a selective
    # move kept in its source (verification's distinct_messages and kept_messages).
    decisions_by_transfer: dict[tuple[str, ...], tuple[int, int]] = field(default_factory=dict)


def read_verification(ledger_path: str, run: Mapping[str, Any]) -> VerificationResult | None:
    """verification.json of the run (runs.verification_path, else the ledger's own folder,
    for a ledger that was moved); None if neither exists."""
    on_store = store.is_object_store(ledger_path)
    default = store.root(ledger_path) / VERIFICATION_DIR / f"run_id={run['run_id']}"
    default = default / VERIFICATION_FILE
    recorded = store.root(run["verification_path"]) if run.get("verification_path") else default
    path = recorded if recorded.is_file() else default
    if not path.is_file():
        return None
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LedgerError(
            f"verification of run {run['run_id']}: cannot read {path} ({exc})"
        ) from exc
    docs = document.get("data_docs_path")
    # Data Docs stay local: an object-store ledger keeps verification.json only.
    data_docs = Path(docs) if docs and not on_store and Path(docs).is_file() else None
    if data_docs is None and not on_store and (path.parent / "data_docs" / "index.html").is_file():
        data_docs = path.parent / "data_docs" / "index.html"
    return VerificationResult(
        path=path,
        verified=bool(document.get("verified")),
        failed_expectations=tuple(document.get("failed_expectations") or ()),
        data_docs=data_docs,
        passed_by_transfer={
            _transfer_key(queue): bool(queue.get("passed")) for queue in document.get("queues", [])
        },
        decisions_by_transfer={
            _transfer_key(queue): (
                int(queue.get("distinct_messages") or 0),
                int(queue.get("kept_messages") or 0),
            )
            for queue in document.get("queues", [])
        },
    )


# --- small helpers ---------------------------------------------------------------------------


def _epoch_us(column: pa.ChunkedArray | pa.Array) -> npt.NDArray[np.int64]:
    """Non-null timestamps as microseconds since the epoch."""
    valid = pc.drop_null(column)
    return np.asarray(valid.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()), dtype=np.int64)


def _datetime_us(moment: datetime) -> int:
    return int(pa.scalar(moment, pa.timestamp("us", tz="UTC")).cast(pa.int64()).as_py())


def _transfer_key(row: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(str(row[name]) for name in _QUEUE_KEY)


def _uncertain_per_transfer(messages: pa.Table) -> dict[tuple[str, ...], int]:
    uncertain = messages.filter(pc.is_null(messages["confirmed_at"]))
    counts = uncertain.group_by(list(_QUEUE_KEY)).aggregate([([], "count_all")])
    return {_transfer_key(row): row["count_all"] for row in counts.to_pylist()}


def format_ms(value: float) -> str:
    """A duration in ms for people: ms below 10 s, seconds above."""
    return f"{value:,.1f} ms" if value < 10_000 else f"{value / 1000:,.1f} s"
