"""Megatron-LM tensor and pipeline parallelism against hand-computed numbers (issue 13).

The published configuration: GPT-3 175B as Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models", arXiv:2205.05198) train it, Table 3: 96 attention heads,
hidden size 12288, 96 layers, tensor-parallel size 8, pipeline-parallel size 8; sequence length
2048, vocabulary 51200 (GPT-2's 50257 padded by Megatron), micro-batch 1 (section 6). The model is
a GPT: LayerNorm, 4h GELU MLP, biases, embeddings shared with the output layer, dropout 0.1. (Its
learned position embeddings, 2048 x 12288 on the first stage, are not in hwdash's architecture:
0.3% of the first stage's parameters.)
"""

from __future__ import annotations

import pytest

from hwdash.core.estimator import architecture, estimate_memory
from hwdash.core.estimator.parallelism import (
    megatron_layer_activation_bytes,
    megatron_stage,
    megatron_stage_params,
    tensor_parallel_block_params,
)
from hwdash.core.plan import Attention, Plan
from hwdash.core.plan_unused import unused_settings
from hwdash.core.specs import ModelSpec

GPT3_175B = ModelSpec(
    id="gpt3-175b",
    name="GPT-3 175B",
    layers=96,
    hidden_size=12288,
    heads=96,
    kv_heads=96,
    head_dim=128,
    intermediate_size=4 * 12288,
    vocab_size=51200,
    tied_embeddings=True,
    mlp="standard",
    attention_bias=True,
    norm_type="layernorm",
    mlp_activation="gelu",
    max_context=2048,
    source="Korthikanti et al. 2022, arXiv:2205.05198, Table 3; Brown et al. 2020, Table 2.1",
)

H, A, L, V, S = 12288, 96, 96, 51200, 2048
SBH = S * 1 * H  # s * b * h = 25,165,824


def _plan(**changes: object) -> Plan:
    """The paper's setup: full training in bf16 with fp32 master weights (mixed), t=8, p=8,
    micro-batch 1, sequence parallelism and selective recomputation, dropout 0.1, the
    distributed optimizer; 64 micro-batches per step (at least p, so 1F1B fills the pipeline)."""
    fields: dict[str, object] = {
        "model": "gpt3-175b",
        "method": "full",
        "precision": "mixed",
        "batch": 1,
        "seq": S,
        "tp": 8,
        "pp": 8,
        "gpus": 64,
        "zero": 1,
        "grad_accum": 64,
        "selective_recompute": True,
        "hidden_dropout": 0.1,
        "optimizer_impl": "fused",
        # the paper's attention stores its scores (no flash kernel in 2022): --attn eager
        "attention": "eager",
    }
    fields.update(changes)
    return Plan.model_validate(fields)


def test_gpt3_175b_parameters_per_gpu_by_hand() -> None:
    # One block has 12h^2 + 13h parameters: QKV 3h^2 + 3h (bias), output projection h^2 + h,
    # MLP 4h^2 + 4h and 4h^2 + h, two LayerNorms 2h each.
    # On one TP rank: the weights over 8 (12h^2 / 8 = 226,492,416), the column-parallel biases
    # (QKV 3h, first MLP 4h) over 8 (7h / 8 = 10,752), the row-parallel biases (2h = 24,576) and
    # the LayerNorms (4h = 49,152) whole: 226,576,896.
    arch = architecture(GPT3_175B)
    assert tensor_parallel_block_params(arch, 8) == 226_576_896
    # The first of 8 stages: 96 / 8 = 12 blocks (2,718,922,752) + the vocabulary-parallel
    # embedding 51200 x 12288 / 8 = 78,643,200: 2,797,565,952 parameters per GPU.
    assert megatron_stage_params(arch, 8, 8, 0) == 2_797_565_952
    # The last: 12 blocks + the final LayerNorm (2h = 24,576) + its copy of the (tied) embedding
    # as the output layer (78,643,200): 2,797,590,528.
    assert megatron_stage_params(arch, 8, 8, 7) == 2_797_590_528
    # A middle stage: the blocks only.
    assert megatron_stage_params(arch, 8, 8, 3) == 12 * 226_576_896


