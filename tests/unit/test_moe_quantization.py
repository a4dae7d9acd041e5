"""QLoRA, 8-bit LoRA and ``--quant`` on MoE models whose routed experts transformers 5.24 fuses.

``MixtralExperts`` (``modeling_mixtral.py``), ``Qwen3MoeExperts`` and the other ``...Experts``
modules keep every expert's gate/up and down projections as two 3-D parameters, not ``nn.Linear``,
and bitsandbytes' ``replace_with_bnb_linear`` (``integrations/bitsandbytes.py``) swaps only
``nn.Linear``: the experts stay in the load dtype. Applying that function to the meta-device models
of these configs (transformers 5.24, bitsandbytes 0.50.2) made ``Linear4bit`` of exactly the
``QUANTIZED`` counts below and left the experts' parameters in the ``...Experts`` modules. The
expected numbers are counted by hand from each config.json.
"""

from __future__ import annotations

import math
from pathlib import Path

from hwdash.core.catalog import load_catalog
from hwdash.core.estimator import _Accumulator, architecture, estimate_memory
from hwdash.core.estimator.phases import PHASE_MODEL_LOAD
from hwdash.core.estimator.quantization import (
    add_quantized_base_load,
    dequantization_workspace_bytes,
    kbit_upcast_bytes,
    quantize_on_load_bytes,
    quantized_weight_bytes,
)
from hwdash.core.estimator.states import LAYOUTS, _base_weight_bytes
from hwdash.core.models.config import model_from_config, model_from_config_file
from hwdash.core.plan import Method, Plan, Precision, Quant
from hwdash.core.specs import ModelSpec

REPO = Path(__file__).resolve().parents[2]
MIXTRAL = model_from_config_file(REPO / "tests/data/model_configs/mixtral-style/config.json")

# Mixtral-8x7B (mistralai/Mixtral-8x7B-v0.1 config.json): hidden 4096, 32 layers, 32 query and
# 8 key/value heads of 128, 8 experts of intermediate 14336, vocab 32000, untied head.
M_HIDDEN, M_LAYERS, M_KV, M_INTER, M_EXPERTS, M_VOCAB = 4096, 32, 8 * 128, 14336, 8, 32000
#: q, k, v, o per layer: the only nn.Linear of a Mixtral block
M_QUANTIZED = M_LAYERS * (2 * M_HIDDEN * M_HIDDEN + 2 * M_HIDDEN * M_KV)
#: every expert's w1, w3 (gate_up_proj) and w2 (down_proj), in MixtralExperts
M_EXPERTS_PARAMS = M_LAYERS * M_EXPERTS * 3 * M_HIDDEN * M_INTER
#: embedding, LM head, RMSNorms (2 per layer + final), router (hidden x experts per layer)
M_REST = 2 * M_VOCAB * M_HIDDEN + (2 * M_LAYERS + 1) * M_HIDDEN + M_LAYERS * M_HIDDEN * M_EXPERTS
#: one block's fused gate_up_proj: experts x 2 intermediate x hidden
M_GATE_UP = M_EXPERTS * 2 * M_INTER * M_HIDDEN

#: Qwen3-30B-A3B's config.json (Qwen/Qwen3-30B-A3B)
QWEN3_MOE = {
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
    "max_position_embeddings": 40960,
}
Q_HIDDEN, Q_LAYERS, Q_Q, Q_KV, Q_INTER, Q_EXPERTS = 2048, 48, 32 * 128, 4 * 128, 768, 128
Q_QUANTIZED = Q_LAYERS * (2 * Q_HIDDEN * Q_Q + 2 * Q_HIDDEN * Q_KV)
Q_EXPERTS_PARAMS = Q_LAYERS * Q_EXPERTS * 3 * Q_HIDDEN * Q_INTER

NF4 = 0.5 + 0.127 / 8  # QLoRA section 3: 4 bits + double-quantized constants


def test_mixtral_experts_are_left_out_of_the_quantized_linears() -> None:
    arch = architecture(MIXTRAL)
    assert M_QUANTIZED == 1_342_177_280  # replace_with_bnb_linear's Linear4bit on the meta model
    assert M_EXPERTS_PARAMS == 45_097_156_608  # left in MixtralExperts
    assert arch.quantizable_params == M_QUANTIZED
    assert arch.unquantized_params == M_EXPERTS_PARAMS + M_REST
    assert arch.total_params == M_QUANTIZED + M_EXPERTS_PARAMS + M_REST
    # the largest matrix bitsandbytes quantizes is q_proj (o_proj ties it), not an expert's
    largest = arch.largest_quantized_linear
    assert (largest.in_features * largest.out_features) == M_HIDDEN * M_HIDDEN
    assert arch.largest_fused_expert_params == M_GATE_UP


def test_qwen3_moe_experts_are_left_out_of_the_quantized_linears() -> None:
    arch = architecture(model_from_config(QWEN3_MOE, name="qwen3-30b-a3b", source="test"))
    assert Q_QUANTIZED == 905_969_664  # replace_with_bnb_linear's Linear4bit on the meta model
    assert Q_EXPERTS_PARAMS == 28_991_029_248  # left in Qwen3MoeExperts
    assert arch.quantizable_params == Q_QUANTIZED
    assert arch.unquantized_params == arch.total_params - Q_QUANTIZED
    assert arch.unquantized_params > Q_EXPERTS_PARAMS


