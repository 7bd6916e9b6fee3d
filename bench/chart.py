"""One PNG a person can read: rate by message size, rate by window, the ratios, the job's time.

``python -m bench.chart bench/results/throughput-<stamp>.json`` redraws the charts
from a saved report (``draw`` and ``draw_peers`` are what `bench.throughput` calls).
``draw_peers`` draws a 4.x section: msg/s of every contender, local shovel included,
per scenario, one panel per layout.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on a build box

import matplotlib.pyplot as plt  # after choosing the backend
from matplotlib.patches import Rectangle

SHOVEL_COLOUR, MOVER_COLOUR, JOB_COLOUR = "#8c8c8c", "#1f77b4", "#ff7f0e"
LOCAL_SHOVEL_COLOUR = "#2ca02c"
PEER_COLOURS = {
    "shovel": SHOVEL_COLOUR,
    "local_shovel": LOCAL_SHOVEL_COLOUR,
    "mover": MOVER_COLOUR,
    "job": JOB_COLOUR,
}
SIZE_LABELS = {100: "100 B", 1024: "1 KiB", 65536: "64 KiB", 1048576: "1 MiB"}
STAGE_COLOURS = {
    "launch": "#c7c7c7",
    "spark_and_plan": "#9edae5",
    "transfer": MOVER_COLOUR,
    "commit": "#98df8a",
    "verify": "#d62728",
    "record_and_exit": "#7f7f7f",
}


def _size_rates(figures: dict[str, Any]) -> dict[int, dict[str, float]]:
    """Median msg/s per size and contender; 1 KiB comes from the single-queue scenario."""
    rates = {}
    for scenario, entry in figures.items():
        if scenario.startswith("size_"):
            size = int(scenario.removeprefix("size_"))
        elif scenario == "single_classic":
            size = 1024
        else:
            continue
        rates[size] = {name: entry[name]["median_rate"] for name in ("shovel", "mover")}
        # The paired ratio (median of per-round ratios), as in the report's tables.
        rates[size]["ratio"] = entry["ratios"]["mover_vs_shovel"]
    return dict(sorted(rates.items()))


def _rate_by_size(axis: Any, figures: dict[str, Any]) -> None:
    rates = _size_rates(figures)
    positions = range(len(rates))
    width = 0.38
    for offset, name, colour in (
        (-width / 2, "shovel", SHOVEL_COLOUR),
        (width / 2, "mover", MOVER_COLOUR),
    ):
        values = [by_name[name] for by_name in rates.values()]
        axis.bar([p + offset for p in positions], values, width, label=name, color=colour)
    for position, by_name in zip(positions, rates.values(), strict=True):
        top = max(by_name["mover"], by_name["shovel"])
        axis.annotate(
            f"{by_name['ratio']:.2f}x",
            (position, top),
            ha="center",
            va="bottom",
            fontsize=9,
            xytext=(0, 3),
            textcoords="offset points",
        )
    axis.set_xticks(list(positions), [SIZE_LABELS.get(size, str(size)) for size in rates])
    axis.set_yscale("log")
    axis.set_ylabel("messages / s (log)")
    axis.set_title("Rate by message size (mover / Shovel above)")
    axis.legend(loc="upper right")


def _rate_by_window(axis: Any, figures: dict[str, Any], default_window: int) -> None:
    points = sorted(
        (int(scenario.removeprefix("window_")), entry["mover"]["median_rate"])
        for scenario, entry in figures.items()
        if scenario.startswith("window_")
    )
    windows, rates = zip(*points, strict=True)
    axis.plot(windows, rates, marker="o", color=MOVER_COLOUR, label="mover")
    shovel = figures["single_classic"]["shovel"]["median_rate"]
    axis.axhline(shovel, color=SHOVEL_COLOUR, linestyle="--", label="Shovel, prefetch 1000")
    axis.axvline(default_window, color="black", linestyle=":", linewidth=1)
    axis.annotate(
        "default",
        (default_window, min(rates)),
        fontsize=8,
        xytext=(3, 0),
        textcoords="offset points",
    )
    axis.set_xscale("log")
    axis.set_xlabel("window (prefetch), messages")
    axis.set_ylabel("messages / s")
    axis.set_title("Mover rate by window, 1 KiB classic -> classic")
    axis.legend(loc="lower right")


def _ratios(axis: Any, figures: dict[str, Any], targets: dict[str, float]) -> None:
    """Everything as 'times as fast as the Shovel': above 1, rmq-spark is faster."""
    bars: list[tuple[str, float, str, float | None]] = []
    for scenario, label in (
        ("single_classic", "classic->classic"),
        ("single_quorum", "classic->quorum"),
        ("far_single", "20 ms away"),
        ("farther_single", "40 ms away"),
    ):
        ratios = figures.get(scenario, {}).get("ratios", {})
        if "mover_vs_shovel" in ratios:
            target = {"far_single": targets["far"], "farther_single": targets["farther"]}.get(
                scenario, targets["mover"]
            )
            bars.append((f"mover\n{label}", ratios["mover_vs_shovel"], MOVER_COLOUR, target))
        if "job_vs_shovel" in ratios:
            bars.append((f"job\n{label}", ratios["job_vs_shovel"], JOB_COLOUR, None))
    for scenario, label in (("dr", "job DR\n20 queues"), ("far_dr", "job DR\n20 ms away")):
        dr = figures.get(scenario, {}).get("ratios", {}).get("job_time_vs_shovels")
        if dr:
            bars.append((label, round(1 / dr, 3), JOB_COLOUR, targets["dr"]))
    if not bars:
        raise KeyError("no scenario with a Shovel to compare")
    positions = range(len(bars))
    axis.bar(positions, [value for _, value, _, _ in bars], color=[c for _, _, c, _ in bars])
    for position, (_, value, _, goal) in zip(positions, bars, strict=True):
        axis.annotate(
            f"{value:.2f}x",
            (position, value),
            ha="center",
            va="bottom",
            fontsize=9,
            xytext=(0, 3),
            textcoords="offset points",
        )
        if goal is not None:
            axis.hlines(goal, position - 0.45, position + 0.45, color="red", linestyle="--")
    axis.axhline(1.0, color="black", linewidth=1)
    axis.set_xticks(list(positions), [label for label, _, _, _ in bars], fontsize=8)
    axis.set_ylabel("x as fast as the Shovel")
    axis.set_title("Speed vs Shovel (red dashes: target)")


def _job_stages(axis: Any, figures: dict[str, Any], overhead_target: float) -> None:
    jobs = [
        (f"{label}\n{figures[scenario]['job']['messages']:,} msgs", figures[scenario]["job"])
        for scenario, label in (
            ("single_classic", "classic->classic"),
            ("single_quorum", "classic->quorum"),
            ("dr", "DR, every queue"),
            ("far_dr", "DR, 20 ms away"),
        )
        if "job" in figures.get(scenario, {})
    ]
    for row, (_label, job) in enumerate(jobs):
        left = 0.0
        for stage, seconds in job["median_stages"].items():
            axis.barh(
                row,
                seconds,
                left=left,
                color=STAGE_COLOURS.get(stage, "grey"),
                label=stage if row == 0 else None,
            )
            left += seconds
        axis.annotate(
            f"overhead {job['median_fixed_overhead_seconds']:.0f} s",
            (left, row),
            va="center",
            fontsize=8,
            xytext=(4, 0),
            textcoords="offset points",
        )
    axis.set_yticks(range(len(jobs)), [label for label, _ in jobs])
    axis.invert_yaxis()
    axis.set_xlabel("seconds (median run)")
    axis.set_title(
        f"Where the job's wall time goes (fixed-overhead target {overhead_target:.0f} s)"
    )
    axis.set_xlim(right=axis.get_xlim()[1] * 1.15)  # room for the annotations
    axis.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), fontsize=8, ncols=6)


def _panel(axis: Any, draw_panel: Callable[..., None], *args: Any) -> None:
    """Draw one panel; a scenario missing from the report leaves it saying so."""
    try:
        draw_panel(axis, *args)
    except (KeyError, ValueError) as missing:  # ValueError: no points at all
        axis.clear()
        axis.set_axis_off()
        axis.text(0.5, 0.5, f"not measured ({missing!r})", ha="center", va="center")


def _broker_cost(axis: Any, figures: dict[str, Any]) -> None:
    """Per scenario, each contender's broker CPU-s per 100k messages; in the separated
    layout, the share of its broker-bound limit it reached above each bar."""
    scenarios = [
        scenario
        for scenario, entry in figures.items()
        if any(
            "median_broker_cpu_per_100k" in value for key, value in entry.items() if key != "ratios"
        )
    ]
    names = [name for name in PEER_COLOURS if any(name in figures[s] for s in scenarios)]
    if not scenarios or not names:
        raise KeyError("no broker CPU figures")
    width = 0.8 / len(names)
    for index, name in enumerate(names):
        for slot, scenario in enumerate(scenarios):
            entry = figures[scenario].get(name)
            if not entry or "median_broker_cpu_per_100k" not in entry:
                continue
            position = slot - 0.4 + width * (index + 0.5)
            cost = entry["median_broker_cpu_per_100k"]
            axis.bar(position, cost, width, color=PEER_COLOURS[name])
            share = entry.get("share_of_broker_bound_limit")
            if share is not None:
                axis.annotate(
                    f"{share:.0%}",
                    (position, cost),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    xytext=(0, 2),
                    textcoords="offset points",
                )
    axis.set_xticks(range(len(scenarios)), [_scenario_label(s) for s in scenarios], fontsize=8)
    axis.set_ylabel("broker CPU-s per 100k messages (idle subtracted)")
    axis.set_title("Broker CPU per 100k (above: share of the broker-bound limit)")
    handles = [Rectangle((0, 0), 1, 1, color=PEER_COLOURS[name]) for name in names]
    axis.legend(handles, names, loc="upper right", fontsize=8)


def draw(report: dict[str, Any], layout: str, path: Path) -> None:
    """One CPU layout of the host section: rates, ratios, job stages and broker cost."""
    figures, goals = report["layouts"][layout]["figures"], report["goals"]
    fig, axes = plt.subplots(2, 3, figsize=(22, 10), constrained_layout=True)
    _panel(axes[0][0], _rate_by_size, figures)
    _panel(axes[0][1], _rate_by_window, figures, goals["default_window"])
    _panel(axes[0][2], _broker_cost, figures)
    mover_goal = goals[f"{layout}_mover_vs_shovel_min"]
    _panel(
        axes[1][0],
        _ratios,
        figures,
        {
            "mover": mover_goal,
            "far": goals["far_mover_vs_shovel_min"],
            # Reports written before the 40 ms scenario have no goal for it.
            "farther": goals.get("farther_mover_vs_shovel_min", goals["far_mover_vs_shovel_min"]),
            "dr": 1 / goals["dr_job_vs_shovels_max"],
        },
    )
    _panel(axes[1][1], _job_stages, figures, goals["fixed_overhead_max_seconds"])
    axes[1][2].set_axis_off()
    machine = report["machine"]
    fig.suptitle(
        f"rmq-spark vs Shovel, {layout} layout ({report['started_at'][:16]} UTC, "
        f"{machine['cores']} cores {machine['cpu']}, RabbitMQ {report['versions']['rabbitmq']}; "
        f"load {report['load_average_start'][0]} -> {report['load_average_end'][0]})"
        + (" QUICK" if report["quick"] else ""),
        fontsize=11,
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _scenario_label(scenario: str) -> str:
    if scenario.startswith("size_"):
        return SIZE_LABELS.get(int(scenario.removeprefix("size_")), scenario)
    return {
        "single_classic": "1 KiB\n-> classic",
        "single_quorum": "1 KiB\n-> quorum",
        "far_single": "1 KiB, 20 ms\naway",
        "farther_single": "1 KiB, 40 ms\naway",
        "far_dr": "DR, 20 ms\naway",
    }.get(scenario, scenario)


def _peer_rates(axis: Any, layout: str, entry: dict[str, Any]) -> None:
    """Grouped bars: per scenario, each contender's median msg/s (log scale)."""
    figures = entry["figures"]
    scenarios = list(figures)
    names = [name for name in PEER_COLOURS if any(name in figures[s] for s in scenarios)]
    width = 0.8 / max(1, len(names))
    for index, name in enumerate(names):
        positions: list[float] = []
        rates: list[float] = []
        for slot, scenario in enumerate(scenarios):
            if name in figures[scenario]:
                positions.append(slot - 0.4 + width * (index + 0.5))
                rates.append(figures[scenario][name]["median_rate"])
        axis.bar(positions, rates, width, label=name, color=PEER_COLOURS[name])
        for position, rate in zip(positions, rates, strict=True):
            axis.annotate(
                f"{rate:,.0f}",
                (position, rate),
                ha="center",
                va="bottom",
                fontsize=7,
                rotation=90,
                xytext=(0, 2),
                textcoords="offset points",
            )
    axis.set_xticks(range(len(scenarios)), [_scenario_label(s) for s in scenarios], fontsize=8)
    axis.set_yscale("log")
    axis.set_ylabel("messages / s (log)")
    # Keys are "<CPU layout> <node layout>" (older reports: the node layout alone).
    cpu_layout, _, node_layout = layout.rpartition(" ")
    title = {"two_nodes": "two nodes (two clusters)", "one_node": "one node, vhost -> vhost"}
    axis.set_title(f"{cpu_layout} layout, " * bool(cpu_layout) + title.get(node_layout, layout))
    axis.legend(loc="upper right", fontsize=8)
    # Room above the tallest bar for its label.
    axis.set_ylim(top=axis.get_ylim()[1] * 2.5)
    notes = [
        f"{name}: not applicable ({reason})" for name, reason in entry["not_applicable"].items()
    ]
    if notes:
        axis.set_xlabel("\n".join(notes), fontsize=8)


