"""A serving plan (``--method inference --engine vllm|sglang``) on the catalog's flavors: the engine's
settings read from the :class:`~hwdash.core.plan.Plan`, its KV pool on each GPU flavor and the
flavor table's serving verdicts (a serving plan fits a flavor when its KV pool holds one
``max_model_len`` sequence).

The memory model is :mod:`hwdash.core.estimator.serving` (each step cited there from the engines'
own code); ``hwdash plan`` (:mod:`hwdash.commands.plan_serving`) and the planner pane both read it
through this module.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hwdash.core.estimator.architecture import architecture
from hwdash.core.estimator.serving import (
    ServingMemory,
    ServingSettings,
    counted_tp_buffers,
    serving_memory,
)
from hwdash.core.estimator.serving_images import request_images, request_tokens, with_images
from hwdash.core.plan import Engine, EngineVersion, Plan, Precision, Quant
from hwdash.core.planning.max_fit import MaxField, MaxFit
from hwdash.core.results import FitVerdict, FlavorFit, MemoryBreakdown, MemoryEstimate, PlanReport
from hwdash.core.specs import ModelSpec

#: Bits per weight of a ``--quant`` load (None: as the checkpoint stores it).
QUANT_BITS = {Quant.NF4: 4, Quant.GPTQ_4: 4, Quant.AWQ_4: 4, Quant.INT8: 8}


def serving_settings(plan: Plan, model: ModelSpec | None = None) -> ServingSettings | None:
    """The serving settings ``plan`` asks for (None: not a serving plan); the Plan checked them.
    With ``model``, a request's length (``max_model_len`` unless given) counts its images' tokens
    (:func:`~hwdash.core.estimator.serving_images.request_tokens`)."""
    if not plan.is_serving:
        return None
    images = request_images(plan, model) if model is not None else None
    engine_id = plan.engine.value
    if plan.engine is Engine.VLLM and plan.engine_version is EngineVersion.V0:
        engine_id = "vllm-v0"  # catalog/engines.toml's row for the V0 engine
    return ServingSettings(
        engine=engine_id,
        max_model_len=request_tokens(plan, images, plan.max_model_len),
        gpu_memory_utilization=plan.gpu_memory_utilization,
        max_num_seqs=plan.max_num_seqs,
        max_num_batched_tokens=plan.max_num_batched_tokens,
        kv_dtype=plan.kv_dtype,
        tp=plan.gpus,
        quant_bits=QUANT_BITS.get(plan.quant),
    )


def memory_on(
    report: PlanReport, settings: ServingSettings, accelerator: Any, catalog: Any
) -> ServingMemory:
    """The engine's memory on one GPU of ``accelerator``."""
    element = 4 if report.plan.precision is Precision.FP32 else 2
    memory = serving_memory(
        architecture(report.model),
        accelerator,
        settings,
        element_bytes=element,
        software=catalog.software,
        engines=catalog.engines or None,
    )
    # a plan with --images: the encoder's profile taken from the pool (serving_images.py)
    return with_images(memory, request_images(report.plan, report.model), element)


#: The peak phase a serving plan's memory names: the engine's state once its KV pool is sized.
PHASE_SERVING = "serving (engine start-up)"


def outside_budget_bytes(memory: ServingMemory) -> int:
    """What the engine holds on one GPU beside its budget: the CUDA-graph pool captured after the
    KV cache is sized, the CUDA context where the baseline snapshot comes after it (vLLM V1:
    ``context_bytes``, :mod:`hwdash.core.estimator.serving`; V0 and SGLang count it inside), and
    the part of a TP rank's communicator buffers its budget does not count (``tp_buffers``: all
    of them for vLLM V1 since PR 25359, none for V0, ``1 - fraction`` of them for SGLang;
    :func:`~hwdash.core.estimator.serving.counted_tp_buffers`)."""
    return memory.cuda_graph_bytes + memory.context_bytes + uncounted_tp_buffers(memory)


def uncounted_tp_buffers(memory: ServingMemory) -> int:
    """The part of a TP rank's communicator buffers the engine's budget does not count."""
    buffers = memory.tp_buffer_bytes
    return buffers - counted_tp_buffers(memory.engine, buffers, memory.fraction)


def engine_total_bytes(memory: ServingMemory) -> int:
    """What the engine takes on one GPU: its budget (``fraction x`` CUDA's total: the weights, the
    profile run's activation peak, non-torch memory and the KV pool) and what it holds outside it
    (:func:`outside_budget_bytes`: the CUDA-graph pool, V1's CUDA context, uncounted TP buffers;
    :mod:`hwdash.core.estimator.serving`). When the weights and the profile leave no pool, what
    they need (above the budget: the engine refuses to start)."""
    inside = memory.weight_bytes + memory.activation_bytes + memory.non_torch_bytes
    return max(memory.budget_bytes, inside + memory.kv_cache_bytes) + outside_budget_bytes(memory)


