"""DeepSeek-V2/V3 (multi-head latent attention, shared + routed experts, leading dense blocks) and
Qwen MoE's shared expert, read from config.json (issue 24).

The small ``TINY_*`` configs are tuning configs made for these tests (not real models). Their
parameter counts and per-layer activations were measured with transformers 5.24 and PEFT 0.21 on
fake tensors (``hwdash plan --model <config> --trace``; the per-layer figures are the slope of the
bytes alive at the end of the forward between 2 and 3 layers, batch 2 x 512 tokens, bf16, every
block past the first a MoE block), and are pinned here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hwdash.cli import main
from hwdash.core.estimator import (
    architecture,
    decompressed_kv_bytes_per_token,
    estimate_memory,
    kv_cache_bytes,
    latent_kv_bytes_per_token,
    layer_activation_bytes,
    lora_adapter_params,
    resolve_lora_targets,
)
from hwdash.core.models.config import model_from_config, model_from_config_file
from hwdash.core.models.params import count_active_parameters, count_parameters
from hwdash.core.plan import Attention, Method, Plan
from hwdash.errors import UsageError

LITE = (
    Path(__file__).resolve().parent.parent
    / "data"
    / "model_configs"
    / "families"
    / "deepseek-v2-lite-style"
    / "config.json"
)

TINY_V2: dict[str, Any] = {
    "model_type": "deepseek_v2",
    "hidden_size": 256,
    "intermediate_size": 704,
    "moe_intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "n_routed_experts": 8,
    "n_shared_experts": 2,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "kv_lora_rank": 64,
    "q_lora_rank": None,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
TINY_V2_Q = {**TINY_V2, "q_lora_rank": 48}
TINY_V3 = {
    **TINY_V2_Q,
    "model_type": "deepseek_v3",
    "n_shared_experts": 1,
    "n_group": 2,
    "topk_group": 1,
    "norm_topk_prob": True,
}
TINY_QWEN_MOE: dict[str, Any] = {
    "model_type": "qwen2_moe",
    "hidden_size": 256,
    "intermediate_size": 704,
    "moe_intermediate_size": 96,
    "shared_expert_intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
#: Qwen1.5-MoE-A2.7B's dimensions (model card, https://huggingface.co/Qwen/Qwen1.5-MoE-A2.7B:
#: "14.3B parameters in total and 2.7B activated parameters during runtime"; 24 layers, 60 experts
#: of 1408, 4 routed per token, a shared expert of 5632).
QWEN15_MOE_STYLE: dict[str, Any] = {
    **TINY_QWEN_MOE,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "vocab_size": 151936,
}


def _model(config: dict[str, Any]) -> Any:
    return model_from_config(config, name="tiny", source="test")


def test_v2_lite_style_counts_the_papers_parameters() -> None:
    # DeepSeek-V2 paper (arXiv:2405.04434) Appendix B: V2-Lite has 15.7B parameters, 2.4B of them
    # activated per token; the paper leaves the input embedding out of the activated count
    model = model_from_config_file(LITE)
    arch = architecture(model)
    assert count_parameters(model) == pytest.approx(15.7e9, rel=0.005)
    assert count_active_parameters(model) - arch.embedding_params == pytest.approx(2.4e9, rel=0.03)
    assert arch.dense_layers == 1 and arch.experts == 64 and arch.experts_per_token == 6
    assert arch.shared_intermediate == 2 * 1408


def test_qwen_moe_counts_its_shared_expert() -> None:
    # without the shared expert (24 x 34.6M) the count was 13.5B
    model = _model(QWEN15_MOE_STYLE)
    assert count_parameters(model) == pytest.approx(14.3e9, rel=0.005)
    assert count_active_parameters(model) == pytest.approx(2.7e9, rel=0.01)


@pytest.mark.parametrize(
    ("config", "hf_count"),
    [
        # sum(p.numel()) of AutoModelForCausalLM.from_config (transformers 5.24)
        (TINY_V2, 4_153_856),
        (TINY_V2_Q, 3_883_712),
        (TINY_V3, 3_662_528),
        (TINY_QWEN_MOE, 5_126_400),
    ],
)
def test_parameters_match_transformers_exactly(config: dict[str, Any], hf_count: int) -> None:
    assert architecture(_model(config)).total_params == hf_count


def test_latent_attention_linears_follow_q_lora_rank() -> None:
    plain = {linear.name for linear in architecture(_model(TINY_V2)).linears}
    latent = {linear.name for linear in architecture(_model(TINY_V2_Q)).linears}
    attention = {"kv_a_proj_with_mqa", "kv_b_proj", "o_proj"}
    assert attention | {"q_proj"} <= plain and "q_a_proj" not in plain
    assert attention | {"q_a_proj", "q_b_proj"} <= latent and "q_proj" not in latent


def test_kv_cache_holds_the_latent() -> None:
    # transformers caches the normalised latent and the rotary key (kv_lora_rank +
    # qk_rope_head_dim per token per layer), not the per-head keys and values
    arch = architecture(model_from_config_file(LITE))
    assert latent_kv_bytes_per_token(arch, 2) == 27 * (512 + 64) * 2
    assert decompressed_kv_bytes_per_token(arch, 2) == 27 * 16 * (128 + 64 + 128) * 2
    assert kv_cache_bytes(arch, 3, 1000, 2) == 3 * 1000 * latent_kv_bytes_per_token(arch, 2)


def test_ordinary_attention_keeps_its_cache() -> None:
    arch = architecture(_model(TINY_QWEN_MOE))
    assert latent_kv_bytes_per_token(arch, 2) == decompressed_kv_bytes_per_token(arch, 2)
    assert kv_cache_bytes(arch, 1, 10, 2) == 2 * 4 * 256 * 10 * 2


@pytest.mark.parametrize(
    ("config", "method", "targets", "attention", "traced"),
    [
        (TINY_V2, "full", (), Attention.EAGER, 38_916_608),
        (TINY_V2_Q, "full", (), Attention.EAGER, 39_313_920),
        (TINY_V3, "full", (), Attention.EAGER, 38_539_776),
        (TINY_V3, "lora", ("q_a_proj", "q_b_proj", "kv_b_proj"), Attention.EAGER, 33_644_032),
        (TINY_QWEN_MOE, "full", (), Attention.SDPA, 13_777_408),
        (TINY_QWEN_MOE, "lora", ("all-linear",), Attention.SDPA, 14_306_304),
        (TINY_QWEN_MOE, "lora", ("q_proj", "v_proj"), Attention.SDPA, 10_598_912),
    ],
)
def test_moe_layer_activations_match_traces(
    config: dict[str, Any],
    method: str,
    targets: tuple[str, ...],
    attention: Attention,
    traced: int,
) -> None:
    arch = architecture(_model(config))
    adapted = resolve_lora_targets(arch, targets) if method == "lora" else ()
    counted = layer_activation_bytes(
        arch, 2, 512, 2, attention, lora_targets=adapted, lora_rank=16 if adapted else 0
    )
    assert counted == pytest.approx(traced, rel=0.01)


def test_dense_block_activations_match_trace() -> None:
    # every block dense (first_k_dense_replace past the depth): traced 38,285,312 bytes per layer
    arch = architecture(_model(TINY_V2)).dense_block
    assert layer_activation_bytes(arch, 2, 512, 2, Attention.EAGER) == 38_285_312


def test_lora_targets_as_peft_resolves_them() -> None:
    # PEFT 0.21 maps MLP names onto DeepSeek's fused routed experts (transformers_weight_
    # conversion.py) and has no such mapping for qwen2_moe, whose names reach the shared expert
    deepseek = architecture(_model(TINY_V2))
    names = {linear.name for linear in resolve_lora_targets(deepseek, ("all-linear",))}
    assert names == {"q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"} | {
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    assert all(
        linear.copies == 8 for linear in resolve_lora_targets(deepseek, ("gate_proj", "up_proj"))
    )
    qwen = architecture(_model(TINY_QWEN_MOE))
    shared = {linear.name for linear in resolve_lora_targets(qwen, ("all-linear",))}
    assert shared == {"q_proj", "k_proj", "v_proj", "o_proj"} | {
        "shared_expert.gate_proj",
        "shared_expert.up_proj",
        "shared_expert.down_proj",
        "shared_expert_gate",
    }
    gate = resolve_lora_targets(qwen, ("gate_proj",))
    assert [linear.name for linear in gate] == ["shared_expert.gate_proj"]


def test_estimate_counts_dense_and_moe_blocks() -> None:
    model = _model(TINY_V2)
    arch = architecture(model)
    plan = Plan(model="tiny", method=Method.FULL, batch=2, seq=512, attention=Attention.EAGER)
    moe = layer_activation_bytes(arch, 2, 512, 2, Attention.EAGER)
    dense = layer_activation_bytes(arch.dense_block, 2, 512, 2, Attention.EAGER)
    estimate = estimate_memory(plan, model, gpus=1)
    assert estimate.per_gpu.activations >= 3 * moe + dense


def test_moe_layer_freq_other_than_one_is_refused() -> None:
    with pytest.raises(UsageError, match="moe_layer_freq"):
        _model({**TINY_V2, "moe_layer_freq": 2})


def test_missing_latent_key_is_named() -> None:
    config = dict(TINY_V2)
    del config["kv_lora_rank"]
    with pytest.raises(UsageError, match="kv_lora_rank"):
        _model(config)


@pytest.mark.parametrize("method", ["full", "lora", "inference"])
def test_cli_plans_deepseek_config(method: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", str(LITE), "--method", method, "--json"]) == 0
    assert '"memory"' in capsys.readouterr().out


def test_cli_lora_on_qwen_moe_with_its_one_output_gate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # all-linear adapts shared_expert_gate (hidden -> 1), which PEFT takes at any rank: the rank
    # check once refused every rank above 1
    config = tmp_path / "config.json"
    config.write_text(json.dumps(QWEN15_MOE_STYLE))
    assert main(["plan", "--model", str(config), "--method", "lora", "--lora-r", "16"]) == 0
    capsys.readouterr()


def test_qwen_moe_lora_says_the_experts_stay_frozen() -> None:
    model = _model(QWEN15_MOE_STYLE)
    plan = Plan(model="q", method=Method.LORA, lora_targets=("all-linear",), lora_dropout=0.05)
    warnings = " ".join(estimate_memory(plan, model, gpus=1).warnings)
    assert "experts stay frozen" in warnings
    assert "refuses LoRA dropout" not in warnings


def test_generate_plan_holds_the_latent_cache() -> None:
    model = model_from_config_file(LITE)
    plan = Plan(model="lite", method=Method.INFERENCE, batch=2, seq=8192)
    estimate = estimate_memory(plan, model, gpus=1)
    assert estimate.per_gpu.kv_cache == 2 * 8192 * 27 * (512 + 64) * 2
    assert any(label.startswith("KV cache (latent attention") for label, _ in estimate.details)


HELDOUT_LITE = LITE.parents[2] / "heldout" / "DeepSeek-V2-Lite" / "config.json"
GIB = 1024**3


@pytest.mark.parametrize(
    ("fields", "traced_peak", "traced_parts"),
    [
        # (weights, gradients, optimizer, activations + temporaries) at the traced peak, GiB
        ({"method": Method.LORA}, 68.78, (30.60, 0.00, 2.67, 35.50)),
        ({"method": Method.LORA, "attention": Attention.EAGER}, 69.30, (30.60, 0.0, 2.67, 36.03)),
        ({"method": Method.LORA, "grad_ckpt": True}, 36.24, (30.60, 1.28, 2.67, 1.68)),
        ({"method": Method.FULL, "grad_ckpt": True}, 146.31, (29.26, 29.26, 87.79, 0.00)),
        ({"method": Method.INFERENCE, "attention": Attention.EAGER}, 29.49, (29.26, 0, 0, 0.23)),
    ],
)
def test_v2_lite_matches_its_traced_step(
    fields: dict[str, Any], traced_peak: float, traced_parts: tuple[float, ...]
) -> None:
    """DeepSeek-V2-Lite (the held-out config.json, 15.7B) traced with ``hwdash plan --model
    <config> --trace``: transformers 5.24 builds ``DeepseekV2ForCausalLM`` from the config on CPU
    fake tensors (PEFT 0.21 for LoRA: r16 on all-linear, dropout 0, which PEFT refuses on fused
    experts), batch 1 x 1024 tokens, bf16, AdamW foreach, two steps, traced at 2 and 4 layers and
    extrapolated to 27. The figures are ``bench/data/deepseek_v2_lite_trace.csv``
    (``bench/mla_trace_rows.py``); the estimate is compared without its overhead, as the trace sees
    no CUDA context. The peak is within 5% and each component within 5% or 0.1 GiB. Before PEFT's
    fused-expert adapters were counted (gate_up_proj at rank 2r, the router's adapter) the LoRA
    adapters, their gradients and Adam states were 26% under the trace."""
    plan = Plan(model="lite", batch=1, seq=1024, lora_dropout=0.0, **fields)
    per_gpu = estimate_memory(plan, model_from_config_file(HELDOUT_LITE), gpus=1).per_gpu
    assert (per_gpu.total - per_gpu.overhead) / GIB == pytest.approx(traced_peak, rel=0.05)
    counted = (
        per_gpu.weights,
        per_gpu.gradients,
        per_gpu.optimizer,
        per_gpu.activations + per_gpu.kv_cache,
    )
    for estimated, traced in zip(counted, traced_parts, strict=True):
        assert estimated / GIB == pytest.approx(traced, rel=0.05, abs=0.1)


def test_v2_lite_lora_adapters_as_peft_builds_them() -> None:
    # sum(p.numel() for trainable p) of get_peft_model(LoraConfig(r=16, target_modules=
    # "all-linear")) on DeepseekV2ForCausalLM from the held-out config (PEFT 0.21, transformers
    # 5.24): the attention's four linears in all 27 blocks; in the 26 MoE blocks the routed experts'
    # gate_up_proj at rank 32 and down_proj at rank 16 (per expert) and the router at rank 16
    model = model_from_config_file(HELDOUT_LITE)
    plan = Plan(model="lite", method=Method.LORA, lora_r=16, lora_dropout=0.0)
    assert estimate_memory(plan, model, gpus=1).trainable_params == 358_994_944
    # the three MLP names given: gate_up_proj fused at rank 32 again, no router adapter (only
    # all-linear maps the router)
    arch = architecture(model)
    pair = resolve_lora_targets(arch, ("gate_proj", "up_proj", "down_proj"))
    per_expert = 32 * (2048 + 2 * 1408) + 16 * (1408 + 2048)
    assert lora_adapter_params(arch, pair, 16) == 26 * 64 * per_expert
