"""Names shared by verification's parts: statuses, engines and the columns of the
counters, the summary and the message checks."""

from __future__ import annotations

from rmq_spark.ledger.schema import MESSAGES, TRANSFER_KEY

# Transfer statuses. A ledger row whose transfer is missing from the counters was moved
# by something the plan does not know about; it gets its own status so it fails.
STATUS_MOVED = "moved"
STATUS_UNPLANNED = "unplanned"

# The driver's broker readings, per queue transfer, besides TRANSFER_KEY.
DEPTH_COLUMNS: tuple[str, ...] = (
    "source_depth_before",
    "source_depth_after",
    "destination_depth_before",
    "destination_depth_after",
)
COUNTER_COLUMNS: tuple[str, ...] = (*TRANSFER_KEY, *DEPTH_COLUMNS, "status", "error")
# Optional counter: True when other publishers send to the destination queue during the
# run (routes[].destination.shared). Its rise above the ledger's rows is then their
# messages (`live_arrivals`), not an unexplained copy; every other check is unchanged.
DESTINATION_SHARED = "destination_shared"
# Optional counter: what consumers removed from the source during the run, by the
# broker's counters (`broker/removals.py`); null when they cannot tell. It proves what
# left a source others keep publishing to, where the depth drop cannot.
SOURCE_REMOVED = "source_removed"
# Optional counter: the fences a selective move acked at its source (transfer/selective.py),
# which the consumer counters see as removals without a ledger row.
FENCES = "fences"
# Ledger rows of messages a selective move kept (published back to their source); null
# (rows written before the column existed) is "moved".
KEPT = "kept"
# Ledger rows of redeliveries a resumed session recognised as moved by an earlier one
# (transfer/recognition.py): acked without a publish, so no copy of their own.
RECOGNISED = "recognised"
# What proves what left the source (`source_witness`): the consumer counters, the
# depth drop (nothing was moved beyond it), or nothing (more was moved than the depth
# fell, with no counters: messages arrived meanwhile, and whether another consumer took
# some of them too cannot be told).
WITNESS_COUNTERS, WITNESS_DEPTH, WITNESS_NONE = "counters", "depth", "none"
# Counters the depths contradict: they saw more removed than was moved while the source's
# exact depth fell by just what was moved. Either a consumer's removals from before the
# run reached the counters late (the starting reading lagged: seen on CI's busy nodes,
# right after a run on the same queue) or another consumer took as many as arrived
# meanwhile. Nothing tells the two apart, so such a source is unproven ("none"), neither
# failed (the first) nor proven (the second).
MESSAGE_COLUMNS: tuple[str, ...] = tuple(c.name for c in MESSAGES)

# Per-queue counts of message-level problems, kept in the summary so a failed
# message-level expectation can name the queues it is about.
NULL_BODY_SHA256 = "null_body_sha256"
NULL_PROPERTIES_SHA256 = "null_properties_sha256"
CONFIRMED_BEFORE_CONSUMED = "confirmed_before_consumed"
PROBLEM_COUNTS: tuple[str, ...] = (
    NULL_BODY_SHA256,
    NULL_PROPERTIES_SHA256,
    CONFIRMED_BEFORE_CONSUMED,
)

SUMMARY_COLUMNS: tuple[str, ...] = (
    *TRANSFER_KEY,
    "status",
    "error",
    *DEPTH_COLUMNS,
    "ledger_rows",
    "confirmed_rows",
    "uncertain_rows",
    "duplicates",
    "recognised",
    "distinct_messages",
    "kept_messages",
    "bytes",
    "source_drop",
    "destination_rise",
    "lost",
    SOURCE_REMOVED,
    "taken_by_others",
    "source_witness",
    "unexpected",
    DESTINATION_SHARED,
    "live_arrivals",
    "missing_at_destination",
    "redelivered_rows",
    "retried_rows",
    "reordered",
    "order_kept",
    "min_position",
    "max_position",
    "distinct_positions",
    "positions_contiguous",
    *PROBLEM_COUNTS,
)

# The columns the message-level expectations read (the driver engine loads only these
# into pandas) and the ones the driver engine's summary reads.
MESSAGE_CHECK_COLUMNS: tuple[str, ...] = (
    "run_id",
    "body_sha256",
    "properties_sha256",
    "consumed_at",
    "confirmed_at",
)
SUMMARY_INPUT_COLUMNS: tuple[str, ...] = (
    *TRANSFER_KEY,
    "position",
    "publish_seq",
    "publish_attempts",
    "redelivered",
    "body_size",
    "body_sha256",
    "properties_sha256",
    "consumed_at",
    "confirmed_at",
    "task_attempt",
    "session",
)
# Read too where the ledger has it (rows written before it existed are "moved").
DECISION = "decision"
# Runs with at most this many ledger rows are verified on the driver (pyarrow + GE on
# pandas, roughly 150 bytes of driver memory per row); larger ones in Spark.
LOCAL_MAX_ROWS = 1_000_000
ENGINE_SPARK, ENGINE_DRIVER = "spark", "driver"
