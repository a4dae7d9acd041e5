"""``hwdash compare``: saved plans side by side.

Without flags it opens the dashboard on its compare tab (the same app as ``hwdash``, so the monitor
flags work too). ``--list`` prints one line per saved plan and ``--json`` one JSON object; both work
without a terminal and recompute each plan against the current catalog, falling back to the summary
cached at save time when a plan can no longer be evaluated.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from hwdash.commands import dashboard
from hwdash.core import strict_json
from hwdash.core.catalog import Catalog
from hwdash.core.plans.store import PlanStore, SavedPlan, SummaryView, current_summary
from hwdash.core.units import format_bytes, format_hours, format_money
from hwdash.errors import UsageError


def add_parser(subparsers: Any) -> None:
    """Register the subcommand."""
    parser = subparsers.add_parser(
        "compare",
        help="saved plans side by side (opens the dashboard on the compare tab)",
        description=(
            "Compare plans saved with `s` in the planner or `hwdash plan ... --save NAME`: one column "
            "per plan with memory per component, per-GPU total, best flavor, hours and cost. Opens "
            "the dashboard on its compare tab; --list and --json print instead. Plans live in "
            "$XDG_DATA_HOME/hwdash/plans.json (~/.local/share/hwdash/plans.json)."
        ),
    )
    output = parser.add_mutually_exclusive_group()
    output.add_argument(
        "--list", action="store_true", help="print one line per saved plan and exit"
    )
    output.add_argument(
        "--json",
        action="store_true",
        help="print the saved plans with their recomputed summaries as one JSON object and exit",
    )
    dashboard.add_arguments(parser)
    # A --catalog given before the subcommand (`hwdash --catalog DIR compare`) must survive: only a
    # --catalog given after it replaces the value.
    for action in parser._actions:
        if action.dest == "catalog":
            action.default = argparse.SUPPRESS


def run(args: argparse.Namespace, *, stdout: TextIO | None = None) -> int:
    """Print the saved plans (``--list``, ``--json``) or open the dashboard on the compare tab."""
    if not (args.list or args.json):
        try:
            return dashboard.run(args, stdout=stdout, initial_tab="compare")
        except UsageError as exc:
            if str(exc) != dashboard.NO_TERMINAL_MESSAGE:
                raise
            raise UsageError(
                "the compare view needs a terminal, and standard output is not one. "
                "For scripts and pipes use `hwdash compare --list` or `hwdash compare --json`."
            ) from None
    from hwdash.core.catalog import load_catalog

    out = sys.stdout if stdout is None else stdout
    catalog = load_catalog(getattr(args, "catalog", []))
    store = PlanStore()
    plans = store.list()
    views = [current_summary(saved, catalog) for saved in plans]
    if args.json:
        out.write(strict_json.dumps(compare_json(store, plans, views), indent=2) + "\n")
    else:
        out.write(compare_lines(store, plans, views, catalog))
    return 0


def compare_json(
    store: PlanStore, plans: list[SavedPlan], views: list[SummaryView]
) -> dict[str, Any]:
    """The ``--json`` object: the plans file and, per plan, its inputs and current summary."""
    entries = []
    for saved, view in zip(plans, views, strict=True):
        summary = view.summary
        entries.append(
            {
                "name": saved.name,
                "saved_at": saved.saved_at.isoformat(),
                "plan": saved.plan.model_dump(mode="json"),
                "summary": None
                if summary is None
                else {**summary.model_dump(mode="json"), "per_gpu_total": summary.per_gpu_total},
                "recomputed": view.fresh,
                "problem": view.problem or None,
            }
        )
    return {"plans_file": str(store.path), "plans": entries}


def compare_lines(
    store: PlanStore, plans: list[SavedPlan], views: list[SummaryView], catalog: Catalog
) -> str:
    """The ``--list`` text: a header and one aligned line per plan."""
    if not plans:
        return (
            f"no saved plans in {store.path}\n"
            "save one with `s` in the planner or `hwdash plan ... --save NAME`\n"
        )
    header = ("name", "model", "method", "per GPU", "best flavor", "time", "cost", "")
    rows: list[tuple[str, ...]] = [header]
    for saved, view in zip(plans, views, strict=True):
        summary = view.summary
        note = "" if view.fresh else ("(cached)" if summary is not None else "(unavailable)")
        rows.append(
            (
                saved.name,
                summary.model_name if summary is not None else saved.plan.model,
                saved.plan.method.value,
                format_bytes(summary.per_gpu_total) if summary is not None else "-",
                (summary.best_flavor or "none fits") if summary is not None else "-",
                format_hours(summary.hours) if summary is not None else "-",
                format_money(summary.cost) if summary is not None else "-",
                note,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    right = {3, 5, 6}
    lines = []
    for row in rows:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    problems = [
        f"{saved.name}: {view.problem}"
        for saved, view in zip(plans, views, strict=True)
        if view.problem
    ]
    text = "\n".join(lines) + "\n"
    if problems:
        text += "".join(
            f"note: cannot recompute {p}; showing the saved figures\n" for p in problems
        )
    return text
