"""Fit, time, cost and recommendation: a plan evaluated on every flavor of the catalog.

For each flavor the memory estimate is redone at that flavor's GPU count and accelerator (a 4-GPU
flavor shards ZeRO state 4 ways), compared with usable memory per GPU, and timed from FLOPs.

Hours and throughput come from :func:`hwdash.core.planning.run_time.estimate_run_time` (FLOPs or memory
bandwidth, times the catalog's ``[[slowdown]]`` factors the plan brings in).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from hwdash.core.catalog import Catalog
from hwdash.core.estimator import (
    QUANTIZED_METHODS,
    architecture,
    estimate_memory,
    resolve_lora_targets,
    resolve_top_level,
)
from hwdash.core.estimator.software import Software
from hwdash.core.models.config import resolve_model
from hwdash.core.plan import LORA_STYLE_METHODS, FsdpMode, Method, Offload, Plan
from hwdash.core.planning.budget import budget_warnings, price_run
from hwdash.core.planning.run_time import estimate_run_time
from hwdash.core.results import (
    TIGHT_HEADROOM_FRACTION,
    FitVerdict,
    FlavorFit,
    MemoryEstimate,
    PlanReport,
)
from hwdash.core.specs import Accelerator, Flavor, Framework, ModelSpec, Slowdown
from hwdash.core.units import GB
from hwdash.errors import UsageError

CPU_ONLY_REASON = (
    "CPU only: no GPU memory; training on CPU is not estimated (expect orders of magnitude slower)"
)
TPU_REASON = (
    "TPU: needs XLA/JAX (or torch_xla) code; the estimate assumes the same memory layout per chip"
)
UNIFIED_REASON = "Apple unified memory via MPS: no CUDA, no DeepSpeed, no vLLM; expect it slower"


def training_tokens(plan: Plan) -> int | None:
    """Tokens the plan trains on (or, for inference, generates): ``--tokens`` or examples x epochs x seq."""
    if plan.tokens is not None:
        return plan.tokens
    if plan.examples is not None and plan.is_training:
        return round(plan.examples * plan.epochs * plan.seq)
    return None


def fit_verdict(need: int, usable: int) -> FitVerdict:
    """The rule: ``no`` when the need exceeds usable memory (exactly full still fits, barely),
    ``tight`` when the headroom is under 10% of *usable* memory (a margin of the card, not of
    the need), else ``fits``."""
    headroom = usable - need
    if headroom < 0:
        return FitVerdict.NO
    if headroom < TIGHT_HEADROOM_FRACTION * usable:
        return FitVerdict.TIGHT
    return FitVerdict.FITS


def _unsupported_on(plan: Plan, accelerator: Accelerator) -> str | None:
    """Why a plan cannot run on this kind of hardware at all, or None."""
    method = plan.rl_method if plan.is_rl else plan.method
    if accelerator.kind == "unified":
        if method in QUANTIZED_METHODS:
            return "bitsandbytes 4/8-bit quantization needs CUDA: not on Apple MPS"
        if plan.zero or plan.offload is not Offload.NONE:
            return "DeepSpeed ZeRO needs CUDA: not on Apple MPS"
        if plan.is_rl and plan.vllm_memory_utilization > 0:
            return "vLLM colocation needs CUDA: not on Apple MPS (use --vllm-util 0)"
    if accelerator.kind == "tpu" and (method in QUANTIZED_METHODS or plan.zero):
        return "bitsandbytes and DeepSpeed need CUDA: not on TPU"
    return None


def evaluate_flavor(
    plan: Plan,
    model: ModelSpec,
    flavor: Flavor,
    accelerator: Accelerator | None,
    tokens: int | None,
    *,
    framework: Framework | None = None,
    slowdowns: Mapping[str, Slowdown] | None = None,
    software: Software | None = None,
) -> tuple[FlavorFit, MemoryEstimate]:
    """The plan on one flavor: fit, time and cost, and the estimate at the flavor's GPU count;
    ``framework``, ``slowdowns``, ``software``: the catalog's entries (None: the packaged ones).
    The verdict compares the whole GPU (what NVML shows) with the usable memory."""
    if accelerator is None or accelerator.kind == "cpu" or flavor.gpu_count == 0:
        estimate = estimate_memory(plan, model, gpus=1, framework=framework, software=software)
        fit = FlavorFit(
            flavor=flavor,
            accelerator=accelerator,
            verdict=FitVerdict.NO,
            need_bytes=estimate.per_gpu.total,
            usable_bytes=0,
            reason=CPU_ONLY_REASON,
        )
        return fit, estimate
    gpus = flavor.gpu_count
    estimate = estimate_memory(
        plan, model, gpus=gpus, accelerator=accelerator, framework=framework, software=software
    )
    need = estimate.whole_gpu_bytes
    usable = accelerator.usable_bytes
    verdict, reasons = _memory_verdict(need, usable, estimate.managed_bytes)
    refusals = _refusals(plan, flavor, accelerator, estimate)
    if refusals:
        verdict = FitVerdict.NO
    caveats = _platform_caveats(accelerator)
    timing = estimate_run_time(
        plan, model, accelerator, gpus, tokens, slowdowns=slowdowns, framework=framework
    )
    run_cost = price_run(timing.hours, flavor.price_per_hour, plan.budget)
    fit = FlavorFit(
        flavor=flavor,
        accelerator=accelerator,
        verdict=verdict,
        need_bytes=need,
        usable_bytes=usable,
        outside_allocator_bytes=need - estimate.reserved_bytes,
        reason="; ".join([*reasons, *refusals, *caveats, *run_cost.notes]),
        hours=timing.hours,
        cost=run_cost.cost,
        over_budget=run_cost.over_budget,
        tokens_per_second=timing.tokens_per_second,
        slowdowns=timing.slowdowns,
        refusals=tuple(refusals),
        caveats=(*caveats, *run_cost.notes),
        managed_bytes=estimate.managed_bytes,
    )
    return fit, estimate


def _platform_caveats(accelerator: Accelerator) -> list[str]:
    """What a fit on a TPU or on unified memory comes with."""
    if accelerator.kind == "tpu":
        return [TPU_REASON]
    if accelerator.kind == "unified":
        return [UNIFIED_REASON]
    return []


def rescaled_fit(fit: FlavorFit, need: int) -> FlavorFit:
    """``fit`` with another need per GPU (a measured allocator factor applied): the memory verdict
    and its reason recomputed; a refusal (:attr:`FlavorFit.refusals`) keeps it ``no``."""
    if not fit.usable_bytes:
        return dataclasses.replace(fit, need_bytes=need)
    verdict, reasons = _memory_verdict(need, fit.usable_bytes, fit.managed_bytes)
    if fit.refusals:
        verdict = FitVerdict.NO
    reason = "; ".join([*reasons, *fit.refusals, *fit.caveats])
    return dataclasses.replace(fit, need_bytes=need, verdict=verdict, reason=reason)


def _memory_verdict(need: int, usable: int, managed: int) -> tuple[FitVerdict, list[str]]:
    """The verdict on memory alone (:func:`fit_verdict`) and why it does not fit; ``managed``:
    the paged optimizer states' bytes in ``need``."""
    verdict = fit_verdict(need, usable)
    if verdict is FitVerdict.NO and managed and need - managed <= usable:
        # Paged optimizer states (CUDA managed memory) are evicted to host RAM when the GPU runs
        # short and paged back for the optimizer step (Dettmers et al. 2023, "QLoRA",
        # arXiv:2305.14314, section 2, "Paged Optimizers"): the run goes on, slower. Tight, not fits.
        return FitVerdict.TIGHT, [
            f"needs {need / 2**30:.1f} GiB per GPU, has {usable / 2**30:.1f} GiB: the paged "
            f"optimizer states ({managed / 2**30:.1f} GiB) spill to host RAM (slower)"
        ]
    if verdict is FitVerdict.NO:
        return verdict, [f"needs {need / 2**30:.1f} GiB per GPU, has {usable / 2**30:.1f} GiB"]
    return verdict, []


