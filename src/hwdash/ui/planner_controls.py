"""The planner form's rows and their controls, built from the plan field registry
(:func:`hwdash.core.plan_fields.form_fields`): each row's label, control, the class that shows it
only where it applies, its choices and placeholder come from the field's
:class:`~hwdash.core.plan_fields.FormRow`; this module turns them into Textual controls and reads a
typed control back as the Plan field's value.

What stays here is what only the form has: the model row's search list and suggestions (the
catalog and the local Hugging Face cache), the examples row's placeholder when the plan carries a
token count, and the words of a typed row's errors.

May import the core, Textual and the planner widgets.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import TypeAdapter
from textual.suggester import SuggestFromList
from textual.widget import Widget

from hwdash.core.catalog import Catalog
from hwdash.core.models.hf_cache import cached_model_ids
from hwdash.core.numbers import parse_number, parse_whole_number
from hwdash.core.plan import Plan
from hwdash.core.plan_fields import BY_NAME, FormRow, form_fields
from hwdash.core.units import format_count, parse_count
from hwdash.ui.widgets.check import Check
from hwdash.ui.widgets.form_select import FormSelect
from hwdash.ui.widgets.ordered_input import OrderedInput

#: The form's rows in display order: Plan field -> its registry row.
FORM_ROWS: dict[str, FormRow] = {field.name: row for field, row in form_fields()}
#: Form fields in display order: (Plan field, label).
FORM_FIELDS: tuple[tuple[str, str], ...] = tuple(
    (name, row.label) for name, row in FORM_ROWS.items()
)
FIELD_NAMES = tuple(FORM_ROWS)


def rows_shown_by(row_class: str) -> tuple[str, ...]:
    """The form fields whose rows carry ``row_class`` (``-lora-only``...), in display order."""
    return tuple(name for name, row in FORM_ROWS.items() if row.shown == row_class)


#: The loss row's first choice: leave it to the framework (``Plan.loss`` None).
LOSS_DEFAULT: str = FORM_ROWS["loss"].unset or ""
#: What the empty examples field says.
EXAMPLES_PLACEHOLDER: str = FORM_ROWS["examples"].placeholder or ""


def control_id(field: str) -> str:
    """The id of the control that edits ``field`` (``plan-lora-r``)."""
    return f"plan-{field.replace('_', '-')}"


def examples_placeholder(plan: Plan) -> str:
    """The empty examples field names the plan's token count when it carries one."""
    if plan.tokens is not None and plan.examples is None:
        return f"{format_count(plan.tokens)} tokens (from the plan)"
    return EXAMPLES_PLACEHOLDER


def field_text(value: Any) -> str:
    """A Plan field's value as a typed row shows it: empty for unset, ``0.5`` not ``0.50``."""
    if value is None:
        return ""
    return f"{value:g}" if isinstance(value, float) else str(value)


@cache
def select_choices(name: str) -> tuple[tuple[str, Any], ...]:
    """A ``select`` row's (label, value) choices: its unset choice first where it has one, then
    the registry's ``choices`` as the Plan field's values (enum members), or, for a whole number
    without them, every value within the Plan field's bounds (ZeRO 0-3)."""
    field, row = BY_NAME[name], FORM_ROWS[name]
    choices: list[tuple[str, Any]] = [] if row.unset is None else [(row.unset, row.unset)]
    if field.choices is not None:
        adapter: TypeAdapter[Any] = TypeAdapter(Plan.model_fields[name].annotation or str)
        return (*choices, *((choice, adapter.validate_python(choice)) for choice in field.choices))
    bounds = {
        key: getattr(limit, key)
        for limit in Plan.model_fields[name].metadata
        for key in ("ge", "le")
        if hasattr(limit, key)
    }
    if field.parse != "whole" or set(bounds) != {"ge", "le"}:
        raise AssertionError(f"the {name} row has no choices")
    return (*choices, *((f"{value}", value) for value in range(bounds["ge"], bounds["le"] + 1)))


def select_value(name: str, value: Any) -> Any:
    """What a ``select`` row shows for the Plan field's ``value`` (its unset choice for None)."""
    unset = FORM_ROWS[name].unset
    return unset if value is None and unset is not None else value


def control_value(name: str, value: Any) -> Any:
    """A ``select`` or ``switch`` control's value as the Plan field's (None for an unset choice)."""
    unset = FORM_ROWS[name].unset
    return None if unset is not None and value == unset else value


def make_control(name: str, plan: Plan, catalog: Catalog) -> Widget:
    """The control that edits the Plan field ``name``, holding ``plan``'s value."""
    cid = control_id(name)
    row = FORM_ROWS[name]
    value = getattr(plan, name)
    if name == "model":
        # Catalog ids, then models in the local Hugging Face cache (read offline).
        suggestions = sorted(catalog.models) + cached_model_ids()
        return OrderedInput(
            plan.model,
            placeholder=row.placeholder or "",
            suggester=SuggestFromList(suggestions, case_sensitive=False),
            compact=True,
            id=cid,
        )
    if row.widget == "select":
        options = list(select_choices(name))
        return FormSelect(
            options, value=select_value(name, value), allow_blank=False, compact=True, id=cid
        )
    if row.widget == "switch":
        return Check(row.box, value, compact=True, id=cid)
    # Plain text for numbers too: a restricted Input drops the characters it does not allow, so
    # "4.5" became 45; the form keeps what was typed and says what is wrong with it.
    placeholder = examples_placeholder(plan) if name == "examples" else row.placeholder
    if placeholder is None:
        return OrderedInput(field_text(value), compact=True, id=cid)
    return OrderedInput(field_text(value), placeholder=placeholder, compact=True, id=cid)


def parse_text(name: str, text: str) -> Any:
    """What a typed field holds, as the Plan field's value; ValueError says what is wrong.

    An empty row leaves a field the Plan may leave unset (its default is None) unset."""
    text = text.strip()
    widget = FORM_ROWS[name].widget
    if name == "model":
        if not text:
            raise ValueError("choose a model: catalog id, config.json path or a count like 7B")
        return text
    if not text:
        if Plan.model_fields[name].default is None:
            return None
        if widget == "integer":
            raise ValueError("required: a whole number")
        if widget == "number":
            raise ValueError("required: a number such as 1 or 0.5")
        raise ValueError("required: a count such as 50k")
    if widget == "integer":
        return parse_whole_number(text)  # the command line's words
    if widget == "count":
        return parse_count(text)
    if widget == "number":
        return parse_number(text)
    raise AssertionError(name)
