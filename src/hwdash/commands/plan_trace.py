"""``hwdash plan --trace``: the traced peak of a fake-tensor step beside the analytic estimate.

The trace and the comparison live in :mod:`hwdash.tracing` (the TUI calls them too); this module
prints them with rich or returns the ``trace`` object of ``--json``.
"""

from __future__ import annotations

import sys
from typing import Any

from hwdash.core.plan import Plan
from hwdash.core.results import MemoryEstimate
from hwdash.core.specs import ModelSpec
from hwdash.tracing import (
    TraceResult,
    check_trace_dependencies,
    comparable_estimate,
    comparison_rows,
    trace_document,
    trace_plan,
    trace_settings,
)


def check_trace_available(plan: Plan) -> None:
    """Fail early (one line, exit 2) when the plan cannot be traced here, before any output."""
    trace_settings(plan)
    check_trace_dependencies(plan)


def run_trace(plan: Plan, model: ModelSpec) -> tuple[TraceResult, MemoryEstimate]:
    """Trace the plan (blocking) and compute the estimate to compare it with."""
    trace = trace_plan(plan, model)
    return trace, comparable_estimate(plan, model)


def trace_json(plan: Plan, model: ModelSpec) -> dict[str, Any]:
    """Trace the plan and return the ``trace`` object of ``--json``."""
    trace, estimate = run_trace(plan, model)
    return trace_document(trace, estimate)


def _percent(error: float | None) -> str:
    return "n/a" if error is None else f"{error:+.1%}"


def print_trace(plan: Plan, model: ModelSpec, console: Any = None) -> None:
    """Trace the plan and print the traced peak beside the estimate, with both breakdowns."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from hwdash.core.units import GIB

    console = console or Console()
    print(
        f"tracing one fake-tensor step of {model.name} (torch, no GPU memory used)...",
        file=sys.stderr,
        flush=True,
    )
    trace, estimate = run_trace(plan, model)
    document = trace_document(trace, estimate)
    versions = ", ".join(f"{name} {version}" for name, version in trace.versions.items())
    step = "inference" if trace.peak_step == 0 else f"step {trace.peak_step}"
    console.print(
        f"[bold]traced peak[/bold] {trace.peak_bytes / GIB:.2f} GiB at {step} {trace.peak_phase} "
        f"(fake {trace.device} tensors, {trace.seconds:.1f} s; {versions})",
        highlight=False,
    )
    without = document["estimate"]["without_overhead"]
    total = document["estimate"]["total"]
    console.print(
        f"estimate {without / GIB:.2f} GiB without overhead ({_percent(document['error'])}), "
        f"{total / GIB:.2f} GiB with it ({_percent(document['error_with_overhead'])}); "
        f"estimated peak at {estimate.peak_phase}",
        highlight=False,
    )
    table = Table(title="estimate vs trace, GiB on one GPU at the traced peak")
    table.add_column("component")
    table.add_column("estimate", justify="right")
    table.add_column("traced", justify="right")
    for label, estimated, traced in comparison_rows(trace, estimate.per_gpu.as_dict()):
        table.add_row(
            label,
            "-" if estimated is None else f"{estimated / GIB:.2f}",
            "-" if traced is None else f"{traced / GIB:.2f}",
        )
    table.add_row(
        "[bold]total[/bold]",
        f"[bold]{total / GIB:.2f}[/bold]",
        f"[bold]{trace.peak_bytes / GIB:.2f}[/bold]",
    )
    console.print(table)
    for note in trace.notes:
        console.print(Text(f"trace: {note}", style="dim"))