def test_gpt3_175b_per_layer_activations_follow_table_2() -> None:
    arch = architecture(GPT3_175B)

    def layer(tp: int, sp: bool, selective: bool) -> float:
        return megatron_layer_activation_bytes(
            arch,
            1,
            S,
            2,
            tp,
            sequence_parallel=sp,
            attention=Attention.EAGER,
            selective_recompute=selective,
            dropout=True,
        )

    # 5as/h = 5 * 96 * 2048 / 12288 = 80
    # no parallelism: sbh (34 + 5as/h) = 114 sbh
    assert layer(1, False, False) == 114 * SBH
    # tensor parallel: sbh (10 + 24/t + 5as/(ht)) = sbh (10 + 3 + 10) = 23 sbh
    assert layer(8, False, False) == 23 * SBH
    # tensor + sequence parallel: sbh/t (34 + 5as/h) = 114 sbh / 8
    assert layer(8, True, False) == 114 * SBH / 8
    # tensor parallel + selective recomputation: sbh (10 + 24/t) = 13 sbh
    assert layer(8, False, True) == 13 * SBH
    # tensor + sequence parallel + selective recomputation: 34 sbh / t
    assert layer(8, True, True) == 34 * SBH / 8


def test_gpt3_175b_first_stage_by_hand() -> None:
    plan = _plan()
    params = 2_797_565_952
    # bf16 parameters (2 bytes) and fp32 main gradients (4 bytes), not distributed;
    # fp32 master copy + Adam's two fp32 states (12 bytes) over dp = 64 / (8 x 8) = 1.
    weights = 2 * params  # 5,595,131,904
    gradients = 4 * params  # 11,190,263,808
    optimizer = 12 * params // 1  # 33,570,791,424
    # Activations: 1F1B keeps p = 8 micro-batches in flight on the first stage, each through its
    # 12 layers: 96 layers of 34 sbh / t = 106,954,752 bytes (sequence parallel, selective
    # recomputation) = 10,267,656,192; plus the embedding's dropout mask, sbh / t per micro-batch
    # (section 4.3): 8 x 3,145,728 = 25,165,824. Together 10,292,822,016.
    activations = 96 * 34 * SBH // 8 + 8 * SBH // 8
    assert activations == 10_292_822_016
    stage = megatron_stage(plan, architecture(GPT3_175B), 64, 0)
    assert stage.micro_batches_in_flight == 8
    assert (stage.weights, stage.gradients, stage.optimizer, stage.activations) == (
        weights,
        gradients,
        optimizer,
        activations,
    )
    # The estimator's breakdown is the heavier stage: the first (the last holds one micro-batch:
    # 12 x 106,954,752 + 4 sbh/t (final norm and output layer inputs) + 4 s b v / t (fp32 logits)
    # + 2 s b v / t (the 16-bit logits, then their gradient cast back from fp32: cross_entropy.py)
    # = 1,374,683,136 bytes of activations).
    last = megatron_stage(plan, architecture(GPT3_175B), 64, 7)
    assert (
        last.activations
        == 12 * 34 * SBH // 8 + 4 * SBH // 8 + (4 + 2) * S * V // 8
        == 1_374_683_136
    )
    estimate = estimate_memory(plan, GPT3_175B)
    memory = estimate.per_gpu
    assert estimate.peak_phase == "start of backward"
    assert (memory.weights, memory.gradients, memory.optimizer, memory.activations) == (
        weights,
        gradients,
        optimizer,
        activations,
    )
    # about 56.5 GiB before the CUDA context and fragmentation: it fits an 80 GB A100, as the
    # paper trains it, where 114 sbh / t per layer without selective recomputation would not
    assert (weights + gradients + optimizer + activations) / 2**30 == pytest.approx(56.48, abs=0.01)
    without_selective = estimate_memory(
        plan.with_changes({"selective_recompute": False}), GPT3_175B
    )
    assert without_selective.per_gpu.activations == 96 * 114 * SBH // 8 + 8 * SBH // 8
    assert without_selective.per_gpu.total > 80 * 2**30


def test_distributed_optimizer_shards_over_data_parallel() -> None:
    # 512 GPUs: dp = 512 / 64 = 8; the distributed optimizer's 6 + 12/d bytes per parameter.
    plan = _plan(gpus=512)
    params = 2_797_565_952
    memory = estimate_memory(plan, GPT3_175B).per_gpu
    assert memory.optimizer == 12 * params // 8 == 4_196_348_928
    assert memory.weights + memory.gradients + memory.optimizer == (6 + 12 / 8) * params
    # without it (--zero 0) every data-parallel rank keeps all 18 bytes
    replicated = estimate_memory(plan.with_changes({"zero": 0}), GPT3_175B).per_gpu
    assert replicated.optimizer == 12 * params


