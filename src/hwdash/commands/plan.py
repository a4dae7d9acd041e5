"""``hwdash plan``: will this run fit, on which flavor, how long and for how much.

Builds a :class:`~hwdash.core.plan.Plan` from the flags, evaluates it on the catalog's flavors with
:func:`~hwdash.core.planning.fit.evaluate_plan`, and prints a breakdown and a flavor table (or ``--json``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from hwdash.core import strict_json
from hwdash.core.estimator.savers import SAVER_FIELDS
from hwdash.core.numbers import parse_number, parse_whole_number, validation_phrase
from hwdash.core.plan import (
    FsdpMode,
    Plan,
    Quant,
)
from hwdash.core.plan_fields import FLAG_GROUPS, PLAN_FIELDS, PlanField
from hwdash.core.plan_fields import member_docs as member_docs  # re-exported: it lived here
from hwdash.core.planning.local_flavor import LOCAL_TARGETS
from hwdash.core.results import FitVerdict
from hwdash.errors import UsageError

PIPED_WIDTH = 160
"""Columns of the tables when stdout is not a terminal (a file or a pipe is never cropped)."""


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


def output_width() -> int | None:
    """None (the terminal's width, or ``COLUMNS``) on a terminal or when ``COLUMNS`` is set;
    :data:`PIPED_WIDTH` for a pipe or a file, where rich would otherwise assume 80."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS", "").strip():
        return None
    return PIPED_WIDTH


#: Plan field -> the flag that sets it, to name the flag in error messages.
FIELD_FLAGS = {
    "model": "--model",
    "method": "--method",
    "precision": "--precision",
    "batch": "--batch",
    "seq": "--seq",
    "grad_ckpt": "--grad-ckpt/--no-grad-ckpt",
    "grad_accum": "--grad-accum",
    "attention": "--attn",
    "optimizer": "--optimizer",
    "optimizer_impl": "--optimizer-impl",
    "lora_r": "--lora-r",
    "lora_targets": "--lora-targets",
    "lora_dropout": "--lora-dropout",
    "lora_modules_to_save": "--lora-modules-to-save",
    "zero": "--zero",
    "offload": "--offload",
    "gpus": "--gpus",
    "examples": "--examples",
    "epochs": "--epochs",
    "tokens": "--tokens",
    "mfu": "--mfu",
    "flavors": "--flavor",
    "rl_method": "--rl-method",
    "rl_reference": "--no-reference",
    "rl_reward_model": "--reward-model/--no-reward-model",
    "vllm_memory_utilization": "--vllm-util",
    "fsdp": "--fsdp",
    "fsdp_offload": "--fsdp-offload",
    "gpus_per_node": "--gpus-per-node",
    "tp": "--tp",
    "pp": "--pp",
    "sequence_parallel": "--no-sequence-parallel",
    "selective_recompute": "--selective-recompute",
    "hidden_dropout": "--hidden-dropout",
    "quant": "--quant",
    "framework": "--framework",
    "loss": "--loss",
    "compile": "--compile/--no-compile",
    "activation_offload": "--activation-offload/--no-activation-offload",
    "optimizer_in_backward": "--optimizer-in-backward/--no-optimizer-in-backward",
    "sync_each_batch": "--sync-each-batch/--no-sync-each-batch",
    "qlora_frozen_dtype": "--qlora-frozen-dtype",
    "adapter_dtype": "--adapter-dtype",
    "value_head": "--value-head",
}


def unused_flag_warnings(plan: Plan, argv: list[str]) -> list[str]:
    """Warnings for typed flags the plan's method ignores (``--examples`` for inference...)."""
    from hwdash.core.plan import unused_settings

    by_flag = {flag: field for field, flag in FIELD_FLAGS.items()}
    for field, flags in FIELD_FLAGS.items():
        by_flag.update({flag: field for flag in flags.split("/")})
    typed_flags = [arg.split("=", 1)[0] for arg in argv if arg.split("=", 1)[0] in by_flag]
    typed = [by_flag[flag] for flag in typed_flags]
    warnings = []
    for field, why in unused_settings(plan, typed):
        flag = FIELD_FLAGS[field]
        if "/" in flag:
            flag = next(f for f in typed_flags if by_flag[f] == field)
        warnings.append(f"{flag} does nothing here: {why}")
    return warnings


