"""A run against its plan in words: the lines the process detail and ``hwdash monitor`` print, and
the short cell of the monitor's process table."""

from __future__ import annotations

import os

from hwdash.core.units import format_gib, format_hours, format_money
from hwdash.telemetry.types import RunView

ATTACH_HINT = (
    "no plan named: start(plan=NAME), HWDASH_PLAN=NAME or python -m hwdash.probe --plan NAME "
    "(a saved plan or a plan file)"
)


def format_rate(tokens_per_s: float | None) -> str:
    """``9.8k tok/s``, ``412 tok/s``, ``1.2M tok/s``; ``-`` when unknown."""
    if tokens_per_s is None:
        return "-"
    if tokens_per_s >= 1e6:
        return f"{tokens_per_s / 1e6:.1f}M tok/s"
    if tokens_per_s >= 1e4:
        return f"{tokens_per_s / 1e3:.0f}k tok/s"
    if tokens_per_s >= 1e3:
        return f"{tokens_per_s / 1e3:.1f}k tok/s"
    return f"{tokens_per_s:.0f} tok/s"


def format_eta(seconds: float | None) -> str:
    """Time to finish: ``42 s``, ``17 min``, ``14.1 h``, ``3.2 d``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f} s"
    return format_hours(seconds / 3600)


def plan_label(reference: str | None) -> str:
    """A plan as the screen names it: a saved plan's name, or a plan file's name (not its path)."""
    if not reference:
        return "no plan"
    return os.path.basename(reference.rstrip("/")) or reference


def run_cell(view: RunView) -> str:
    """The process table's cell: speed and time to finish (``9.8k tok/s 14.1 h``)."""
    rate = format_rate(view.tokens_per_s)
    if view.eta_s is None:
        return rate
    return f"{rate.removesuffix(' tok/s')}/s {format_eta(view.eta_s)}"


def _peak_lines(view: RunView) -> list[str]:
    if view.measured_peak_bytes is None and view.planned_peak_bytes is None:
        return []
    measured = "-" if view.measured_peak_bytes is None else format_gib(view.measured_peak_bytes)
    planned = "-" if view.planned_peak_bytes is None else format_gib(view.planned_peak_bytes)
    line = f"peak reserved {measured} measured vs {planned} planned"
    if view.peak_error is not None:
        line += f" ({view.peak_error:+.1%})"
    lines = [line]
    if view.measured_nvml_peak_bytes is not None and view.planned_total_bytes is not None:
        nvml = view.measured_nvml_peak_bytes / view.planned_total_bytes - 1
        lines.append(
            f"peak on the GPU (NVML) {format_gib(view.measured_nvml_peak_bytes)} vs "
            f"{format_gib(view.planned_total_bytes)} planned ({nvml:+.1%})"
        )
    return lines


def run_lines(view: RunView) -> list[str]:
    """The run in a few lines: speed, progress, money and energy, memory against the plan."""
    tokens = "-" if view.tokens is None else f"{view.tokens:,}"
    speed = [
        f"step {'-' if view.step is None else f'{view.step:,}'}",
        f"{tokens} tokens" + (" (estimated)" if view.tokens_estimated else ""),
        format_rate(view.tokens_per_s),
    ]
    if view.tflops is not None:
        speed.append(f"{view.tflops:,.0f} TFLOPS")
    if view.mfu is not None:
        speed.append(f"MFU {view.mfu:.0%}")
    lines = ["  ·  ".join(speed)]
    done = [f"finishes in {format_eta(view.eta_s)}"]
    if view.progress is not None:
        done.insert(0, f"{view.progress:.1%} done")
    if view.elapsed_s is not None:
        done.append(f"running {format_eta(view.elapsed_s)}")
    lines.append("  ·  ".join(done))
    money = []
    if view.cost_usd is not None:
        cost = f"cost so far {format_money(view.cost_usd)}"
        if view.cost_to_go_usd is not None:
            cost += f", to go {format_money(view.cost_to_go_usd)}"
        if view.price_per_hour is not None:
            cost += f" ({format_money(view.price_per_hour)}/h)"
        money.append(cost)
    if view.energy_kwh is not None:
        money.append(f"energy {view.energy_kwh:.3f} kWh")
    if money:
        lines.append("  ·  ".join(money))
    lines.extend(_peak_lines(view))
    if view.plan_error is not None:
        lines.append(f"plan {plan_label(view.plan)} not read: {view.plan_error}")
    elif view.plan is None:
        lines.append(ATTACH_HINT)
    return lines
