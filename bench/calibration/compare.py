"""hwdash's estimate for a traced case, and the relative errors of it and of the anchors."""

from __future__ import annotations

from typing import Any

from calibration.anchors import ANCHORS
from hwdash.core.catalog import ModelSpec


def hwdash_estimate(record: dict[str, Any], spec: ModelSpec) -> dict[str, Any]:
    """The estimator's breakdown for the record's plan, or an ``error`` entry when it cannot run.

    Guarded: the estimator is written alongside this harness and may be missing or fail for a setting.
    """
    try:
        from hwdash.core.estimator import estimate_memory
        from hwdash.core.plan import Plan

        estimate = estimate_memory(Plan(**record["plan"]), spec, gpus=1)
    except Exception as exc:  # the estimator is optional here: record why, never stop the run
        return {"error": f"{type(exc).__name__}: {exc}"}
    breakdown = estimate.per_gpu.as_dict()
    return {
        "components": breakdown,
        "total": breakdown["total"],
        "without_overhead": breakdown["total"] - breakdown["overhead"],
        "total_params": estimate.total_params,
        "trainable_params": estimate.trainable_params,
    }


def relative_error(estimate: int | None, measured: int) -> float | None:
    """(estimate - measured) / measured; positive means the estimate is too high."""
    if estimate is None or measured <= 0:
        return None
    return (estimate - measured) / measured


def kernel_matches_cuda(record: dict[str, Any], spec: ModelSpec) -> bool:
    """Whether the attention kernel the trace ran is the one a CUDA run would take.

    On CPU, SDPA's flash kernel also takes fp32; on CUDA, fp32 grouped-query attention (transformers
    passes ``enable_gqa``) falls to the math path, while amp and bf16 inputs take flash. So an fp32
    SDPA row of a GQA model stands for CUDA only when the math kernel was forced, and a forced-math
    row stands for CUDA only in fp32 on a GQA model.
    """
    plan = record["plan"]
    if plan["attention"] != "sdpa" or plan["method"] == "inference":
        return True
    gqa = spec.kv_heads < spec.heads
    cuda_takes_math = plan["precision"] == "fp32" and gqa
    forced_math = record.get("sdpa_backend", "auto") == "math"
    return forced_math == cuda_takes_math


def add_estimates(record: dict[str, Any], spec: ModelSpec) -> dict[str, Any]:
    """A copy of ``record`` with ``estimate`` (hwdash), ``anchors`` and their errors filled in.

    The error of hwdash is taken on its estimate without the ``overhead`` component (CUDA context and
    allocator slack), because the trace measures allocated tensor bytes only; ``error_with_overhead``
    keeps the whole total for reference.
    """
    out = dict(record)
    out["kernel_matches_cuda"] = kernel_matches_cuda(record, spec)
    measured = int(record["peak_bytes"])
    estimate = hwdash_estimate(record, spec)
    out["estimate"] = estimate
    if "error" in estimate:
        out["error"] = None
        out["error_with_overhead"] = None
        out["estimate_pending"] = True
    else:
        out["error"] = relative_error(estimate["without_overhead"], measured)
        out["error_with_overhead"] = relative_error(estimate["total"], measured)
        out["estimate_pending"] = False
    anchors: dict[str, Any] = {}
    for name, rule in ANCHORS.items():
        predicted = rule(record)
        anchors[name] = {"bytes": predicted, "error": relative_error(predicted, measured)}
    out["anchors"] = anchors
    return out