def test_pipeline_in_flight_micro_batches() -> None:
    arch = architecture(GPT3_175B)
    # fewer micro-batches than stages: the first stage holds only those
    two = megatron_stage(_plan(grad_accum=2), arch, 64, 0)
    eight = megatron_stage(_plan(grad_accum=64), arch, 64, 0)
    assert two.micro_batches_in_flight == 2
    assert two.activations * 4 == pytest.approx(eight.activations)
    # stage k of p holds p - k micro-batches (1F1B)
    assert megatron_stage(_plan(), arch, 64, 5).micro_batches_in_flight == 3


def test_full_recomputation_keeps_each_layer_input() -> None:
    arch = architecture(GPT3_175B)
    plan = _plan(selective_recompute=False, grad_ckpt=True, hidden_dropout=0.0)
    stage = megatron_stage(plan, arch, 64, 0)
    one_layer = 34 * SBH / 8 - 2 * SBH / 8 + 2 * 96 * S * S / 8  # no masks: 32 sbh + 2as^2b, /t
    assert stage.one_layer == pytest.approx(one_layer)
    # 8 micro-batches x 12 layers x their input (2 sbh / t with sequence parallelism) + the layer
    # being recomputed
    assert stage.activations == pytest.approx(8 * 12 * 2 * SBH / 8 + one_layer)


def test_no_sequence_parallel_keeps_norm_activations_whole() -> None:
    plan = _plan(sequence_parallel=False)
    memory = estimate_memory(plan, GPT3_175B).per_gpu
    # 96 layers of 13 sbh (selective, TP only) + the 8 embedding dropout masks (sbh each)
    assert memory.activations == 96 * 13 * SBH + 8 * SBH


def test_bf16_megatron_is_counted_with_fp32_main_gradients_and_master() -> None:
    estimate = estimate_memory(_plan(precision="bf16"), GPT3_175B)
    mixed = estimate_memory(_plan(), GPT3_175B)
    assert estimate.per_gpu == mixed.per_gpu
    assert any("fp32 main gradients" in warning for warning in estimate.warnings)


def test_fp32_megatron_bytes() -> None:
    params = 2_797_565_952
    memory = estimate_memory(_plan(precision="fp32", gpus=512), GPT3_175B).per_gpu
    # fp32 parameters and gradients, Adam states over d = 8: 8 + 8/d bytes per parameter
    assert memory.weights + memory.gradients + memory.optimizer == (8 + 8 / 8) * params


def test_framework_megatron_alone_is_the_megatron_path() -> None:
    """``--framework megatron`` full training with data parallelism only runs Megatron-LM's own
    layers (set H's megatron-tutorials DP rows): Korthikanti's per-layer activations, its fp32
    main-gradient buffer and distributed optimizer, not the generic (Hugging Face) path."""
    plan = Plan.model_validate(
        {
            "model": "gpt3-175b",
            "method": "full",
            "precision": "mixed",
            "framework": "megatron",
            "batch": 1,
            "seq": S,
            "gpus": 8,
            "zero": 1,
            "hidden_dropout": 0.1,
            "attention": "flash",
        }
    )
    assert plan.megatron and plan.megatron_flags == "--framework megatron"
    memory = estimate_memory(plan, GPT3_175B).per_gpu
    params = megatron_stage_params(architecture(GPT3_175B), 1, 1, 0)
    # 2 + 4 bytes per parameter and the optimizer's 12 over dp = 8
    assert (memory.weights, memory.gradients) == (2 * params, 4 * params)
    assert memory.optimizer == 12 * params // 8
    # 96 layers of the paper's 34 sbh less the scores (flash: an fp32 log-sum-exp per row), the
    # embedding's dropout mask (sbh), the head: 4 sbh (norm and output inputs) + 6 s b v (logits)
    layer = 34 * SBH + 4 * A * S
    assert memory.activations == 96 * layer + SBH + 4 * SBH + 6 * S * V
    # the settings that Megatron-LM does not run keep the generic path, as do other methods
    for changes in ({"zero": 3}, {"fsdp": "full", "zero": 0}, {"method": "lora"}):
        assert not plan.with_changes(changes).megatron, changes
    assert not plan.with_changes({"framework": "hf"}).megatron
    # so Megatron's own settings are read there, and only there
    assert unused_settings(plan, ["hidden_dropout"]) == []
    (unused,) = unused_settings(plan.with_changes({"framework": "hf"}), ["hidden_dropout"])
    assert unused == (
        "hidden_dropout",
        "only Megatron plans (--tp, --pp, --cp or --ep above 1, or --framework megatron full "
        "training) use it",
    )
