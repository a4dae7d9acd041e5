"""The CUDA context in a serving engine's memory (catalog/engines.toml ``context_outside_budget``):
vLLM V1 takes its baseline snapshot after the context exists (vllm/v1/worker/gpu_worker.py
``init_device``; vllm/utils/mem_utils.py ``memory_profiling`` counts only the non-torch growth
after it), so the context comes on top of its budget; V0 (non_torch_mib, fitted with it) and
SGLang count it inside, so their totals do not add it.

By hand, Llama-3.1-8B on one H100 SXM (catalog/accelerators.toml: no cuda_total_mib, so NVML's
81,559 MiB), each engine at its default fraction: the budget is floor(fraction x 81,559 MiB);
the context row of catalog/software.toml (hopper, the default) is 804,061,184 bytes; vLLM's
CUDA-graph pool is 512 MiB (engines.toml). One GPU, no TP buffers; the weights and profile leave a
pool, so weights + activations + non-torch + pool = the budget.
"""

from __future__ import annotations

import math

import pytest

from hwdash.core.catalog import load_catalog
from hwdash.core.estimator.architecture import architecture
from hwdash.core.estimator.serving import MIB, ServingSettings, serving_memory
from hwdash.core.models.config import resolve_model
from hwdash.core.plan import Method, Plan
from hwdash.core.planning.fit import evaluate_plan
from hwdash.core.planning.serving_plan import (
    engine_estimate,
    engine_json,
    engine_total_bytes,
    outside_budget_bytes,
)

CATALOG = load_catalog(include_user=False)
LLAMA = architecture(resolve_model("llama-3.1-8b", CATALOG))
H100 = CATALOG.accelerators["h100-sxm"]
CONTEXT = 804_061_184
CUDA_TOTAL = 81_559 * MIB


@pytest.mark.parametrize(
    ("engine", "fraction", "context", "graphs"),
    [
        ("vllm", 0.9, CONTEXT, 512 * MIB),
        ("vllm-v0", 0.9, 0, 512 * MIB),
        ("sglang", 0.88, 0, 0),
    ],
)
def test_only_vllm_v1_holds_the_context_outside_its_budget(
    engine: str, fraction: float, context: int, graphs: int
) -> None:
    memory = serving_memory(LLAMA, H100, ServingSettings(engine=engine, max_model_len=8192))
    budget = math.floor(fraction * CUDA_TOTAL)
    assert memory.budget_bytes == budget and memory.kv_cache_bytes > 0
    assert memory.context_bytes == context
    assert outside_budget_bytes(memory) == graphs + context
    assert engine_total_bytes(memory) == budget + graphs + context
    written = engine_json(memory)
    assert (written["context_bytes"], written["total_bytes"]) == (
        context,
        budget + graphs + context,
    )


def test_v1s_context_is_a_line_of_the_engine_estimate_and_leaves_the_pool_alone() -> None:
    settings = ServingSettings(engine="vllm", max_model_len=8192)
    memory = serving_memory(LLAMA, H100, settings)
    # the pool is the budget's rest: the context is not subtracted from it
    inside = memory.weight_bytes + memory.activation_bytes + memory.non_torch_bytes
    assert memory.non_torch_bytes == 0 and memory.kv_cache_bytes == memory.budget_bytes - inside
    plan = Plan(model="llama-3.1-8b", method=Method.INFERENCE)
    estimate = engine_estimate(evaluate_plan(plan, CATALOG).estimate, memory)
    assert ("CUDA context (outside the budget)", CONTEXT) in estimate.details
    assert estimate.per_gpu.overhead == 512 * MIB + CONTEXT
