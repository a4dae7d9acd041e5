"""The planner pane: a form for a :class:`Plan` on the left, its estimate on the right.

Every change in the form recomputes the estimate at once (``evaluate_plan`` is a pure function that
takes a few milliseconds). A field whose value cannot be used is marked (``-invalid``) with the reason
under it; the form is never cleared and the last good estimate stays on screen, dimmed, until the form
is valid again.

``t`` traces the plan's step on fake tensors (:mod:`hwdash.tracing`, torch and transformers where
installed) in a worker thread, with a spinner, and shows the traced peak beside the estimate; a
change in the form marks that result stale.

The pane is put together from its parts: the form (:mod:`hwdash.ui.planner_form`), the results
(:mod:`hwdash.ui.planner_results`) and the dialogs (:mod:`hwdash.ui.planner_dialog_actions`); this
module holds what ties them together: the recompute on every change, the event handlers, the
flavor table's filters and the trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Vertical
from textual.events import Resize
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Checkbox, DataTable, Input, OptionList, Select, Static
from textual.worker import Worker, WorkerState, get_current_worker

from hwdash.core.catalog import Catalog
from hwdash.core.plan import Plan
from hwdash.core.planning.local_flavor import (
    LOCAL_FLAVOR_ID,
    LocalGpu,
    NoLocalGpu,
    local_machine,
    with_local_machine,
)
from hwdash.core.planning.max_fit import MaxField
from hwdash.core.plans.store import PlanStore, SavedPlan
from hwdash.core.results import PlanReport
from hwdash.core.specs import ModelSpec
from hwdash.ui.planner_dialog_actions import PlannerDialogs
from hwdash.ui.planner_form import (
    EXAMPLES_PLACEHOLDER,
    FORM_CSS,
    FORM_FIELDS,
    LOSS_DEFAULT,
    MODEL_MATCHES,
    PlannerForm,
    control_id,
)
from hwdash.ui.planner_keys import PLANNER_BINDINGS
from hwdash.ui.planner_results import (
    RESULTS_CSS,
    WIDE_BREAKPOINT,
    PlannerResults,
    flavor_note,
    form_warnings,
    form_words,
)
from hwdash.ui.widgets.planner_breakdown import MemoryBreakdownView
from hwdash.ui.widgets.planner_flavors import MAX_WORDS, PROVIDER_LABELS, FlavorTable, SortKey
from hwdash.ui.widgets.planner_trace import TraceOutcome, TraceView, run_trace_until_cancelled

__all__ = [
    "EXAMPLES_PLACEHOLDER",
    "FORM_FIELDS",
    "LOSS_DEFAULT",
    "MODEL_MATCHES",
    "WIDE_BREAKPOINT",
    "PlannerPane",
    "form_words",
    "run_trace_until_cancelled",
]


class PlannerPane(PlannerForm, PlannerResults, PlannerDialogs, Widget):
    """The plan form and its live estimate: memory breakdown, warnings and the flavor table."""

    #: The form's rules, then the results' (one string, in the order they always had).
    DEFAULT_CSS = FORM_CSS + RESULTS_CSS

    #: Shown in the footer while focus is inside the pane (see :mod:`hwdash.ui.planner_keys`).
    BINDINGS: ClassVar[list[BindingType]] = [*PLANNER_BINDINGS]

    class PlanChanged(Message):
        """The estimate was recomputed; ``report`` is None while the form is invalid."""

        def __init__(
            self, report: PlanReport | None, *, chosen: bool = False, label: str = ""
        ) -> None:
            super().__init__()
            self.report = report
            """The new estimate, or None when the form has errors."""
            self.chosen = chosen
            """Whether the user chose this plan (loaded, saved or edited it), as opposed to the
            form's starting default: only a chosen plan is drawn on the monitor."""
            self.label = label
            """How to name it: the saved plan's name, else model and method."""

    class PlanSaved(Message):
        """A plan was saved to the store from this pane."""

        def __init__(self, saved: SavedPlan) -> None:
            super().__init__()
            self.saved = saved
            """The stored entry (its name may carry a ``(2)`` suffix)."""

    def __init__(
        self,
        catalog: Catalog,
        store: PlanStore,
        *,
        initial: Plan | None = None,
        id: str | None = "planner",
    ) -> None:
        super().__init__(id=id)
        self.catalog = catalog
        self.store = store
        self._base = initial if initial is not None else self._default_plan(catalog)
        self._starting_plan = self._base
        self._chosen_defaults: set[str] = set()
        """The rows of :data:`FRAMEWORK_PLAN_FIELDS` the user set: the framework fills the others."""
        self._shown_defaults: dict[str, Any] = {}
        """What the pane last put in those rows (a row that holds something else was edited)."""
        self._note_choices(self._base)
        self._chosen_name: str | None = None
        """The name of a plan the user loaded or saved (None: the form's own)."""
        self.report: PlanReport | None = None
        """The last good estimate (kept while the form is invalid)."""
        self.errors: dict[str, str] = {}
        """Field name -> reason, for every field the current form cannot use (``""``: the whole form)."""
        self._recompute_pending = False
        self._load_pending = False
        """A plan was loaded before the form was built: it fills the form on mount."""
        self._shown_errors: dict[str, str] | None = None
        self.exported: Path | None = None
        """The file the last export wrote (tests read it)."""
        self.max_field: MaxField | None = None
        """The ``--max`` field of the flavor table's "max" column (``x`` cycles it; None: off)."""

    @staticmethod
    def _default_plan(catalog: Catalog) -> Plan:
        preferred = ("qwen2.5-7b", "llama-3.1-8b")
        model = next((m for m in preferred if m in catalog.models), None)
        if model is None:
            model = next(iter(sorted(catalog.models)), "7B")
        return Plan(model=model)

    # -- layout ---------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield from self._compose_form()
        # The headline (model, GiB per GPU, the recommended flavor) stays above the scrolling
        # results: visiting the flavor table scrolls them, and nothing there takes focus to
        # scroll them back.
        with Vertical(id="plan-side"):
            yield Static("", id="plan-problem", markup=False)
            yield Static("", id="plan-headline", markup=False)
            yield from self._compose_results()

    def on_mount(self) -> None:
        if not self.query(f"#{control_id('method')}"):
            # The app quit while this pane was being mounted after the first frame (seen when it
            # exits within a fraction of a second of starting): its form is gone, nothing to do.
            return
        if self._load_pending:
            self.load_plan(self._base, self._chosen_name)
        self._recompute()

    def on_resize(self, event: Resize) -> None:
        wide = event.size.width >= WIDE_BREAKPOINT
        self.set_class(wide, "-wide")
        self.query_one(TraceView).set_detailed(wide)

    # -- recomputing -----------------------------------------------------------------------------

    def request_recompute(self) -> None:
        """Recompute once the current burst of changes has been handled."""
        if not self._recompute_pending:
            self._recompute_pending = True
            self.call_later(self._recompute)

    def _recompute(self) -> None:
        self._recompute_pending = False
        self._show_rows_for_method()
        plan, errors = self._build_plan()
        report: PlanReport | None = None
        if plan is not None:
            self._show_framework_defaults(plan)
            report = self._estimate(plan, errors)
        self.errors = errors
        with self.app.batch_update():
            self._show_errors(errors)
            if report is not None:
                self.report = report
                self._show_report(report, form_warnings(report.plan))
            self.set_class(report is None and self.report is not None, "-stale")
            self.query_one(MemoryBreakdownView).stale = report is None
            self.query_one(FlavorTable).stale = report is None
            self.query_one(TraceView).follow_plan(None if report is None else report.plan)
        chosen = self._chosen_name is not None or (
            report is not None and report.plan != self._starting_plan
        )
        label = ""
        if report is not None:
            label = self._chosen_name or f"{report.model.id} {report.plan.method.value} (edited)"
        self.post_message(self.PlanChanged(report, chosen=chosen, label=label))

    def _announce_saved(self, saved: SavedPlan) -> None:
        """Tell the app a plan was saved (:class:`PlanSaved`)."""
        self.post_message(self.PlanSaved(saved))

    # -- events ----------------------------------------------------------------------------------

    @on(Input.Changed)
    def _input_changed(self, event: Input.Changed) -> None:
        if event.input.id == control_id("model"):
            self._update_model_matches(event.value)
        self.request_recompute()

    @on(Select.Changed)
    def _select_changed(self, event: Select.Changed) -> None:
        if event.select.id == "plan-provider":
            if isinstance(event.value, str):
                self.query_one(FlavorTable).provider = event.value
            return
        self.request_recompute()

    @on(Checkbox.Changed)
    def _checkbox_changed(self, event: Checkbox.Changed) -> None:
        if event.checkbox.id == "plan-fits-only":
            self.query_one(FlavorTable).fits_only = event.value
            return
        self.request_recompute()

    @on(DataTable.RowSelected, "#plan-flavor-table")
    def _flavor_chosen(self, event: DataTable.RowSelected) -> None:
        """Enter on a flavor row: say what the row cannot (hardware, memory, the reason)."""
        table = self.query_one(FlavorTable)
        if not 0 <= event.cursor_row < len(table.shown):
            return
        fit = table.shown[event.cursor_row]
        self.notify(flavor_note(fit), title=fit.flavor.name, timeout=8, markup=False)

    @on(Input.Submitted, "#plan-model")
    def _model_submitted(self, event: Input.Submitted) -> None:
        matches = self.query_one("#plan-model-matches", OptionList)
        if matches.has_class("-open") and matches.option_count:
            first = matches.get_option_at_index(0)
            if first.id is not None:
                self._choose_model(first.id)

    @on(OptionList.OptionSelected, "#plan-model-matches")
    def _model_chosen(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option_id is not None:
            self._choose_model(event.option_id)

    # -- the flavor table ------------------------------------------------------------------------

    def action_sort(self, sort_by: SortKey) -> None:
        """Sort the flavor table (again: reverse)."""
        self.query_one(FlavorTable).sort_on(sort_by)

    def set_local_gpus(self, gpus: Sequence[LocalGpu]) -> bool:
        """Add this machine (the GPUs the monitor sees) to the flavor table as ``local``, once.
        Returns whether it was added."""
        if LOCAL_FLAVOR_ID in self.catalog.flavors:
            return False
        try:
            machine = local_machine(gpus, self.catalog)
        except NoLocalGpu:
            return False
        self.catalog = with_local_machine(self.catalog, machine)
        if self.is_mounted:  # else the first estimate, on mount, already sees it
            self.request_recompute()
        return True

    def action_toggle_fits_only(self) -> None:
        """Show only flavors the plan fits on, or all."""
        checkbox = self.query_one("#plan-fits-only", Checkbox)
        checkbox.value = not checkbox.value

    def action_next_max(self) -> None:
        """Cycle the flavor table's "max" column: off, seq, batch (an inference plan's:
        concurrency), the fewest gpus, off (``hwdash plan --max``)."""
        cycle: list[MaxField | None] = [None, MaxField.SEQ, MaxField.BATCH, MaxField.GPUS]
        self.max_field = cycle[(cycle.index(self.max_field) + 1) % len(cycle)]
        self._show_max(self.report)
        shown = self.query_one(FlavorTable).max_field
        words = "off" if shown is None else MAX_WORDS[shown]
        self.notify(f"max column: {words} (x: next)", timeout=4, markup=False)

    def action_next_provider(self) -> None:
        """Cycle the provider filter."""
        select: Select[str] = self.query_one("#plan-provider", Select)
        keys = list(PROVIDER_LABELS)
        current = select.value if isinstance(select.value, str) else "all"
        select.value = keys[(keys.index(current) + 1) % len(keys)]

    # -- tracing ---------------------------------------------------------------------------------

    def action_trace(self) -> None:
        """Trace the current plan on fake tensors in a worker thread, with a spinner meanwhile."""
        view = self.query_one(TraceView)
        if view.running:
            self.notify("A trace is already running.", title="Trace", timeout=3, markup=False)
            return
        report = self.report
        if report is None or self.errors:
            self.notify(
                "Nothing to trace: fix the marked fields first.", severity="warning", timeout=4
            )
            return
        view.show_running(report.model.name)
        self._trace_in_thread(report.plan, report.model)

    @work(thread=True, exclusive=True, group="trace", exit_on_error=False)
    def _trace_in_thread(self, plan: Plan, model: ModelSpec) -> TraceOutcome | None:
        # Blocking (seconds); runs off the event loop. Never raises: a failure is the outcome's
        # message. The result reaches the pane as a Worker.StateChanged message; None when the
        # worker was cancelled (the app quitting).
        worker = get_current_worker()
        return run_trace_until_cancelled(plan, model, lambda: worker.is_cancelled)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.group != "trace":
            return
        view = self.query_one(TraceView)
        outcome = event.worker.result
        if event.state is WorkerState.SUCCESS and isinstance(outcome, TraceOutcome):
            if outcome.message:
                outcome = replace(outcome, message=form_words(outcome.message))
            current = None if self.errors or self.report is None else self.report.plan
            view.show_outcome(outcome, stale=outcome.plan != current)
        elif event.state is WorkerState.ERROR:  # run_trace catches everything; belt and braces
            error = event.worker.error
            plan = self.report.plan if self.report is not None else self._base
            message = f"the trace did not finish ({type(error).__name__}: {error})"
            view.show_outcome(TraceOutcome(plan, plan.model, message=message), stale=False)
        elif event.state in (WorkerState.SUCCESS, WorkerState.CANCELLED):  # cancelled: no outcome
            view.stop_running()

    @property
    def trace_outcome(self) -> TraceOutcome | None:
        """The last finished trace (None before the first, or while the first runs)."""
        return self.query_one(TraceView).outcome

    @property
    def trace_is_stale(self) -> bool:
        """Whether the form has changed since the trace shown."""
        return self.query_one(TraceView).stale
