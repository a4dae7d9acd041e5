"""A plan back to ``hwdash plan`` flags, so an option of ``--fit`` can be copied and re-run.

:func:`plan_arguments` writes only what differs from the defaults, in the order of the field
registry's :data:`~hwdash.core.plan_fields.ARGV_ORDER`; parsing the result with ``hwdash plan``'s
own parser gives the same plan back (a test checks the round trip for generated plans).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from hwdash.core.estimator.savers import (
    FRAMEWORK_PLAN_FIELDS,
    packaged_frameworks,
    with_framework_defaults,
)
from hwdash.core.plan import Plan
from hwdash.core.plan_fields import PlanField, fields_in_argv_order
from hwdash.core.specs import Framework


def _number(value: float) -> str:
    """``0.05`` and ``3`` as written, never ``3.0`` or ``5e-02``."""
    return repr(int(value)) if float(value).is_integer() else repr(float(value))


def _flag_words(field: PlanField, value: Any) -> list[str]:
    """The arguments that set ``field`` to ``value`` (a value that differs from the default)."""
    name = field.flag.removeprefix("--")
    if field.kind in ("toggle", "pair", "switch"):
        return [field.flag if value else f"--no-{name}"]
    if field.kind == "negated":
        return [] if value else [field.flag]
    if field.kind == "list":
        return [field.flag, ",".join(value)]
    if field.kind == "repeat":
        return [word for item in value for word in (field.flag, item)]
    if field.parse == "number":
        return [field.flag, _number(value)]
    return [field.flag, str(getattr(value, "value", value))]


def plan_arguments(plan: Plan, framework: Framework | None = None) -> list[str]:
    """The ``hwdash plan`` arguments (without ``plan``) that build ``plan``, from the field
    registry (:data:`~hwdash.core.plan_fields.PLAN_FIELDS`). ``framework``: the catalog's entry
    for ``plan.framework`` (None: the packaged one), whose defaults the command line fills in
    where no flag is given: a setting that differs from them is written."""
    defaults = Plan(model=plan.model)
    if framework is None:
        framework = packaged_frameworks().get(plan.framework.value)
    try:
        filled: Plan | None = with_framework_defaults(plan, framework)
    except ValidationError:
        filled = None  # the framework's defaults do not fit this plan: write all its settings

    def differs(name: str) -> bool:
        if name in FRAMEWORK_PLAN_FIELDS:
            # without its flag the command line takes the framework's default
            return filled is None or bool(getattr(plan, name) != getattr(filled, name))
        return bool(getattr(plan, name) != getattr(defaults, name))

    args: list[str] = []
    for field in fields_in_argv_order():
        if field.always_written or differs(field.name):
            args += _flag_words(field, getattr(plan, field.name))
    return args
