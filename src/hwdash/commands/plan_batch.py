"""A serving plan's batch job (``--examples`` requests, ``--output-tokens`` generated each): the
flags checked, each flavor's hours and cost, and the first flavor's JSON ``serving.batch`` and
text line. The time model is :mod:`hwdash.core.planning.serving_time`."""

from __future__ import annotations

import dataclasses
import math

from hwdash.core.estimator.architecture import architecture
from hwdash.core.estimator.serving import ServingMemory, ServingSettings
from hwdash.core.plan import Method, Plan, Precision
from hwdash.core.planning.budget import NEEDS_DATA_SIZE, budget_warnings, price_run
from hwdash.core.planning.serving_time import BatchJob, BatchTime, batch_time
from hwdash.core.results import FlavorFit, PlanReport
from hwdash.errors import UsageError


def batch_job(plan: Plan, settings: ServingSettings | None) -> BatchJob | None:
    """The serving plan's batch job (``--examples`` requests of ``--seq`` tokens, the last
    ``--output-tokens`` of them generated), checked; None without ``--examples``."""
    if settings is None:
        if plan.method is Method.INFERENCE and plan.output_tokens is not None:
            raise UsageError(
                "needs --engine vllm or sglang (a serving plan)", flag="--output-tokens"
            )
        return None
    if plan.examples is None:
        return None
    if plan.output_tokens is None:
        raise UsageError(
            "a serving plan's batch job of --examples requests needs the tokens each generates: "
            "add --output-tokens M (the prompt is --seq minus M)",
            flag="--output-tokens",
        )
    if plan.seq > settings.max_model_len:
        raise UsageError(
            f"the batch job's requests are --seq {plan.seq:,} tokens, above --max-model-len "
            f"{settings.max_model_len:,}: the engine would refuse them",
            flag="--max-model-len",
        )
    return BatchJob(plan.examples, plan.seq - plan.output_tokens, plan.output_tokens)


def flavor_batch_time(
    report: PlanReport, fit: FlavorFit, memory: ServingMemory
) -> BatchTime | None:
    """The batch job on one flavor (None: no job, no accelerator or no rates): its GPUs run
    ``gpu_count // tp`` engines side by side, each with an equal share of the requests (rounded
    up); the time is one engine's share, the throughput all the engines'."""
    plan = report.plan
    job = batch_job(plan, memory.settings)
    if job is None or fit.accelerator is None:
        return None
    engines = max(1, fit.flavor.gpu_count // memory.settings.tp)
    share = dataclasses.replace(job, requests=math.ceil(job.requests / engines))
    element = 4 if plan.precision is Precision.FP32 else 2
    timing = batch_time(architecture(report.model), fit.accelerator, memory, share, element)
    if timing is None:
        return None
    return dataclasses.replace(timing, job=job, engines=engines)


def with_batch_time(report: PlanReport, fit: FlavorFit, memory: ServingMemory) -> FlavorFit:
    """The flavor's hours, cost and output tokens/s for the batch job (:func:`flavor_batch_time`;
    unchanged without one)."""
    if batch_job(report.plan, memory.settings) is None:
        return fit
    timing = flavor_batch_time(report, fit, memory)
    if timing is None:
        return dataclasses.replace(fit, hours=None, cost=None, tokens_per_second=None)
    run_cost = price_run(timing.hours, fit.flavor.price_per_hour, report.plan.budget)
    return dataclasses.replace(
        fit,
        hours=timing.hours,
        cost=run_cost.cost,
        over_budget=run_cost.over_budget,
        tokens_per_second=timing.output_tokens_per_second,
    )


def with_batch_times(report: PlanReport, memories: dict[str, ServingMemory]) -> PlanReport:
    """The serving report with each GPU flavor's hours, cost and tokens/s for the batch job
    (:func:`with_batch_time`), the table re-sorted cheapest first by the job's cost and the
    recommendation redone (:func:`~hwdash.core.planning.fit.recommend`); unchanged without
    ``--examples``."""
    from hwdash.core.planning.fit import recommend

    settings = next(iter(memories.values())).settings if memories else None
    if settings is None or batch_job(report.plan, settings) is None:
        return report
    fits = [
        with_batch_time(report, fit, memories[fit.flavor.id]) if fit.flavor.id in memories else fit
        for fit in report.flavors
    ]
    fits.sort(key=_by_cost)
    recommended, fastest = recommend(fits)
    # the budget's warnings again, now that the flavors have costs
    kept = [w for w in report.warnings if w != NEEDS_DATA_SIZE and not w.startswith(_OVER_BUDGET)]
    warnings = (*kept, *budget_warnings(report.plan.budget, fits, recommended))
    return dataclasses.replace(
        report,
        flavors=tuple(fits),
        recommended=recommended,
        fastest=fastest,
        warnings=tuple(dict.fromkeys(warnings)),
    )


#: how :func:`~hwdash.core.planning.budget.budget_warnings` starts its over-budget warning
_OVER_BUDGET = "no flavor that fits is within the budget"


def _by_cost(fit: FlavorFit) -> tuple[int, float, int, str]:
    """Priced flavors with a cost by that cost, then the rest by id (as the training table)."""
    if fit.cost is None:
        return (1, 0.0, fit.flavor.gpu_count, fit.flavor.id)
    return (0, round(fit.cost, 6), fit.flavor.gpu_count, fit.flavor.id)


def serving_batch(serving: tuple[str, ServingMemory, PlanReport] | None) -> BatchTime | None:
    """The batch job's time on the serving plan's first flavor (as its table row), or None."""
    if serving is None:
        return None
    flavor_id, memory, report = serving
    fit = next(fit for fit in report.flavors if fit.flavor.id == flavor_id)
    return flavor_batch_time(report, fit, memory)
