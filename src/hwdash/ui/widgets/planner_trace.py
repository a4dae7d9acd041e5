"""The planner's trace panel: a spinner while a fake-tensor trace runs, then the traced peak beside
the analytic estimate, or one line saying why there is no trace.

The trace itself runs in the planner pane's worker thread (:func:`hwdash.tracing.trace_plan`); this
widget only shows its outcome. An outcome belongs to the plan it traced: when the form changes to
another plan the outcome is kept but marked stale, and it is current again when the form comes back
to the traced plan.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, LoadingIndicator, Static

from hwdash.core.plan import Offload, Plan
from hwdash.core.results import MemoryEstimate
from hwdash.core.specs import ModelSpec
from hwdash.core.units import format_bytes
from hwdash.errors import UsageError
from hwdash.tracing import (
    TraceResult,
    comparable_estimate,
    comparison_rows,
    relative_error,
    trace_plan,
)

#: What the panel says under a stale result.
STALE_HINT = "plan changed since this trace: ctrl+t traces again"


@dataclass(frozen=True)
class TraceOutcome:
    """What one press of the trace key produced: a trace and its estimate, or a message."""

    plan: Plan
    """The plan that was traced (as the form held it)."""
    model_name: str
    """Display name of the plan's model."""
    trace: TraceResult | None = None
    """The traced step; None when the plan could not be traced."""
    estimate: MemoryEstimate | None = None
    """The estimate the trace stands for (:func:`hwdash.tracing.comparable_estimate`)."""
    message: str | None = None
    """Why there is no trace, in one line (a missing package, an untraceable method)."""

    @property
    def error(self) -> float | None:
        """(estimate without overhead - traced) / traced; positive: the estimate is too high."""
        if self.trace is None or self.estimate is None:
            return None
        per_gpu = self.estimate.per_gpu
        return relative_error(per_gpu.total - per_gpu.overhead, self.trace.peak_bytes)


def run_trace(plan: Plan, model: ModelSpec) -> TraceOutcome:
    """Trace ``plan`` (blocking: call it from a worker thread) and never raise.

    A missing package, an untraceable method or a library failing under fake tensors becomes the
    outcome's one-line ``message``.
    """
    try:
        trace = trace_plan(plan, model)
        estimate = comparable_estimate(plan, model)
    except UsageError as exc:
        message = str(exc)
        if exc.flag and message.startswith(f"{exc.flag}: "):
            message = message[len(exc.flag) + 2 :]
        return TraceOutcome(plan, model.name, message=message)
    except Exception as exc:  # a worker must not take the dashboard down with a traceback
        first_line = (str(exc).strip().splitlines() or [""])[0][:200]
        return TraceOutcome(
            plan, model.name, message=f"the trace failed ({type(exc).__name__}: {first_line})"
        )
    return TraceOutcome(plan, model.name, trace=trace, estimate=estimate)


def run_trace_until_cancelled(
    plan: Plan, model: ModelSpec, cancelled: Callable[[], bool], *, poll_s: float = 0.1
) -> TraceOutcome | None:
    """:func:`run_trace` in a daemon thread, waited for until it ends or ``cancelled()``.

    A worker calls this so that quitting the app mid-trace does not wait for the trace: Textual
    cancels the worker, this returns None at the next poll, and the daemon thread (which cannot be
    interrupted inside torch) ends with the process instead of holding it open.
    """
    finished: list[TraceOutcome] = []
    thread = threading.Thread(
        target=lambda: finished.append(run_trace(plan, model)), name="hwdash-trace", daemon=True
    )
    thread.start()
    while thread.is_alive():
        thread.join(poll_s)
        if cancelled():
            return None
    return finished[0] if finished else None


def _when(trace: TraceResult) -> str:
    if trace.peak_step == 0:
        return trace.peak_phase
    return f"step {trace.peak_step} {trace.peak_phase}"


