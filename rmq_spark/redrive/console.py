"""What a moving redrive prints: its decisions, each destination's witness, the RESULT.

The decisions table is the dry run's (`preflight.format_counts`), from the committed
ledger rows instead of a read of the DLQ, so a plan and its run read alike.
"""

from __future__ import annotations

from rmq_spark.redrive.preflight import format_counts
from rmq_spark.redrive.run import RedriveResult


def format_result(result: RedriveResult) -> str:
    """Decisions, destinations, then one RESULT line (verified or not, lost, unproven).

    A destination's `witness` is `depth` when its exact depth proves what arrived and
    `confirms` when only the broker's publisher confirms do (unproven: redrive/tally.py);
    the RESULT line names each unproven destination, with what may have taken its
    messages when the depth fell short (its TTL or length limit, a consumer between the
    readings).
    """
    source = result.source
    decided = format_counts(result.dlq, result.counts).splitlines()
    decided[0] = f"run {result.run_id}, by its ledger rows (confirmed):"
    lines = ["\n".join(decided)]
    if result.destinations:
        width = max(len("destination"), *(len(d.destination) for d in result.destinations))
        lines.append(
            f"  {'destination':<{width}}  {'arrived':>7}  {'witness':<8}  "
            f"{'depth before':>12}  {'after':>6}  {'consumers':>9}"
        )
        for d in result.destinations:
            before = "-" if d.before is None else str(d.before.depth)
            after = "-" if d.after is None else str(d.after.depth)
            consumers = (
                "-"
                if d.before is None or d.after is None
                else str(max(d.before.consumers, d.after.consumers))
            )
            witness = d.witness if not d.missing else f"missing {d.missing}"
            lines.append(
                f"  {d.destination:<{width}}  {d.confirmed:>7}  {witness:<8}  "
                f"{before:>12}  {after:>6}  {consumers:>9}"
            )
    verdict = "verified" if result.verified else "NOT VERIFIED"
    missing = sum(d.missing for d in result.destinations)
    problems = []
    if result.outcome.error:
        problems.append(f"error: {result.outcome.error}")
    if not source.positions_contiguous:
        problems.append("ledger positions have a gap")
    if missing:
        problems.append(f"missing at a destination {missing}")
    unproven = ", ".join(
        d.destination + (f" ({', '.join(d.unproven_because)})" if d.unproven_because else "")
        for d in result.unproven
    )
    lines.append(
        f"RESULT {verdict}: run {result.run_id}, examined {source.examined}, moved "
        f"{source.moved}, kept {source.kept}, lost {source.lost}, uncertain "
        f"{source.uncertain}, "
        + (f"duplicates {source.duplicates} (named in the ledger), " if source.duplicates else "")
        + f"{result.seconds:.1f} s"
        + (f"; destinations unproven (confirms only): {unproven}" if unproven else "")
        + (f"; {'; '.join(problems)}" if problems else "")
    )
    return "\n".join(lines)