def test_mixtral_qlora_base_counts_the_experts_unquantized() -> None:
    """The frozen base of QLoRA / 8-bit LoRA: NF4 (int8) attention, the experts with the rest at
    the frozen dtype (fp32 after prepare_model_for_kbit_training, bf16 with it kept 16-bit)."""
    arch = architecture(MIXTRAL)
    unquantized = M_EXPERTS_PARAMS + M_REST
    layout = LAYOUTS[Precision.BF16]
    qlora, _ = _base_weight_bytes(arch, Method.QLORA, layout, 4)
    assert qlora == M_QUANTIZED * NF4 + 4 * unquantized
    qlora_bf16, _ = _base_weight_bytes(arch, Method.QLORA, layout, 2)
    assert qlora_bf16 == M_QUANTIZED * NF4 + 2 * unquantized
    rows = M_LAYERS * (2 * M_HIDDEN + 2 * M_KV)  # LLM.int8()'s fp32 scale per output row
    int8, _ = _base_weight_bytes(arch, Method.LORA_8BIT, layout, 4)
    assert int8 == M_QUANTIZED + 4 * rows + 4 * unquantized


def test_mixtral_qlora_model_load() -> None:
    """Model load: the quantized attention plus everything else 16-bit as loaded; the transients
    are quantizing q_proj (the largest nn.Linear) and the fp32 upcast, during which one block's
    fused gate_up_proj (larger than the embedding) has its 16-bit original alive."""
    arch = architecture(MIXTRAL)
    unquantized = M_EXPERTS_PARAMS + M_REST
    assert quantize_on_load_bytes(arch, 4) == 2 * M_HIDDEN**2 + 2 * 4 * (M_HIDDEN**2 // 64)
    assert kbit_upcast_bytes(arch, 4) == 2 * unquantized + 2 * M_GATE_UP
    acc = _Accumulator()
    linears = M_QUANTIZED * NF4
    add_quantized_base_load(acc, arch, 4, linears, 4, "base")
    loaded = linears + 2 * unquantized
    assert acc.phase_total(PHASE_MODEL_LOAD) == loaded + 2 * unquantized + 2 * M_GATE_UP


def test_mixtral_int8_inference_peaks_at_load_with_16_bit_experts() -> None:
    """``--quant int8`` on Mixtral with a short prompt: the load holds int8 attention with its row
    scales, the experts and the rest in bf16, and Int8Params' two 16-bit copies of q_proj."""
    plan = Plan(model=MIXTRAL.id, method="inference", quant="int8", batch=1, seq=16)
    estimate = estimate_memory(plan, MIXTRAL)
    assert estimate.peak_phase == PHASE_MODEL_LOAD
    rows = M_LAYERS * (2 * M_HIDDEN + 2 * M_KV)
    weights = M_QUANTIZED + 4 * rows + 2 * (M_EXPERTS_PARAMS + M_REST)
    assert weights == 92_064_718_848
    assert estimate.per_gpu.total - estimate.per_gpu.overhead == weights + 4 * M_HIDDEN**2


def test_mixtral_nf4_inference_weights_and_workspace() -> None:
    arch = architecture(MIXTRAL)
    expected = M_QUANTIZED * NF4 + 2 * (M_EXPERTS_PARAMS + M_REST)
    assert math.isclose(quantized_weight_bytes(arch, Quant.NF4, 2), expected)
    # the experts run unquantized: only q_proj's 16-bit weight is dequantized
    assert dequantization_workspace_bytes(arch, Quant.NF4, 16, 2) == 2 * M_HIDDEN**2


def test_a_dense_model_is_unchanged() -> None:
    """llama-3.1-8b: every block linear is quantized, the largest is an MLP projection."""
    arch = architecture(load_catalog().models["llama-3.1-8b"])
    hidden, inter, layers, kv = 4096, 14336, 32, 8 * 128
    linears = layers * (2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inter)
    assert arch.quantizable_params == linears
    assert arch.largest_quantized_linear == arch.largest_linear
    assert arch.largest_fused_expert_params == 0
    assert kbit_upcast_bytes(arch, 4) == 2 * arch.unquantized_params + 2 * 128256 * hidden


def _warnings(spec: ModelSpec, **fields: object) -> list[str]:
    return list(estimate_memory(Plan(model=spec.id, **fields), spec).warnings)


def test_a_quantized_moe_plan_says_its_experts_stay_16_bit() -> None:
    def said(warnings: list[str], text: str) -> bool:
        return any(text in warning for warning in warnings)

    qlora = _warnings(MIXTRAL, method="qlora", lora_dropout=0)
    assert said(qlora, "routed experts (fused 3D weights in transformers 5) stay in 16 bits")
    assert said(qlora, "upcast to fp32")
    bf16 = _warnings(MIXTRAL, method="qlora", lora_dropout=0, qlora_frozen_dtype="bf16")
    assert said(bf16, "stay in 16 bits") and not said(bf16, "upcast to fp32")
    assert said(_warnings(MIXTRAL, method="inference", quant="nf4"), "stay in 16 bits")
    gptq = MIXTRAL.model_copy(update={"checkpoint_bits": 4})
    assert said(_warnings(gptq, method="inference"), "checkpoint's experts are counted in 16 bits")
    assert not said(_warnings(MIXTRAL, method="lora", lora_dropout=0), "16 bits")
    dense = load_catalog().models["llama-3.1-8b"]
    assert not said(_warnings(dense, method="qlora"), "16 bits")
