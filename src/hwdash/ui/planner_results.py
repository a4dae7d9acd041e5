"""The planner's results: the headline (model, memory per GPU, the recommended flavor), the memory
breakdown, the warnings, the details and the flavor table, and the words that turn the estimator's
command-line advice into the form's.

Part of :class:`~hwdash.ui.planner_pane.PlannerPane` (a mixin, see :mod:`hwdash.ui.planner_base`).
May import the core, Textual, the planner widgets, :mod:`hwdash.ui.planner_base`,
:mod:`hwdash.ui.planner_form` and the runs ledger (what this box measured for similar plans).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Static

from hwdash.core.catalog import CatalogError
from hwdash.core.models.config import resolve_model
from hwdash.core.plan import Plan
from hwdash.core.plan_unused import unused_settings
from hwdash.core.planning.fit import evaluate_plan
from hwdash.core.planning.max_fit import MaxField, MaxFit, find_max
from hwdash.core.planning.serving_max import serving_max_by_flavor
from hwdash.core.planning.serving_plan import engine_report
from hwdash.core.results import FitVerdict, FlavorFit, PlanReport
from hwdash.core.units import format_bytes, format_count, format_hours, format_money
from hwdash.errors import UsageError
from hwdash.ui.planner_base import PlannerParts
from hwdash.ui.planner_form import FIELD_NAMES
from hwdash.ui.widgets.check import Check
from hwdash.ui.widgets.form_select import FormSelect
from hwdash.ui.widgets.planner_breakdown import MemoryBreakdownView
from hwdash.ui.widgets.planner_flavors import PROVIDER_LABELS, FlavorTable
from hwdash.ui.widgets.planner_serving import serving_memory_shown, serving_text
from hwdash.ui.widgets.planner_trace import TraceView

#: Width from which results use two columns (breakdown beside the flavor table).
WIDE_BREAKPOINT = 150

#: The results' half of the pane's CSS, after the form's (:data:`hwdash.ui.planner_form.FORM_CSS`).
RESULTS_CSS = """    PlannerPane #plan-side {
        width: 1fr;
        height: 1fr;
        padding: 0 0 0 1;
    }
    PlannerPane #plan-results {
        width: 1fr;
        height: 1fr;
    }
    PlannerPane.-wide #plan-results {
        layout: horizontal;
        overflow-y: hidden;
    }
    PlannerPane #plan-summary {
        height: auto;
    }
    PlannerPane.-wide #plan-summary {
        width: 64;
        height: 1fr;
        padding-right: 1;
    }
    PlannerPane #plan-flavors {
        height: auto;
    }
    PlannerPane.-wide #plan-flavors {
        width: 1fr;
        height: 1fr;
    }
    PlannerPane.-wide FlavorTable {
        height: 1fr;
        max-height: 100%;
    }
    PlannerPane #plan-headline {
        height: auto;
        margin-bottom: 1;
    }
    PlannerPane #plan-problem {
        display: none;
        color: $error;
        height: auto;
    }
    PlannerPane.-stale #plan-problem {
        display: block;
    }
    PlannerPane #plan-serving {
        display: none;
        height: auto;
        margin-bottom: 1;
    }
    PlannerPane #plan-warnings {
        height: auto;
        color: $warning;
        margin-top: 1;
    }
    PlannerPane #plan-details {
        display: none;
        height: auto;
        margin-top: 1;
    }
    PlannerPane.-wide #plan-details {
        display: block;
    }
    PlannerPane #plan-flavor-controls {
        height: 1;
        margin-top: 1;
    }
    PlannerPane #plan-flavor-controls Checkbox {
        margin-right: 2;
    }
    PlannerPane #plan-provider {
        width: 24;
    }
    PlannerPane.-stale FlavorTable, PlannerPane.-stale #plan-headline {
        opacity: 60%;
    }
    """

#: Command-line flags the estimator's warnings mention, and the form field each one is here.
_FLAG_WORDS = {
    "--attn": "attention",
    "--batch": "micro-batch",
    "--budget": "budget $",
    "--examples": "examples",
    "--framework": "framework",
    "--fsdp": "FSDP",
    "--fsdp-offload": "FSDP offl.",
    "--loss": "loss",
    "--pp": "pipeline",
    "--tp": "tensor par.",
    "--grad-accum": "grad accum",
    "--grad-ckpt": "grad ckpt",
    "--gpus": "GPUs",
    "--lora-dropout": "LoRA drop",
    "--lora-r": "LoRA rank",
    "--method": "method",
    "--mfu": "MFU",
    "--offload": "offload",
    "--optimizer": "optimizer",
    "--optimizer-impl": "AdamW impl",
    "--precision": "precision",
    "--quant": "quantize",
    "--seq": "seq length",
    "--tokens": "tokens",
    "--vllm-util": "vLLM share",
    "--zero": "ZeRO stage",
}
#: Flags whose name is not the Plan field's (``--attn`` sets ``attention``).
_FLAG_FIELDS = {"--attn": "attention", "--vllm-util": "vllm_memory_utilization"}

_FLAG_RE = re.compile(r"--[a-z][a-z-]*")


def field_for_flag(flag: str | None) -> str:
    """The form field an estimator error's flag is about, or ``""`` (the whole form)."""
    if not flag:
        return ""
    field = _FLAG_FIELDS.get(flag, flag.lstrip("-").replace("-", "_"))
    return field if field in FIELD_NAMES else ""


