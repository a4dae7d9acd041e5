"""``--max seq|batch|gpus`` for a serving plan (``--engine vllm|sglang``), answered by the engine's
own memory (:mod:`hwdash.core.estimator.serving`) rather than one ``generate`` call's:

* ``seq``: the longest ``--max-model-len`` the engine starts with on the flavor. The engine refuses
  to start when its KV pool cannot hold one request of that length (vLLM:
  ``vllm/v1/core/kv_cache_utils.py`` ``check_enough_kv_cache_memory``, "max seq len ... is larger
  than the maximum number of tokens that can be stored in KV cache"; SGLang sizes its token pool
  the same way). The pool shrinks with the length only where the profile run covers it (vLLM V0)
  or the request's images; the search is a bisection over 1 .. the model's context.
* ``batch``: a server's batch is the sequences it runs at once, so the answer is
  ``--max concurrency``'s (the whole ``--max-model-len`` requests the pool holds).
* ``gpus``: the fewest tensor-parallel GPUs of the flavor's kind whose engine starts, trying only
  sizes that divide the attention heads (vLLM's ``ModelConfig.verify_with_parallel_config``: "Total
  number of attention heads must be divisible by tensor parallel size").
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hwdash.core.estimator.serving import ServingMemory, ServingSettings
from hwdash.core.planning.max_fit import MaxField, MaxFit, last_holding, with_gpu_count
from hwdash.core.planning.serving_plan import (
    engine_total_bytes,
    max_concurrency,
    memory_on,
    serving_on_flavors,
    serving_settings,
)
from hwdash.core.results import FitVerdict, FlavorFit, PlanReport


def serving_max(
    report: PlanReport,
    settings: ServingSettings,
    target: str,
    field: MaxField,
    catalog: Any,
    memory: ServingMemory,
) -> MaxFit:
    """``--max FIELD`` for the serving plan of ``report`` on ``target`` (module docstring);
    ``memory``: the engine's memory there at the plan's settings."""
    if field is MaxField.CONCURRENCY:
        return max_concurrency(report, target, memory)
    if field is MaxField.BATCH:
        answer = max_concurrency(report, target, memory)
        return dataclasses.replace(answer, field=field, words=_SEQUENCES_AT_ONCE)
    fit = next(fit for fit in report.flavors if fit.flavor.id == target)
    if field is MaxField.SEQ:
        return _longest_model_len(report, settings, fit, catalog)
    return _fewest_gpus(report, settings, fit, catalog)


#: How the answer of ``--max batch`` on a serving plan reads (its batch is its concurrency).
_SEQUENCES_AT_ONCE = "largest --batch (a server's: --max-model-len requests at once)"


def _at(fit: FlavorFit, memory: ServingMemory) -> FlavorFit:
    """``fit`` with the engine's need and verdict at ``memory``'s settings; its headroom the KV
    pool's leftover after one request when the engine starts (what a longer request would need)."""
    if not memory.fits:
        need = engine_total_bytes(memory)
        return dataclasses.replace(fit, need_bytes=need, verdict=FitVerdict.NO)
    leftover = memory.kv_cache_bytes - memory.request_bytes
    return dataclasses.replace(
        fit, need_bytes=fit.usable_bytes - leftover, verdict=FitVerdict.FITS, reason=""
    )


def _longest_model_len(
    report: PlanReport, settings: ServingSettings, fit: FlavorFit, catalog: Any
) -> MaxFit:
    """The longest ``max_model_len`` whose engine starts on ``fit``'s flavor (bisection)."""
    bound = report.model.max_context

    def memory_at(length: int) -> ServingMemory:
        changed = dataclasses.replace(settings, max_model_len=length)
        return memory_on(report, changed, fit.accelerator, catalog)

    def answer(value: int | None, length: int, bounded_by: str | None = None) -> MaxFit:
        return MaxFit(
            field=MaxField.SEQ,
            target=fit.flavor.id,
            value=value,
            fit=_at(fit, memory_at(length)),
            bound=bound,
            bounded_by=bounded_by,
            plan_seq=settings.max_model_len,
            words="longest --max-model-len",
        )

    if not memory_at(1).fits:
        return answer(None, 1)
    if memory_at(bound).fits:
        return answer(bound, bound, f"the model's context ({bound})")
    longest = last_holding(1, bound, lambda length: memory_at(length).fits)
    return answer(longest, longest)


def _fewest_gpus(
    report: PlanReport, settings: ServingSettings, fit: FlavorFit, catalog: Any
) -> MaxFit:
    """The fewest TP GPUs (up to the flavor's count) whose engine starts; None when even the
    flavor's own count (or the largest size that divides the heads) does not."""
    heads = report.model.heads
    sizes = [tp for tp in range(1, fit.flavor.gpu_count + 1) if heads % tp == 0]
    name = fit.accelerator.name if fit.accelerator is not None else ""
    last = None
    for tp in sizes:
        memory = memory_on(report, dataclasses.replace(settings, tp=tp), fit.accelerator, catalog)
        last = dataclasses.replace(_at(fit, memory), flavor=with_gpu_count(fit.flavor, tp))
        if memory.fits:
            return MaxFit(
                field=MaxField.GPUS,
                target=fit.flavor.id,
                value=tp,
                fit=last,
                accelerator_name=name,
                flavor_gpus=fit.flavor.gpu_count,
            )
    return MaxFit(
        field=MaxField.GPUS,
        target=fit.flavor.id,
        value=None,
        fit=last if last is not None else fit,
        accelerator_name=name,
        flavor_gpus=fit.flavor.gpu_count,
    )


def serving_max_by_flavor(report: PlanReport, field: MaxField, catalog: Any) -> dict[str, MaxFit]:
    """:func:`serving_max` on every GPU flavor the serving plan runs on (the planner's "max"
    column); empty for a plan that is not a serving plan."""
    settings = serving_settings(report.plan, report.model)
    if settings is None:
        return {}
    report, memories = serving_on_flavors(report, settings, catalog)
    return {
        flavor: serving_max(report, settings, flavor, field, catalog, memory)
        for flavor, memory in memories.items()
    }
