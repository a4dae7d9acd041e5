"""The planner pane: a form for a :class:`Plan` on the left, its estimate on the right.

Every change in the form recomputes the estimate at once (``evaluate_plan`` is a pure function that
takes a few milliseconds). A field whose value cannot be used is marked (``-invalid``) with the reason
under it; the form is never cleared and the last good estimate stays on screen, dimmed, until the form
is valid again.

``t`` traces the plan's step on fake tensors (:mod:`hwdash.tracing`, torch and transformers where
installed) in a worker thread, with a spinner, and shows the traced peak beside the estimate; a
change in the form marks that result stale.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from pydantic import ValidationError
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.events import DescendantBlur, DescendantFocus, Key, Resize
from textual.message import Message
from textual.suggester import SuggestFromList
from textual.widget import Widget
from textual.widgets import Checkbox, DataTable, Input, Label, OptionList, Select, Static
from textual.widgets.option_list import Option
from textual.worker import Worker, WorkerState, get_current_worker

from hwdash.core.catalog import Catalog, CatalogError
from hwdash.core.estimator.savers import FRAMEWORK_PLAN_FIELDS, with_framework_defaults
from hwdash.core.models.config import resolve_model
from hwdash.core.models.hf_cache import cached_model_ids
from hwdash.core.numbers import parse_number, parse_whole_number, validation_phrase
from hwdash.core.plan import (
    LORA_STYLE_METHODS,
    RL_TRAINABLE_METHODS,
    TRAINING_ONLY_FIELDS,
    Attention,
    Framework,
    FsdpMode,
    Loss,
    Method,
    Offload,
    Optimizer,
    OptimizerImpl,
    Plan,
    Precision,
    Quant,
    unused_settings,
)
from hwdash.core.planning.fit import evaluate_plan
from hwdash.core.planning.fit_options import FitOption, closest_flavor, find_fit_options
from hwdash.core.planning.local_flavor import (
    LOCAL_FLAVOR_ID,
    LocalGpu,
    NoLocalGpu,
    local_machine,
    with_local_machine,
)
from hwdash.core.plans.exports import FILE_SUFFIXES, export_text
from hwdash.core.plans.store import (
    PlanStore,
    PlanStoreError,
    PlanSummary,
    SavedPlan,
    clean_name,
    default_exports_folder,
)
from hwdash.core.results import FitVerdict, FlavorFit, PlanReport
from hwdash.core.specs import ModelSpec
from hwdash.core.units import format_bytes, format_count, format_hours, format_money, parse_count
from hwdash.errors import UsageError
from hwdash.ui.planner_keys import PLANNER_BINDINGS
from hwdash.ui.widgets.check import Check
from hwdash.ui.widgets.form_select import FormSelect
from hwdash.ui.widgets.ordered_input import OrderedInput
from hwdash.ui.widgets.planner_breakdown import MemoryBreakdownView
from hwdash.ui.widgets.planner_dialogs import ConfirmDialog, NameDialog
from hwdash.ui.widgets.planner_export import FORMATS, ExportDialog
from hwdash.ui.widgets.planner_fit import FitOptionsDialog
from hwdash.ui.widgets.planner_flavors import PROVIDER_LABELS, FlavorTable, SortKey
from hwdash.ui.widgets.planner_trace import TraceOutcome, TraceView, run_trace_until_cancelled

#: Form fields in display order: (Plan field, label).
FORM_FIELDS: tuple[tuple[str, str], ...] = (
    ("model", "model"),
    ("method", "method"),
    ("precision", "precision"),
    ("batch", "micro-batch"),
    ("seq", "seq length"),
    ("grad_ckpt", "grad ckpt"),
    ("attention", "attention"),
    ("optimizer", "optimizer"),
    ("lora_r", "LoRA rank"),
    ("zero", "ZeRO stage"),
    ("offload", "offload"),
    ("gpus", "GPUs"),
    ("examples", "examples"),
    ("epochs", "epochs"),
    ("tokens", "tokens"),  # inference: the tokens to generate (hours and cost)
    ("mfu", "MFU"),
    # Added after the first layout: at the end, so the rows above keep their places.
    ("grad_accum", "grad accum"),
    ("lora_dropout", "LoRA drop"),
    ("optimizer_impl", "AdamW impl"),
    ("rl_method", "RL policy"),
    ("rl_reference", "RL ref"),
    ("rl_reward_model", "RL reward"),
    ("vllm_memory_utilization", "vLLM share"),
    ("quant", "quantize"),
    # Issue 13: the training stacks' defaults and savers, FSDP and Megatron parallelism.
    ("framework", "framework"),
    ("loss", "loss"),
    ("fsdp", "FSDP"),
    ("fsdp_offload", "FSDP offl."),
    ("tp", "tensor par."),
    ("pp", "pipeline"),
)
_FIELD_NAMES = tuple(name for name, _ in FORM_FIELDS)
#: Rows shown only for PPO and GRPO plans.
_RL_FIELDS = ("rl_method", "rl_reference", "rl_reward_model", "vllm_memory_utilization")
#: Rows shown only for inference plans.
_INFERENCE_FIELDS = ("quant", "tokens")
#: Fields of the adapters: hidden unless the plan trains LoRA-style adapters (directly, or as the
#: policy of an RL plan); what they hold then does not apply and never blocks the plan.
_LORA_FIELDS = ("lora_r", "lora_dropout")
#: Rows hidden for inference (what they set only training reads: the command line warns about them).
_TRAINING_FIELDS = (*(name for name in _FIELD_NAMES if name in TRAINING_ONLY_FIELDS), "framework")
#: Rows for fine-tuning plans (not inference, not RL): PyTorch FSDP.
_FSDP_FIELDS = ("fsdp",)
#: Rows shown only once FSDP shards the plan.
_FSDP_ONLY_FIELDS = ("fsdp_offload",)
#: Rows shown only for full training (Megatron-LM tensor and pipeline parallelism).
_FULL_ONLY_FIELDS = ("tp", "pp")
#: The class that shows a row only where it applies (the pane's method classes switch them).
_ROW_CLASSES = {
    **dict.fromkeys(_RL_FIELDS, "-rl-only"),
    **dict.fromkeys(_INFERENCE_FIELDS, "-inference-only"),
    **dict.fromkeys(_TRAINING_FIELDS, "-training-only"),
    **dict.fromkeys(_FSDP_FIELDS, "-fine-tuning-only"),
    **dict.fromkeys(_FSDP_ONLY_FIELDS, "-fsdp-only"),
    **dict.fromkeys(_FULL_ONLY_FIELDS, "-full-only"),
    **dict.fromkeys(_LORA_FIELDS, "-lora-only"),
}
#: The loss row's first choice: leave it to the framework (``Plan.loss`` None).
LOSS_DEFAULT = "framework default"
_INTEGER_FIELDS = ("batch", "seq", "lora_r", "gpus", "grad_accum", "tp", "pp")
#: Fields typed as decimal numbers.
_NUMBER_FIELDS = ("epochs", "mfu", "vllm_memory_utilization", "lora_dropout")
#: Enum fields shown as drop-downs of every member.
_ENUM_FIELDS: dict[str, Any] = {
    "method": Method,
    "precision": Precision,
    "attention": Attention,
    "optimizer": Optimizer,
    "optimizer_impl": OptimizerImpl,
    "offload": Offload,
    "quant": Quant,
    "framework": Framework,
    "fsdp": FsdpMode,
}

#: Width from which results use two columns (breakdown beside the flavor table).
WIDE_BREAKPOINT = 150
#: What the empty examples field says.
EXAMPLES_PLACEHOLDER = "e.g. 50k"
#: How many model matches the search list shows.
MODEL_MATCHES = 8


_LEADING_FLAG = re.compile(r"--(fsdp-offload|fsdp|tp|pp|gpus|loss|framework)\b")


def _field_for_message(message: str) -> str | None:
    """The form field a plan-level error is about, if its message names one (``offload``, ``zero``)."""
    leading = _LEADING_FLAG.match(message)
    if leading is not None:  # FSDP and Megatron messages start with their flag
        return leading.group(1).replace("-", "_")
    lowered = message.lower()
    if lowered.startswith("quant "):
        return "quant"
    for name in ("offload", "zero", "method", "rl_method"):
        if name in lowered:
            return name if name in _FIELD_NAMES else None
    return None


def _control_id(field: str) -> str:
    return f"plan-{field.replace('_', '-')}"


class PlannerPane(Widget):
    """The plan form and its live estimate: memory breakdown, warnings and the flavor table."""

    DEFAULT_CSS = """
    PlannerPane {
        layout: horizontal;
        height: 1fr;
    }
    PlannerPane #plan-form {
        width: 36;
        height: 1fr;
        border-right: vkey $foreground 20%;
        padding: 0 1 0 0;
    }
    PlannerPane.-wide #plan-form {
        width: 44;
    }
    PlannerPane .plan-field {
        height: auto;
    }
    PlannerPane .plan-field > Horizontal {
        height: auto;
    }
    PlannerPane .plan-field Label {
        width: 12;
        color: $text-muted;
    }
    PlannerPane .plan-field Input, PlannerPane .plan-field Select {
        width: 1fr;
    }
    PlannerPane .plan-field.-invalid Label {
        color: $error;
        text-style: bold;
    }
    PlannerPane .plan-field Input.-invalid {
        background: $error 25%;
    }
    PlannerPane .plan-field.-rl-only {
        display: none;
    }
    PlannerPane.-rl .plan-field.-rl-only {
        display: block;
    }
    PlannerPane .plan-field.-inference-only {
        display: none;
    }
    PlannerPane .plan-field.-lora-only {
        display: none;
    }
    PlannerPane.-lora .plan-field.-lora-only {
        display: block;
    }
    PlannerPane.-inference .plan-field.-inference-only {
        display: block;
    }
    PlannerPane.-inference .plan-field.-training-only {
        display: none;
    }
    PlannerPane.-inference .plan-field.-fine-tuning-only, PlannerPane.-rl .plan-field.-fine-tuning-only {
        display: none;
    }
    PlannerPane .plan-field.-fsdp-only, PlannerPane .plan-field.-full-only {
        display: none;
    }
    PlannerPane.-fsdp .plan-field.-fsdp-only, PlannerPane.-full .plan-field.-full-only {
        display: block;
    }
    PlannerPane .plan-error {
        display: none;
        color: $error;
        padding-left: 12;
        height: auto;
    }
    PlannerPane .plan-field.-invalid .plan-error {
        display: block;
    }
    PlannerPane #plan-model-matches {
        display: none;
        height: auto;
        max-height: 8;
        margin-left: 2;
        border: none;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    PlannerPane #plan-model-matches.-open {
        display: block;
    }
    PlannerPane #plan-side {
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

    @staticmethod
    def _default_plan(catalog: Catalog) -> Plan:
        preferred = ("qwen2.5-7b", "llama-3.1-8b")
        model = next((m for m in preferred if m in catalog.models), None)
        if model is None:
            model = next(iter(sorted(catalog.models)), "7B")
        return Plan(model=model)

    # -- layout ---------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        plan = self._base
        # Containers take no focus stop: tab goes from field to field, and p/c/m keep working.
        with VerticalScroll(id="plan-form", can_focus=False):
            for name, label in FORM_FIELDS:
                classes = f"plan-field {_ROW_CLASSES.get(name, '')}".rstrip()
                with Vertical(classes=classes, id=f"plan-row-{name.replace('_', '-')}"):
                    with Horizontal():
                        yield Label(label)
                        yield self._make_control(name, plan)
                    if name == "model":
                        yield OptionList(id="plan-model-matches")
                    yield Static(
                        "",
                        classes="plan-error",
                        id=f"plan-error-{name.replace('_', '-')}",
                        markup=False,  # errors quote what was typed
                    )
        # The headline (model, GiB per GPU, the recommended flavor) stays above the scrolling
        # results: visiting the flavor table scrolls them, and nothing there takes focus to
        # scroll them back.
        with Vertical(id="plan-side"):
            yield Static("", id="plan-problem", markup=False)
            yield Static("", id="plan-headline", markup=False)
            yield from self._compose_results()

    def _compose_results(self) -> ComposeResult:
        with VerticalScroll(id="plan-results", can_focus=False):
            with Vertical(id="plan-summary"):
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

    def _make_control(self, name: str, plan: Plan) -> Widget:
        cid = _control_id(name)
        if name == "model":
            # Catalog ids, then models in the local Hugging Face cache (read offline).
            suggestions = sorted(self.catalog.models) + cached_model_ids()
            return OrderedInput(
                plan.model,
                placeholder="↓ lists models; or config.json, 7B",
                suggester=SuggestFromList(suggestions, case_sensitive=False),
                compact=True,
                id=cid,
            )
        if name in _ENUM_FIELDS:
            return FormSelect(
                [(member.value, member) for member in _ENUM_FIELDS[name]],
                value=getattr(plan, name),
                allow_blank=False,
                compact=True,
                id=cid,
            )
        if name == "zero":
            return FormSelect(
                [(f"{stage}", stage) for stage in range(4)],
                value=plan.zero,
                allow_blank=False,
                compact=True,
                id=cid,
            )
        if name == "grad_ckpt":
            return Check("recompute", plan.grad_ckpt, compact=True, id=cid)
        if name == "loss":
            choices: list[tuple[str, Any]] = [(LOSS_DEFAULT, LOSS_DEFAULT)]
            choices += [(member.value, member) for member in Loss]
            return FormSelect(
                choices,
                value=LOSS_DEFAULT if plan.loss is None else plan.loss,
                allow_blank=False,
                compact=True,
                id=cid,
            )
        if name == "fsdp_offload":
            return Check("params, grads, optimizer", plan.fsdp_offload, compact=True, id=cid)
        if name == "rl_method":
            return FormSelect(
                [(member.value, member) for member in RL_TRAINABLE_METHODS],
                value=plan.rl_method,
                allow_blank=False,
                compact=True,
                id=cid,
            )
        if name == "rl_reference":
            return Check("frozen reference", plan.rl_reference, compact=True, id=cid)
        if name == "rl_reward_model":
            return Check("reward model", plan.rl_reward_model, compact=True, id=cid)
        if name == "vllm_memory_utilization":
            return OrderedInput(
                f"{plan.vllm_memory_utilization:g}",
                placeholder="0: no vLLM engine",
                compact=True,
                id=cid,
            )
        if name in _INTEGER_FIELDS:
            # Plain text: a restricted Input drops the characters it does not allow, so "4.5"
            # became 45; the form keeps what was typed and says what is wrong with it.
            return OrderedInput(str(getattr(plan, name)), compact=True, id=cid)
        if name == "tokens":
            return OrderedInput(
                "" if plan.tokens is None else str(plan.tokens),
                placeholder="to generate, e.g. 10M",
                compact=True,
                id=cid,
            )
        if name == "examples":
            return OrderedInput(
                "" if plan.examples is None else str(plan.examples),
                placeholder=_examples_placeholder(plan),
                compact=True,
                id=cid,
            )
        if name in ("epochs", "lora_dropout"):
            return OrderedInput(f"{getattr(plan, name):g}", compact=True, id=cid)
        if name == "mfu":
            return OrderedInput(
                "" if plan.mfu is None else f"{plan.mfu:g}",
                placeholder="catalog default",
                compact=True,
                id=cid,
            )
        raise AssertionError(f"no control for {name}")

    def on_mount(self) -> None:
        if not self.query(f"#{_control_id('method')}"):
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

    # -- reading the form ------------------------------------------------------------------------

    def read_form(self) -> tuple[dict[str, Any], dict[str, str]]:
        """The plan fields the form holds, and the reason for every field it cannot use."""
        values: dict[str, Any] = {}
        errors: dict[str, str] = {}
        for name in _FIELD_NAMES:
            control = self.query_one(f"#{_control_id(name)}")
            if isinstance(control, (Select, Checkbox)):
                values[name] = None if control.value == LOSS_DEFAULT else control.value
            elif isinstance(control, Input):
                try:
                    values[name] = self._parse_text(name, control.value)
                except ValueError as exc:
                    errors[name] = str(exc)
        return values, errors

    @staticmethod
    def _parse_text(name: str, text: str) -> Any:
        text = text.strip()
        if name == "model":
            if not text:
                raise ValueError("choose a model: catalog id, config.json path or a count like 7B")
            return text
        if name in _INTEGER_FIELDS:
            if not text:
                raise ValueError("required: a whole number")
            return parse_whole_number(text)  # the command line's words
        if name in ("examples", "tokens"):
            return parse_count(text) if text else None
        if name in _NUMBER_FIELDS:
            if not text:
                if name == "mfu":
                    return None
                raise ValueError("required: a number such as 1 or 0.5")
            return parse_number(text)
        raise AssertionError(name)

    def _note_choices(self, plan: Plan) -> None:
        """Put ``plan`` (the starting plan, a loaded one) in the framework's rows: a value that
        differs from what its framework would choose counts as the user's choice."""
        try:
            resolved = with_framework_defaults(plan, self.catalog.framework_for(plan))
        except ValidationError:
            resolved = None  # the framework's defaults do not fit this plan: keep all it says
        self._chosen_defaults = {
            name
            for name in FRAMEWORK_PLAN_FIELDS
            if resolved is None or getattr(plan, name) != getattr(resolved, name)
        }
        self._shown_defaults = {name: getattr(plan, name) for name in FRAMEWORK_PLAN_FIELDS}

    def _show_framework_defaults(self, plan: Plan) -> None:
        """Show the framework's choices in the rows the user left alone (without a recompute)."""
        for name in FRAMEWORK_PLAN_FIELDS:
            if name in self._chosen_defaults:
                continue
            value = getattr(plan, name)
            self._shown_defaults[name] = value
            control = self.query_one(f"#{_control_id(name)}")
            if isinstance(control, (Select, Checkbox)) and control.value != value:
                with control.prevent(Select.Changed, Checkbox.Changed):
                    control.value = value

    def _build_plan(self) -> tuple[Plan | None, dict[str, str]]:
        values, errors = self.read_form()
        for name in FRAMEWORK_PLAN_FIELDS:
            if values.get(name) != self._shown_defaults.get(name):
                self._chosen_defaults.add(name)  # edited: the user's choice wins from now on
        data = self._base.model_dump()
        data.update({k: v for k, v in values.items() if k not in errors})
        method = Method(data["method"])
        if method is not Method.INFERENCE:
            # the quantize row is hidden for training: what it holds does not apply
            data["quant"] = Quant.NONE
        if not _trains_adapters(Method(data["method"]), Method(data["rl_method"])):
            # the LoRA rows are hidden: a half-typed rank there must not block a full fine-tune
            for name in _LORA_FIELDS:
                errors.pop(name, None)
                data[name] = getattr(self._base, name)
        if method is Method.INFERENCE or method in (Method.PPO, Method.GRPO):
            # the FSDP rows are hidden there (FSDP is modelled for fine-tuning)
            data["fsdp"] = FsdpMode.NONE
        if FsdpMode(data["fsdp"]) is FsdpMode.NONE:
            data["fsdp_offload"] = False
        if method is not Method.FULL:
            # the tensor/pipeline rows are for full training only (Megatron-LM)
            data["tp"] = data["pp"] = 1
        if method is Method.INFERENCE:
            # The training rows are hidden: a half-typed value there must not block the plan.
            # Examples stay in the plan (the warnings say they do nothing, as the command line does).
            for name in _TRAINING_FIELDS:
                if errors.pop(name, None) is not None:
                    data[name] = getattr(self._base, name)
        else:
            # The tokens row is for inference: a training plan keeps the count it was given
            # (``--tokens``), which yields to examples typed here.
            errors.pop("tokens", None)
            data["tokens"] = self._base.tokens
            if values.get("examples") is not None:
                data["tokens"] = None
        # Fields the plan left unset and the form did not change stay unset, as on the command
        # line: defaults that depend on other fields follow the plan (GRPO counts a reward model
        # only when one is asked for: estimator/rl.py ``_rl_counts_reward_model``).
        given = self._base.model_fields_set
        data = {k: v for k, v in data.items() if k in given or v != getattr(self._base, k)}
        try:
            plan = Plan.model_validate(data)
        except ValidationError as exc:
            for problem in exc.errors():
                loc = problem["loc"]
                message = _friendly(problem)
                field = str(loc[0]) if loc else _field_for_message(message)
                if field not in _FIELD_NAMES:
                    field = ""
                errors.setdefault(field, message)
            return None, errors
        if errors:
            return None, errors
        try:
            # The framework's precision, checkpointing and optimizer where the user chose none,
            # by the function ``hwdash plan`` uses (its savers resolve in the estimator).
            plan = with_framework_defaults(
                plan, self.catalog.framework_for(plan), self._chosen_defaults
            )
        except ValidationError as exc:
            errors["framework"] = _friendly(exc.errors()[0])
            return None, errors
        return plan, errors

    # -- recomputing -----------------------------------------------------------------------------

    def request_recompute(self) -> None:
        """Recompute once the current burst of changes has been handled."""
        if not self._recompute_pending:
            self._recompute_pending = True
            self.call_later(self._recompute)

    def _recompute(self) -> None:
        self._recompute_pending = False
        method = self.query_one(f"#{_control_id('method')}", Select).value
        self.set_class(method in (Method.PPO, Method.GRPO), "-rl")
        self.set_class(method is Method.INFERENCE, "-inference")
        rl_method = self.query_one(f"#{_control_id('rl_method')}", Select).value
        self.set_class(
            isinstance(method, Method)
            and _trains_adapters(method, rl_method if isinstance(rl_method, Method) else None),
            "-lora",
        )
        self.set_class(method is Method.FULL, "-full")
        fsdp = self.query_one(f"#{_control_id('fsdp')}", Select).value
        fine_tuning = method not in (Method.INFERENCE, Method.PPO, Method.GRPO)
        self.set_class(fine_tuning and fsdp not in (FsdpMode.NONE, Select.BLANK), "-fsdp")
        plan, errors = self._build_plan()
        report: PlanReport | None = None
        if plan is not None:
            self._show_framework_defaults(plan)
            try:
                resolve_model(plan.model, self.catalog)
            except (UsageError, CatalogError, ValueError) as exc:
                errors["model"] = _plain(exc, "--model")
            else:
                try:
                    report = evaluate_plan(plan, self.catalog)
                except UsageError as exc:
                    errors[_field_for_flag(exc.flag)] = _plain(exc, exc.flag)
                except (CatalogError, ValueError) as exc:
                    errors[""] = str(exc)
                except Exception as exc:  # an estimator bug must not take the dashboard down
                    errors[""] = f"the estimator failed on this plan ({type(exc).__name__}: {exc})"
        self.errors = errors
        with self.app.batch_update():
            self._show_errors(errors)
            if report is not None:
                self.report = report
                self._show_report(report, _form_warnings(report.plan))
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

    def _show_errors(self, errors: dict[str, str]) -> None:
        if errors == self._shown_errors:
            return
        self._shown_errors = dict(errors)
        for name in _FIELD_NAMES:
            suffix = name.replace("_", "-")
            invalid = name in errors
            self.query_one(f"#plan-row-{suffix}").set_class(invalid, "-invalid")
            self.query_one(f"#{_control_id(name)}").set_class(invalid, "-invalid")
            self.query_one(f"#plan-error-{suffix}", Static).update(errors.get(name, ""))
        problem = self.query_one("#plan-problem", Static)
        general = errors.get("")
        if errors:
            fields = [label for name, label in FORM_FIELDS if name in errors]
            text = general or f"check {', '.join(fields)}"
            problem.update(Text(f"✗ {text}; showing the last good estimate", style="bold"))
        else:
            problem.update("")

    def _show_report(self, report: PlanReport, notes: Sequence[str] = ()) -> None:
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
        best = next((f for f in report.flavors if f.flavor.id == report.recommended), None)
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
        self.query_one("#plan-headline", Static).update(headline)
        self.query_one(MemoryBreakdownView).estimate = estimate
        warnings = list(dict.fromkeys((*notes, *estimate.warnings, *report.warnings)))
        warning_view = self.query_one("#plan-warnings", Static)
        warning_view.update("\n".join(f"⚠ {form_words(w)}" for w in warnings))
        warning_view.display = bool(warnings)
        details = Text("where the bytes go (per GPU)\n", style="bold")
        for label, value in estimate.details:
            details.append(f"  {label:<44.44} {format_bytes(value):>10}\n")
        if best is not None and best.tokens_per_second:
            details.append(f"\n{best.flavor.id}: {best.tokens_per_second:,.0f} tokens/s")
        self.query_one("#plan-details", Static).update(details if estimate.details else "")
        self.query_one(FlavorTable).show_report(report)

    # -- events ----------------------------------------------------------------------------------

    @on(Input.Changed)
    def _input_changed(self, event: Input.Changed) -> None:
        if event.input.id == _control_id("model"):
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
        self.notify("\n".join(lines), title=flavor.name, timeout=8, markup=False)

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

    def on_key(self, event: Key) -> None:
        # Down from the model field walks into its list: the matches, or every catalog model.
        if event.key != "down":
            return
        model_input = self.query_one(f"#{_control_id('model')}", Input)
        if not model_input.has_focus:
            return
        matches = self.query_one("#plan-model-matches", OptionList)
        if not matches.has_class("-open"):
            self._update_model_matches(model_input.value, browse=True)
        event.stop()
        event.prevent_default()
        matches.focus()
        current = model_input.value.strip().lower()
        ids = [matches.get_option_at_index(i).id for i in range(matches.option_count)]
        matches.highlighted = ids.index(current) if current in ids else 0

    def on_descendant_blur(self, event: DescendantBlur) -> None:
        # Focus may leave the pane altogether (escape to the tab bar): close the list then too.
        if event.widget.id in (_control_id("model"), "plan-model-matches"):
            self.call_after_refresh(self._close_matches_unless_focused)

    def _close_matches_unless_focused(self) -> None:
        focused = self.app.focused
        if focused is None or focused.id not in (_control_id("model"), "plan-model-matches"):
            self.query_one("#plan-model-matches", OptionList).remove_class("-open")

    def on_descendant_focus(self, event: DescendantFocus) -> None:
        if event.widget.id not in (_control_id("model"), "plan-model-matches"):
            self.query_one("#plan-model-matches", OptionList).remove_class("-open")

    def _choose_model(self, model_id: str) -> None:
        model_input = self.query_one(f"#{_control_id('model')}", Input)
        model_input.value = model_id
        model_input.cursor_position = len(model_id)
        self.query_one("#plan-model-matches", OptionList).remove_class("-open")
        model_input.focus()

    def model_matches(self, text: str) -> list[str]:
        """Catalog model ids matching ``text`` (id, name or Hugging Face id), best first."""
        key = text.strip().lower()
        if not key:
            return []
        starts: list[str] = []
        contains: list[str] = []
        for model in sorted(self.catalog.models.values(), key=lambda m: m.id):
            fields = (model.id, model.name.lower(), model.hf_id.lower())
            if any(f.startswith(key) for f in fields):
                starts.append(model.id)
            elif any(key in f for f in fields):
                contains.append(model.id)
        return (starts + contains)[:MODEL_MATCHES]

    def _update_model_matches(self, text: str, *, browse: bool = False) -> None:
        matches = self.query_one("#plan-model-matches", OptionList)
        model_input = self.query_one(f"#{_control_id('model')}", Input)
        exact = text.strip().lower() in self.catalog.models
        found = sorted(self.catalog.models) if browse else self.model_matches(text)
        matches.clear_options()
        for model_id in found:
            name = self.catalog.models[model_id].name
            prompt = Text(model_id)
            prompt.append(f"  {name}", style="dim")
            matches.add_option(Option(prompt, id=model_id))
        is_open = bool(found) and (browse or not exact) and model_input.has_focus
        matches.set_class(is_open, "-open")

    # -- actions ---------------------------------------------------------------------------------

    def action_sort(self, sort_by: SortKey) -> None:
        """Sort the flavor table (again: reverse)."""
        self.query_one(FlavorTable).sort_on(sort_by)

    def action_fit_options(self) -> None:
        """Options that make the plan fit the selected flavor (else the recommended one, else
        the cheapest that comes close): enter applies one to the form."""
        report = self.report
        if report is None or self.errors:
            self.notify(
                "Nothing to fit: fix the marked fields first.", severity="warning", timeout=4
            )
            return
        fit = self._flavor_to_fit(report)
        if fit is None:
            self.notify("No GPU flavor to fit.", severity="warning", timeout=4, markup=False)
            return
        flavor = fit.flavor
        search = find_fit_options(report.plan, report.model, self.catalog, flavor.id, [flavor])
        label = flavor.id + (" (this machine)" if flavor.id == LOCAL_FLAVOR_ID else "")

        def chosen(option: FitOption | None) -> None:
            if option is None:
                return
            self.load_plan(option.plan)
            applied = "Applied: " + "; ".join(option.words)
            self.notify(applied, title="Make it fit", timeout=5, markup=False)

        self.app.push_screen(FitOptionsDialog(search, label), chosen)

    def action_export(self) -> None:
        """Choose a format and a file (default: the exports folder in hwdash's data folder); a
        file that exists is replaced only after a yes."""
        report = self.report
        if report is None or self.errors:
            self.notify(
                "Nothing to export: fix the marked fields first.", severity="warning", timeout=4
            )
            return
        folder = default_exports_folder()
        stem = re.sub(r"[^A-Za-z0-9._-]+", "-", report.model.id).strip("-") or "plan"
        paths = {
            kind: folder / f"hwdash-{stem}-{kind}.{FILE_SUFFIXES[kind]}" for kind, _ in FORMATS
        }

        def chosen(result: tuple[str, Path] | None) -> None:
            if result is None:
                return
            kind, path = result
            try:
                text, notes = export_text(kind, report, self.catalog)
            except ValueError as exc:
                self.notify(str(exc), title="Export", severity="error", timeout=8, markup=False)
                return
            if not path.exists():
                self._write_export(path, text, notes)
                return

            def answered(replace_it: bool | None) -> None:
                if replace_it:
                    self._write_export(path, text, notes)
                else:
                    message = f"not written: {path} is as it was"
                    self.notify(message, title="Export", timeout=5, markup=False)

            question = f"Replace the file that exists?\n{path}"
            self.app.push_screen(ConfirmDialog(question), answered)

        self.app.push_screen(ExportDialog(paths), chosen)

    def _write_export(self, path: Path, text: str, notes: Sequence[str]) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        except OSError as exc:
            message = f"cannot write {path}: {exc.strerror or exc}"
            self.notify(message, title="Export", severity="error", timeout=8, markup=False)
            return
        self.exported = path
        message = "\n".join([f"wrote {path}", *notes])
        self.notify(message, title="Export", timeout=8, markup=False)

    def _flavor_to_fit(self, report: PlanReport) -> FlavorFit | None:
        table = self.query_one(FlavorTable)
        if 0 <= table.cursor_row < len(table.shown) and table.has_focus:
            return table.shown[table.cursor_row]
        by_id = {fit.flavor.id: fit for fit in report.flavors}
        if report.recommended in by_id:
            return by_id[report.recommended]
        return closest_flavor(report)

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

    def action_next_provider(self) -> None:
        """Cycle the provider filter."""
        select: Select[str] = self.query_one("#plan-provider", Select)
        keys = list(PROVIDER_LABELS)
        current = select.value if isinstance(select.value, str) else "all"
        select.value = keys[(keys.index(current) + 1) % len(keys)]

    def action_save_current(self, name: str | None = None) -> None:
        """Save the current plan: under ``name``, or after asking (default: model and method)."""
        report = self.report
        if report is None or self.errors:
            self.notify(
                "Nothing to save: fix the marked fields first.", severity="warning", timeout=4
            )
            return
        if name is not None:
            self._save(name, report)
            return

        def describe(text: str) -> str:
            try:
                clean_name(text)
            except PlanStoreError as exc:
                raise ValueError(str(exc)) from None  # the name itself is unusable
            try:
                final = self.store.unique_name(text)
            except PlanStoreError as exc:
                # A broken plans file: the dialog says so, and saving moves it aside.
                return str(exc)
            if final != " ".join(text.split()):
                return f"that name is taken: will save as '{final}'"
            return f"saves to {self.store.path}"

        def saved(result: str | None) -> None:
            if result is not None:
                self._save(result, report)

        default = report.plan.default_name(report.model.name)
        self.app.push_screen(
            NameDialog("Save plan as", default, describe=describe, ok_label="Save"), saved
        )

    def save_current(self, name: str | None = None) -> None:
        """Public alias of the ``s`` action (see :meth:`action_save_current`)."""
        self.action_save_current(name)

    def _save(self, name: str, report: PlanReport) -> None:
        summary = PlanSummary.from_report(report)
        try:
            saved = self.store.save(name, report.plan, summary=summary)
        except PlanStoreError as exc:
            self.notify(str(exc), title="Plans file", severity="error", timeout=10, markup=False)
            if exc.backup is None:
                return
            # The broken file was moved aside; the store is empty now, so saving again works.
            try:
                saved = self.store.save(name, report.plan, summary=summary)
            except PlanStoreError as again:
                self.notify(
                    str(again), title="Plans file", severity="error", timeout=10, markup=False
                )
                return
        self.notify(f"Saved plan '{saved.name}'", title="Planner", timeout=4, markup=False)
        self.post_message(self.PlanSaved(saved))
        self._chosen_name = saved.name
        self.request_recompute()  # the monitor now draws the plan under its saved name

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

    # -- loading ---------------------------------------------------------------------------------

    def load_plan(self, plan: Plan, name: str | None = None) -> None:
        """Fill the form from ``plan`` (fields the form does not show are kept) and recompute.
        ``name``: the saved plan's name (the monitor draws the plan under it)."""
        self._base = plan
        self._note_choices(plan)
        self._chosen_name = name if name is not None else f"{plan.model} {plan.method.value}"
        if not self.query(f"#{_control_id('model')}"):
            # Called before the form is on screen (the pane is mounted after the first frame):
            # the form is filled from this plan once it is.
            self._load_pending = True
            return
        self._load_pending = False
        for name in _FIELD_NAMES:
            control = self.query_one(f"#{_control_id(name)}")
            value = getattr(plan, name)
            if isinstance(control, Select):
                control.value = LOSS_DEFAULT if name == "loss" and value is None else value
            elif isinstance(control, Checkbox):
                control.value = bool(value)
            elif isinstance(control, Input):
                if value is None:
                    control.value = ""
                elif isinstance(value, float):
                    control.value = f"{value:g}"
                else:
                    control.value = str(value)
        examples = self.query_one(f"#{_control_id('examples')}", Input)
        examples.placeholder = _examples_placeholder(plan)
        self.query_one("#plan-model-matches", OptionList).remove_class("-open")
        self.request_recompute()


