"""The plan a run names, read into the numbers the run is held against.

A run names its plan (``hwdash.probe.start(plan=...)``, ``HWDASH_PLAN``, ``python -m hwdash.probe
--plan``, or the dashboard's "attach plan") by a saved plan's name (``hwdash plan --save NAME``) or
by the path of a plan file: the output of ``hwdash plan --json`` (its ``plan`` object) or any file
``hwdash plan --from`` reads (a DeepSpeed JSON, a TrainingArguments/TRL file, an axolotl YAML...).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hwdash.core.catalog import Catalog, load_catalog
from hwdash.core.plan import Plan
from hwdash.core.planning.fit import evaluate_plan, training_tokens
from hwdash.core.planning.run_time import flops_per_token
from hwdash.core.plans.store import PlanStore
from hwdash.errors import UsageError

MAX_PLAN_FILE_BYTES = 4 * 1024 * 1024
"""A plan file is a few kilobytes; a larger one is not read."""


class PlanReferenceError(UsageError):
    """The plan a run names cannot be read; the message says why."""


@dataclass(frozen=True)
class PlanFacts:
    """What a run is held against, from its plan."""

    reference: str
    """As the run named it."""
    name: str
    """The saved plan's name, or the file's name."""
    plan: Plan
    model: str
    """The model's catalog id (or the ``--model`` value as given)."""
    method: str
    planned_total_bytes: int
    """Per-GPU peak, whole GPU (what NVML should show): the plan's total."""
    planned_peak_bytes: int
    """Per-GPU peak as the allocator reserves it: the estimate's reserved memory, without the CUDA
    context and NCCL's communicators (the probe's ``max_memory_reserved`` holds neither)."""
    model_flops_per_token: float
    """Model FLOPs per token, recomputation left out (what MFU counts: PaLM, Chowdhery et al. 2022,
    appendix B, counts the model's FLOPs, not the hardware's)."""
    total_tokens: int | None
    """Tokens the plan trains on (``--tokens``, or examples x epochs x sequence)."""
    gpus: int
    price_per_hour: float | None
    """The price of the plan's flavor (``--flavor ID``, one named) per hour; None without one."""
    flavor: str | None
    flavor_gpus: int | None
    planned_hours: float | None
    mfu_assumed: float | None
    """The MFU the plan's hours assume on its flavor (``--mfu``, else the accelerator's default)."""


def _plan_from_file(path: Path) -> Plan:
    """A plan file: ``hwdash plan --json``'s output, or anything ``--from`` reads."""
    from hwdash.core.plans.imports import read_plan_file

    try:
        if path.stat().st_size > MAX_PLAN_FILE_BYTES:
            raise PlanReferenceError(f"plan file {path} is larger than 4 MiB")
        if path.suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(data, dict) and isinstance(data.get("plan"), dict):
                fields = {k: v for k, v in data["plan"].items() if k in Plan.model_fields}
                return Plan.model_validate(fields)
    except (OSError, ValueError) as exc:
        raise PlanReferenceError(f"plan file {path} cannot be read: {exc}") from None
    imported = read_plan_file(path)
    if "model" not in imported.updates:
        raise PlanReferenceError(f"plan file {path} names no model")
    return Plan.model_validate(imported.updates)


def read_plan_reference(reference: str, store: PlanStore | None = None) -> tuple[str, Plan]:
    """(a display name, the Plan) for a saved plan's name or a plan file's path."""
    text = reference.strip()
    if not text:
        raise PlanReferenceError("the plan reference is empty")
    path = Path(text).expanduser()
    if path.is_file():
        return path.name, _plan_from_file(path)
    saved = (store or PlanStore()).get(text)
    if saved is not None:
        return saved.name, saved.plan
    raise PlanReferenceError(
        f"no saved plan named {text!r} and no such file (save one with hwdash plan ... --save NAME)"
    )


def plan_facts(
    reference: str, *, catalog: Catalog | None = None, store: PlanStore | None = None
) -> PlanFacts:
    """The run's plan evaluated (memory, FLOPs, tokens, price). Raises :class:`PlanReferenceError`
    (or the estimator's :class:`UsageError`) with a message."""
    name, plan = read_plan_reference(reference, store)
    catalog = catalog if catalog is not None else load_catalog()
    report = evaluate_plan(plan, catalog)
    total = report.estimate.per_gpu.total
    flavor = catalog.flavors.get(plan.flavors[0]) if len(plan.flavors) == 1 else None
    fit = next((f for f in report.flavors if flavor is not None and f.flavor.id == flavor.id), None)
    accelerator = catalog.accelerator_for(flavor) if flavor is not None else None
    mfu = plan.mfu
    if mfu is None and accelerator is not None:
        mfu = accelerator.default_mfu
    return PlanFacts(
        reference=reference,
        name=name,
        plan=plan,
        model=report.model.id,
        method=plan.method.value,
        planned_total_bytes=total,
        planned_peak_bytes=report.estimate.reserved_bytes,
        model_flops_per_token=flops_per_token(
            plan.model_copy(update={"grad_ckpt": False, "selective_ac": None}),
            report.model,
            model_flops=True,
        ),
        total_tokens=training_tokens(plan),
        gpus=plan.gpus,
        price_per_hour=None if flavor is None else flavor.price_per_hour,
        flavor=None if flavor is None else flavor.id,
        flavor_gpus=None if flavor is None else flavor.gpu_count,
        planned_hours=None if fit is None else fit.hours,
        mfu_assumed=mfu,
    )


def facts_summary(facts: PlanFacts) -> dict[str, Any]:
    """The plan's part of a ledger record."""
    return {
        "plan": facts.reference,
        "model": facts.model,
        "method": facts.method,
        "planned_peak_bytes": facts.planned_peak_bytes,
        "planned_total_bytes": facts.planned_total_bytes,
        "flops_per_token": facts.model_flops_per_token,
    }