def _refusals(
    plan: Plan, flavor: Flavor, accelerator: Accelerator, estimate: MemoryEstimate
) -> list[str]:
    """Why the plan cannot run on the flavor whatever its memory: the GPU count against tp x pp,
    the hardware kind, vLLM's share, the host RAM that offload needs."""
    reasons: list[str] = []
    gpus = flavor.gpu_count
    model_parallel = plan.tp * plan.pp * plan.sequence_shards
    if gpus % model_parallel:
        words = "tp x pp" + (" x cp" if plan.cp > 1 else " x sp" if plan.sp_ulysses > 1 else "")
        reasons.append(f"{gpus} GPUs is not a multiple of {words} = {model_parallel}")
    elif gpus % (plan.tp * plan.pp * plan.ep):
        reasons.append(f"{gpus} GPUs is not a multiple of tp x ep x pp")
    unsupported = _unsupported_on(plan, accelerator)
    if unsupported is not None:
        reasons.append(unsupported)
    if any(warning.startswith("vLLM's") for warning in estimate.warnings):
        # vLLM refuses to start when its share cannot hold the weights and some KV cache.
        reasons.append("the vLLM share is smaller than its weights + KV cache (raise --vllm-util)")
    if flavor.ram_gb is not None and estimate.host_bytes > flavor.ram_gb * GB:
        reasons.append(
            f"offload needs {estimate.host_bytes / GB:.0f} GB host RAM, the flavor has {flavor.ram_gb:g} GB"
        )
    return reasons


