"""The :class:`~hwdash.core.plan.Plan` of ``hwdash plan``: built from the flags and a ``--from`` file.

:data:`FIELD_FLAGS` names the flag of each Plan field, so a refused value is said of the flag that
set it (or of the ``--from`` file that did); the framework's defaults fill in what the user did not
choose, and flags the plan's method ignores are warned about.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pydantic import ValidationError

from hwdash.core.estimator.savers import SAVER_FIELDS
from hwdash.core.numbers import validation_phrase
from hwdash.core.plan import Plan
from hwdash.core.plan_fields import (
    UNSET_UNLESS_GIVEN,  # None: the framework's default
    flag_spellings,
)
from hwdash.errors import UsageError

#: Plan field -> the flag that sets it (a switch: both forms, ``--compile/--no-compile``), to name
#: the flag in messages; the registry's spellings, so a new field needs no entry here.
FIELD_FLAGS: dict[str, str] = flag_spellings()


def unused_flag_warnings(plan: Plan, argv: list[str]) -> list[str]:
    """Warnings for typed flags the plan's method ignores (``--examples`` for inference...)."""
    from hwdash.core.plan_unused import unused_settings

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


def _split(values: list[str]) -> tuple[str, ...]:
    """Comma-separated values (of one flag or several) as a tuple, blanks and repeats dropped."""
    items: list[str] = []
    for value in values:
        items.extend(part.strip() for part in value.split(",") if part.strip())
    return tuple(dict.fromkeys(items))


def plan_from_args(args: argparse.Namespace) -> Plan:
    """Build and validate the plan; a bad value raises :class:`UsageError` naming its flag."""
    fields = _plan_fields(args, _model_from_args(args))
    try:
        return Plan(**fields)
    except ValidationError as exc:
        raise _usage_error(exc) from None


def _model_from_args(args: argparse.Namespace) -> str:
    """The model asked: ``--model`` (an id or a config.json path) or ``--params`` (a count)."""
    if args.model and args.params:
        raise UsageError("give --model or --params, not both", flag="--params")
    model: str = args.model or args.params
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
    return model


#: Megatron's settings whose flag's destination is the Plan field's own name.
_MEGATRON_SETTINGS = ("selective_recompute", "hidden_dropout", "optimizer_offload_fraction")


#: The serving plan's settings (``--engine`` and what it reads), flags named as the Plan fields.
_SERVING_SETTINGS = (
    "engine",
    "engine_version",
    "gpu_memory_utilization",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "kv_dtype",
)


def _plan_fields(args: argparse.Namespace, model: str) -> dict[str, Any]:
    """The Plan's fields from the parsed flags (the savers only where a flag was given)."""
    fields: dict[str, Any] = {
        "model": model,
        "method": args.method,
        "precision": args.precision,
        "batch": args.batch,
        "seq": args.seq,
        "grad_ckpt": args.grad_ckpt,
        "selective_ac": args.selective_ac,
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
        "output_tokens": args.output_tokens,
        "mfu": args.mfu,
        "flavors": _split(args.flavor),
        "budget": args.budget,
        "rl_method": args.rl_method,
        "rl_reference": not args.no_reference,
        "vllm_memory_utilization": args.vllm_util,
        "fsdp": args.fsdp,
        "fsdp_offload": args.fsdp_offload,
        "gpus_per_node": args.gpus_per_node,
        "nccl_buffsize": args.nccl_buffsize,
        "tp": args.tp,
        "pp": args.pp,
        "cp": args.cp,
        "sp_ulysses": args.sp_ulysses,
        "ep": args.ep,
        "sequence_parallel": not args.no_sequence_parallel,
        "images": args.images,
        "image_tokens": args.image_tokens,
        "quant": args.quant,
        "generation": args.generation,
    }
    # the serving settings (issue 30) and Megatron's: each flag's destination is the field's name
    fields.update({name: getattr(args, name) for name in (*_SERVING_SETTINGS, *_MEGATRON_SETTINGS)})
    if args.reward_model is not None:
        fields["rl_reward_model"] = args.reward_model
    fields["framework"] = args.framework
    fields["fsdp_version"] = args.fsdp_version
    for name in UNSET_UNLESS_GIVEN:
        if getattr(args, name) is not None:
            fields[name] = getattr(args, name)
    for name in SAVER_FIELDS:
        if getattr(args, name) is not None:
            fields[name] = getattr(args, name)
    return fields


def _usage_error(exc: ValidationError) -> UsageError:
    """The Plan's first refusal said of the flag that set the field (or that the text names)."""
    first = exc.errors()[0]
    loc = first["loc"]
    field = str(loc[0]) if loc else ""
    flag = FIELD_FLAGS.get(field)
    if flag is None:
        # model-level checks (offload needs ZeRO, ...) carry no field: name the flags from the text.
        message = str(first["msg"]).removeprefix("Value error, ")
        flag = _flag_from_message(message)
        if flag is not None:
            # the serving checks say "--flag: reason" (core.plan.Plan._check_serving)
            message = message.removeprefix(f"{flag}: ")
        return UsageError(message, flag=flag)
    value = first.get("input")
    shown = f"{value:g}" if isinstance(value, float) else str(value)
    return UsageError(f"{validation_phrase(first)}, got {shown}", flag=flag)


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


def blame_the_file(
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


def _flag_from_message(message: str) -> str | None:
    """The flag a model-level refusal is about, read from its text (None: no flag named)."""
    if message.startswith("--"):
        # the parallelism checks name their flag first (core.plan.Plan._check_parallelism)
        return message.split()[0].split("/")[0].rstrip(":")
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
