"""A trace set beside the estimate it stands for: the comparable estimate, the errors, the rows.

Pure (the estimator is imported when an estimate is asked for).
"""

from __future__ import annotations

from typing import Any

from hwdash.core.plan import Plan
from hwdash.core.results import MemoryEstimate
from hwdash.core.specs import ModelSpec
from hwdash.tracing.results import TraceResult
from hwdash.tracing.settings import traced_plan


def comparable_estimate(plan: Plan, model: ModelSpec) -> MemoryEstimate:
    """The estimate a trace stands for: the estimate of :func:`traced_plan` on one GPU. A
    vision-language model is traced as its language model alone (``ModelSpec.hf_config`` is the
    text model's), so the estimate it is compared with leaves the vision tower out too."""
    from hwdash.core.estimator import estimate_memory

    if model.vision is not None:
        model = model.model_copy(update={"vision": None})
    return estimate_memory(traced_plan(plan, model), model, gpus=1)


def trace_document(trace: TraceResult, estimate: MemoryEstimate) -> dict[str, Any]:
    """The trace, the estimate it is compared with and the errors, JSON-ready.

    This is the ``trace`` object of ``hwdash plan --trace --json``. Errors are (estimate - traced)
    / traced; ``error`` leaves out the estimate's ``overhead`` (CUDA context, allocator slack),
    which a trace of tensor storages cannot see, and ``error_with_overhead`` keeps it.
    """
    breakdown = estimate.per_gpu.as_dict()
    without_overhead = breakdown["total"] - breakdown["overhead"]
    document = trace.as_dict()
    document["estimate"] = {
        "components": breakdown,
        "total": breakdown["total"],
        "without_overhead": without_overhead,
        "peak_phase": estimate.peak_phase,
    }
    document["error"] = relative_error(without_overhead, trace.peak_bytes)
    document["error_with_overhead"] = relative_error(breakdown["total"], trace.peak_bytes)
    return document


def relative_error(estimate: int, measured: int) -> float | None:
    """(estimate - measured) / measured; positive means the estimate is too high."""
    if measured <= 0:
        return None
    return (estimate - measured) / measured


def comparison_rows(
    trace: TraceResult, estimate: dict[str, int]
) -> list[tuple[str, int | None, int | None]]:
    """Rows ``(label, estimated bytes, traced bytes)`` that set the two breakdowns side by side.

    ``estimate`` is :meth:`MemoryBreakdown.as_dict`. The trace has no KV-cache category (the cache
    is made in forward, so it counts as activations) and cannot see the estimate's overhead (the
    CUDA context and allocator slack are not tensors); the estimate has no temporaries of its own
    (its activations include the largest transient). So activations, temporaries and the KV cache
    are compared as one row, with their parts below it.
    """
    parts = trace.components
    return [
        (
            "weights / parameters+buffers",
            estimate["weights"],
            parts["parameters"] + parts["buffers"],
        ),
        ("gradients", estimate["gradients"], parts["gradients"]),
        ("optimizer (+ master copy)", estimate["optimizer"], parts["optimizer"] + parts["other"]),
        (
            "activations, temporaries, KV cache",
            estimate["activations"] + estimate["kv_cache"],
            parts["activations"] + parts["temporaries"],
        ),
        ("  activations (traced: + KV cache)", estimate["activations"], parts["activations"]),
        ("  backward temporaries", None, parts["temporaries"]),
        ("  KV cache", estimate["kv_cache"], None),
        ("overhead (context, allocator)", estimate["overhead"], None),
    ]