def _sort_key(fit: FlavorFit) -> tuple[int, float, int, str]:
    """Cheapest first: priced flavors with a total cost by that cost, then priced flavors without
    one (hours unknown, or CPU-only) by $/hour, then the unpriced (local) ones by id. Equal costs
    (4 GPUs at 4x the price and 4x the speed) go to the flavor with fewer GPUs."""
    price = fit.flavor.price_per_hour
    if price is None:
        return (2, 0.0, fit.flavor.gpu_count, fit.flavor.id)
    if fit.cost is None:
        return (1, price, fit.flavor.gpu_count, fit.flavor.id)
    return (0, round(fit.cost, 6), fit.flavor.gpu_count, fit.flavor.id)


def _recommendable(fit: FlavorFit) -> bool:
    """Fits, is not over the budget (``--budget``), and runs the usual CUDA stack (TPUs need
    other code; CPU never)."""
    return (
        fit.verdict is FitVerdict.FITS
        and fit.over_budget is not True
        and fit.accelerator is not None
        and fit.accelerator.kind in ("gpu", "unified")
    )


def recommend(fits: list[FlavorFit]) -> tuple[str | None, str | None]:
    """The cheapest and the fastest flavor that fits (``fits`` verdict, not ``tight``), within
    the budget when the plan has one.

    Cheapest: among priced flavors by total cost when hours are known, else by $/hour. Local
    flavors have no price; one is recommended only when no priced flavor fits (the fastest of
    them), since "cheapest" means nothing without a price. Fastest: fewest hours, else the highest
    tokens/s.
    """
    candidates = [fit for fit in fits if _recommendable(fit)]
    if not candidates:
        return None, None

    def speed(fit: FlavorFit) -> float:
        return fit.tokens_per_second or 0.0

    priced = [fit for fit in candidates if fit.flavor.price_per_hour is not None]
    if priced:
        cheapest = min(priced, key=lambda fit: (_sort_key(fit), -speed(fit))).flavor.id
    else:
        cheapest = max(candidates, key=speed).flavor.id
    fastest = max(candidates, key=lambda fit: (speed(fit), -_sort_key(fit)[1])).flavor.id
    return cheapest, fastest