def _count(text: str) -> int:
    from hwdash.core.units import parse_count

    try:
        return parse_count(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


#: How the command line reads a registry field's value (:data:`hwdash.core.plan_fields.ValueParser`).
_VALUE_TYPES: dict[str, Callable[[str], Any]] = {
    "whole": whole_number,
    "number": number,
    "count": _count,
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


def add_field_flags(parser: argparse.ArgumentParser) -> None:
    """The Plan fields' options, from the registry (:data:`~hwdash.core.plan_fields.PLAN_FIELDS`),
    each in its ``--help`` section."""
    groups = {title: parser.add_argument_group(title) for title in FLAG_GROUPS}
    for field in PLAN_FIELDS:
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
    add_field_flags(parser)
    out = parser.add_argument_group("catalog and output")
    out.add_argument(
        "--catalog",
        action="append",
        default=[],
        metavar="DIR",
        help="extra catalog folder or file (repeatable)",
    )
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
        choices=["deepspeed", "trainer", "accelerate", "hf-jobs"],
        help="write the plan as a DeepSpeed config, a Trainer/TRL + PEFT snippet, an accelerate "
        "config or the `hf jobs uv run` line (stdout, or -o FILE)",
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
        "--save",
        metavar="NAME",
        help="save the plan under NAME in the plans file (dashboard compare)",
    )


def _split(values: list[str]) -> tuple[str, ...]:
    items: list[str] = []
    for value in values:
        items.extend(part.strip() for part in value.split(",") if part.strip())
    return tuple(dict.fromkeys(items))


def plan_from_args(args: argparse.Namespace) -> Plan:
    """Build and validate the plan; a bad value raises :class:`UsageError` naming its flag."""
    if args.model and args.params:
        raise UsageError("give --model or --params, not both", flag="--params")
    model = args.model or args.params
    if not model:
        raise UsageError(
            "which model? give a catalog id, a config.json path, or --params 7B", flag="--model"
        )
    if args.params:
        from hwdash.core.units import parse_count

        try:
            parse_count(args.params)
        except ValueError as exc:
            raise UsageError(str(exc), flag="--params") from None
    fields: dict[str, Any] = {
        "model": model,
        "method": args.method,
        "precision": args.precision,
        "batch": args.batch,
        "seq": args.seq,
        "grad_ckpt": args.grad_ckpt,
        "grad_accum": args.grad_accum,
        "attention": args.attn,
        "optimizer": args.optimizer,
        "optimizer_impl": args.optimizer_impl,
        "lora_r": args.lora_r,
        "lora_targets": _split([args.lora_targets]) or ("all-linear",),
        "lora_dropout": args.lora_dropout,
        "lora_modules_to_save": _split([args.lora_modules_to_save]),
        "zero": args.zero,
        "offload": args.offload,
        "gpus": args.gpus,
        "examples": args.examples,
        "epochs": args.epochs,
        "tokens": args.tokens,
        "mfu": args.mfu,
        "flavors": _split(args.flavor),
        "rl_method": args.rl_method,
        "rl_reference": not args.no_reference,
        "vllm_memory_utilization": args.vllm_util,
        "fsdp": args.fsdp,
        "fsdp_offload": args.fsdp_offload,
        "gpus_per_node": args.gpus_per_node,
        "tp": args.tp,
        "pp": args.pp,
        "sequence_parallel": not args.no_sequence_parallel,
        "selective_recompute": args.selective_recompute,
        "hidden_dropout": args.hidden_dropout,
        "quant": args.quant,
    }
    if args.reward_model is not None:
        fields["rl_reward_model"] = args.reward_model
    fields["framework"] = args.framework
    for name in SAVER_FIELDS:
        if getattr(args, name) is not None:
            fields[name] = getattr(args, name)
    try:
        return Plan(**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = first["loc"]
        field = str(loc[0]) if loc else ""
        flag = FIELD_FLAGS.get(field)
        if flag is None:
            # model-level checks (offload needs ZeRO, ...) carry no field: name the flags from the text.
            message = str(first["msg"]).removeprefix("Value error, ")
            flag = _flag_from_message(message)
            raise UsageError(message, flag=flag) from None
        value = first.get("input")
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        raise UsageError(f"{validation_phrase(first)}, got {shown}", flag=flag) from None


def apply_framework_defaults(
    plan: Plan, catalog: Any, argv: list[str], imported: Any = None
) -> Plan:
    """The plan with its framework's precision, checkpointing and optimizer defaults where the user
    chose nothing (:func:`hwdash.core.estimator.savers.with_framework_defaults`, as the planner form does):
    typed flags and the settings a ``--from`` file (``imported``) gave always win; the savers
    themselves resolve in the estimator."""
    from hwdash.core.estimator.savers import with_framework_defaults

    try:
        return with_framework_defaults(
            plan, catalog.framework_for(plan), chosen_fields(argv, imported)
        )
    except ValidationError as exc:
        message = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
        raise UsageError(message, flag="--framework") from None


def chosen_fields(argv: list[str], imported: Any = None) -> set[str]:
    """The Plan fields the user set: by a typed flag (either form of ``--grad-ckpt/--no-grad-ckpt``)
    or in a ``--from`` file (``imported``); the framework's defaults never replace them."""
    typed = _typed_flags(argv)
    chosen = {name for name in FIELD_FLAGS if _was_typed(name, typed)}
    if imported is not None:
        chosen |= set(imported.updates)
    return chosen


def _typed_flags(argv: list[str]) -> set[str]:
    """The long flags typed on the command line (``--batch 4`` and ``--batch=4``)."""
    return {arg.split("=", 1)[0] for arg in argv if arg.startswith("--")}


def _was_typed(field: str, typed: set[str]) -> bool:
    """Whether the flag setting Plan ``field`` was typed, in either form (``--x``/``--no-x``)."""
    flags = FIELD_FLAGS.get(field, "")
    return bool(flags) and bool(set(flags.split("/")) & typed)


def _blame_the_file(
    error: UsageError, imported: Any, argv: list[str], path: str | None
) -> UsageError:
    """``error`` said of the ``--from`` file when the setting it names came from the file and was
    not typed (an axolotl file's unknown LoRA target is the file's, not ``--lora-targets``')."""
    if imported is None or path is None or error.flag is None:
        return error
    typed = _typed_flags(argv)
    for name in imported.updates:
        if error.flag in FIELD_FLAGS.get(name, "").split("/") and not _was_typed(name, typed):
            reason = str(error).removeprefix(f"{error.flag}: ")
            return UsageError(
                f"{path}: its {name} (what {error.flag} sets): {reason}", flag="--from"
            )
    return error


def apply_imported(plan: Plan, imported: Any, argv: list[str], path: str) -> Plan:
    """The plan with the file's values under the flags typed on the command line."""
    typed = _typed_flags(argv)
    for name, message in imported.refused.items():
        # the file's setting cannot be planned; a typed flag for the same field replaces it
        if not _was_typed(name, typed):
            raise UsageError(message, flag="--from")
    updates = {}
    for name, value in imported.updates.items():
        if name == "model" and "--params" in typed:
            continue
        if not _was_typed(name, typed):
            updates[name] = value
    try:
        changed = plan.with_changes(updates)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        raise UsageError(f"{path}: {field}: {first['msg']}", flag="--from") from None
    if imported.ignored:
        shown = ", ".join(imported.ignored[:12])
        more = f" and {len(imported.ignored) - 12} more" if len(imported.ignored) > 12 else ""
        print(f"hwdash: --from {path}: ignored {shown}{more}", file=sys.stderr)
    for note in imported.notes:
        print(f"hwdash: --from {path}: {note}", file=sys.stderr)
    for name in imported.not_carried:
        # what the file cannot say: the estimate uses the flag typed, else the default; say which
        if name == "rl_method" and not changed.is_rl:
            continue
        if _was_typed(name, typed):
            continue
        flag = FIELD_FLAGS[name].split("/")[0]
        value = getattr(changed, name)
        shown = f"{flag} {getattr(value, 'value', value)}"
        print(
            f"hwdash: --from {path}: a {imported.kind} config does not say {flag}: the estimate "
            f"uses {shown} (the default); add {flag} to choose",
            file=sys.stderr,
        )
    return changed


def _exists_message(output: str) -> str:
    return f"'{output}' already exists: add --force to overwrite it"


def export(
    kind: str,
    report: Any,
    catalog: Any,
    output: str | None,
    *,
    check: tuple[int, str] | None = None,
    force: bool = False,
) -> int:
    """Write the plan as ``kind`` to ``output`` (stdout when None; an existing file only with
    ``force``). ``check``: ``--check``'s (status, line) for the plan's flavor: a failed check
    writes nothing and returns its status. Without one, an export for a flavor the plan does not
    fit (or only tightly) is written with a warning."""
    from hwdash.commands.plan_fit import check_line
    from hwdash.core.plans.exports import export_flavor_id, export_text

    try:
        text, notes = export_text(kind, report, catalog)
    except ValueError as exc:
        raise UsageError(str(exc), flag="--export") from None
    # With the export on stdout, stdout is the export alone: the check's line goes to stderr.
    check_stream = sys.stdout if output is not None else sys.stderr
    if check is not None and check[0] != 0:
        print(check[1], file=check_stream)
        print(f"hwdash: --check failed: the {kind} export was not written", file=sys.stderr)
        return check[0]
    flavor_id = export_flavor_id(report)
    if check is None and flavor_id is not None:
        status, line = check_line(report, flavor_id)
        if status != 0:
            print(
                f"hwdash: warning: {line} (the {kind} export is written for it anyway; "
                "--check refuses it)",
                file=sys.stderr,
            )
    for note in notes:
        print(f"hwdash: {note}", file=sys.stderr)
    if output is None:
        sys.stdout.write(text)
    else:
        try:
            with open(output, "w" if force else "x", encoding="utf-8") as handle:
                handle.write(text)
        except FileExistsError:
            raise UsageError(_exists_message(output), flag="-o") from None
        except OSError as exc:
            raise UsageError(f"cannot write '{output}': {exc.strerror or exc}", flag="-o") from None
        print(f"wrote {output}", file=sys.stderr)
    if check is not None:
        print(check[1], file=check_stream)
        return check[0]
    return 0


def _flag_from_message(message: str) -> str | None:
    if message.startswith("--"):
        # the parallelism checks name their flag first (core.plan.Plan._check_parallelism)
        return message.split()[0].split("/")[0]
    lowered = message.lower()
    if lowered.startswith("quant "):
        return "--quant"
    if "optimizer_in_backward" in lowered:
        return "--optimizer-in-backward"
    if "offload" in lowered:
        return "--offload"
    if "zero" in lowered:
        return "--zero"
    if "rl_method" in lowered:
        return "--rl-method"
    return None


def run(args: argparse.Namespace) -> int:
    """Run the subcommand."""
    from hwdash.commands import plan_fit
    from hwdash.core.catalog import load_catalog
    from hwdash.core.models.config import resolve_model
    from hwdash.core.planning.fit import evaluate_plan

    imported = None
    if args.from_file is not None:
        from pathlib import Path

        from hwdash.core.plans.imports import read_plan_file

        imported = read_plan_file(Path(args.from_file))
        if not args.model and not args.params and "model" in imported.updates:
            args.model = imported.updates["model"]
    plan = plan_from_args(args)
    if imported is not None:
        plan = apply_imported(plan, imported, getattr(args, "argv", []), args.from_file)
    if args.output is not None and args.export is None:
        raise UsageError("-o names the file --export writes: add --export FORMAT", flag="-o")
    if args.force and args.output is None:
        raise UsageError("--force overwrites the -o FILE of --export: add -o FILE", flag="--force")
    if args.output is not None and not args.force and os.path.lexists(args.output):
        raise UsageError(_exists_message(args.output), flag="-o")
    if args.export is not None and args.json and args.output is None:
        raise UsageError(
            "--export and --json would both write to stdout: add -o FILE for the export",
            flag="--export",
        )
    if args.check and len(plan.flavors) != 1:
        raise UsageError("give exactly one --flavor ID to check against", flag="--check")
    catalog = load_catalog(args.catalog)
    plan = apply_framework_defaults(plan, catalog, getattr(args, "argv", []), imported)
    # This machine's GPUs become the `local` flavor (NVML, or the fake scenario).
    local = plan_fit.probe_local_gpus(args.fake_nvml)
    catalog, machines = plan_fit.add_local_flavors(
        catalog, local, with_free=args.fit == "local-free" or "local-free" in plan.flavors
    )
    for flavor_id in plan.flavors:
        if flavor_id in LOCAL_TARGETS and flavor_id not in catalog.flavors:
            # "unknown flavor 'local'" would send the user to the catalog; the GPUs are missing.
            plan_fit.target_flavors(flavor_id, catalog, local, flag="--flavor")
    if args.fit is not None:
        plan_fit.target_flavors(args.fit, catalog, local)  # an unknown target: exit 2 now
    model = resolve_model(plan.model, catalog)
    trace_skipped: str | None = None
    if args.trace:
        from hwdash.tracing import TraceUnavailable, check_trace_dependencies, trace_settings

        trace_settings(plan)  # a setting that cannot be traced: exit 2, before any output
        try:
            check_trace_dependencies(plan)
        except TraceUnavailable as exc:
            # The estimate needs none of torch/transformers/peft: print it, skip the trace.
            trace_skipped = str(exc).removeprefix("--trace: ")
    try:
        report = evaluate_plan(plan, catalog, model)
    except UsageError as exc:
        raise _blame_the_file(exc, imported, getattr(args, "argv", []), args.from_file) from None
    from hwdash.core.estimator.savers import applied_framework_defaults

    # What the framework set that the user did not: the text's "framework" line and --json say it.
    framework_defaults = applied_framework_defaults(
        plan, catalog.framework_for(plan), chosen_fields(getattr(args, "argv", []), imported)
    )
    unused = unused_flag_warnings(plan, getattr(args, "argv", []))
    if unused:
        report = dataclasses.replace(report, warnings=(*unused, *report.warnings))
    # --check's (exit status, line): the status holds whatever else is asked.
    check = plan_fit.check_line(report, plan.flavors[0]) if args.check else None
    status = 0 if check is None else check[0]
    fit_result = None
    fit_why = ""
    if args.export is None and args.fit is not None:
        fit_result = plan_fit.search(plan, model, catalog, args.fit, local)
    elif args.export is None and not args.json and not args.check and not report.recommended:
        # Nothing fits and no --fit: the top three options for the flavor asked (--flavor; of
        # several, the cheapest that comes close), else for the cheapest flavor that comes close.
        from hwdash.core.planning.fit_options import closest_flavor

        closest = closest_flavor(report)
        if closest is not None and closest.verdict is not FitVerdict.TIGHT:
            fit_result = plan_fit.search(plan, model, catalog, closest.flavor.id, local)
            if len(plan.flavors) == 1:
                fit_why = "the flavor asked"
            elif plan.flavors:
                fit_why = "of the flavors asked, the cheapest that comes close"
            else:
                fit_why = "nothing fits: the cheapest flavor that comes close"
    # The catalog folders given: a suggested command repeats them, to estimate with the same entries.
    catalog_args = [arg for folder in args.catalog for arg in ("--catalog", folder)]
    saved_message = None
    if args.save is not None:
        from hwdash.core.plans.store import PlanStore, PlanSummary

        store = PlanStore()
        saved = store.save(args.save, plan, summary=PlanSummary.from_report(report))
        saved_message = f"saved plan '{saved.name}' to {store.path}"
    if args.export is not None:
        status = export(args.export, report, catalog, args.output, check=check, force=args.force)
        if not args.json:
            if saved_message is not None:
                print(saved_message, file=sys.stderr)
            return status
    if args.json:
        document = report.to_json()
        if fit_result is not None:
            document["fit"] = plan_fit.fit_json(
                fit_result, catalog_args, catalog.framework_for(plan)
            )
        if machines:
            document["local"] = {
                ident: {"name": machine.flavor.name, "notes": list(machine.notes)}
                for ident, machine in machines.items()
            }
        document["details"] = [[label, value] for label, value in report.estimate.details]
        document["framework_defaults"] = framework_defaults
        if check is not None:
            document["check"] = {"flavor": plan.flavors[0], "status": check[0], "message": check[1]}
            if args.export is None:  # (an export printed it)
                print(check[1], file=sys.stderr)
        if saved_message is not None:
            document["saved_as"] = saved.name
            print(saved_message, file=sys.stderr)
        if trace_skipped is not None:
            document["trace"] = {"skipped": trace_skipped}
            print(f"hwdash: trace skipped: {trace_skipped}", file=sys.stderr)
        elif args.trace:
            from hwdash.commands.plan_trace import trace_json

            document["trace"] = trace_json(plan, model)
        sys.stdout.write(strict_json.dumps(document, indent=2) + "\n")
        return status
    if check is not None and args.fit is None and not args.trace:
        print(check[1])  # the guard's line alone
        if saved_message is not None:
            print(saved_message)
        return status
    render_report(
        report,
        local_notes=[n for m in machines.values() for n in m.notes],
        framework_defaults=framework_defaults,
    )
    if fit_result is not None:
        from rich.console import Console

        auto = args.fit is None
        plan_fit.render_options(
            fit_result,
            Console(width=output_width()),
            limit=3 if auto else None,
            extra_args=catalog_args,
            framework=catalog.framework_for(plan),
            why=fit_why,
        )
    if saved_message is not None:
        print(saved_message)
    if trace_skipped is not None:
        print(f"hwdash: trace skipped: {trace_skipped}", file=sys.stderr)
    elif args.trace:
        from hwdash.commands.plan_trace import print_trace

        print_trace(plan, model)
    if check is not None:
        print(check[1])
    return status


def _parallel_words(plan: Plan, gpus: int) -> str:
    """How the GPUs are used, for the title: FSDP's shard group or Megatron's tp x pp x dp."""
    if plan.fsdp is not FsdpMode.NONE:
        from hwdash.core.estimator.parallelism import fsdp_shard_size

        shard = fsdp_shard_size(gpus, plan.fsdp, plan.gpus_per_node)
        offload = ", CPU offload" if plan.fsdp_offload else ""
        return f" (FSDP {plan.fsdp.value} shard over {shard}{offload})"
    if plan.tp > 1 or plan.pp > 1:
        dp = max(1, gpus // (plan.tp * plan.pp))
        sp = ", sequence parallel" if plan.sequence_parallel and plan.tp > 1 else ""
        return f" (tp {plan.tp} x pp {plan.pp} x dp {dp}{sp})"
    return ""


_VERDICT_STYLE = {"fits": "green", "tight": "yellow", "no": "red"}


def render_report(
    report: Any,
    *,
    saved_as: str | None = None,
    console: Any = None,
    local_notes: list[str] | None = None,
    framework_defaults: dict[str, Any] | None = None,
) -> None:
    """Print the breakdown, warnings and the flavor table with rich. ``framework_defaults``: what
    the framework set that the user did not choose
    (:func:`hwdash.core.estimator.savers.applied_framework_defaults`), listed on the "framework" line."""
    from rich.cells import cell_len
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from hwdash.core.results import MEMORY_COMPONENTS
    from hwdash.core.units import GIB, format_count, format_hours, format_money

    # Piped or redirected output is never cropped at 80 columns: a fixed, roomy width instead.
    console = console or Console(width=output_width())
    plan, estimate = report.plan, report.estimate
    memory = estimate.per_gpu.as_dict()
    total = memory["total"]
    # Model, flavor and plan names come from user files: rich Text, never markup.
    # The precision once: the compute dtype is said only when it differs from what was asked
    # (mixed or amp resolve to bf16 or fp16 on the hardware).
    precision = plan.precision.value
    if estimate.compute_dtype != precision:
        precision = f"{precision} ({estimate.compute_dtype} compute)"
    if plan.quant is not Quant.NONE:
        precision = f"{precision}, {plan.quant.value} weights"
    title = Text.assemble(
        (report.model.name, "bold"),
        f": {plan.method.value}, {precision}, batch {plan.batch} x seq "
        f"{plan.seq}, {format_count(estimate.total_params)} params "
        f"({format_count(estimate.trainable_params)} trainable), {estimate.gpus} GPU"
        f"{'s' if estimate.gpus != 1 else ''}{_parallel_words(plan, estimate.gpus)}",
    )
    console.print(title, highlight=False)
    if plan.is_training:
        from hwdash.core.estimator.savers import (
            describe_framework_defaults,
            describe_savers,
            resolve_savers,
        )

        applied = describe_framework_defaults(framework_defaults or {})
        if applied:
            applied = f"; defaults it applied: {applied}"
        console.print(
            f"framework {plan.framework.value}: "
            f"{describe_savers(resolve_savers(plan, report.framework))}{applied}",
            style="dim",
            highlight=False,
        )
    breakdown = Table()
    breakdown.add_column("component")
    breakdown.add_column("GiB per GPU", justify="right")
    breakdown.add_column("share", justify="right")
    for name in MEMORY_COMPONENTS:
        value = memory[name]
        share = value / total if total else 0.0
        breakdown.add_row(name.replace("_", " "), f"{value / GIB:.2f}", f"{share:.0%}")
    breakdown.add_row("[bold]total[/bold]", f"[bold]{total / GIB:.2f}[/bold]", "100%")
    console.print(breakdown)
    if plan.is_training:
        console.print(
            f"peak: {estimate.peak_phase} (the components as they are then)",
            style="dim",
            highlight=False,
        )
    parts = list(estimate.details)
    if parts:
        table_of_parts = Table(show_header=True, box=None, padding=(0, 2))
        table_of_parts.add_column("made of", style="dim")
        table_of_parts.add_column("GiB", justify="right", style="dim")
        for label, value in parts:
            table_of_parts.add_row(Text(label), f"{value / GIB:.2f}")
        console.print(table_of_parts)
    if estimate.host_bytes:
        console.print(f"host RAM for offload: {estimate.host_bytes / GIB:.1f} GiB")
    for warning in report.warnings:
        console.print(Text.assemble(("warning:", "yellow"), " ", warning), highlight=False)
    console.print("flavors, cheapest first:")
    # The note goes in the table when the terminal is wide enough, else as numbered notes below.
    wide = console.width >= 120
    table = Table()
    # On a narrow terminal the flavor's name wraps (its marks on a line of their own) and the
    # note becomes a number: the verdict and the numbers a user acts on keep their full width.
    table.add_column("flavor", overflow="fold", ratio=2 if wide else None)
    table.add_column("fit", no_wrap=True)
    for column in ("free GiB", "GPUs", "$/h", "hours", "cost"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("note", overflow="fold", ratio=1, min_width=20 if wide else 3)
    notes: dict[str, int] = {}
    for fit in report.flavors:
        verdict = fit.verdict.value
        marks = []
        if fit.flavor.id == report.recommended:
            marks.append("cheapest")
        if fit.flavor.id == report.fastest:
            marks.append("fastest")
        if fit.flavor.provider == "local" and fit.flavor.id in ("local", "local-free"):
            marks.append("this machine")
        flavor_cell = Text(fit.flavor.id)
        if marks:
            flavor_cell.stylize("bold")
            flavor_cell.append(f" ({', '.join(marks)})")
        headroom = "-" if fit.usable_bytes == 0 else f"{fit.headroom_bytes / GIB:+.1f}"
        price = fit.flavor.price_per_hour
        note_cell = Text(fit.reason)
        if fit.reason and not wide:
            note_cell = Text(f"[{notes.setdefault(fit.reason, len(notes) + 1)}]")
        table.add_row(
            flavor_cell,
            f"[{_VERDICT_STYLE[verdict]}]{verdict}[/{_VERDICT_STYLE[verdict]}]",
            headroom,
            str(fit.flavor.gpu_count),
            "-" if price is None else f"{price:.2f}",
            format_hours(fit.hours),
            format_money(fit.cost),
            note_cell,
        )
    for kept in table.columns[1:7]:  # fit and the numbers: never cut
        kept.min_width = max(
            [cell_len(str(kept.header))]
            + [cell_len(Text.from_markup(str(cell)).plain) for cell in kept.cells]
        )
    console.print(table)
    for reason, number in notes.items():
        console.print(f"[{number}] {reason}", highlight=False, markup=False)
    factors = dict.fromkeys(
        f"{entry.id} x{entry.factor:g}" for fit in report.flavors for entry in fit.slowdowns
    )
    if factors:
        console.print(
            f"hours include the catalog's slowdowns: {', '.join(factors)} "
            "(hwdash catalog list --kind slowdowns)",
            style="dim",
            highlight=False,
            markup=False,
        )
    for note in dict.fromkeys(local_notes or ()):
        console.print(f"this machine: {note}", highlight=False, markup=False)
    if report.recommended:
        console.print(
            Text.assemble("recommended: ", (report.recommended, "bold"), " (cheapest that fits)"),
            highlight=False,
        )
    else:
        console.print("recommended: none (no flavor fits)")
    if saved_as:
        console.print(Text(f"saved as '{saved_as}'"))