#: Command-line flags the estimator's warnings mention, and the form field each one is here.
_FLAG_WORDS = {
    "--attn": "attention",
    "--batch": "micro-batch",
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


def _field_for_flag(flag: str | None) -> str:
    """The form field an estimator error's flag is about, or ``""`` (the whole form)."""
    if not flag:
        return ""
    field = _FLAG_FIELDS.get(flag, flag.lstrip("-").replace("-", "_"))
    return field if field in _FIELD_NAMES else ""


_FLAG_RE = re.compile(r"--[a-z][a-z-]*")


def _trains_adapters(method: Method, rl_method: Method | None) -> bool:
    """Whether a plan trains LoRA-style adapters: LoRA, QLoRA, 8-bit LoRA, DoRA, or an RL plan
    whose policy is one of them."""
    if method in (Method.PPO, Method.GRPO):
        return rl_method in LORA_STYLE_METHODS
    return method in LORA_STYLE_METHODS


def _form_warnings(plan: Plan) -> list[str]:
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


def _examples_placeholder(plan: Plan) -> str:
    """The empty examples field names the plan's token count when it carries one."""
    if plan.tokens is not None and plan.examples is None:
        return f"{format_count(plan.tokens)} tokens (from the plan)"
    return EXAMPLES_PLACEHOLDER


def _friendly(problem: Any) -> str:
    """A pydantic error as a short phrase for the field's error line (the CLI's words)."""
    return validation_phrase(problem)


def _plain(exc: Exception, flag: str | None) -> str:
    """An error message without the ``--flag:`` prefix (the field already says which one)."""
    message = str(exc)
    if flag and message.startswith(f"{flag}: "):
        return message[len(flag) + 2 :]
    return message