def form_warnings(plan: Plan) -> list[str]:
    """What the command line warns about a setting the plan's method ignores, for the fields the
    form keeps while their rows are hidden: examples in an inference plan
    (``commands/plan.py`` ``unused_flag_warnings``)."""
    given = ["examples"] if plan.examples is not None else []
    return [
        f"{_FLAG_WORDS.get('--' + name, name)} does nothing here: {form_words(why)}"
        for name, why in unused_settings(plan, given)
    ]


def form_words(text: str) -> str:
    """The estimator's advice in the form's words: ``try --grad-ckpt`` becomes ``try grad ckpt``."""
    return _FLAG_RE.sub(lambda match: _FLAG_WORDS.get(match.group(0), match.group(0)), text)


def plain(exc: Exception, flag: str | None) -> str:
    """An error message without the ``--flag:`` prefix (the field already says which one)."""
    message = str(exc)
    if flag and message.startswith(f"{flag}: "):
        return message[len(flag) + 2 :]
    return message


def recommended_fit(report: PlanReport) -> FlavorFit | None:
    """The flavor table's row for the report's recommended flavor, if it has one."""
    return next((f for f in report.flavors if f.flavor.id == report.recommended), None)


def headline_text(report: PlanReport) -> Text:
    """Model, parameters, method, memory per GPU and tokens; then the recommended flavor."""
    estimate = report.estimate
    plan = report.plan
    headline = Text()
    headline.append(report.model.name, style="bold")
    headline.append(f"  {format_count(estimate.total_params)} params")
    if estimate.trainable_params and estimate.trainable_params != estimate.total_params:
        headline.append(f", {format_count(estimate.trainable_params)} trainable")
    headline.append(f"\n{plan.method.value} · {plan.precision.value} · ")
    headline.append(f"{format_bytes(estimate.per_gpu.total)} per GPU", style="bold")
    if estimate.gpus > 1:
        headline.append(f" × {estimate.gpus}")
    if report.tokens:
        headline.append(f" · {format_count(report.tokens)} tokens")
    headline.append("\n")
    best = recommended_fit(report)
    if best is not None:
        headline.append("★ ", style="bold yellow")
        headline.append(best.flavor.id, style="bold")
        if best.hours is not None:
            detail = f"{format_hours(best.hours)}, {format_money(best.cost)}"
        else:
            detail = f"{format_money(best.flavor.price_per_hour)}/h"
        headline.append(
            f"  {best.verdict.value}, {detail}",
            style="green" if best.verdict is FitVerdict.FITS else "yellow",
        )
    else:
        headline.append("fits no flavor in the catalog", style="bold red")
    return headline


def details_text(report: PlanReport) -> Text:
    """Where the bytes go (per GPU), and the recommended flavor's throughput."""
    details = Text("where the bytes go (per GPU)\n", style="bold")
    for label, value in report.estimate.details:
        details.append(f"  {label:<44.44} {format_bytes(value):>10}\n")
    best = recommended_fit(report)
    if best is not None and best.tokens_per_second:
        details.append(f"\n{best.flavor.id}: {best.tokens_per_second:,.0f} tokens/s")
    return details


def flavor_note(fit: FlavorFit) -> str:
    """What a flavor row cannot say: hardware, memory needed of usable, speed, reason, price date."""
    flavor = fit.flavor
    hardware = f"{flavor.gpu_count} × {fit.accelerator.name}" if fit.accelerator else "CPU only"
    lines = [
        f"{hardware}; needs {format_bytes(fit.need_bytes)} of "
        f"{format_bytes(fit.usable_bytes)} per device",
    ]
    if fit.tokens_per_second:
        lines.append(f"{fit.tokens_per_second:,.0f} tokens/s")
    if fit.reason:
        lines.append(form_words(fit.reason))
    if flavor.price_date:
        lines.append(f"price as of {flavor.price_date}")
    return "\n".join(lines)


_LEDGER_CACHE: dict[str, Any] = {}


