"""Phases outside the step (issue 29): model load (quantize-on-load, PEFT's fp32 upcast), checkpoint
save, and ``--generation legacy``'s second KV cache.

The hand computations use llama-3.1-8b's config.json (hidden 4096, intermediate 14336, 32 layers,
32 query and 8 key/value heads of 128, vocab 128256, untied head) and the formulas of the sources
cited in :mod:`hwdash.core.estimator.quantization` and :mod:`hwdash.core.estimator.inference`.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from hwdash.core.catalog import load_catalog
from hwdash.core.estimator import (
    _STEP_ONLY,
    PHASE_BACKWARD,
    _Accumulator,
    _peak_phase,
    architecture,
    estimate_memory,
)
from hwdash.core.estimator.phases import (
    PEAK_PHASES,
    PHASE_CHECKPOINT_SAVE,
    PHASE_MODEL_LOAD,
    _peak_breakdown,
    _phase_details,
)
from hwdash.core.estimator.quantization import kbit_upcast_bytes, quantize_on_load_bytes
from hwdash.core.plan import Plan
from hwdash.core.plan_unused import unused_settings
from hwdash.core.results import MemoryEstimate

CATALOG = load_catalog()
REPO = Path(__file__).resolve().parents[2]

# llama-3.1-8b, from its config.json
HIDDEN, INTER, LAYERS, KV_DIM, VOCAB = 4096, 14336, 32, 8 * 128, 128256
LINEARS_PER_LAYER = 2 * HIDDEN * HIDDEN + 2 * HIDDEN * KV_DIM + 3 * HIDDEN * INTER
QUANTIZABLE = LAYERS * LINEARS_PER_LAYER
EMBEDDING = VOCAB * HIDDEN  # and the untied LM head, the same size
UNQUANTIZED = 2 * EMBEDDING + (2 * LAYERS + 1) * HIDDEN  # + the RMSNorm weights
LARGEST_LINEAR = HIDDEN * INTER  # gate/up/down_proj
#: NF4 with double quantization: 4 bits plus 0.127 bits of constants per weight (QLoRA paper)
NF4_LINEARS = QUANTIZABLE * (0.5 + 0.127 / 8)


def _estimate(**fields: object) -> MemoryEstimate:
    plan = Plan(model="llama-3.1-8b", **fields)
    return estimate_memory(plan, CATALOG.models["llama-3.1-8b"])


def _without_overhead(estimate: MemoryEstimate) -> int:
    return estimate.per_gpu.total - estimate.per_gpu.overhead


def test_the_hand_counts_match_the_architecture() -> None:
    arch = architecture(CATALOG.models["llama-3.1-8b"])
    assert (arch.quantizable_params, arch.unquantized_params) == (QUANTIZABLE, UNQUANTIZED)


def test_quantize_on_load_transients() -> None:
    arch = architecture(CATALOG.models["llama-3.1-8b"])
    # 4-bit: the bf16 source + quantize_4bit's fp32 absmax per 64 weights + its offset copy
    assert quantize_on_load_bytes(arch, 4) == 2 * LARGEST_LINEAR + 2 * 4 * (LARGEST_LINEAR // 64)
    # 8-bit: the bf16 source still on the GPU + Int8Params' fp16 copy
    assert quantize_on_load_bytes(arch, 8) == 4 * LARGEST_LINEAR
    # prepare_model_for_kbit_training: 2 -> 4 bytes per unquantized parameter, plus the bf16
    # original of the LM head (the last and largest) while it is cast
    assert kbit_upcast_bytes(arch, 4) == 2 * UNQUANTIZED + 2 * EMBEDDING
    assert kbit_upcast_bytes(arch, 2) == 0


def test_qlora_peak_at_model_load() -> None:
    """QLoRA llama-3.1-8b with a short sequence: the load (NF4 linears, the rest upcast to fp32,
    the LM head's bf16 original) is above every phase of the step."""
    estimate = _estimate(method="qlora", batch=1, seq=64, grad_ckpt=True)
    assert estimate.peak_phase == PHASE_MODEL_LOAD
    load = NF4_LINEARS + 4 * UNQUANTIZED + 2 * EMBEDDING
    assert _without_overhead(estimate) == math.ceil(load)
    # nothing but weights exists while loading: no adapters' states, gradients or activations
    memory = estimate.per_gpu
    assert (memory.gradients, memory.optimizer, memory.activations, memory.kv_cache) == (0,) * 4
    labels = [label for label, _ in estimate.details]
    assert any("prepare_model_for_kbit_training" in label for label in labels)
    assert not any("adapters" in label for label in labels)


def test_a_longer_sequence_keeps_the_peak_in_the_step() -> None:
    estimate = _estimate(method="qlora", batch=1, seq=2048, grad_ckpt=True)
    assert estimate.peak_phase == PHASE_BACKWARD


def test_int8_inference_peak_at_model_load() -> None:
    """LLM.int8() quantized on load with a short prompt: the two 16-bit copies of the largest
    linear exceed the prefill's KV cache and activations."""
    estimate = _estimate(method="inference", quant="int8", batch=1, seq=128)
    assert estimate.peak_phase == PHASE_MODEL_LOAD
    rows = LAYERS * (2 * HIDDEN + 2 * KV_DIM + 2 * INTER + HIDDEN)
    weights = QUANTIZABLE + 4 * rows + 2 * UNQUANTIZED
    assert _without_overhead(estimate) == weights + 4 * LARGEST_LINEAR


def test_a_checkpoint_quantized_beforehand_has_no_quantize_transient() -> None:
    spec = CATALOG.models["llama-3.1-8b"].model_copy(update={"checkpoint_bits": 4})
    plan = Plan(model="llama-3.1-8b", method="inference", batch=1, seq=16)
    assert estimate_memory(plan, spec).peak_phase == "prefill"


def test_a_term_can_add_a_save_gather_that_holds_the_peak() -> None:
    """The API another term (FSDP's FULL_STATE_DICT gather) uses to add bytes to the save."""
    plan = Plan(model="llama-3.1-8b", method="full")
    acc = _Accumulator(weights=10.0, optimizer=5.0, activations=3.0, step_temporaries=1.0)
    acc.note("step temporaries", 1.0, _STEP_ONLY)
    assert _peak_phase(plan, acc) == PHASE_BACKWARD
    acc.add_phase_transient(PHASE_CHECKPOINT_SAVE, "weights", 2.0, "small gather")
    acc.add_phase_transient(PHASE_CHECKPOINT_SAVE, "weights", 4.0, "full state dict gather")
    assert acc.phase_total(PHASE_CHECKPOINT_SAVE) == 19.0  # the largest transient only
    assert _peak_phase(plan, acc) == PHASE_CHECKPOINT_SAVE
    breakdown = _peak_breakdown(acc, PHASE_CHECKPOINT_SAVE, 0.0)
    assert (breakdown.weights, breakdown.optimizer, breakdown.activations) == (14, 5, 0)
    assert ("full state dict gather", 4) in _phase_details(acc, PHASE_CHECKPOINT_SAVE)
    assert ("step temporaries", 1) not in _phase_details(acc, PHASE_CHECKPOINT_SAVE)
    with pytest.raises(ValueError):
        acc.add_phase_bytes(PHASE_BACKWARD, "weights", 1.0, "not outside the step")


def test_the_save_holds_no_accumulated_gradients() -> None:
    """Gradient accumulation's sums are freed by zero_grad before the Trainer saves."""
    import hwdash.core.estimator.estimate as estimate_module

    seen: dict[str, float] = {}
    original = estimate_module._peak_phase

    def spy(plan: Plan, acc: _Accumulator) -> str:
        seen["save"] = acc.phase_total(PHASE_CHECKPOINT_SAVE)
        seen["held"] = acc.weights + acc.optimizer
        seen["gradients"] = acc.persistent_gradients
        return original(plan, acc)

    estimate_module._peak_phase = spy
    try:
        _estimate(method="full", grad_accum=4)
    finally:
        estimate_module._peak_phase = original
    assert seen["gradients"] > 0
    assert seen["save"] == seen["held"]


def test_legacy_generation_doubles_the_cache() -> None:
    current = _estimate(method="inference", batch=4, seq=4096)
    legacy = _estimate(method="inference", batch=4, seq=4096, generation="legacy")
    assert legacy.per_gpu.kv_cache == 2 * current.per_gpu.kv_cache
    for part in ("weights", "gradients", "optimizer", "activations"):
        assert getattr(legacy.per_gpu, part) == getattr(current.per_gpu, part)
    assert current.per_gpu.kv_cache == 2 * LAYERS * KV_DIM * 4096 * 4 * 2


def test_legacy_generation_in_rl_and_not_with_vllm() -> None:
    fields = {"method": "grpo", "rl_method": "lora", "batch": 2, "seq": 1024}
    policy = _estimate(**fields, vllm_memory_utilization=0)
    policy_legacy = _estimate(**fields, vllm_memory_utilization=0, generation="legacy")
    assert policy_legacy.per_gpu.kv_cache == 2 * policy.per_gpu.kv_cache
    engine = _estimate(**fields)
    engine_legacy = _estimate(**fields, generation="legacy")
    assert engine_legacy.per_gpu == engine.per_gpu
    assert unused_settings(Plan(model="llama-3.1-8b", **fields), ["generation"])
    assert unused_settings(Plan(model="llama-3.1-8b", method="lora"), ["generation"])
    assert not unused_settings(Plan(model="llama-3.1-8b", method="inference"), ["generation"])


def test_legacy_generation_copies_only_the_self_attention_cache() -> None:
    spec = CATALOG.models["flan-t5-large"]
    current = estimate_memory(Plan(model="flan-t5-large", method="inference"), spec)
    legacy = estimate_memory(
        Plan(model="flan-t5-large", method="inference", generation="legacy"), spec
    )
    # self- and cross-attention caches are the same size; only the self-attention one is copied
    assert legacy.per_gpu.kv_cache * 2 == current.per_gpu.kv_cache * 3


def test_every_peak_phase_name_is_documented() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    documented = MemoryEstimate.__dataclass_fields__["peak_phase"]
    assert documented.default in PEAK_PHASES
    for name in PEAK_PHASES:
        assert re.search(rf"`{re.escape(name)}`", readme), name