def engine_estimate(estimate: MemoryEstimate, memory: ServingMemory) -> MemoryEstimate:
    """``estimate`` (one ``generate`` call's) with its per-GPU memory the engine's on one flavor:
    weights (TP-sharded), the profile run's activation peak, the KV pool as ``kv_cache``, and
    non-torch memory with what is outside the budget (the CUDA-graph pool, V1's CUDA context,
    uncounted TP buffers) as ``overhead``; the total is
    :func:`engine_total_bytes`. torch's allocated peak is its tensors (weights, activations,
    pool), the reserved one adds the graph pool (torch's graph memory pool, ``vllm/v1/worker/
    gpu_model_runner.py`` ``capture_model``). Parameters, dtype and warnings stay the
    estimate's."""
    overhead = engine_total_bytes(memory) - (
        memory.weight_bytes + memory.activation_bytes + memory.kv_cache_bytes
    )
    per_gpu = MemoryBreakdown(
        weights=memory.weight_bytes,
        activations=memory.activation_bytes,
        kv_cache=memory.kv_cache_bytes,
        overhead=overhead,
    )
    allocated = memory.weight_bytes + memory.activation_bytes + memory.kv_cache_bytes
    profile = (
        f"profile run's activation peak ({memory.profile_tokens:,} tokens)"
        if memory.profile_tokens
        else "activations (no profile run)"
    )
    details: tuple[tuple[str, int], ...] = (
        (f"weights (TP {memory.settings.tp})", memory.weight_bytes),
        (profile, memory.activation_bytes),
        ("non-torch memory", memory.non_torch_bytes),
        (f"KV cache pool ({memory.kv_blocks:,} blocks)", memory.kv_cache_bytes),
        ("CUDA graphs (outside the budget)", memory.cuda_graph_bytes),
    )
    if memory.context_bytes:
        details += (("CUDA context (outside the budget)", memory.context_bytes),)
    uncounted = uncounted_tp_buffers(memory)
    if uncounted:
        details += (("TP communicator buffers (outside the budget)", uncounted),)
    return dataclasses.replace(
        estimate,
        per_gpu=per_gpu,
        gpus=memory.settings.tp,
        managed_bytes=0,
        host_bytes=0,
        peak_phase=PHASE_SERVING,
        details=details,
        allocated_bytes=allocated,
        reserved_bytes=allocated + memory.cuda_graph_bytes,
    )


def engine_json(memory: ServingMemory) -> dict[str, int | float]:
    """The JSON ``serving`` object's keys beside issue 30's fixed five: the parts of the engine's
    memory on the shown flavor, per GPU (``total_bytes`` is ``memory.total``)."""
    return {
        "memory_fraction": memory.fraction,
        "cuda_total_bytes": memory.total_bytes,
        "budget_bytes": memory.budget_bytes,
        "weight_bytes": memory.weight_bytes,
        "activation_bytes": memory.activation_bytes,
        "non_torch_bytes": memory.non_torch_bytes,
        "cuda_graph_bytes": memory.cuda_graph_bytes,
        "context_bytes": memory.context_bytes,
        "outside_budget_bytes": outside_budget_bytes(memory),
        "total_bytes": engine_total_bytes(memory),
    }


def with_engine_estimate(
    report: PlanReport, memories: dict[str, ServingMemory], flavor_id: str | None
) -> PlanReport:
    """``report`` with its estimate the engine's on ``flavor_id`` (:func:`engine_estimate`);
    unchanged when no flavor is shown (no GPU flavor holds the plan's TP)."""
    if flavor_id is None or flavor_id not in memories:
        return report
    return dataclasses.replace(
        report, estimate=engine_estimate(report.estimate, memories[flavor_id])
    )