def render_outcome(
    outcome: TraceOutcome, *, stale: bool = False, detailed: bool = False, width: int = 60
) -> Text:
    """The outcome as a few lines: traced peak, estimate and error (and with ``detailed``, the
    component rows of :func:`hwdash.tracing.comparison_rows`)."""
    dim = "dim" if stale else ""
    out = Text(no_wrap=True, overflow="ellipsis", style=dim)
    trace, estimate = outcome.trace, outcome.estimate
    if trace is None or estimate is None:
        out.append("trace: ", style=dim or "bold")
        out.append(outcome.message or "no trace", style=dim or "yellow")
        out.no_wrap = False  # a message wraps rather than losing its end
    else:
        per_gpu = estimate.per_gpu
        without_overhead = per_gpu.total - per_gpu.overhead
        out.append(f"{'traced':<12}", style=dim or "bold")
        out.append(format_bytes(trace.peak_bytes), style=dim or "bold")
        out.append(f" at {_when(trace)}\n")
        out.append(f"{'estimate':<12}")
        out.append(format_bytes(without_overhead))
        error = outcome.error
        if error is not None:
            out.append(" ")
            good = abs(error) <= 0.12  # issue 5's worst-error goal: 12 %
            out.append(f"{error:+.1%}", style=dim or ("bold green" if good else "bold yellow"))
        out.append(" w/o overhead")
        scope = _scope(outcome.plan)
        out.append(f"\n{'':<12}fake {trace.device} tensors, {trace.seconds:.1f} s{scope}")
        if detailed:
            label_width = max(width - 22, 12)
            out.append(
                f"\n\n{'':<{label_width}}{'estimate':>10}{'traced':>10}", style=dim or "bold"
            )
            for label, estimated, traced in comparison_rows(trace, per_gpu.as_dict()):
                shown_estimate = "-" if estimated is None else format_bytes(estimated)
                shown_trace = "-" if traced is None else format_bytes(traced)
                out.append(
                    f"\n{label:<{label_width}.{label_width}}{shown_estimate:>10}{shown_trace:>10}"
                )
    if stale:
        out.append(f"\n{STALE_HINT}", style="italic")
    return out


def _scope(plan: Plan) -> str:
    """Say so when the trace stands for one GPU without ZeRO rather than the plan's own layout."""
    if plan.gpus > 1 or plan.zero or plan.offload is not Offload.NONE:
        return "; 1 GPU, no ZeRO"
    return ""


class TraceView(Vertical):
    """Hidden until the first trace; then a spinner while tracing and the outcome after."""

    DEFAULT_CSS = """
    TraceView {
        display: none;
        height: auto;
        margin-top: 1;
    }
    TraceView.-running, TraceView.-done {
        display: block;
    }
    TraceView #trace-running {
        display: none;
        height: 1;
    }
    TraceView.-running #trace-running {
        display: block;
    }
    TraceView #trace-running LoadingIndicator {
        width: 6;
        height: 1;
        min-height: 1;
        content-align: left middle;
    }
    TraceView #trace-running Label {
        width: 1fr;
        color: $text-muted;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    TraceView #trace-result {
        height: auto;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.outcome: TraceOutcome | None = None
        """The last finished trace (or refusal); None before the first."""
        self.stale = False
        """Whether the form now holds another plan than :attr:`outcome`'s."""
        self.detailed = False
        """Whether to list the components under the totals (the pane's wide layout)."""

    def compose(self) -> ComposeResult:
        # The spinner is mounted only while a trace runs: a LoadingIndicator redraws itself 16
        # times a second even when hidden, which was most of an idle dashboard's CPU.
        with Horizontal(id="trace-running"):
            yield Label("tracing ...", id="trace-running-label", markup=False)  # a model's name
        yield Static("", id="trace-result")

    @property
    def running(self) -> bool:
        """Whether the spinner is showing."""
        return self.has_class("-running")

    def show_running(self, model_name: str) -> None:
        """Show the spinner (the previous outcome stays below it, dimmed)."""
        self.query_one("#trace-running-label", Label).update(
            f"tracing {model_name} on fake tensors ..."
        )
        self.add_class("-running")
        running = self.query_one("#trace-running", Horizontal)
        if not running.query(LoadingIndicator):
            running.mount(LoadingIndicator(), before=0)
        if self.outcome is not None:
            self.stale = True
            self._draw()

    def show_outcome(self, outcome: TraceOutcome, *, stale: bool) -> None:
        """Stop the spinner and show ``outcome``."""
        self.outcome = outcome
        self.stale = stale
        self._stop_spinner()
        self.add_class("-done")
        self._draw()

    def stop_running(self) -> None:
        """Hide the spinner without a new outcome (the trace was cancelled)."""
        self._stop_spinner()
        self.set_class(self.outcome is not None, "-done")

    def _stop_spinner(self) -> None:
        self.remove_class("-running")
        self.query(LoadingIndicator).remove()

    def follow_plan(self, plan: Plan | None) -> None:
        """The form now holds ``plan`` (None: invalid): mark the outcome stale unless it is for it."""
        if self.outcome is None or self.running:
            return
        stale = plan != self.outcome.plan
        if stale != self.stale:
            self.stale = stale
            self._draw()

    def set_detailed(self, detailed: bool) -> None:
        """List the components (wide layout) or the totals only."""
        if detailed != self.detailed:
            self.detailed = detailed
            self._draw()

    def _draw(self) -> None:
        result = self.query_one("#trace-result", Static)
        if self.outcome is None:
            result.update("")
            return
        width = self.content_region.width or 60
        result.update(
            render_outcome(self.outcome, stale=self.stale, detailed=self.detailed, width=width)
        )
