"""The compare view: saved plans side by side, one column per plan, differences highlighted.

Each column is recomputed against the current catalog when shown (see :mod:`hwdash.core.plans.store`
for why); a plan that can no longer be evaluated shows its cached summary, marked "cached".
In numeric rows the lowest value is green and the highest red; in text rows, cells that differ from the
first plan are yellow. ``enter``/``l`` loads the highlighted plan back into the planner, ``r`` renames
it, ``d`` deletes it after asking.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from rich.console import JustifyMethod
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widget import Widget
from textual.widgets import DataTable, Static

from hwdash.core.catalog import Catalog
from hwdash.core.plan import LORA_STYLE_METHODS, Plan
from hwdash.core.plans.store import (
    PlanStore,
    PlanStoreError,
    SavedPlan,
    SummaryView,
    current_summary,
)
from hwdash.core.results import MEMORY_COMPONENTS
from hwdash.core.units import format_bytes, format_hours, format_money
from hwdash.ui.widgets.planner_breakdown import COMPONENT_LABELS, bar
from hwdash.ui.widgets.planner_dialogs import ConfirmDialog, NameDialog

LOW_STYLE = "bold green"
HIGH_STYLE = "bold red"
DIFFERENT_STYLE = "bold yellow"
TOTAL_BAR_STYLE = "#5fafff"


@dataclass(frozen=True)
class CompareRow:
    """One row of the comparison: a label and how to read each plan's value."""

    key: str
    label: str
    value: Callable[[SavedPlan, SummaryView], float | str | None]
    """The raw value (numbers are compared, strings checked for differences)."""
    text: Callable[[float | str | None], str]
    """How a value is written in the cell."""
    numeric: bool = False
    """Whether min/max highlighting applies."""


def _memory(component: str) -> Callable[[SavedPlan, SummaryView], float | None]:
    def read(saved: SavedPlan, view: SummaryView) -> float | None:
        summary = view.summary
        return None if summary is None else float(summary.memory.get(component, 0))

    return read


def _bytes_text(value: float | str | None) -> str:
    return "-" if not isinstance(value, (int, float)) else format_bytes(value)


def _hours_text(value: float | str | None) -> str:
    return format_hours(value) if isinstance(value, (int, float)) else "-"


def _money_text(value: float | str | None) -> str:
    return format_money(value) if isinstance(value, (int, float)) else "-"


def _str_text(value: float | str | None) -> str:
    return "-" if value is None else str(value)


def _setup(saved: SavedPlan, view: SummaryView) -> str:
    plan = saved.plan
    method = plan.method.value
    if plan.is_rl:
        method += f"({plan.rl_method.value})"
    elif plan.method in LORA_STYLE_METHODS:
        method += f" r{plan.lora_r}"
    return f"{method} · {plan.precision.value}"


def _shape(saved: SavedPlan, view: SummaryView) -> str:
    plan = saved.plan
    extras = " ckpt" if plan.grad_ckpt else ""
    return f"{plan.batch} × {plan.seq}{extras}"


def _parallel(saved: SavedPlan, view: SummaryView) -> str:
    plan = saved.plan
    text = f"{plan.gpus} GPU{'s' if plan.gpus > 1 else ''}"
    if plan.zero:
        text += f" ZeRO-{plan.zero}"
    if plan.offload.value != "none":
        text += f" off:{plan.offload.value}"
    return text


def _model(saved: SavedPlan, view: SummaryView) -> str:
    summary = view.summary
    return summary.model_name if summary is not None else saved.plan.model


ROWS: tuple[CompareRow, ...] = (
    CompareRow("model", "model", _model, _str_text),
    CompareRow("setup", "method", _setup, _str_text),
    CompareRow("shape", "batch × seq", _shape, _str_text),
    CompareRow("parallel", "GPUs", _parallel, _str_text),
    *(
        CompareRow(name, COMPONENT_LABELS[name], _memory(name), _bytes_text, numeric=True)
        for name in MEMORY_COMPONENTS
    ),
    CompareRow("total", "per-GPU total", _memory("total"), _bytes_text, numeric=True),
    CompareRow(
        "host",
        "host RAM",
        lambda s, v: None if v.summary is None else float(v.summary.host_bytes),
        _bytes_text,
        numeric=True,
    ),
    CompareRow(
        "best",
        "best flavor",
        lambda s, v: None if v.summary is None else (v.summary.best_flavor or "none fits"),
        _str_text,
    ),
    CompareRow(
        "hours",
        "hours",
        lambda s, v: None if v.summary is None else v.summary.hours,
        _hours_text,
        numeric=True,
    ),
    CompareRow(
        "cost",
        "cost",
        lambda s, v: None if v.summary is None else v.summary.cost,
        _money_text,
        numeric=True,
    ),
    CompareRow(
        "status",
        "estimate",
        lambda s, v: "current" if v.fresh else ("cached" if v.summary else "unavailable"),
        _str_text,
    ),
    CompareRow(
        "saved",
        "saved",
        lambda s, v: s.saved_at.astimezone().strftime("%Y-%m-%d %H:%M"),
        _str_text,
    ),
)

