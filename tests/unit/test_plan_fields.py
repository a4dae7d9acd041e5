"""The plan field registry (:mod:`hwdash.core.plan_fields`): every Plan field has one entry, every
flag it declares round-trips through ``plan_arguments`` -> ``hwdash plan``'s parser -> Plan, and the
command line and the planner form spell each field as the registry does."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from hwdash.cli import build_parser
from hwdash.commands.plan import FIELD_FLAGS, apply_framework_defaults, plan_from_args
from hwdash.commands.plan_args import plan_arguments
from hwdash.core.catalog import load_catalog
from hwdash.core.plan import Plan
from hwdash.core.plan_fields import (
    ARGV_ORDER,
    BY_NAME,
    FLAG_GROUPS,
    NOT_FLAGS,
    PLAN_FIELDS,
    PlanField,
    flag_spellings,
)

CATALOG = load_catalog(include_user=False)

#: Plans a changed field is tried in, first valid one wins (RL, FSDP and Megatron settings need
#: their method; ZeRO offload needs stage 3; quantization needs inference).
CONTEXTS: tuple[dict[str, Any], ...] = (
    {},
    {"method": "full", "gpus": 12},
    {"method": "full", "gpus": 4, "zero": 3},
    {"method": "full", "gpus": 4, "fsdp": "full"},
    {"method": "full", "gpus": 4, "tp": 2, "pp": 2},
    {"method": "ppo"},
    {"method": "qlora"},
    {"method": "inference"},
)


def _candidates(field: PlanField) -> list[Any]:
    """Values of ``field`` other than the Plan's default, as the Plan field takes them."""
    info = Plan.model_fields[field.name]
    default = None if info.is_required() else info.default
    default = getattr(default, "value", default)
    if field.kind in ("toggle", "switch", "negated", "pair"):
        values: list[Any] = [True, False]
    elif field.kind == "list":
        values = [("q_proj", "v_proj")]
    elif field.kind == "repeat":
        values = [("l4x1", "t4-small")]
    elif field.choices is not None:
        values = list(field.choices)
    elif field.parse == "whole":
        values = [2, 3]
    elif field.parse == "number":
        values = [0.25, 0.5]
    elif field.parse == "count":
        values = [50_000]
    else:
        values = ["7B"]
    return [value for value in values if value != default]


def _changed_plans(field: PlanField) -> Iterator[Plan]:
    """For each value of :func:`_candidates`, a valid plan that holds it."""
    for value in _candidates(field):
        for context in CONTEXTS:
            try:
                yield Plan(**{"model": "qwen2.5-7b", **context, field.name: value})
                break
            except ValidationError:
                continue
        else:
            pytest.fail(f"{field.name}={value!r} is valid in none of the test's plans")


def test_every_plan_field_is_in_the_registry_or_says_why_not() -> None:
    names = [field.name for field in PLAN_FIELDS]
    assert len(names) == len(set(names)), "a Plan field with two entries"
    assert set(names).isdisjoint(NOT_FLAGS)
    assert set(names) | set(NOT_FLAGS) == set(Plan.model_fields)
    assert all(reason.strip() for reason in NOT_FLAGS.values())
    flags = [field.flag for field in PLAN_FIELDS]
    assert len(flags) == len(set(flags)), "two fields with one flag"
    assert {field.group for field in PLAN_FIELDS} <= set(FLAG_GROUPS)
    # the order plan_arguments writes in names registry fields only, each once
    assert len(ARGV_ORDER) == len(set(ARGV_ORDER)) and set(ARGV_ORDER) <= set(BY_NAME)


@pytest.mark.parametrize("field", PLAN_FIELDS, ids=lambda field: field.name)
def test_every_flag_round_trips_through_plan_arguments(field: PlanField) -> None:
    plans = list(_changed_plans(field))
    assert plans, f"no value of {field.name} to try"
    for plan in plans:
        argv = plan_arguments(plan)
        # the field's own flag says it (a negated flag only exists in its "--no-" form)
        assert set(field.spelling.split("/")) & set(argv), (field.name, argv)
        args = build_parser().parse_args(["plan", *argv])
        assert apply_framework_defaults(plan_from_args(args), CATALOG, argv) == plan, argv


def test_no_flag_at_all_gives_the_plan_defaults() -> None:
    # the parser's defaults are the Plan model's own (the registry does not repeat them)
    args = build_parser().parse_args(["plan", "--model", "qwen2.5-7b"])
    assert plan_from_args(args) == Plan(model="qwen2.5-7b")
    assert plan_arguments(Plan(model="qwen2.5-7b")) == ["--model", "qwen2.5-7b", "--method", "lora"]


def test_the_parser_spells_each_field_as_the_registry_does() -> None:
    plan_parser = build_parser()._subparsers._group_actions[0].choices["plan"]  # type: ignore[union-attr]
    by_flag = {flag: action for action in plan_parser._actions for flag in action.option_strings}
    for field in PLAN_FIELDS:
        for flag in field.spelling.split("/"):
            action = by_flag[flag]
            assert action.help in (field.help_text(), field.off_help), flag
            if field.kind == "value":
                assert action.metavar == field.metavar, flag
                assert action.choices == (None if field.choices is None else list(field.choices))
    # the flags messages name a field by (commands/plan.py) are the registry's
    assert flag_spellings() == FIELD_FLAGS


def test_the_form_rows_are_the_planner_forms() -> None:
    # The planner form does not read the registry yet: its rows must say what the form does today.
    from hwdash.ui import planner_pane as form

    rows = {field.name: field.form for field in PLAN_FIELDS if field.form is not None}
    assert {name: row.label for name, row in rows.items()} == dict(form.FORM_FIELDS)
    assert {name: row.shown for name, row in rows.items() if row.shown} == form._ROW_CLASSES
    widgets = {name: row.widget for name, row in rows.items()}
    for name in form._INTEGER_FIELDS:
        assert widgets[name] == "integer", name
    for name in form._NUMBER_FIELDS:
        assert widgets[name] == "number", name
    for name in (*form._ENUM_FIELDS, "zero", "loss", "rl_method"):
        assert widgets[name] == "select", name
