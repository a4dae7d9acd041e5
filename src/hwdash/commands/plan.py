"""``hwdash plan``: will this run fit, on which flavor, how long and for how much.

Builds a :class:`~hwdash.core.plan.Plan` from the flags, evaluates it on the catalog's flavors with
:func:`~hwdash.core.planning.fit.evaluate_plan`, and prints a breakdown and a flavor table (or ``--json``).

This module registers the subcommand and its flags; the rest lives by concern beside it:
``plan_inputs`` (the Plan from the flags and ``--from``), ``plan_run`` (the run's flow),
``plan_report`` (the text report) and ``plan_export`` (``--export``). Their public names are
importable from here as before.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from hwdash.commands.plan_export import export
from hwdash.commands.plan_inputs import (
    FIELD_FLAGS,
    apply_framework_defaults,
    apply_imported,
    chosen_fields,
    plan_from_args,
    unused_flag_warnings,
)
from hwdash.commands.plan_report import PIPED_WIDTH, output_width, render_report
from hwdash.commands.plan_run import run
from hwdash.core.numbers import parse_number, parse_whole_number
from hwdash.core.plan_fields import FLAG_GROUPS, PLAN_FIELDS, SERVING, PlanField
from hwdash.core.plan_fields import member_docs as member_docs  # re-exported: it lived here

__all__ = [
    "FIELD_FLAGS",
    "PIPED_WIDTH",
    "add_field_flags",
    "add_parser",
    "apply_framework_defaults",
    "apply_imported",
    "chosen_fields",
    "export",
    "member_docs",
    "number",
    "output_width",
    "plan_from_args",
    "render_report",
    "run",
    "unused_flag_warnings",
    "whole_number",
]


def whole_number(text: str) -> int:
    """argparse type: a whole number, refused in the dashboard form's words."""
    try:
        return parse_whole_number(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def number(text: str) -> float:
    """argparse type: a finite number, refused in the dashboard form's words."""
    try:
        return parse_number(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count(text: str) -> int:
    from hwdash.core.units import parse_count

    try:
        return parse_count(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _elements(text: str) -> int | str:
    """argparse type: a DeepSpeed element count (``5e8``, ``500M``, ``0``) or ``auto``."""
    from hwdash.core.units import parse_count

    word = text.strip().lower()
    if word == "auto":
        return "auto"
    try:
        return parse_count(word)
    except ValueError:
        pass
    try:
        value = parse_number(word)
    except ValueError:
        value = -1.0
    if value < 0 or not float(value).is_integer():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an element count (examples: 5e8, 500M, 0) or auto"
        )
    return int(value)


#: How the command line reads a registry field's value (:data:`hwdash.core.plan_field_types.ValueParser`).
_VALUE_TYPES: dict[str, Callable[[str], Any]] = {
    "whole": whole_number,
    "number": number,
    "count": _count,
    "elements": _elements,
}


def _field_options(field: PlanField) -> dict[str, Any]:
    """The ``add_argument`` keywords of one registry field (all kinds but ``pair``)."""
    options: dict[str, Any] = {"help": field.help_text()}
    if field.kind in ("switch", "negated"):
        return {"action": "store_true", **options}
    options["default"] = field.default
    if field.kind == "toggle":
        return {"action": argparse.BooleanOptionalAction, **options}
    if field.kind == "repeat":
        options["action"] = "append"
    if field.parse is not None:
        options["type"] = _VALUE_TYPES[field.parse]
    if field.choices is not None:
        options["choices"] = list(field.choices)
    if field.metavar is not None:
        options["metavar"] = field.metavar
    return options


def _add_pair(group: Any, field: PlanField) -> None:
    """``--x`` / ``--no-x`` as two exclusive options of one destination (None: neither given)."""
    exclusive = group.add_mutually_exclusive_group()
    dest = field.flag.removeprefix("--").replace("-", "_")
    for flag, value, help_text in (
        (field.flag, True, field.help_text()),
        (f"--no-{field.flag.removeprefix('--')}", False, field.off_help),
    ):
        exclusive.add_argument(
            flag,
            dest=dest,
            action="store_const",
            const=value,
            **({"default": None} if value else {}),
            help=help_text,
        )


def add_field_flags(parser: argparse.ArgumentParser, titles: tuple[str, ...] = FLAG_GROUPS) -> None:
    """The Plan fields' options of the ``--help`` sections ``titles``, from the registry
    (:data:`~hwdash.core.plan_fields.PLAN_FIELDS`), each in its section."""
    groups = {title: parser.add_argument_group(title) for title in titles}
    for field in PLAN_FIELDS:
        if field.group not in groups:
            continue
        group = groups[field.group]
        if field.kind == "pair":
            _add_pair(group, field)
        else:
            group.add_argument(field.flag, **_field_options(field))
        for flag, help_text in field.also:
            group.add_argument(flag, help=help_text)


def add_parser(subparsers: Any) -> None:
    """Register the subcommand and its flags."""
    parser = subparsers.add_parser(
        "plan",
        help="estimate GPU memory, time and cost of a training or inference run",
        description=(
            "Estimate peak GPU memory per device (weights, gradients, optimizer states, activations, "
            "KV cache, overhead) for a plan, and whether it fits each flavor of the catalog, with "
            "hours and dollars. Example: hwdash plan --model qwen2.5-7b --method lora --batch 4 "
            "--seq 2048 --grad-ckpt"
        ),
    )
    # the serving section follows "catalog and output" in --help, as it did before its flags
    # were Plan fields
    add_field_flags(parser, tuple(title for title in FLAG_GROUPS if title != SERVING))
    out = parser.add_argument_group("catalog and output")
    out.add_argument(
        "--catalog",
        action="append",
        default=[],
        metavar="DIR",
        help="extra catalog folder or file (repeatable)",
    )
    add_field_flags(parser, (SERVING,))
    _add_fit_flags(parser.add_argument_group("make it fit"))
    _add_handoff_flags(parser.add_argument_group("configs in and out"))
    _add_output_flags(out)


def _add_fit_flags(fit: Any) -> None:
    """``--fit``, ``--check`` and ``--fake-nvml``: make it fit, the launch guard, the local GPUs."""
    fit.add_argument(
        "--fit",
        metavar="TARGET",
        help="the smallest changes that make the plan fit TARGET: a flavor id, local (this "
        "machine's GPUs), local-free (the memory free on them now) or any (every flavor, "
        "cheapest first)",
    )
    fit.add_argument(
        "--check",
        action="store_true",
        help="with one --flavor: print one line and exit 0 if the plan fits it, 1 if it is tight "
        "or does not fit (a launch guard for job scripts); the exit code holds with --json, "
        "--save, --fit and --export, and an --export it fails is not written",
    )
    fit.add_argument(
        "--max",
        action="append",
        metavar="FIELD",
        help="with one --flavor (an id, local or local-free): the largest seq, batch or "
        "concurrency (inference: sequences of --seq tokens at once) that fits it, or the "
        "fewest gpus of its kind; fits as --check says (exit 0; 1 when even 1 does not fit)",
    )
    fit.add_argument(
        "--fake-nvml",
        default=None,
        metavar="PATH",
        help="read this machine's GPUs (the local flavor) from a fake NVML scenario; also "
        "HWDASH_FAKE_NVML",
    )


def _add_handoff_flags(handoff: Any) -> None:
    """``--from``, ``--export``, ``-o`` and ``--force``: configs in and out."""
    handoff.add_argument(
        "--from",
        dest="from_file",
        metavar="FILE",
        help="read the plan from a DeepSpeed JSON, TrainingArguments/TRL JSON or YAML (or the "
        "--export trainer snippet), accelerate, axolotl or LLaMA-Factory YAML; flags given here win",
    )
    handoff.add_argument(
        "--export",
        choices=["deepspeed", "trainer", "accelerate", "hf-jobs", "vllm"],
        help="write the plan as a DeepSpeed config, a Trainer/TRL + PEFT snippet, an accelerate "
        "config, the `hf jobs uv run` line or (--engine vllm|sglang) the server's command line "
        "(stdout, or -o FILE)",
    )
    handoff.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="with --export: write to FILE instead of stdout (an existing FILE needs --force)",
    )
    handoff.add_argument(
        "--force", action="store_true", help="with -o FILE: overwrite FILE if it exists"
    )


def _add_output_flags(out: Any) -> None:
    """``--json``, ``--trace`` and ``--save``: what is printed and kept."""
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument(
        "--trace",
        action="store_true",
        help="also run the plan's step on fake tensors (needs torch and transformers, no GPU) "
        "and show the traced peak beside the estimate",
    )
    out.add_argument(
        "--calibrated",
        action="store_true",
        help="use what this box measured for similar runs (same model and method, from the runs "
        "ledger): their median MFU for hours and cost, their measured/planned peak for the verdict",
    )
    out.add_argument(
        "--save",
        metavar="NAME",
        help="save the plan under NAME in the plans file (dashboard compare)",
    )