#: Column widths for plan columns.
MIN_COLUMN_WIDTH = 12
MAX_COLUMN_WIDTH = 26


def row_cells(row: CompareRow, values: list[float | str | None]) -> list[Text]:
    """The cells of one row with differences styled.

    Numeric rows: the lowest value green, the highest red (only when they differ). Text rows: cells
    that differ from the first plan's yellow. ``status`` cells that are not current are dimmed.
    """
    texts = [row.text(value) for value in values]
    styles = [""] * len(values)
    if row.numeric:
        numbers = [v for v in values if isinstance(v, (int, float))]
        if len(numbers) >= 2 and min(numbers) != max(numbers):
            low, high = min(numbers), max(numbers)
            for index, value in enumerate(values):
                if value == low:
                    styles[index] = LOW_STYLE
                elif value == high:
                    styles[index] = HIGH_STYLE
    elif row.key == "status":
        styles = ["" if value == "current" else "dim italic" for value in values]
    elif row.key != "saved" and values:
        first = values[0]
        styles = ["" if value == first else DIFFERENT_STYLE for value in values]
    justify: JustifyMethod = "right" if row.numeric else "left"
    return [
        Text(text, style=style, justify=justify) for text, style in zip(texts, styles, strict=True)
    ]


class ComparePane(Widget):
    """Saved plans side by side. Posts :class:`ComparePane.LoadPlan` to load one into the planner."""

    DEFAULT_CSS = """
    ComparePane {
        height: 1fr;
        layout: vertical;
    }
    ComparePane #compare-help {
        height: auto;
        color: $text-muted;
        padding: 0 1;
    }
    ComparePane #compare-empty {
        display: none;
        padding: 1 2;
        color: $text-muted;
    }
    ComparePane.-empty #compare-empty {
        display: block;
    }
    ComparePane.-empty #compare-table {
        display: none;
    }
    ComparePane #compare-table {
        height: 1fr;
    }
    ComparePane #compare-problems {
        height: auto;
        color: $warning;
        padding: 0 1;
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("l", "load", "Load into planner"),
        Binding("r", "rename", "Rename"),
        Binding("d", "delete", "Delete"),
    ]

    class LoadPlan(Message):
        """The user asked to load a saved plan back into the planner."""

        def __init__(self, plan: Plan, name: str = "") -> None:
            super().__init__()
            self.plan = plan
            """The saved plan's inputs."""
            self.name = name
            """The saved plan's name."""

    def __init__(self, store: PlanStore, catalog: Catalog, *, id: str | None = "compare") -> None:
        super().__init__(id=id)
        self.store = store
        self.catalog = catalog
        self.plans: list[SavedPlan] = []
        """The saved plans on screen, in column order."""
        self.views: list[SummaryView] = []
        """Their summaries (recomputed, or cached where recomputing failed)."""

    def compose(self) -> ComposeResult:
        yield Static(
            "←/→ choose a plan · enter/l load into planner · r rename · d delete",
            id="compare-help",
        )
        yield Static(
            "No saved plans yet. Press s in the planner (or run `hwdash plan ... --save NAME`).",
            id="compare-empty",
        )
        table: DataTable[Text] = DataTable(
            id="compare-table", cursor_type="column", zebra_stripes=True
        )
        table.show_row_labels = True
        yield table
        yield Static("", id="compare-problems", markup=False)  # plan names are the user's

    def on_show(self) -> None:
        self.refresh_plans()
        if self.plans:
            # Keyboard first: the column cursor is ready for enter, r and d (the table takes no
            # letters, so the app's tab keys keep working).
            self.table.focus()

    @property
    def table(self) -> DataTable[Text]:
        """The comparison grid."""
        return self.query_one("#compare-table", DataTable)

    def refresh_plans(self) -> None:
        """Re-read the store and recompute every column."""
        try:
            plans = self.store.list()
        except PlanStoreError as exc:
            self.notify(str(exc), title="Plans file", severity="error", timeout=10, markup=False)
            plans = []
        self.plans = plans
        self.views = [current_summary(saved, self.catalog) for saved in plans]
        self._rebuild()

    def _rebuild(self) -> None:
        table = self.table
        selected = self.selected_plan()
        with self.app.batch_update():
            table.clear(columns=True)
            self.set_class(not self.plans, "-empty")
            rows = [
                (
                    row,
                    row_cells(
                        row, [row.value(s, v) for s, v in zip(self.plans, self.views, strict=True)]
                    ),
                )
                for row in ROWS
            ]
            widths = []
            for index, saved in enumerate(self.plans):
                longest = max([len(saved.name)] + [cells[index].cell_len for _, cells in rows])
                width = min(max(longest, MIN_COLUMN_WIDTH), MAX_COLUMN_WIDTH)
                widths.append(width)
                table.add_column(Text(saved.name, style="bold"), width=width, key=f"plan-{index}")
            if self.plans:
                for row, cells in rows:
                    table.add_row(*cells, key=row.key, label=Text(row.label, style="bold"))
                    if row.key == "total":
                        table.add_row(*self._total_bars(widths), key="total-bar", label="")
            problems = [
                f"'{saved.name}': {view.problem}"
                for saved, view in zip(self.plans, self.views, strict=True)
                if view.problem
            ]
            self.query_one("#compare-problems", Static).update(
                "\n".join(f"⚠ cannot recompute {p}; showing the saved figures" for p in problems)
            )
            if selected is not None:
                names = [p.name for p in self.plans]
                if selected.name in names:
                    table.move_cursor(column=names.index(selected.name), animate=False)

    def _total_bars(self, widths: list[int]) -> list[Text]:
        """A bar per plan: its per-GPU total against the largest one, so sizes compare at a glance.
        Every bar has the same full length (the narrowest column's), so a wider column (a longer
        plan name) does not draw a longer bar for the same total."""
        totals = [v.summary.per_gpu_total if v.summary is not None else 0 for v in self.views]
        largest = max(totals, default=0)
        scale = min(widths, default=0)
        return [
            Text(
                bar(total / largest if largest else 0.0, scale).ljust(width),
                style=TOTAL_BAR_STYLE,
            )
            for total, width in zip(totals, widths, strict=True)
        ]

    def selected_plan(self) -> SavedPlan | None:
        """The plan under the column cursor."""
        if not self.plans or not self.is_mounted:
            return None
        column = self.table.cursor_column
        return self.plans[column] if 0 <= column < len(self.plans) else None

    def select_plan(self, name: str) -> None:
        """Move the column cursor to the plan called ``name``."""
        names = [p.name for p in self.plans]
        if name in names:
            self.table.move_cursor(column=names.index(name), animate=False)

    # -- actions ---------------------------------------------------------------------------------

    def on_data_table_column_selected(self, event: DataTable.ColumnSelected) -> None:
        event.stop()
        self.action_load()

    def action_load(self) -> None:
        """Load the highlighted plan into the planner."""
        saved = self.selected_plan()
        if saved is None:
            return
        self.post_message(self.LoadPlan(saved.plan, saved.name))
        self.notify(
            f"Loaded '{saved.name}' into the planner", title="Compare", timeout=3, markup=False
        )

    def action_rename(self) -> None:
        """Ask for a new name for the highlighted plan."""
        saved = self.selected_plan()
        if saved is None:
            return
        others = {p.name for p in self.plans if p.name != saved.name}

        def describe(text: str) -> str:
            name = " ".join(text.split())
            if not name:
                raise ValueError("a plan needs a name")
            if name in others:
                raise ValueError(f"a plan named '{name}' already exists")
            return f"rename '{saved.name}'"

        def renamed(result: str | None) -> None:
            if result is None:
                return
            try:
                new = self.store.rename(saved.name, result)
            except PlanStoreError as exc:
                self.notify(str(exc), title="Rename", severity="error", timeout=6, markup=False)
                return
            self.refresh_plans()
            self.select_plan(new.name)
            self.notify(
                f"Renamed '{saved.name}' to '{new.name}'", title="Compare", timeout=3, markup=False
            )

        self.app.push_screen(
            NameDialog("Rename plan", saved.name, describe=describe, ok_label="Rename"), renamed
        )

    def action_delete(self) -> None:
        """Delete the highlighted plan after confirmation."""
        saved = self.selected_plan()
        if saved is None:
            return

        def answered(yes: bool | None) -> None:
            if not yes:
                return
            try:
                self.store.remove(saved.name)
            except PlanStoreError as exc:
                self.notify(str(exc), title="Delete", severity="error", timeout=6, markup=False)
                return
            self.refresh_plans()
            self.notify(f"Deleted '{saved.name}'", title="Compare", timeout=3, markup=False)

        self.app.push_screen(ConfirmDialog(f"Delete the saved plan '{saved.name}'?"), answered)
