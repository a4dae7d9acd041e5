"""The planner's flavor table: one row per flavor with fit, headroom, hours and cost; sorted and filtered."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import DataTable

from hwdash.core.planning.max_fit import MaxFit
from hwdash.core.results import FitVerdict, FlavorFit, PlanReport
from hwdash.core.units import format_bytes, format_hours, format_money

SortKey = Literal["cost", "time", "memory"]
SORT_KEYS: tuple[SortKey, ...] = ("cost", "time", "memory")

#: Provider filter values and their labels (``all`` shows every provider).
PROVIDER_LABELS = {
    "all": "all providers",
    "hf-jobs": "Hugging Face Jobs",
    "local": "local",
    "hf-tpu": "TPU",
}

#: The key of the row that says no flavor passes the filters.
EMPTY_ROW = "--no-flavor--"

#: Colour and word for each verdict.
VERDICT_STYLES = {
    FitVerdict.FITS: "bold green",
    FitVerdict.TIGHT: "bold yellow",
    FitVerdict.NO: "bold red",
}

RECOMMENDED_MARK = "★"

#: (column key, heading, the sort it triggers when the heading is clicked)
COLUMNS: tuple[tuple[str, str, SortKey | None], ...] = (
    ("mark", " ", None),
    ("flavor", "flavor", None),
    ("fit", "fit", None),
    ("cost", "cost", "cost"),
    ("hours", "time", "time"),
    ("headroom", "headroom", "memory"),
    ("price", "$/h", "cost"),
    ("gpus", "GPUs", None),
    ("accelerator", "accelerator", None),
    ("note", "note", None),
)

#: Where the "max" column goes (``x``): after the verdict, on screen at 80 columns.
MAX_AT = 3

#: The "max" column's heading for each ``--max`` field, short enough for 80 columns: ``↑`` the
#: largest that fits, ``↓`` the fewest.
MAX_HEADINGS = {"seq": "seq↑", "batch": "batch↑", "concurrency": "conc↑", "gpus": "gpus↓"}

#: What the column shows, in words (the pane says it when ``x`` changes it).
MAX_WORDS = {
    "seq": "the longest --seq that fits each flavor",
    "batch": "the largest --batch that fits each flavor",
    "concurrency": "the most sequences of --seq tokens at once (inference) that fit each flavor",
    "gpus": "the fewest GPUs of each flavor's kind that fit",
}


def _sort_value(fit: FlavorFit, sort_by: SortKey, *, use_totals: bool) -> float | None:
    if sort_by == "cost":
        return fit.cost if use_totals else fit.flavor.price_per_hour
    if sort_by == "time":
        if use_totals:
            return fit.hours
        # Without a data size there are no hours: faster throughput first.
        return None if fit.tokens_per_second is None else -fit.tokens_per_second
    # memory: most headroom first.
    return float(-fit.headroom_bytes)


def order_fits(
    fits: Iterable[FlavorFit],
    *,
    sort_by: SortKey = "cost",
    descending: bool = False,
    fits_only: bool = False,
    provider: str = "all",
) -> list[FlavorFit]:
    """The rows to show, in order.

    Flavors the plan fits on come before those it does not, so the first row is the best choice for the
    chosen sort. Cost sorts by total dollars when the data size is known, else by dollars per hour; time
    sorts by hours, else by throughput; memory by headroom, most first. Rows without the sorted value
    (a local machine has no price) go last. ``descending`` reverses the order within each group.
    """
    rows = [
        fit
        for fit in fits
        if (provider == "all" or fit.flavor.provider == provider)
        and (not fits_only or fit.verdict is not FitVerdict.NO)
    ]
    if sort_by == "cost":
        use_totals = any(fit.cost is not None for fit in rows)
    elif sort_by == "time":
        use_totals = any(fit.hours is not None for fit in rows)
    else:
        use_totals = True
    ordered: list[FlavorFit] = []
    for group in (
        [fit for fit in rows if fit.verdict is not FitVerdict.NO],
        [fit for fit in rows if fit.verdict is FitVerdict.NO],
    ):
        known = [
            fit for fit in group if _sort_value(fit, sort_by, use_totals=use_totals) is not None
        ]
        unknown = [fit for fit in group if fit not in known]
        known.sort(
            key=lambda fit: (_sort_value(fit, sort_by, use_totals=use_totals), fit.flavor.id),
            reverse=descending,
        )
        unknown.sort(key=lambda fit: fit.flavor.id)
        ordered.extend(known + unknown)
    return ordered


def format_headroom(headroom_bytes: int) -> str:
    """Signed headroom, e.g. ``+3.2 GiB`` or ``-1.0 GiB``."""
    sign = "+" if headroom_bytes >= 0 else "-"
    return f"{sign}{format_bytes(abs(headroom_bytes))}"


class FlavorTable(DataTable[Text | str]):
    """Flavors for the current report; click a heading (or use the pane's keys) to sort."""

    DEFAULT_CSS = """
    FlavorTable {
        height: auto;
        max-height: 24;
    }
    """

    sort_by: reactive[SortKey] = reactive[SortKey]("cost")
    """Which value orders the rows."""
    descending: reactive[bool] = reactive(False)
    """Reverse the order within the fitting and non-fitting groups."""
    fits_only: reactive[bool] = reactive(False)
    """Hide flavors the plan does not fit on."""
    provider: reactive[str] = reactive("all")
    """Show one provider only (a key of ``PROVIDER_LABELS``)."""
    stale: reactive[bool] = reactive(False)
    """True while the form is invalid and the rows are the last good estimate (drawn dimmed)."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.report: PlanReport | None = None
        """The report the rows come from."""
        self.shown: list[FlavorFit] = []
        """The rows on screen, in order (after sort and filter)."""
        self.max_field: str | None = None
        """The ``--max`` field whose answers the "max" column shows (None: no such column)."""
        self.max_answers: dict[str, MaxFit] = {}
        """That field's answer on each flavor, by flavor id."""

    def on_mount(self) -> None:
        self._rebuild()

    def show_report(self, report: PlanReport | None) -> None:
        """Replace the rows with this report's flavors."""
        self.report = report
        self._rebuild()

    def show_max(self, field: str | None, answers: dict[str, MaxFit]) -> None:
        """Show (``field`` None: hide) the "max FIELD" column, ``answers`` by flavor id."""
        self.max_field = field
        self.max_answers = answers
        self._rebuild()

    def columns_shown(self) -> tuple[tuple[str, str, SortKey | None], ...]:
        """:data:`COLUMNS`, with the "max" column after the verdict while one is asked for (at
        80 columns the table shows the flavor, the verdict and not much more)."""
        if self.max_field is None:
            return COLUMNS
        return (
            *COLUMNS[:MAX_AT],
            ("max", MAX_HEADINGS.get(self.max_field, self.max_field), None),
            *COLUMNS[MAX_AT:],
        )

    def max_cell(self, flavor_id: str) -> Text:
        """The "max" column's cell: the answer, ``none`` when nothing fits, ``-`` unknown."""
        answer = self.max_answers.get(flavor_id)
        if answer is None:
            return Text("-", justify="right")
        if answer.value is None:
            return Text("none", style="red", justify="right")
        return Text(str(answer.value), justify="right")

    def sort_on(self, sort_by: SortKey) -> None:
        """Sort by ``sort_by``; asking for the current sort again reverses it."""
        if sort_by == self.sort_by:
            self.descending = not self.descending
        else:
            self.sort_by = sort_by
            self.descending = False

    def watch_sort_by(self) -> None:
        self._rebuild()

    def watch_descending(self) -> None:
        self._rebuild()

    def watch_fits_only(self) -> None:
        self._rebuild()

    def watch_provider(self) -> None:
        self._rebuild()

    def watch_stale(self) -> None:
        self.set_class(self.stale, "-stale")

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        sort = dict((key, sort) for key, _, sort in COLUMNS).get(str(event.column_key.value))
        if sort is not None:
            self.sort_on(sort)

    def _heading(self, key: str, label: str, sort: SortKey | None) -> Text:
        if sort is not None and sort == self.sort_by and key != "price":
            # The arrow says which way the column's numbers run: headroom sorts most first.
            largest_first = self.descending != (sort == "memory")
            arrow = "▼" if largest_first else "▲"
            return Text(f"{label} {arrow}", style="bold underline")
        return Text(label)

    def _rebuild(self) -> None:
        if not self.is_mounted:
            return
        selected = (
            self.shown[self.cursor_row].flavor.id
            if 0 <= self.cursor_row < len(self.shown)
            else None
        )
        self.clear(columns=True)
        report = self.report
        self.shown = (
            order_fits(
                report.flavors,
                sort_by=self.sort_by,
                descending=self.descending,
                fits_only=self.fits_only,
                provider=self.provider,
            )
            if report is not None
            else []
        )
        recommended = report.recommended if report is not None else None
        columns = self.columns_shown()
        rows: list[tuple[str, list[Text]]] = [
            (fit.flavor.id, self._cells(fit, recommended)) for fit in self.shown
        ]
        if self.max_field is not None:
            rows = [
                (key, [*cells[:MAX_AT], self.max_cell(key), *cells[MAX_AT:]]) for key, cells in rows
            ]
        if report is not None and not self.shown and report.flavors:
            message = self.empty_message(report)
            rows.append(
                (
                    EMPTY_ROW,
                    [
                        Text(message, style="yellow") if key == "flavor" else Text("")
                        for key, *_ in columns
                    ],
                )
            )
        # Each column as wide as its widest cell, given to the table up front: left to measure
        # them itself, DataTable does so on its next idle, and a frame drawn before that (the
        # screen redrawn as a dialog closes) stays cached at the headings' widths until the next
        # change (textual/widgets/_data_table.py: ``_update_dimensions`` does not clear the row
        # render caches, whose key is the update count).
        for index, (key, label, sort) in enumerate(columns):
            heading = self._heading(key, label, sort)
            width = max([heading.cell_len, *(cells[index].cell_len for _, cells in rows)])
            self.add_column(heading, key=key, width=width)
        for row_key, cells in rows:
            self.add_row(*cells, key=row_key)
        if selected is not None:
            ids = [fit.flavor.id for fit in self.shown]
            if selected in ids:
                self.move_cursor(row=ids.index(selected), animate=False)

    def empty_message(self, report: PlanReport) -> str:
        """What the table says when its filters leave no flavor (instead of an empty table under a
        headline that recommends a flavor the filter hides)."""
        text = "no flavor"
        if self.provider != "all":
            text += f" of {PROVIDER_LABELS.get(self.provider, self.provider)}"
        if self.fits_only:
            text += " fits"
        if report.recommended:
            text += f"; the recommended {report.recommended} is filtered out"
        return text + " (v: next provider, o: every verdict)"

    @staticmethod
    def _cells(fit: FlavorFit, recommended: str | None) -> list[Text]:
        is_recommended = fit.flavor.id == recommended
        name_style = "bold" if is_recommended else ""
        price = fit.flavor.price_per_hour
        return [
            Text(RECOMMENDED_MARK if is_recommended else "", style="bold yellow"),
            Text(
                fit.flavor.id + (" (this machine)" if fit.flavor.id == "local" else ""),
                style=name_style,
            ),
            Text(fit.verdict.value, style=VERDICT_STYLES[fit.verdict]),
            Text(format_money(fit.cost), justify="right"),
            Text(format_hours(fit.hours), justify="right"),
            Text(
                format_headroom(fit.headroom_bytes),
                style="red" if fit.headroom_bytes < 0 else "",
                justify="right",
            ),
            Text("-" if price is None else format_money(price), justify="right"),
            Text(str(fit.flavor.gpu_count) if fit.flavor.gpu_count else "cpu"),
            # A plain str cell would be parsed as markup; names come from user catalogs.
            Text(fit.accelerator.name if fit.accelerator is not None else "CPU only"),
            Text(fit.reason, style="dim"),
        ]