def measured_here(report: PlanReport) -> str | None:
    """What this box measured for similar plans (:mod:`hwdash.runs.calibration`), read from the
    runs ledger again only when the file changed; None without similar runs (or a ledger)."""
    from hwdash.runs import ledger
    from hwdash.runs.calibration import calibration, newest_records

    path = ledger.ledger_path()
    try:
        info = path.stat()
    except OSError:
        return None
    key = (str(path), info.st_mtime_ns, info.st_size)
    if _LEDGER_CACHE.get("key") != key:
        try:
            records = newest_records(path) or []
        except (OSError, ValueError):
            records = []
        _LEDGER_CACHE.update(key=key, records=records)
    found = calibration(_LEDGER_CACHE["records"], report.model.id, report.plan.method.value)
    return None if found is None else found.sentence()


class PlannerResults(PlannerParts):
    """The results half of the planner pane: estimating a plan and showing the estimate."""

    def _compose_results(self) -> ComposeResult:
        with VerticalScroll(id="plan-results", can_focus=False):
            with Vertical(id="plan-summary"):
                yield Static("", id="plan-serving", markup=False)
                yield MemoryBreakdownView(id="plan-breakdown")
                yield TraceView(id="plan-trace")
                yield Static("", id="plan-warnings", markup=False)
                yield Static("", id="plan-details", markup=False)
            with Vertical(id="plan-flavors"):
                with Horizontal(id="plan-flavor-controls"):
                    yield Check("fits only", id="plan-fits-only", compact=True)
                    yield FormSelect(
                        [(label, key) for key, label in PROVIDER_LABELS.items()],
                        value="all",
                        allow_blank=False,
                        compact=True,
                        id="plan-provider",
                    )
                yield FlavorTable(id="plan-flavor-table")

    def _estimate(self, plan: Plan, errors: dict[str, str]) -> PlanReport | None:
        """The estimate of ``plan``, or None with the reason added to ``errors``."""
        try:
            resolve_model(plan.model, self.catalog)
        except (UsageError, CatalogError, ValueError) as exc:
            errors["model"] = plain(exc, "--model")
            return None
        try:
            # a serving plan: the flavors' verdicts are the engine's, and so is the memory shown
            # (headline, bars, the monitor's plan line) on the flavor of the serving lines
            return engine_report(evaluate_plan(plan, self.catalog), self.catalog)
        except UsageError as exc:
            errors[field_for_flag(exc.flag)] = plain(exc, exc.flag)
        except (CatalogError, ValueError) as exc:
            errors[""] = str(exc)
        except Exception as exc:  # an estimator bug must not take the dashboard down
            errors[""] = f"the estimator failed on this plan ({type(exc).__name__}: {exc})"
        return None

    def _show_report(self, report: PlanReport, notes: Sequence[str] = ()) -> None:
        """Show ``report``: headline, breakdown, warnings (``notes`` first), details, flavors."""
        estimate = report.estimate
        self.query_one("#plan-headline", Static).update(headline_text(report))
        serving = serving_memory_shown(report, self.catalog)
        serving_view = self.query_one("#plan-serving", Static)
        serving_view.update(Text() if serving is None else serving_text(*serving))
        serving_view.display = serving is not None
        self.query_one(MemoryBreakdownView).estimate = estimate
        warnings = list(dict.fromkeys((*notes, *estimate.warnings, *report.warnings)))
        warning_view = self.query_one("#plan-warnings", Static)
        warning_view.update("\n".join(f"⚠ {form_words(w)}" for w in warnings))
        warning_view.display = bool(warnings)
        details = details_text(report) if estimate.details else Text()
        measured = measured_here(report)
        if measured is not None:
            details.append(("\n" if details.plain else "") + f"measured here: {measured}", "italic")
        self.query_one("#plan-details", Static).update(details)
        self.query_one(FlavorTable).show_report(report)
        self._show_max(report)

    def _show_max(self, report: PlanReport | None) -> None:
        """The flavor table's "max" column (``x``): each flavor's ``--max`` answer for the field
        chosen, or no column."""
        table = self.query_one(FlavorTable)
        field = self.max_field
        if field is None or report is None:
            table.show_max(None, {})
            return
        if field is MaxField.BATCH and not report.plan.is_training:
            field = MaxField.CONCURRENCY  # an inference plan's batch: sequences at once
        if report.plan.is_serving:
            # the engine's answers, as hwdash plan --max (core/planning/serving_max.py)
            table.show_max(field.value, serving_max_by_flavor(report, field, self.catalog))
            return
        answers: dict[str, MaxFit] = {}
        for fit in report.flavors:
            try:
                answers[fit.flavor.id] = find_max(
                    report.plan, report.model, self.catalog, fit.flavor.id, field
                )
            except (UsageError, ValueError):
                continue  # shown as "-": a setting the search cannot re-plan
        table.show_max(field.value, answers)
