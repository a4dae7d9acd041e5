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
from hwdash.core.estimator.serving import ServingMemory, ServingSettings, serving_memory
from hwdash.core.estimator.serving_images import request_images, request_tokens, with_images
from hwdash.core.plan import Engine, EngineVersion, Plan, Precision, Quant
from hwdash.core.planning.max_fit import MaxField, MaxFit
from hwdash.core.results import FitVerdict, PlanReport
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


def serving_on_flavors(
    report: PlanReport, settings: ServingSettings, catalog: Any
) -> tuple[PlanReport, dict[str, ServingMemory]]:
    """The report with each GPU flavor's verdict a serving plan's (fits when the pool holds one
    ``max_model_len`` sequence on the flavor's GPUs, split ``tp`` ways), and each one's memory."""
    memories: dict[str, ServingMemory] = {}
    fits = []
    for fit in report.flavors:
        accelerator = fit.accelerator
        if accelerator is None or accelerator.kind != "gpu" or fit.flavor.gpu_count < settings.tp:
            fits.append(fit)
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
        fits.append(dataclasses.replace(fit, verdict=verdict, reason=reason))
    fitting = [fit.flavor.id for fit in fits if fit.verdict is FitVerdict.FITS]
    # the table is cheapest first: the recommendation is the first flavor that still fits
    recommended = fitting[0] if fitting else None
    fastest = report.fastest if report.fastest in fitting else None
    changed = dataclasses.replace(
        report, flavors=tuple(fits), recommended=recommended, fastest=fastest
    )
    return changed, memories


def shown_flavor(plan: Plan, memories: dict[str, ServingMemory]) -> str | None:
    """The flavor whose serving memory a report shows: the first ``--flavor`` the engine runs on,
    else the first GPU flavor of the table (None: no GPU flavor holds the plan's TP)."""
    wanted = [flavor for flavor in plan.flavors if flavor in memories] or list(memories)
    return wanted[0] if wanted else None


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


def max_concurrency_by_flavor(report: PlanReport, catalog: Any) -> dict[str, MaxFit]:
    """:func:`max_concurrency` on every GPU flavor the serving plan runs on (the planner's "max"
    column); empty for a plan that is not a serving plan."""
    settings = serving_settings(report.plan, report.model)
    if settings is None:
        return {}
    return {
        flavor: max_concurrency(report, flavor, memory)
        for flavor, memory in serving_on_flavors(report, settings, catalog)[1].items()
    }
