"""The text report of ``hwdash plan``: the title, the memory breakdown and the flavor table (rich).

Names from user files (models, flavors, plans) are printed as rich ``Text``, never as markup; piped
or redirected output gets a fixed, roomy width (:data:`PIPED_WIDTH`) instead of rich's 80 columns.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from hwdash.core.plan import FsdpMode, Plan, Quant

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

PIPED_WIDTH = 160
"""Columns of the tables when stdout is not a terminal (a file or a pipe is never cropped)."""


def output_width() -> int | None:
    """None (the terminal's width, or ``COLUMNS``) on a terminal or when ``COLUMNS`` is set;
    :data:`PIPED_WIDTH` for a pipe or a file, where rich would otherwise assume 80."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS", "").strip():
        return None
    return PIPED_WIDTH


def _parallel_words(plan: Plan, gpus: int) -> str:
    """How the GPUs are used, for the title: FSDP's shard group or Megatron's tp x pp x dp."""
    if plan.fsdp is not FsdpMode.NONE:
        from hwdash.core.estimator.parallelism import fsdp_shard_size

        shard = fsdp_shard_size(gpus, plan.fsdp, plan.gpus_per_node)
        offload = ", CPU offload" if plan.fsdp_offload else ""
        return f" (FSDP {plan.fsdp.value} shard over {shard}{offload})"
    if plan.megatron:
        dp = max(1, gpus // (plan.tp * plan.pp * plan.cp))
        sp = ", sequence parallel" if plan.sequence_parallel and plan.tp > 1 else ""
        cp = f" x cp {plan.cp}" if plan.cp > 1 else ""
        ep = f", ep {plan.ep}" if plan.ep > 1 else ""
        return f" (tp {plan.tp} x pp {plan.pp}{cp} x dp {dp}{sp}{ep})"
    if plan.sp_ulysses > 1:
        return f" (Ulysses sequence parallel over {plan.sp_ulysses})"
    return ""


_VERDICT_STYLE = {"fits": "green", "tight": "yellow", "no": "red"}


def render_report(
    report: Any,
    *,
    saved_as: str | None = None,
    console: Any = None,
    local_notes: list[str] | None = None,
    framework_defaults: dict[str, Any] | None = None,
    max_fit: Any = None,
) -> None:
    """Print the breakdown, warnings and the flavor table with rich. ``framework_defaults``: what
    the framework set that the user did not choose
    (:func:`hwdash.core.estimator.savers.applied_framework_defaults`), listed on the "framework" line.
    ``max_fit``: ``--max FIELD``'s answer (:class:`~hwdash.core.planning.max_fit.MaxFit`), a column
    of the flavor table and a line under it."""
    from rich.console import Console
    from rich.text import Text

    # Piped or redirected output is never cropped at 80 columns: a fixed, roomy width instead.
    console = console or Console(width=output_width())
    console.print(_title(report), highlight=False)
    if report.plan.is_training:
        _print_framework_line(console, report, framework_defaults)
    _print_memory(console, report)
    for warning in report.warnings:
        console.print(Text.assemble(("warning:", "yellow"), " ", warning), highlight=False)
    console.print("flavors, cheapest first:")
    _print_flavor_table(console, report, max_fit)
    if max_fit is not None:
        console.print(Text(max_fit.sentence()), highlight=False)
    _print_footer(console, report, local_notes, saved_as)


def _title(report: Any) -> Text:
    """The plan in one line: model, method, precision, shapes, parameters and GPUs."""
    from rich.text import Text

    from hwdash.core.units import format_count

    plan, estimate = report.plan, report.estimate
    # Model, flavor and plan names come from user files: rich Text, never markup.
    # The precision once: the compute dtype is said only when it differs from what was asked
    # (mixed or amp resolve to bf16 or fp16 on the hardware).
    precision = plan.precision.value
    if estimate.compute_dtype != precision:
        precision = f"{precision} ({estimate.compute_dtype} compute)"
    if plan.quant is not Quant.NONE:
        precision = f"{precision}, {plan.quant.value} weights"
    return Text.assemble(
        (report.model.name, "bold"),
        f": {plan.method.value}, {precision}, batch {plan.batch} x seq "
        f"{plan.seq}, {format_count(estimate.total_params)} params "
        f"({format_count(estimate.trainable_params)} trainable), {estimate.gpus} GPU"
        f"{'s' if estimate.gpus != 1 else ''}{_parallel_words(plan, estimate.gpus)}",
    )


def _print_framework_line(
    console: Console, report: Any, framework_defaults: dict[str, Any] | None
) -> None:
    """The "framework" line of a training plan: its memory savers and the defaults it applied."""
    from hwdash.core.estimator.savers import (
        describe_framework_defaults,
        describe_savers,
        resolve_savers,
    )

    plan = report.plan
    applied = describe_framework_defaults(framework_defaults or {})
    if applied:
        applied = f"; defaults it applied: {applied}"
    console.print(
        f"framework {plan.framework.value}: "
        f"{describe_savers(resolve_savers(plan, report.framework))}{applied}",
        style="dim",
        highlight=False,
    )


def _print_memory(console: Console, report: Any) -> None:
    """The per-GPU memory: the components' table, the peak's phase, the details and host RAM."""
    from rich.table import Table
    from rich.text import Text

    from hwdash.core.results import MEMORY_COMPONENTS
    from hwdash.core.units import GIB

    plan, estimate = report.plan, report.estimate
    memory = estimate.per_gpu.as_dict()
    total = memory["total"]
    breakdown = Table()
    breakdown.add_column("component")
    breakdown.add_column("GiB per GPU", justify="right")
    breakdown.add_column("share", justify="right")
    for name in MEMORY_COMPONENTS:
        value = memory[name]
        share = value / total if total else 0.0
        breakdown.add_row(name.replace("_", " "), f"{value / GIB:.2f}", f"{share:.0%}")
    breakdown.add_row("[bold]total[/bold]", f"[bold]{total / GIB:.2f}[/bold]", "100%")
    console.print(breakdown)
    # The three totals: the tensors, the caching allocator's pool around them, and the whole GPU
    # (the total above: the CUDA context and kernels and NCCL's buffers lie outside the allocator)
    totals = Table(show_header=True, box=None, padding=(0, 2))
    totals.add_column("per GPU")
    totals.add_column("GiB", justify="right")
    totals.add_column("what reports it", style="dim")
    totals.add_row("allocated", f"{estimate.allocated_bytes / GIB:.2f}", "max_memory_allocated")
    totals.add_row("reserved", f"{estimate.reserved_bytes / GIB:.2f}", "max_memory_reserved")
    totals.add_row("whole GPU", f"{estimate.whole_gpu_bytes / GIB:.2f}", "nvidia-smi (the total)")
    console.print(totals)
    if plan.is_training:
        console.print(
            f"peak: {estimate.peak_phase} (the components as they are then)",
            style="dim",
            highlight=False,
        )
    parts = list(estimate.details)
    if parts:
        table_of_parts = Table(show_header=True, box=None, padding=(0, 2))
        table_of_parts.add_column("made of", style="dim")
        table_of_parts.add_column("GiB", justify="right", style="dim")
        for label, value in parts:
            table_of_parts.add_row(Text(label), f"{value / GIB:.2f}")
        console.print(table_of_parts)
    if estimate.host_bytes:
        console.print(f"host RAM for offload: {estimate.host_bytes / GIB:.1f} GiB")


def _print_flavor_table(console: Console, report: Any, max_fit: Any = None) -> None:
    """The flavors, cheapest first; on a narrow terminal the notes as numbers, listed below;
    with ``max_fit`` (``--max``), its answer in a column on its flavor's row."""
    from rich.table import Table
    from rich.text import Text

    from hwdash.core.planning.budget import band_of
    from hwdash.core.units import GIB, format_hours, format_money

    # The note goes in the table when the terminal is wide enough, else as numbered notes below.
    wide = console.width >= 120
    table = Table()
    # On a narrow terminal the flavor's name wraps (its marks on a line of their own) and the
    # note becomes a number: the verdict and the numbers a user acts on keep their full width.
    table.add_column("flavor", overflow="fold", ratio=2 if wide else None)
    table.add_column("fit", no_wrap=True)
    for column in ("free GiB", "GPUs", "$/h", "hours", "cost"):
        table.add_column(column, justify="right", no_wrap=True)
    budgeted = report.plan.budget is not None  # --budget: each cost's band (the seeds' guide)
    if budgeted:
        table.add_column("band", justify="right", no_wrap=True)
    if max_fit is not None:
        table.add_column(f"max {max_fit.field.value}", justify="right", no_wrap=True)
    table.add_column("note", overflow="fold", ratio=1, min_width=20 if wide else 3)
    notes: dict[str, int] = {}
    for fit in report.flavors:
        verdict = fit.verdict.value
        headroom = "-" if fit.usable_bytes == 0 else f"{fit.headroom_bytes / GIB:+.1f}"
        price = fit.flavor.price_per_hour
        note_cell = Text(fit.reason)
        if fit.reason and not wide:
            note_cell = Text(f"[{notes.setdefault(fit.reason, len(notes) + 1)}]")
        cells: list[Any] = [
            _flavor_cell(fit, report),
            f"[{_VERDICT_STYLE[verdict]}]{verdict}[/{_VERDICT_STYLE[verdict]}]",
            headroom,
            str(fit.flavor.gpu_count),
            "-" if price is None else f"{price:.2f}",
            format_hours(fit.hours),
            format_money(fit.cost),
        ]
        if budgeted:
            cells.append(band_of(fit.cost) or "-")
        if max_fit is not None:
            found = fit.flavor.id == max_fit.target and max_fit.value is not None
            cells.append(str(max_fit.value) if found else "none")
        table.add_row(*cells, note_cell)
    _keep_numbers_whole(table, 7 + budgeted + (max_fit is not None))
    console.print(table)
    for reason, number in notes.items():
        console.print(f"[{number}] {reason}", highlight=False, markup=False)


def _flavor_cell(fit: Any, report: Any) -> Text:
    """The flavor's id, in bold with its marks (cheapest, fastest, this machine) when it has any."""
    from rich.text import Text

    marks = []
    if fit.flavor.id == report.recommended:
        marks.append("cheapest")
    if fit.flavor.id == report.fastest:
        marks.append("fastest")
    if fit.flavor.provider == "local" and fit.flavor.id in ("local", "local-free"):
        marks.append("this machine")
    flavor_cell = Text(fit.flavor.id)
    if marks:
        flavor_cell.stylize("bold")
        flavor_cell.append(f" ({', '.join(marks)})")
    return flavor_cell


def _keep_numbers_whole(table: Table, end: int = 7) -> None:
    """The fit column and the numbers never cut: each at least as wide as its widest cell."""
    from rich.cells import cell_len
    from rich.text import Text

    for kept in table.columns[1:end]:  # fit and the numbers: never cut
        kept.min_width = max(
            [cell_len(str(kept.header))]
            + [cell_len(Text.from_markup(str(cell)).plain) for cell in kept.cells]
        )


def _print_footer(
    console: Console, report: Any, local_notes: list[str] | None, saved_as: str | None
) -> None:
    """Below the table: the slowdowns the hours include, this machine's notes, the recommendation."""
    from rich.text import Text

    from hwdash.core.units import format_money

    factors = dict.fromkeys(
        f"{entry.id} x{entry.factor:g}" for fit in report.flavors for entry in fit.slowdowns
    )
    if factors:
        console.print(
            f"hours include the catalog's slowdowns: {', '.join(factors)} "
            "(hwdash catalog list --kind slowdowns)",
            style="dim",
            highlight=False,
            markup=False,
        )
    for note in dict.fromkeys(local_notes or ()):
        console.print(f"this machine: {note}", highlight=False, markup=False)
    within = ""
    if report.plan.budget is not None and report.tokens is not None:
        within = f" within the {format_money(report.plan.budget)} budget"
    if report.recommended:
        console.print(
            Text.assemble(
                "recommended: ", (report.recommended, "bold"), " (cheapest that fits", within, ")"
            ),
            highlight=False,
        )
    else:
        console.print(f"recommended: none (no flavor fits{within})")
    if saved_as:
        console.print(Text(f"saved as '{saved_as}'"))