def check_plan_for_model(plan: Plan, model: ModelSpec) -> None:
    """Reject what the model cannot do, naming the flag: LoRA on modules it does not have
    (``--lora-targets``), or a rank wider than an adapted matrix (``--lora-r``)."""
    method = plan.rl_method if plan.is_rl else plan.method
    _check_model_parallel(plan, model)
    if model.checkpoint_bits is not None and method is Method.FULL:
        raise UsageError(
            f"{model.name} is a {model.checkpoint_bits}-bit checkpoint: full fine-tuning cannot "
            "update quantized weights (train adapters: lora, qlora)",
            flag="--method",
        )
    if method not in LORA_STYLE_METHODS:
        return
    arch = architecture(model)
    try:
        targets = resolve_lora_targets(arch, plan.lora_targets)
    except ValueError as exc:
        raise UsageError(str(exc), flag="--lora-targets") from None
    try:
        resolve_top_level(arch, plan.lora_modules_to_save)
    except ValueError as exc:
        raise UsageError(str(exc), flag="--lora-modules-to-save") from None
    both = set(resolve_top_level(arch, plan.lora_modules_to_save)) & set(
        resolve_top_level(arch, plan.lora_targets, strict=False)
    )
    outside = resolve_top_level(arch, plan.lora_modules_to_save) + resolve_top_level(
        arch, plan.lora_targets, strict=False
    )
    if outside and plan.fsdp is not FsdpMode.NONE:
        raise UsageError(
            "LoRA on the embedding or LM head and --lora-modules-to-save are not counted under "
            "--fsdp (hwdash.core.estimator.parallelism); plan them with DeepSpeed --zero or one GPU",
            flag="--lora-modules-to-save" if plan.lora_modules_to_save else "--lora-targets",
        )
    if both:
        # PEFT wraps a module named in modules_to_save and never adapts it as well
        # (check_target_module_exists, peft/tuners/tuners_utils.py)
        raise UsageError(
            f"the {' and '.join(sorted(both))} is both a LoRA target and trained in full: "
            "give it to one of --lora-targets and --lora-modules-to-save",
            flag="--lora-modules-to-save",
        )
    # a one-output gate (Qwen MoE's shared_expert_gate) takes any rank in PEFT: not a limit
    widths = [min(t.in_features, t.out_features) for t in targets]
    narrowest = min([width for width in widths if width > 1] or widths)
    if plan.lora_r > narrowest:
        raise UsageError(
            f"rank {plan.lora_r} is wider than {model.name}'s narrowest adapted matrix ({narrowest})",
            flag="--lora-r",
        )


def _check_model_parallel(plan: Plan, model: ModelSpec) -> None:
    """Megatron splits the heads (and KV heads) over ``--tp`` and the layers over ``--pp``
    (``megatron/training/arguments.py`` asserts both divisions)."""
    for heads, what in ((model.heads, "attention heads"), (model.kv_heads, "KV heads")):
        if heads % plan.tp:
            raise UsageError(
                f"{model.name} has {heads} {what}, not divisible by --tp {plan.tp}", flag="--tp"
            )
    if model.layers % plan.pp:
        raise UsageError(
            f"{model.name} has {model.layers} layers, not divisible by --pp {plan.pp}", flag="--pp"
        )
    _check_long_context(plan, model)


def _check_long_context(plan: Plan, model: ModelSpec) -> None:
    """DeepSpeed-Ulysses splits the heads (and KV heads) over ``--sp-ulysses`` (Jacobs et al.
    2023, section 3); Megatron splits the experts over ``--ep`` (``megatron/training/arguments.py``:
    num-experts a multiple of the expert-model-parallel size)."""
    if plan.sp_ulysses > 1:
        for heads, what in ((model.heads, "attention heads"), (model.kv_heads, "KV heads")):
            if heads % plan.sp_ulysses:
                raise UsageError(
                    f"{model.name} has {heads} {what}, not divisible by --sp-ulysses "
                    f"{plan.sp_ulysses}",
                    flag="--sp-ulysses",
                )
    if plan.ep > 1:
        if model.experts <= 1:
            raise UsageError(f"{model.name} has no experts: --ep needs a MoE model", flag="--ep")
        if model.experts % plan.ep:
            raise UsageError(
                f"{model.name} has {model.experts} experts, not divisible by --ep {plan.ep}",
                flag="--ep",
            )