def draw_peers(report: dict[str, Any], version: str, path: Path) -> None:
    """The 4.x section of `report` for RabbitMQ `version`: one panel per layout."""
    section = report["peers"][version]
    layouts = section["layouts"]
    fig, axes = plt.subplots(2, len(layouts), figsize=(7.5 * len(layouts), 12), squeeze=False)
    for column, (layout, entry) in enumerate(layouts.items()):
        _panel(axes[0][column], _peer_rates, layout, entry)
        _panel(axes[1][column], _broker_cost, entry["figures"])
    machine = report["machine"]
    fig.suptitle(
        f"Shovel, local shovel and rmq-spark on RabbitMQ {section['versions']['rabbitmq']} "
        f"({report['started_at'][:16]} UTC, {machine['cores']} cores {machine['cpu']}; "
        f"load {report['load_average_start'][0]} -> {report['load_average_end'][0]})"
        + (" QUICK" if report["quick"] else ""),
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m bench.chart bench/results/throughput-<stamp>.json")
        return 2
    source = Path(argv[0])
    report = json.loads(source.read_text(encoding="utf-8"))
    for layout in report.get("layouts", {}):
        draw(report, layout, source.with_name(f"{source.stem}-{layout}.png"))
    for version in report.get("peers", {}):
        draw_peers(report, version, source.with_name(f"{source.stem}-rabbitmq-{version}.png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
