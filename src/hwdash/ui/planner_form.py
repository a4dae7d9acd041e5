"""The planner's form: its rows (built from the plan field registry by
:mod:`hwdash.ui.planner_controls`), reading them into a :class:`Plan`, marking the fields it cannot use, and the model search list under the
model row.

Part of :class:`~hwdash.ui.planner_pane.PlannerPane` (a mixin, see :mod:`hwdash.ui.planner_base`).
May import the core, Textual, the planner widgets, :mod:`hwdash.ui.planner_base` and
:mod:`hwdash.ui.planner_controls`.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.events import DescendantBlur, DescendantFocus, Key
from textual.widgets import Checkbox, Input, Label, OptionList, Select, Static
from textual.widgets.option_list import Option

from hwdash.core.estimator.savers import FRAMEWORK_PLAN_FIELDS, with_framework_defaults
from hwdash.core.numbers import validation_phrase
from hwdash.core.plan import LORA_STYLE_METHODS, Engine, FsdpMode, KvDtype, Method, Plan, Quant
from hwdash.ui.planner_base import PlannerParts
from hwdash.ui.planner_controls import (
    EXAMPLES_PLACEHOLDER,
    FIELD_NAMES,
    FORM_FIELDS,
    FORM_ROWS,
    LOSS_DEFAULT,
    control_id,
    control_value,
    examples_placeholder,
    field_text,
    make_control,
    parse_text,
    rows_shown_by,
    select_value,
)

__all__ = [
    "EXAMPLES_PLACEHOLDER",
    "FIELD_NAMES",
    "FORM_FIELDS",
    "LOSS_DEFAULT",
    "PlannerForm",
    "control_id",
    "examples_placeholder",
    "make_control",
    "parse_text",
]

#: Fields of the adapters: hidden unless the plan trains LoRA-style adapters (directly, or as the
#: policy of an RL plan); what they hold then does not apply and never blocks the plan.
_LORA_FIELDS = rows_shown_by("-lora-only")
#: Rows hidden for inference (what they set only training reads: the command line warns about them).
_TRAINING_FIELDS = rows_shown_by("-training-only")
#: The serving engine's settings: shown for an inference plan with ``--engine vllm|sglang``.
_SERVING_ONLY = tuple(name for name in rows_shown_by("-serving-only") if name != "kv_dtype")

#: How many model matches the search list shows.
MODEL_MATCHES = 8

#: The form's half of the pane's CSS (rows, error lines, the model list); the results' half
#: follows it (:data:`hwdash.ui.planner_results.RESULTS_CSS`).
FORM_CSS = """
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
    PlannerPane .plan-field.-serving-only {
        display: none;
    }
    PlannerPane.-inference.-serving .plan-field.-serving-only {
        display: block;
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
"""

_LEADING_FLAG = re.compile(
    r"--(fsdp-offload|fsdp|tp|pp|cp|sp-ulysses|ep|gpus|loss|framework|engine|"
    r"gpu-memory-utilization|max-model-len|max-num-seqs|max-num-batched-tokens|kv-dtype)\b"
)


def field_for_message(message: str) -> str | None:
    """The form field a plan-level error is about, if its message names one (``offload``, ``zero``)."""
    leading = _LEADING_FLAG.match(message)
    if leading is not None:  # FSDP, Megatron and serving messages start with their flag
        return leading.group(1).replace("-", "_")
    lowered = message.lower()
    if lowered.startswith("quant "):
        return "quant"
    for name in ("offload", "zero", "method", "rl_method"):
        if name in lowered:
            return name if name in FIELD_NAMES else None
    return None


def trains_adapters(method: Method, rl_method: Method | None) -> bool:
    """Whether a plan trains LoRA-style adapters: LoRA, QLoRA, 8-bit LoRA, DoRA, or an RL plan
    whose policy is one of them."""
    if method in (Method.PPO, Method.GRPO):
        return rl_method in LORA_STYLE_METHODS
    return method in LORA_STYLE_METHODS


def friendly(problem: Any) -> str:
    """A pydantic error as a short phrase for the field's error line (the CLI's words)."""
    return validation_phrase(problem)


def _neutral(
    data: dict[str, Any], errors: dict[str, str], names: tuple[str, ...], value: Any
) -> None:
    """Hidden rows: ``names`` hold ``value`` in ``data``, whatever their rows hold or fail on."""
    for name in names:
        errors.pop(name, None)
        data[name] = value


def _drop_hidden_parallelism(data: dict[str, Any], method: Method, errors: dict[str, str]) -> None:
    """The tensor, pipeline and expert rows are for full training only (Megatron-LM); the
    context and Ulysses rows for fine-tuning (not RL or inference): hidden, they split nothing."""
    if method is not Method.FULL:
        _neutral(data, errors, ("tp", "pp", "ep"), 1)
    if method is Method.INFERENCE or method in (Method.PPO, Method.GRPO):
        _neutral(data, errors, ("cp", "sp_ulysses", "ep"), 1)


def _drop_hidden_serving(data: dict[str, Any], method: Method, errors: dict[str, str]) -> None:
    """The engine row is for inference; the engine's settings for a serving plan (vLLM,
    SGLang): hidden, they are unset (the Plan refuses them without a serving engine)."""
    if method is not Method.INFERENCE:
        _neutral(data, errors, ("engine",), Engine.HF)
    if method is not Method.INFERENCE or data.get("engine", Engine.HF) is Engine.HF:
        _neutral(data, errors, _SERVING_ONLY, None)
        data["kv_dtype"] = KvDtype.AUTO


class PlannerForm(PlannerParts):
    """The form half of the planner pane: its rows, reading and filling them, its error marks."""

    def _compose_form(self) -> ComposeResult:
        plan = self._base
        # Containers take no focus stop: tab goes from field to field, and p/c/m keep working.
        with VerticalScroll(id="plan-form", can_focus=False):
            for name, label in FORM_FIELDS:
                classes = f"plan-field {FORM_ROWS[name].shown or ''}".rstrip()
                with Vertical(classes=classes, id=f"plan-row-{name.replace('_', '-')}"):
                    with Horizontal():
                        yield Label(label)
                        yield make_control(name, plan, self.catalog)
                    if name == "model":
                        yield OptionList(id="plan-model-matches")
                    yield Static(
                        "",
                        classes="plan-error",
                        id=f"plan-error-{name.replace('_', '-')}",
                        markup=False,  # errors quote what was typed
                    )

    # -- reading the form ------------------------------------------------------------------------

    def read_form(self) -> tuple[dict[str, Any], dict[str, str]]:
        """The plan fields the form holds, and the reason for every field it cannot use."""
        values: dict[str, Any] = {}
        errors: dict[str, str] = {}
        for name in FIELD_NAMES:
            control = self.query_one(f"#{control_id(name)}")
            if isinstance(control, (Select, Checkbox)):
                values[name] = control_value(name, control.value)
            elif isinstance(control, Input):
                try:
                    values[name] = parse_text(name, control.value)
                except ValueError as exc:
                    errors[name] = str(exc)
        return values, errors

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
            control = self.query_one(f"#{control_id(name)}")
            if isinstance(control, (Select, Checkbox)) and control.value != value:
                with control.prevent(Select.Changed, Checkbox.Changed):
                    control.value = value

    def _build_plan(self) -> tuple[Plan | None, dict[str, str]]:
        """The plan the form holds (None while it has errors), and the reason for each error."""
        values, errors = self.read_form()
        for name in FRAMEWORK_PLAN_FIELDS:
            if values.get(name) != self._shown_defaults.get(name):
                self._chosen_defaults.add(name)  # edited: the user's choice wins from now on
        data = self._base.model_dump()
        data.update({k: v for k, v in values.items() if k not in errors})
        self._drop_hidden_rows(data, values, errors)
        # Fields the plan left unset and the form did not change stay unset, as on the command
        # line: defaults that depend on other fields follow the plan (GRPO counts a reward model
        # only when one is asked for: estimator/rl.py ``_rl_counts_reward_model``).
        given = self._base.model_fields_set
        data = {k: v for k, v in data.items() if k in given or v != getattr(self._base, k)}
        return self._validated(data, errors)

    def _drop_hidden_rows(
        self, data: dict[str, Any], values: dict[str, Any], errors: dict[str, str]
    ) -> None:
        """What the rows hidden for the plan's method hold does not apply: put the starting plan's
        value (or the field's neutral one) in ``data`` and forget their errors."""
        method = Method(data["method"])
        if method is not Method.INFERENCE:
            # the quantize row is hidden for training: what it holds does not apply
            data["quant"] = Quant.NONE
        if not trains_adapters(Method(data["method"]), Method(data["rl_method"])):
            # the LoRA rows are hidden: a half-typed rank there must not block a full fine-tune
            for name in _LORA_FIELDS:
                errors.pop(name, None)
                data[name] = getattr(self._base, name)
        if method is Method.INFERENCE or method in (Method.PPO, Method.GRPO):
            # the FSDP rows are hidden there (FSDP is modelled for fine-tuning)
            data["fsdp"] = FsdpMode.NONE
        if FsdpMode(data["fsdp"]) is FsdpMode.NONE:
            data["fsdp_offload"] = False
        _drop_hidden_parallelism(data, method, errors)
        _drop_hidden_serving(data, method, errors)
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

    def _validated(
        self, data: dict[str, Any], errors: dict[str, str]
    ) -> tuple[Plan | None, dict[str, str]]:
        """``data`` as a Plan with its framework's defaults, or None and each field's reason."""
        try:
            plan = Plan.model_validate(data)
        except ValidationError as exc:
            for problem in exc.errors():
                loc = problem["loc"]
                message = friendly(problem)
                field = str(loc[0]) if loc else field_for_message(message)
                if field not in FIELD_NAMES:
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
            errors["framework"] = friendly(exc.errors()[0])
            return None, errors
        return plan, errors

    def _show_rows_for_method(self) -> None:
        """Switch the pane's method classes, which show the rows that apply to the plan."""
        method = self.query_one(f"#{control_id('method')}", Select).value
        self.set_class(method in (Method.PPO, Method.GRPO), "-rl")
        self.set_class(method is Method.INFERENCE, "-inference")
        rl_method = self.query_one(f"#{control_id('rl_method')}", Select).value
        self.set_class(
            isinstance(method, Method)
            and trains_adapters(method, rl_method if isinstance(rl_method, Method) else None),
            "-lora",
        )
        self.set_class(method is Method.FULL, "-full")
        engine = self.query_one(f"#{control_id('engine')}", Select).value
        self.set_class(engine in (Engine.VLLM, Engine.SGLANG), "-serving")
        fsdp = self.query_one(f"#{control_id('fsdp')}", Select).value
        fine_tuning = method not in (Method.INFERENCE, Method.PPO, Method.GRPO)
        self.set_class(fine_tuning and fsdp not in (FsdpMode.NONE, Select.BLANK), "-fsdp")

    def _show_errors(self, errors: dict[str, str]) -> None:
        """Mark the rows ``errors`` names, with the reason under each, and say so above the results."""
        if errors == self._shown_errors:
            return
        self._shown_errors = dict(errors)
        for name in FIELD_NAMES:
            suffix = name.replace("_", "-")
            invalid = name in errors
            self.query_one(f"#plan-row-{suffix}").set_class(invalid, "-invalid")
            self.query_one(f"#{control_id(name)}").set_class(invalid, "-invalid")
            self.query_one(f"#plan-error-{suffix}", Static).update(errors.get(name, ""))
        problem = self.query_one("#plan-problem", Static)
        general = errors.get("")
        if errors:
            fields = [label for name, label in FORM_FIELDS if name in errors]
            text = general or f"check {', '.join(fields)}"
            problem.update(Text(f"✗ {text}; showing the last good estimate", style="bold"))
        else:
            problem.update("")

    # -- loading ---------------------------------------------------------------------------------

    def load_plan(self, plan: Plan, name: str | None = None) -> None:
        """Fill the form from ``plan`` (fields the form does not show are kept) and recompute.
        ``name``: the saved plan's name (the monitor draws the plan under it)."""
        self._base = plan
        self._note_choices(plan)
        self._chosen_name = name if name is not None else f"{plan.model} {plan.method.value}"
        if not self.query(f"#{control_id('model')}"):
            # Called before the form is on screen (the pane is mounted after the first frame):
            # the form is filled from this plan once it is.
            self._load_pending = True
            return
        self._load_pending = False
        for name in FIELD_NAMES:
            control = self.query_one(f"#{control_id(name)}")
            value = getattr(plan, name)
            if isinstance(control, Select):
                control.value = select_value(name, value)
            elif isinstance(control, Checkbox):
                control.value = bool(value)
            elif isinstance(control, Input):
                control.value = field_text(value)
        examples = self.query_one(f"#{control_id('examples')}", Input)
        examples.placeholder = examples_placeholder(plan)
        self.query_one("#plan-model-matches", OptionList).remove_class("-open")
        self.request_recompute()

    # -- the model search list -------------------------------------------------------------------

    def on_key(self, event: Key) -> None:
        # Down from the model field walks into its list: the matches, or every catalog model.
        if event.key != "down":
            return
        model_input = self.query_one(f"#{control_id('model')}", Input)
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
        if event.widget.id in (control_id("model"), "plan-model-matches"):
            self.call_after_refresh(self._close_matches_unless_focused)

    def _close_matches_unless_focused(self) -> None:
        focused = self.app.focused
        if focused is None or focused.id not in (control_id("model"), "plan-model-matches"):
            self.query_one("#plan-model-matches", OptionList).remove_class("-open")

    def on_descendant_focus(self, event: DescendantFocus) -> None:
        if event.widget.id not in (control_id("model"), "plan-model-matches"):
            self.query_one("#plan-model-matches", OptionList).remove_class("-open")

    def _choose_model(self, model_id: str) -> None:
        model_input = self.query_one(f"#{control_id('model')}", Input)
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
        model_input = self.query_one(f"#{control_id('model')}", Input)
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
