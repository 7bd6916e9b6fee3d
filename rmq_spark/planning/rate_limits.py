"""The rate limits each transfer keeps to, resolved on the driver before the move.

The config sets limits for the whole job and per route (`config.Limits`); a
transfer keeps to the smaller of its route's and its share of the job's
(`transfer_limits`). The driver resolves them per route for the plan
(`route_rate_limits`) and hands them to the movers in their settings, where
`transfer.rate_limit.RateBrake` applies them; the one-line descriptions are for
progress, the console and the report.
"""

from __future__ import annotations

from rmq_spark.config import JobConfig, Limits
from rmq_spark.model import queues_at_once, task_count


def transfer_limits(job: Limits, route: Limits, at_once: int) -> Limits:
    """The limits one transfer keeps to: the smaller of its route's and its share of
    the job's.

    The share is the job's limit divided by `at_once`, the most transfers that can
    move at the same time (the job's capacity, or fewer when the plan has fewer
    queues), so however the executors' tasks interleave, the transfers moving
    together never pass the job's limit. A transfer does not take over the share of
    one that finished: the executors do not talk to each other, so the tail of a
    job runs below its limit rather than above it.
    """
    if at_once < 1:
        raise ValueError(f"at_once must be >= 1, got {at_once}")

    def smaller(job_rate: float | None, route_rate: float | None) -> float | None:
        share = None if job_rate is None else job_rate / at_once
        rates = [rate for rate in (share, route_rate) if rate is not None]
        return min(rates) if rates else None

    depths = [d for d in (job.destination_max_depth, route.destination_max_depth) if d]
    return Limits(
        messages_per_second=smaller(job.messages_per_second, route.messages_per_second),
        bytes_per_second=smaller(job.bytes_per_second, route.bytes_per_second),
        # A depth is per destination queue: not shared.
        destination_max_depth=min(depths) if depths else None,
    )


def transfers_at_once(config: JobConfig, transfers: int) -> int:
    """The most transfers of a plan of `transfers` queues that move at the same time:
    `task_count` tasks, each moving `queues_at_once` of its queues (model.py)."""
    max_active, per_task = config.max_active, config.mover.queues_per_task
    capacity = task_count(max_active, per_task) * queues_at_once(max_active, per_task)
    return max(1, min(transfers, capacity))


def route_rate_limits(config: JobConfig, transfers: int) -> dict[str, Limits]:
    """route name -> the limits each of its transfers keeps to, for a plan of
    `transfers` queues; routes with no limit at all are left out."""
    at_once = transfers_at_once(config, transfers)
    resolved = {
        route.name: transfer_limits(config.limits, route.limits, at_once) for route in config.routes
    }
    return {name: limits for name, limits in resolved.items() if not limits.unlimited}


def describe_limits(limits: Limits) -> str:
    """'500 msg/s, 1,000,000 B/s' for progress and reports; 'unlimited' when unset."""
    parts = []
    if limits.messages_per_second is not None:
        parts.append(f"{limits.messages_per_second:,.6g} msg/s")
    if limits.bytes_per_second is not None:
        parts.append(f"{limits.bytes_per_second:,.0f} B/s")
    if limits.destination_max_depth is not None:
        parts.append(f"destination depth < {limits.destination_max_depth:,}")
    return ", ".join(parts) or "unlimited"


def limits_in_force(config: JobConfig) -> str:
    """The config's limits in one line ('' when none): the job's, then each limited
    route's per queue."""
    parts = []
    if not config.limits.unlimited:
        parts.append(f"job {describe_limits(config.limits)}")
    parts.extend(
        f"route {route.name} per queue {describe_limits(route.limits)}"
        for route in config.routes
        if not route.limits.unlimited
    )
    return "; ".join(parts)
