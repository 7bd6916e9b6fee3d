"""The throughput benchmark's figures, targets and tables, from its runs.

`figures` summarises one CPU layout's runs per scenario and contender (medians, broker
CPU per 100k messages net of the idle VMs, the share of the broker-bound limit in the
separated layout, the ratios the targets are about); `targets` checks the issue's
targets for one layout; `markdown` renders what docs/performance.md shows.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from bench.contenders import LOCAL_SHOVEL, SHOVEL, Run
from bench.cpu_layout import SEPARATED, SHARED, broker_bound_limit

# The targets (issue 16 and, before it, the benchmark issue).
SEPARATED_MOVER_VS_SHOVEL_MIN = 1.25
SEPARATED_SHARE_OF_LIMIT_MIN = 0.95
SHARED_MOVER_VS_SHOVEL_MIN = 1.05
BROKER_CPU_MOVER_VS_SHOVEL_MAX = 0.7
FAR_MOVER_VS_SHOVEL_MIN = 1.2
# 40 ms each way (issue 31): the mover's window is to adapt where the Shovel's prefetch
# cannot.
FARTHER_MOVER_VS_SHOVEL_MIN = 1.5
DR_JOB_VS_SHOVELS_MAX = 0.8
FIXED_OVERHEAD_MAX_SECONDS = 15.0
CLIENT_CPU_PER_100K_MAX = 3.0
LEDGER_OVERHEAD_MAX = 0.10
DEFAULT_WINDOW_OF_PLATEAU_MIN = 0.90
WINDOWS = (1, 10, 100, 300, 1000, 5000)
SINGLE_SCENARIOS = (("single_classic", "classic->classic"), ("single_quorum", "classic->quorum"))


def goals(default_window: int) -> dict[str, float]:
    return {
        "separated_mover_vs_shovel_min": SEPARATED_MOVER_VS_SHOVEL_MIN,
        "separated_share_of_broker_bound_limit_min": SEPARATED_SHARE_OF_LIMIT_MIN,
        "shared_mover_vs_shovel_min": SHARED_MOVER_VS_SHOVEL_MIN,
        "broker_cpu_mover_vs_shovel_max": BROKER_CPU_MOVER_VS_SHOVEL_MAX,
        "far_mover_vs_shovel_min": FAR_MOVER_VS_SHOVEL_MIN,
        "farther_mover_vs_shovel_min": FARTHER_MOVER_VS_SHOVEL_MIN,
        "dr_job_vs_shovels_max": DR_JOB_VS_SHOVELS_MAX,
        "fixed_overhead_max_seconds": FIXED_OVERHEAD_MAX_SECONDS,
        "client_cpu_per_100k_max": CLIENT_CPU_PER_100K_MAX,
        "ledger_overhead_max": LEDGER_OVERHEAD_MAX,
        "default_window_of_plateau_min": DEFAULT_WINDOW_OF_PLATEAU_MIN,
        "default_window": default_window,
    }


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def summarise(runs: Sequence[Run]) -> dict[str, Any]:
    seconds = [run.seconds for run in runs]
    summary: dict[str, Any] = {
        "runs": len(runs),
        "messages": max(run.messages for run in runs),
        "bytes": max(run.bytes for run in runs),
        "median_seconds": round(median(seconds), 2),
        "min_seconds": round(min(seconds), 2),
        "max_seconds": round(max(seconds), 2),
        "median_rate": round(median([run.rate for run in runs]), 1),
        "median_mib_per_second": round(
            median([run.bytes / run.seconds / 2**20 for run in runs]), 2
        ),
        "median_broker_cpu_seconds": {
            side: round(median([run.broker_cpu_seconds[side] for run in runs]), 2)
            for side in runs[0].broker_cpu_seconds
        },
    }
    costs = [
        run.details["broker_cpu_per_100k"] for run in runs if "broker_cpu_per_100k" in run.details
    ]
    if costs:
        summary["median_broker_cpu_per_100k"] = round(median(costs), 2)
    shares = [
        run.rate / limit
        for run in runs
        if "broker_cores" in run.details
        and (
            limit := broker_bound_limit(
                run.details["broker_cpu_per_100k"], run.details["broker_cores"]
            )
        )
    ]
    if shares:
        # Separated layout only: the brokers' own cores bound the rate.
        summary["broker_bound_limit_rate"] = round(
            broker_bound_limit(
                summary["median_broker_cpu_per_100k"], runs[0].details["broker_cores"]
            )
            or 0
        )
        summary["share_of_broker_bound_limit"] = round(median(shares), 3)
    proxy = [run.details["proxy_cpu_seconds"] for run in runs if "proxy_cpu_seconds" in run.details]
    if proxy:
        summary["median_proxy_cpu_seconds"] = round(median(proxy), 2)
    incomplete = [run for run in runs if run.details.get("left_in_source")]
    if incomplete:
        # The contender said it was done, yet the source still held messages.
        summary["runs_leaving_messages_in_source"] = [
            {"moved": run.messages, "left_in_source": run.details["left_in_source"]}
            for run in incomplete
        ]
    cpu = [run.client_cpu_seconds for run in runs if run.client_cpu_seconds is not None]
    if cpu:
        summary["median_client_cpu_seconds"] = round(median(cpu), 2)
    rss = [run.peak_rss_kib for run in runs if run.peak_rss_kib is not None]
    if rss:
        summary["max_peak_rss_mib"] = round(max(rss) / 1024, 1)
    overhead = [run.details["fixed_overhead_seconds"] for run in runs if "stages" in run.details]
    if overhead:
        summary["median_fixed_overhead_seconds"] = round(median(overhead), 2)
        summary["median_stages"] = {
            stage: round(median([run.details["stages"][stage] for run in runs]), 2)
            for stage in runs[0].details["stages"]
        }
    return summary


def speedup(baseline: Sequence[Run], contender: Sequence[Run]) -> float:
    """How many times faster `contender` is than `baseline`: median of per-round ratios."""
    pairs = list(zip(baseline, contender, strict=False))
    return round(median([b.seconds / c.seconds for b, c in pairs]), 3)


def figures(results: dict[str, dict[str, list[Run]]]) -> dict[str, Any]:
    """Per scenario: contender summaries and the ratios the targets are about."""
    out: dict[str, Any] = {}
    for scenario, by_contender in results.items():
        entry: dict[str, Any] = {name: summarise(runs) for name, runs in by_contender.items()}
        ratios = {}
        if SHOVEL in by_contender:
            for name in ("mover", "job", LOCAL_SHOVEL):
                if name in by_contender:
                    ratios[f"{name}_vs_shovel"] = speedup(by_contender[SHOVEL], by_contender[name])
        if SHOVEL in entry and "median_broker_cpu_per_100k" in entry[SHOVEL]:
            shovel_cost = entry[SHOVEL]["median_broker_cpu_per_100k"]
            for name in ("mover", "job", LOCAL_SHOVEL):
                if name in entry and shovel_cost > 0:
                    ratios[f"{name}_broker_cpu_vs_shovel"] = round(
                        entry[name]["median_broker_cpu_per_100k"] / shovel_cost, 3
                    )
        if LOCAL_SHOVEL in by_contender and "mover" in by_contender:
            ratios["mover_vs_local_shovel"] = speedup(
                by_contender[LOCAL_SHOVEL], by_contender["mover"]
            )
        if "mover_no_ledger" in by_contender:
            pairs = zip(by_contender["mover"], by_contender["mover_no_ledger"], strict=False)
            ratios["ledger_overhead"] = round(
                median([(on.seconds - off.seconds) / on.seconds for on, off in pairs]), 3
            )
        if "orchestrated_shovels" in by_contender:
            pairs = zip(by_contender["job"], by_contender["orchestrated_shovels"], strict=False)
            ratios["job_time_vs_shovels"] = round(
                median([j.seconds / s.seconds for j, s in pairs]), 3
            )
        entry["ratios"] = ratios
        out[scenario] = entry
    return out


Check = tuple[str, str, Callable[[], Any], str, float]  # scenario, target, measure, op, goal


def targets(summary: dict[str, Any], layout: str, default_window: int) -> list[dict[str, Any]]:
    """The issue's targets that apply to `layout`, each with its figure and met/missed.

    A target whose scenario was not run here is left out; one whose scenario ran but
    did not complete is reported as not measured (and missed).
    """

    def figure(scenario: str, name: str, key: str) -> Any:
        return summary[scenario][name][key]

    def ratio(scenario: str, key: str) -> Any:
        return summary[scenario]["ratios"][key]

    def client_cpu_per_100k() -> float:
        mover: dict[str, float] = summary["single_classic"]["mover"]
        return round(mover["median_client_cpu_seconds"] * 100_000 / mover["messages"], 2)

    def default_window_share() -> float:
        rates: dict[int, float] = {
            w: summary[f"window_{w}"]["mover"]["median_rate"] for w in WINDOWS
        }
        return round(rates[default_window] / max(rates.values()), 3)

    checks: list[Check] = []
    for scenario, label in SINGLE_SCENARIOS:
        if layout == SEPARATED:
            checks += [
                (
                    scenario,
                    f"mover share of its broker-bound limit, 1 KiB {label}",
                    partial_figure(figure, scenario, "mover", "share_of_broker_bound_limit"),
                    ">=",
                    SEPARATED_SHARE_OF_LIMIT_MIN,
                ),
                (
                    scenario,
                    f"mover vs Shovel, 1 KiB {label} (x faster)",
                    partial_figure(ratio, scenario, "mover_vs_shovel"),
                    ">=",
                    SEPARATED_MOVER_VS_SHOVEL_MIN,
                ),
            ]
        if layout == SHARED:
            checks.append(
                (
                    scenario,
                    f"mover vs Shovel, 1 KiB {label} (x faster)",
                    partial_figure(ratio, scenario, "mover_vs_shovel"),
                    ">=",
                    SHARED_MOVER_VS_SHOVEL_MIN,
                )
            )
        checks.append(
            (
                scenario,
                f"broker CPU per 100k: mover / Shovel, 1 KiB {label}",
                partial_figure(ratio, scenario, "mover_broker_cpu_vs_shovel"),
                "<=",
                BROKER_CPU_MOVER_VS_SHOVEL_MAX,
            )
        )
    checks += [
        (
            "single_classic",
            "mover client CPU-s per 100k 1 KiB messages (ledger on)",
            client_cpu_per_100k,
            "<=",
            CLIENT_CPU_PER_100K_MAX,
        ),
        (
            "single_classic",
            "job fixed overhead (s): Spark start + plan + commit + verify",
            partial_figure(figure, "single_classic", "job", "median_fixed_overhead_seconds"),
            "<=",
            FIXED_OVERHEAD_MAX_SECONDS,
        ),
        (
            "single_classic",
            "ledger overhead (share of mover transfer time)",
            partial_figure(ratio, "single_classic", "ledger_overhead"),
            "<=",
            LEDGER_OVERHEAD_MAX,
        ),
        (
            f"window_{default_window}",
            f"default window ({default_window}) rate / window-curve plateau",
            default_window_share,
            ">=",
            DEFAULT_WINDOW_OF_PLATEAU_MIN,
        ),
        (
            "dr",
            "DR: job wall time / orchestrated shovels' wall time",
            partial_figure(ratio, "dr", "job_time_vs_shovels"),
            "<=",
            DR_JOB_VS_SHOVELS_MAX,
        ),
        (
            "far_single",
            "20 ms away: mover vs Shovel, 1 KiB (x faster)",
            partial_figure(ratio, "far_single", "mover_vs_shovel"),
            ">=",
            FAR_MOVER_VS_SHOVEL_MIN,
        ),
        (
            f"far_single_window_{default_window}",
            f"20 ms away, window {default_window} for both: mover vs Shovel, 1 KiB (x faster)",
            partial_figure(ratio, f"far_single_window_{default_window}", "mover_vs_shovel"),
            ">=",
            FAR_MOVER_VS_SHOVEL_MIN,
        ),
        (
            "farther_single",
            "40 ms each way: mover vs Shovel, 1 KiB, window 1000 for both (x faster)",
            partial_figure(ratio, "farther_single", "mover_vs_shovel"),
            ">=",
            FARTHER_MOVER_VS_SHOVEL_MIN,
        ),
        (
            f"farther_single_window_{default_window}",
            f"40 ms each way, window {default_window} for both: mover vs Shovel, 1 KiB (x faster)",
            partial_figure(ratio, f"farther_single_window_{default_window}", "mover_vs_shovel"),
            ">=",
            FARTHER_MOVER_VS_SHOVEL_MIN,
        ),
        (
            "far_dr",
            "20 ms away, DR: job wall time / orchestrated shovels' wall time",
            partial_figure(ratio, "far_dr", "job_time_vs_shovels"),
            "<=",
            DR_JOB_VS_SHOVELS_MAX,
        ),
    ]
    out = []
    for scenario, name, measure, op, goal in checks:
        if scenario not in summary:
            continue
        try:
            value = measure()
        except KeyError:
            value = None  # its scenario failed; the report's "errors" say why
        met = value is not None and (value >= goal if op == ">=" else value <= goal)
        out.append(
            {
                "layout": layout,
                "target": name,
                "measured": value,
                "goal": f"{op} {goal}",
                "met": met,
            }
        )
    return out


def partial_figure(read: Callable[..., Any], *keys: str) -> Callable[[], Any]:
    return lambda: read(*keys)


def markdown(report: dict[str, Any]) -> str:
    """The tables docs/performance.md shows."""
    lines: list[str] = []
    for layout, section in report.get("layouts", {}).items():
        lines += ["", *host_markdown(layout, section)]
    if report.get("targets"):
        lines += ["", "| layout | target | measured | goal | |", "|---|---|---:|---:|---|"]
        for target in report["targets"]:
            verdict = "met" if target["met"] else "**missed**"
            lines.append(
                f"| {target['layout']} | {target['target']} | {target['measured']} "
                f"| {target['goal']} | {verdict} |"
            )
    for version, section in report.get("peers", {}).items():
        lines += ["", *peers_markdown(version, section)]
    return "\n".join(lines).strip("\n")


def _cell(figures_: dict[str, Any], key: str, fmt: str = "{}") -> str:
    return fmt.format(figures_[key]) if key in figures_ else ""


def host_markdown(layout: str, section: dict[str, Any]) -> list[str]:
    """One CPU layout of the host RabbitMQ's scenarios."""
    summary = section["figures"]
    placement = section.get("placement", {})
    lines = [
        f"{layout} (brokers on CPUs {placement.get('broker_cpus', 'all')}, client on "
        f"{placement.get('client_cpus', 'all')}; idle brokers "
        f"{section.get('idle_broker_cpu_per_second', 0)} CPU-s/s, subtracted):",
        "",
        "| scenario | contender | messages | median s | msg/s | MiB/s | client CPU-s "
        "| broker CPU-s /100k | share of broker-bound limit | vs shovel |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for scenario, entry in summary.items():
        for name, figures_ in entry.items():
            if name == "ratios":
                continue
            ratio = entry["ratios"].get(f"{name}_vs_shovel", "")
            lines.append(
                f"| {scenario} | {name} | {figures_['messages']:,} | {figures_['median_seconds']} "
                f"| {figures_['median_rate']:,.0f} | {figures_['median_mib_per_second']} "
                f"| {_cell(figures_, 'median_client_cpu_seconds')} "
                f"| {_cell(figures_, 'median_broker_cpu_per_100k')} "
                f"| {_cell(figures_, 'share_of_broker_bound_limit', '{:.0%}')} | {ratio} |"
            )
    for scenario, entry in summary.items():
        for name, figures_ in entry.items():
            if name != "ratios" and "median_proxy_cpu_seconds" in figures_:
                lines.append(
                    f"\n{scenario} {name}: the delay proxy spent "
                    f"{figures_['median_proxy_cpu_seconds']} CPU-s (client cores)"
                )
    lines += _left_in_source(summary)
    return lines


def peers_markdown(version: str, section: dict[str, Any]) -> list[str]:
    """One 4.x section: every layout's contenders, and the ones a layout rules out."""
    rabbitmq = section.get("versions", {}).get("rabbitmq", version)
    lines = [
        f"RabbitMQ {rabbitmq}:",
        "",
        "| layout | scenario | contender | messages | median s | msg/s | MiB/s "
        "| broker CPU-s /100k | share of broker-bound limit | vs shovel |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for layout, entry in section["layouts"].items():
        for scenario, by_contender in entry["figures"].items():
            for name, figures_ in by_contender.items():
                if name == "ratios":
                    continue
                ratio = by_contender["ratios"].get(f"{name}_vs_shovel", "")
                lines.append(
                    f"| {layout} | {scenario} | {name} | {figures_['messages']:,} "
                    f"| {figures_['median_seconds']} | {figures_['median_rate']:,.0f} "
                    f"| {figures_['median_mib_per_second']} "
                    f"| {_cell(figures_, 'median_broker_cpu_per_100k')} "
                    f"| {_cell(figures_, 'share_of_broker_bound_limit', '{:.0%}')} | {ratio} |"
                )
        for name, reason in entry.get("not_applicable", {}).items():
            lines.append(f"| {layout} | every scenario | {name} | not applicable: {reason} |")
    for layout, entry in section["layouts"].items():
        lines += [f"{layout}: {line.strip()}" for line in _left_in_source(entry["figures"])]
    return lines


def _left_in_source(summary: dict[str, Any]) -> list[str]:
    lines = []
    for scenario, entry in summary.items():
        for name, figures_ in entry.items():
            for bad in (
                figures_.get("runs_leaving_messages_in_source", []) if name != "ratios" else []
            ):
                lines.append(
                    f"\n{scenario} {name}: reported done after moving {bad['moved']:,}; "
                    f"{bad['left_in_source']} message(s) were still in the source"
                )
    return lines