def evaluate_plan(plan: Plan, catalog: Catalog, model: ModelSpec | None = None) -> PlanReport:
    """The full report: the plan's own breakdown at ``plan.gpus``, and every (or the chosen) flavor.

    Raises :class:`UsageError` naming the flag for an unknown model or flavor, and for what the model
    cannot do (:func:`check_plan_for_model`).
    """
    if model is None:
        model = resolve_model(plan.model, catalog)
    check_plan_for_model(plan, model)
    flavors = _chosen_flavors(plan, catalog)
    # The plan's own breakdown is hardware-neutral, unless --flavor names hardware: then it uses the
    # first named flavor's accelerator (its bf16 support, a vLLM engine's share of its memory).
    breakdown_accelerator = catalog.accelerator_for(flavors[0]) if plan.flavors else None
    if breakdown_accelerator is not None and breakdown_accelerator.kind == "cpu":
        breakdown_accelerator = None
    # The savers' defaults come from the catalog's entry for the framework (a user catalog may
    # override the packaged frameworks.toml).
    framework = catalog.framework_for(plan)
    estimate = estimate_memory(
        plan,
        model,
        gpus=plan.gpus,
        accelerator=breakdown_accelerator,
        framework=framework,
        software=catalog.software,
    )
    tokens = training_tokens(plan)
    fits = [
        evaluate_flavor(
            plan,
            model,
            flavor,
            catalog.accelerator_for(flavor),
            tokens,
            framework=framework,
            slowdowns=catalog.slowdowns,
            software=catalog.software,
        )[0]
        for flavor in flavors
    ]
    fits.sort(key=_sort_key)
    recommended, fastest = recommend(fits)
    warnings = _report_warnings(plan, estimate, tokens, fits, recommended)
    return PlanReport(
        plan=plan,
        model=model,
        estimate=estimate,
        flavors=tuple(fits),
        recommended=recommended,
        fastest=fastest,
        tokens=tokens,
        warnings=warnings,
        framework=framework,
    )


def _chosen_flavors(plan: Plan, catalog: Catalog) -> list[Flavor]:
    """The flavors ``--flavor`` names (a UsageError for an unknown one), else every flavor."""
    if not plan.flavors:
        return list(catalog.flavors.values())
    unknown = [ident for ident in plan.flavors if ident not in catalog.flavors]
    if unknown:
        known = ", ".join(sorted(catalog.flavors)[:12])
        raise UsageError(
            f"unknown flavor {', '.join(repr(u) for u in unknown)} (known: {known}, ...; "
            "see `hwdash catalog list --kind flavors`)",
            flag="--flavor",
        )
    return [catalog.flavors[ident] for ident in plan.flavors]


def _report_warnings(
    plan: Plan,
    estimate: MemoryEstimate,
    tokens: int | None,
    fits: list[FlavorFit],
    recommended: str | None,
) -> tuple[str, ...]:
    """The estimate's warnings, then the report's own (RL time, no hours, nothing fits), once each."""
    warnings = list(estimate.warnings)
    if plan.is_rl:
        warnings.append(
            "RL time counts FLOPs only; generation is memory-bandwidth bound, so hours are a lower bound"
        )
    if tokens is None and plan.is_training:
        warnings.append(
            "no --examples/--tokens: hours and cost are not estimated; flavors sorted by $/hour"
        )
    if not any(fit.verdict is not FitVerdict.NO for fit in fits) and fits:
        warnings.append(
            "no flavor fits: try --grad-ckpt, a smaller --batch/--seq, LoRA/QLoRA or ZeRO"
        )
    elif (
        recommended is None
        and any(fit.verdict is FitVerdict.TIGHT for fit in fits)
        and not any(fit.over_budget and fit.verdict is FitVerdict.FITS for fit in fits)
    ):  # (flavors that fit but cost over --budget: the budget's warning says why none)
        warnings.append(
            "only tight fits (under 10% headroom): none recommended; a longer batch or a memory "
            "spike may OOM there"
        )
    warnings += budget_warnings(plan.budget, fits, recommended)
    return tuple(dict.fromkeys(warnings))
