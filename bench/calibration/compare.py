"""Which traced rows stand for a CUDA run (the estimate and anchor columns: ``calibration.report``)."""

from __future__ import annotations

from typing import Any

from hwdash.core.specs import ModelSpec


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