def serving_on_flavors(
    report: PlanReport, settings: ServingSettings, catalog: Any
) -> tuple[PlanReport, dict[str, ServingMemory]]:
    """The report with each GPU flavor's verdict a serving plan's (fits when the pool holds one
    ``max_model_len`` sequence on the flavor's GPUs, split ``tp`` ways) and its need what the
    engine takes there (:func:`engine_total_bytes`), and each one's memory."""
    memories: dict[str, ServingMemory] = {}
    fits = []
    for fit in report.flavors:
        accelerator = fit.accelerator
        if accelerator is None or accelerator.kind != "gpu":
            fits.append(fit)
            continue
        if fit.flavor.gpu_count < settings.tp:
            # the engine's tensor-parallel group needs --gpus GPUs on one flavor
            reason = (
                f"TP {settings.tp} needs {settings.tp} GPUs, the flavor has {fit.flavor.gpu_count}"
            )
            fits.append(dataclasses.replace(fit, verdict=FitVerdict.NO, reason=reason))
            continue
        memory = memory_on(report, settings, accelerator, catalog)
        memories[fit.flavor.id] = memory
        verdict = FitVerdict.FITS if memory.fits else FitVerdict.NO
        reason = (
            f"serving: {memory.max_concurrency:.2f}x {settings.max_model_len:,}-token sequences"
            if memory.fits
            else f"KV pool holds {memory.kv_tokens:,} tokens, under one --max-model-len "
            f"{settings.max_model_len:,} sequence"
        )
        need = engine_total_bytes(memory)
        fits.append(dataclasses.replace(fit, verdict=verdict, reason=reason, need_bytes=need))
    fitting = [fit.flavor.id for fit in fits if fit.verdict is FitVerdict.FITS]
    # the table is cheapest first: the recommendation is the first flavor that still fits
    recommended = fitting[0] if fitting else None
    fastest = report.fastest if report.fastest in fitting else None
    changed = dataclasses.replace(
        report, flavors=tuple(fits), recommended=recommended, fastest=fastest
    )
    return changed, memories


def shown_flavor(
    plan: Plan, memories: dict[str, ServingMemory], recommended: str | None = None
) -> str | None:
    """The flavor whose serving memory a report shows: the first ``--flavor`` the engine runs on,
    else the ``recommended`` one (the cheapest the engine starts on), else the first GPU flavor of
    the table (None: no GPU flavor holds the plan's TP). The planner's :func:`serving_flavor`
    picks by the same order."""
    wanted = [flavor for flavor in plan.flavors if flavor in memories]
    if not wanted and recommended in memories:
        wanted = [recommended]
    wanted = wanted or list(memories)
    return wanted[0] if wanted else None


def serving_flavor(report: PlanReport, tp: int) -> FlavorFit | None:
    """The flavor the planner's serving lines, its memory and a saved serving plan's summary are
    about: the plan's first ``--flavor`` with ``tp`` GPUs, else the recommended one, else the first
    GPU flavor of the table with ``tp`` GPUs (None: none has)."""
    runs = [
        fit
        for fit in report.flavors
        if fit.accelerator is not None
        and fit.accelerator.kind == "gpu"
        and fit.flavor.gpu_count >= tp
    ]
    for wanted in (*report.plan.flavors, report.recommended):
        found = next((fit for fit in runs if fit.flavor.id == wanted), None)
        if found is not None:
            return found
    return runs[0] if runs else None


def engine_report(report: PlanReport, catalog: Any) -> PlanReport:
    """A serving plan's report as the planner shows it: the flavors' verdicts and needs the
    engine's (:func:`serving_on_flavors`) and the estimate the engine's on :func:`serving_flavor`
    (:func:`with_engine_estimate`); ``report`` itself for a plan that is not a serving plan."""
    settings = serving_settings(report.plan, report.model)
    if settings is None:
        return report
    report, memories = serving_on_flavors(report, settings, catalog)
    shown = serving_flavor(report, settings.tp)
    return with_engine_estimate(report, memories, None if shown is None else shown.flavor.id)


def max_concurrency(report: PlanReport, target: str, memory: ServingMemory) -> MaxFit:
    """``--max concurrency`` for a serving plan: the whole ``--max-model-len`` sequences the KV
    pool holds at once on ``target`` (vLLM's "Maximum concurrency", rounded down), with the pool's
    leftover as the headroom."""
    fit = next(fit for fit in report.flavors if fit.flavor.id == target)
    length = memory.settings.max_model_len
    value = memory.whole_requests
    leftover = memory.kv_cache_bytes - value * memory.request_bytes
    # the flavor's fit at the answer, its headroom the pool's leftover (one GPU's bytes)
    at_answer = dataclasses.replace(fit, need_bytes=fit.usable_bytes - leftover)
    return MaxFit(
        field=MaxField.CONCURRENCY,
        target=target,
        value=value or None,
        fit=at_answer,
        plan_seq=length,
        accelerator_name=fit.accelerator.name if fit.accelerator is not None else "",
        flavor_gpus=fit.flavor.gpu_count,
    )
