"""The plan field registry (:mod:`hwdash.core.plan_fields`): every Plan field has one entry, every
flag it declares round-trips through ``plan_arguments`` -> ``hwdash plan``'s parser -> Plan, and the
command line spells each field as the registry does, and the planner form has a row per registry
form row."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError
from textual.widgets import Label

from hwdash.cli import build_parser
from hwdash.commands.plan import apply_framework_defaults, plan_from_args
from hwdash.commands.plan_args import plan_arguments
from hwdash.core.catalog import load_catalog
from hwdash.core.estimator.savers import SAVER_FIELDS
from hwdash.core.plan import Plan
from hwdash.core.plan_fields import (
    ARGV_ORDER,
    BY_NAME,
    FLAG_GROUPS,
    FORM_ORDER,
    NOT_FLAGS,
    PLAN_FIELDS,
    UNSET_UNLESS_GIVEN,
    PlanField,
    form_fields,
)

CATALOG = load_catalog(include_user=False)

#: Plans a changed field is tried in, first valid one wins (RL, FSDP and Megatron settings need
#: their method; ZeRO offload needs stage 3; quantization needs inference; a serving engine's settings need
#: --engine vllm).
CONTEXTS: tuple[dict[str, Any], ...] = (
    {},
    {"method": "full", "gpus": 12},
    {"method": "full", "gpus": 4, "zero": 3},
    {"method": "full", "gpus": 4, "fsdp": "full"},
    {"method": "full", "gpus": 4, "tp": 2, "pp": 2},
    {"method": "full", "gpus": 12, "seq": 1200, "zero": 1},
    {"method": "ppo"},
    {"method": "qlora"},
    {"method": "inference"},
    {"method": "inference", "engine": "vllm"},
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
        # within the field's bounds (--fsdp-version is 1 or 2)
        top = min((getattr(bound, "le", 3) for bound in info.metadata), default=3)
        values = [value for value in (1, 2, 3) if value <= top][-2:]
    elif field.parse == "number":
        values = [0.25, 0.5]
    elif field.parse == "count":
        values = [50_000]
    elif field.name == "selective_ac":
        values = ["op", "2"]  # torchtitan's op policy or a block frequency
    elif field.parse == "elements":
        values = [50_000, "auto"] if "auto" in str(info.annotation) else [50_000]
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


def test_the_form_order_lists_form_rows_only_each_once() -> None:
    assert len(FORM_ORDER) == len(set(FORM_ORDER))
    assert all(BY_NAME[name].form is not None for name in FORM_ORDER), FORM_ORDER
    # the form lists every row the registry declares: those FORM_ORDER lists first, in its order
    names = [field.name for field, _ in form_fields()]
    assert names[: len(FORM_ORDER)] == list(FORM_ORDER)
    assert set(names) == {field.name for field in PLAN_FIELDS if field.form is not None}


def test_every_row_class_has_its_rules_in_the_form_css() -> None:
    from hwdash.ui.planner_form import FORM_CSS

    for _, row in form_fields():
        if row.shown is not None:
            # a rule that names the class (it hides the row, or shows it where it applies)
            assert re.search(rf"\.plan-field\.{re.escape(row.shown)}[ ,]", FORM_CSS), row.shown


def _row_words(row: Any) -> str:
    return str(row.query_one(Label).render())


async def test_the_planner_form_has_a_control_per_registry_row() -> None:
    # The form is built from the registry: the mounted planner has exactly the registry's rows, in
    # its order, each with the registry's label, control, row class, choices and placeholder.
    from textual.app import App, ComposeResult
    from textual.widgets import Checkbox, Input, Select

    from hwdash.core.plans.store import PlanStore
    from hwdash.ui.planner_pane import PlannerPane

    plan = Plan(model="qwen2.5-7b", method="grpo", rl_method="lora", tokens=5_000_000)

    class FormApp(App[None]):
        def compose(self) -> ComposeResult:
            yield PlannerPane(CATALOG, PlanStore(), initial=plan)

    async with FormApp().run_test(size=(120, 60)) as pilot:
        await pilot.pause()
        rows = list(pilot.app.query(".plan-field"))
        expected = form_fields()
        assert [row.id for row in rows] == [
            f"plan-row-{field.name.replace('_', '-')}" for field, _ in expected
        ]
        for (field, form_row), row in zip(expected, rows, strict=True):
            assert _row_words(row) == form_row.label, field.name
            shown = {name for name in row.classes if name != "plan-field"}
            assert shown == ({form_row.shown} if form_row.shown else set()), field.name
            control = row.query_one(f"#plan-{field.name.replace('_', '-')}")
            value = getattr(plan, field.name)
            if form_row.widget == "select":
                assert isinstance(control, Select), field.name
                labels = [str(label) for label, _ in control._options]
                choices = list(field.choices or map(str, range(4)))  # ZeRO: its bounds 0-3
                assert labels == ([form_row.unset] if form_row.unset else []) + choices
                assert control.value == (form_row.unset if value is None else value)
            elif form_row.widget == "switch":
                assert isinstance(control, Checkbox), field.name
                assert str(control.label) == form_row.box and control.value == value
            else:
                assert isinstance(control, Input), field.name
                if field.name == "examples":  # the plan's tokens, until examples are typed
                    assert control.placeholder == "5.0M tokens (from the plan)"
                else:
                    assert control.placeholder == (form_row.placeholder or ""), field.name


def test_only_the_framework_default_fields_stay_unset_when_not_typed() -> None:
    # the fields a plan leaves out of model_fields_set: the marked ones, the savers and GRPO's reward
    # model; Plan.with_changes (what a --from file is applied with) keeps only the set ones
    args = build_parser().parse_args(["plan", "--model", "qwen2.5-7b"])
    plan = plan_from_args(args)
    unset = set(Plan.model_fields) - plan.model_fields_set
    assert unset == {*UNSET_UNLESS_GIVEN, *SAVER_FIELDS, "rl_reward_model"}
    assert unset.isdisjoint(plan.with_changes({"batch": 2}).model_fields_set)


@pytest.mark.parametrize("name", UNSET_UNLESS_GIVEN)
def test_a_framework_default_field_is_set_only_by_its_flag(name: str) -> None:
    field = BY_NAME[name]
    # None on the Plan is the framework's own default, and the parser's default is None too, so
    # "not given" is told apart from any value the flag takes
    assert Plan.model_fields[name].default is None and field.default is None
    untyped = plan_from_args(build_parser().parse_args(["plan", "--model", "x"]))
    assert untyped.model_dump(mode="json")[name] is None  # --json writes it as null
    for plan in _changed_plans(field):
        argv = plan_arguments(plan)
        given = plan_from_args(build_parser().parse_args(["plan", *argv]))
        assert name in given.model_fields_set, argv
        assert getattr(given, name) == getattr(plan, name), argv
        assert given.model_dump(mode="json")[name] == plan.model_dump(mode="json")[name]
