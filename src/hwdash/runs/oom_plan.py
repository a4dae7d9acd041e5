"""An out-of-memory snapshot held against the run's plan: each category of the snapshot beside the
plan's estimate of it, the biggest surprise named, and the smallest changes that make the plan fit
the need the run really had.

The comparison is made at the allocator's level, where the snapshot is: the plan's weights,
gradients, optimizer states, activations and KV cache (its CUDA context and fragmentation guess
left out) against the live blocks by category (:mod:`hwdash.runs.oom_analysis`). The **measured
need** is what was live at the out-of-memory error plus the request that failed; its ratio to the
plan's need is the **factor** the make-it-fit search applies: an option fits when its estimate times
the factor fits the flavor, which is the search over the flavor with its memory divided by the factor.
A **surprise** is a category at least :data:`SURPRISE_RATIO` times its planned bytes and
:data:`SURPRISE_MIN_BYTES` over them (or that much where the plan expected none); the biggest excess
is named.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hwdash.core.catalog import Catalog
from hwdash.core.estimator import estimate_memory
from hwdash.core.models.config import resolve_model
from hwdash.core.plan import Plan
from hwdash.core.planning.fit_options import FitSearch, find_fit_options
from hwdash.core.specs import ModelSpec
from hwdash.core.units import MIB, format_gib
from hwdash.runs.oom_analysis import OomReport

SURPRISE_RATIO = 1.2
SURPRISE_MIN_BYTES = 256 * MIB
UNKNOWN_NOTE_SHARE = 0.10
"""Live bytes without a Python stack above this share of the allocated are said as not sorted."""

#: snapshot category -> the plan's component
COMPONENTS = {
    "parameters": "weights",
    "gradients": "gradients",
    "optimizer": "optimizer",
    "activations": "activations",
    "kv_cache": "kv_cache",
}
LABELS = {
    "parameters": "parameters",
    "gradients": "gradients",
    "optimizer": "optimizer states",
    "activations": "activations",
    "kv_cache": "KV cache",
}


@dataclass(frozen=True)
class PlanComparison:
    """The snapshot against the plan (see the module)."""

    name: str
    plan: Plan
    model: ModelSpec
    rows: tuple[tuple[str, int, int], ...]
    """(category, measured bytes, planned bytes), in :data:`COMPONENTS` order."""
    measured_need_bytes: int
    planned_need_bytes: int
    surprise: str | None
    unknown_note: str | None

    @property
    def factor(self) -> float | None:
        """Measured need over the plan's (1.3: the run needed 30% more); None without a plan need."""
        if self.planned_need_bytes <= 0:
            return None
        return self.measured_need_bytes / self.planned_need_bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "categories": {
                category: {"measured_bytes": measured, "planned_bytes": planned}
                for category, measured, planned in self.rows
            },
            "measured_need_bytes": self.measured_need_bytes,
            "planned_need_bytes": self.planned_need_bytes,
            "factor": self.factor,
            "surprise": self.surprise,
            "unknown_note": self.unknown_note,
        }


def _surprise(rows: tuple[tuple[str, int, int], ...], plan: Plan) -> str | None:
    worst: tuple[int, str] | None = None
    for category, measured, planned in rows:
        excess = measured - planned
        if excess < SURPRISE_MIN_BYTES or (planned and measured < SURPRISE_RATIO * planned):
            continue
        label = LABELS[category]
        if planned:
            words = (
                f"{label} {measured / planned:.1f}x the plan "
                f"({format_gib(measured)} live, {format_gib(planned)} planned)"
            )
        else:
            words = f"{label} {format_gib(measured)} live, the plan expected none"
        if category == "activations":
            words += (
                f": the plan said batch {plan.batch} x sequence {plan.seq}; a longer sequence or a "
                "larger batch fills activations"
            )
        if worst is None or excess > worst[0]:
            worst = (excess, words)
    return None if worst is None else worst[1]


def compare(report: OomReport, name: str, plan: Plan, catalog: Catalog) -> PlanComparison:
    """The snapshot's categories beside the plan's per-GPU estimate."""
    model = resolve_model(plan.model, catalog)
    estimate = estimate_memory(
        plan, model, gpus=plan.gpus, framework=catalog.framework_for(plan)
    ).per_gpu
    rows = tuple(
        (category, int(report.categories.get(category, 0)), int(getattr(estimate, component)))
        for category, component in COMPONENTS.items()
    )
    requested = report.oom.requested_bytes if report.oom is not None else 0
    unknown = int(report.categories.get("unknown", 0))
    note = None
    if report.allocated_bytes and unknown >= UNKNOWN_NOTE_SHARE * report.allocated_bytes:
        note = (
            f"{format_gib(unknown)} live without a Python stack (allocated before the history "
            "was turned on, or by C++ and the autograd engine's thread) is not sorted"
        )
    return PlanComparison(
        name=name,
        plan=plan,
        model=model,
        rows=rows,
        measured_need_bytes=report.allocated_bytes + requested,
        planned_need_bytes=estimate.total - estimate.overhead,
        surprise=_surprise(rows, plan),
        unknown_note=note,
    )


def comparison_lines(comparison: PlanComparison, width: int = 80) -> list[str]:
    """The comparison in words: each category live and planned, the need and its factor, the
    surprise and the note (wrapped at ``width``)."""
    import textwrap

    lines = [f"Against the plan {comparison.name}"]
    for category, measured, planned in comparison.rows:
        lines.append(
            f"  {LABELS[category]:<17} {format_gib(measured):>10} live  "
            f"{format_gib(planned):>10} planned"
        )
    factor = comparison.factor
    lines.append(
        f"  need {format_gib(comparison.measured_need_bytes)} (live + the failed request) vs "
        f"{format_gib(comparison.planned_need_bytes)} planned"
        + ("" if factor is None else f": {factor:.2f}x")
    )
    for head, words in (
        ("biggest surprise", comparison.surprise),
        ("note", comparison.unknown_note),
    ):
        if words is not None:
            lines += textwrap.wrap(
                f"{head}: {words}", width, initial_indent="  ", subsequent_indent="    "
            )
    return lines


def fit_measured(comparison: PlanComparison, catalog: Catalog, target: str) -> FitSearch:
    """The smallest changes that make the plan fit ``target`` (a flavor id) once every estimate is
    scaled by the measured factor (never below 1: a plan that was right needs no scaling)."""
    flavor = catalog.flavors.get(target)
    if flavor is None:
        raise KeyError(target)
    factor = max(1.0, comparison.factor or 1.0)
    accelerator = catalog.accelerator_for(flavor)
    scaled = catalog
    if accelerator is not None and factor > 1.0:
        mib = accelerator.usable_bytes / MIB
        smaller = accelerator.model_copy(
            update={"nvml_total_mib": max(1, math.floor(mib / factor))}
        )
        scaled = Catalog(
            accelerators={**catalog.accelerators, accelerator.id: smaller},
            flavors=catalog.flavors,
            models=catalog.models,
            slowdowns=catalog.slowdowns,
            files=catalog.files,
        )
    return find_fit_options(
        comparison.plan, comparison.model, scaled, target, [flavor], slowdowns=catalog.slowdowns
    )
