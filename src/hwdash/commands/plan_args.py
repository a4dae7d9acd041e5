"""A plan back to ``hwdash plan`` flags, so an option of ``--fit`` can be copied and re-run.

:func:`plan_arguments` writes only what differs from the defaults, in the order ``--help`` lists the
flags; parsing the result with ``hwdash plan``'s own parser gives the same plan back (a test checks
the round trip for generated plans).
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
from hwdash.core.specs import Framework


def _number(value: float) -> str:
    """``0.05`` and ``3`` as written, never ``3.0`` or ``5e-02``."""
    return repr(int(value)) if float(value).is_integer() else repr(float(value))


def plan_arguments(plan: Plan, framework: Framework | None = None) -> list[str]:
    """The ``hwdash plan`` arguments (without ``plan``) that build ``plan``. ``framework``: the
    catalog's entry for ``plan.framework`` (None: the packaged one), whose defaults the command
    line fills in where no flag is given: a setting that differs from them is written."""
    defaults = Plan(model=plan.model)
    if framework is None:
        framework = packaged_frameworks().get(plan.framework.value)
    try:
        filled: Plan | None = with_framework_defaults(plan, framework)
    except ValidationError:
        filled = None  # the framework's defaults do not fit this plan: write all its settings
    args: list[str] = ["--model", plan.model]

    def differs(name: str) -> bool:
        if name in FRAMEWORK_PLAN_FIELDS:
            # without its flag the command line takes the framework's default
            return filled is None or bool(getattr(plan, name) != getattr(filled, name))
        return bool(getattr(plan, name) != getattr(defaults, name))

    def value(name: str) -> Any:
        item = getattr(plan, name)
        return getattr(item, "value", item)

    # --method is always written: a copied line should say what it trains.
    args += ["--method", plan.method.value]
    simple = (
        ("precision", "--precision"),
        ("optimizer", "--optimizer"),
        ("optimizer_impl", "--optimizer-impl"),
        ("lora_r", "--lora-r"),
        ("batch", "--batch"),
        ("seq", "--seq"),
        ("grad_accum", "--grad-accum"),
        ("attention", "--attn"),
        ("zero", "--zero"),
        ("offload", "--offload"),
        ("gpus", "--gpus"),
        ("rl_method", "--rl-method"),
        ("fsdp", "--fsdp"),
        ("gpus_per_node", "--gpus-per-node"),
        ("tp", "--tp"),
        ("pp", "--pp"),
        ("quant", "--quant"),
        ("framework", "--framework"),
        ("loss", "--loss"),
        ("qlora_frozen_dtype", "--qlora-frozen-dtype"),
        ("adapter_dtype", "--adapter-dtype"),
        ("value_head", "--value-head"),
    )
    for name, flag in simple:
        if differs(name):
            args += [flag, str(value(name))]
    if differs("lora_targets"):
        args += ["--lora-targets", ",".join(plan.lora_targets)]
    if differs("lora_modules_to_save"):
        args += ["--lora-modules-to-save", ",".join(plan.lora_modules_to_save)]
    if differs("lora_dropout"):
        args += ["--lora-dropout", _number(plan.lora_dropout)]
    if differs("grad_ckpt"):
        args.append("--grad-ckpt" if plan.grad_ckpt else "--no-grad-ckpt")
    if plan.fsdp_offload:
        args.append("--fsdp-offload")
    if not plan.sequence_parallel:
        args.append("--no-sequence-parallel")
    if plan.selective_recompute:
        args.append("--selective-recompute")
    if differs("hidden_dropout"):
        args += ["--hidden-dropout", _number(plan.hidden_dropout)]
    for name, flag in (
        ("compile", "compile"),
        ("activation_offload", "activation-offload"),
        ("optimizer_in_backward", "optimizer-in-backward"),
        ("sync_each_batch", "sync-each-batch"),
    ):
        setting = getattr(plan, name)
        if setting is not None:
            args.append(f"--{flag}" if setting else f"--no-{flag}")
    if not plan.rl_reference:
        args.append("--no-reference")
    if differs("rl_reward_model"):
        args.append("--reward-model" if plan.rl_reward_model else "--no-reward-model")
    if differs("vllm_memory_utilization"):
        args += ["--vllm-util", _number(plan.vllm_memory_utilization)]
    if plan.examples is not None:
        args += ["--examples", str(plan.examples)]
    if differs("epochs"):
        args += ["--epochs", _number(plan.epochs)]
    if plan.tokens is not None:
        args += ["--tokens", str(plan.tokens)]
    if plan.mfu is not None:
        args += ["--mfu", _number(plan.mfu)]
    for flavor in plan.flavors:
        args += ["--flavor", flavor]
    return args
