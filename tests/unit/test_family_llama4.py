"""Llama 4 (Scout, Maverick) through the config door: interleaved MoE with a shared expert, dense
blocks of ``intermediate_size_mlp``, NoPE and chunked-attention layers, the vision tower (issue 30).

How the pinned figures were measured (transformers 5.24, torch 2.13 CPU, PEFT 0.21):

* parameter counts: ``sum(p.numel())`` of ``Llama4ForConditionalGeneration(Llama4Config(**config))``
  built under ``torch.device("meta")`` (``Llama4ForCausalLM(config.text_config)`` for the text
  model), from the config.json files under ``tests/data/model_configs/llama4`` (the published
  ``"attn_temperature_tuning": 4`` passed as true, which the strict 5.24 config class wants);
* per-layer activations: ``bench/llama4_trace_rows.py``, which traces the tiny text config at 1 to
  4 layers with ``hwdash.tracing.trace_plan`` (fake CPU tensors, bf16, SDPA, batch 2 x 512
  tokens, LoRA rank 16, dropout 0) and takes the growth of the activations and temporaries alive
  at the end of the step-2 forward from one depth to the next: layer 1 is a MoE block with RoPE
  (chunked attention, Q/K norm), layer 2 a dense block with RoPE, layer 3 a MoE block without
  RoPE. The same figures come from ``torch.autograd.graph.saved_tensors_hooks`` on real CPU
  tensors (storages summed once, parameters left out);
* whole plans: ``PYTHONPATH=src python -m hwdash plan --model
  tests/data/model_configs/llama4/tiny-llama4-text --batch 2 --seq 512 --trace --json``
  (``--method full``, and ``--method lora --lora-targets q_proj,v_proj``): the traced peak; the
  same for the Scout and Maverick configs at the settings of
  :func:`test_published_configs_within_two_percent_of_trace` (the tracer draws their 48 layers
  from traces at 4 and 8).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from hwdash.cli import main
from hwdash.core.estimator import (
    architecture,
    layer_activation_bytes,
    lora_adapter_params,
    resolve_lora_targets,
)
from hwdash.core.estimator.architecture import dense_block_adapted
from hwdash.core.estimator.inference import inference_activation_bytes
from hwdash.core.estimator.serving import packaged_engines, profile_activation_bytes
from hwdash.core.models.config import hf_config_of, model_from_config, model_from_config_file
from hwdash.core.models.params import count_active_parameters, count_parameters
from hwdash.core.plan import Attention, Method, Plan
from hwdash.errors import UsageError
from hwdash.tracing.comparison import comparable_estimate

CONFIGS = Path(__file__).resolve().parent.parent / "data" / "model_configs" / "llama4"
SCOUT = CONFIGS / "Llama-4-Scout-17B-16E" / "config.json"
MAVERICK = CONFIGS / "Llama-4-Maverick-17B-128E" / "config.json"
TINY = CONFIGS / "tiny-llama4" / "config.json"
TINY_TEXT = CONFIGS / "tiny-llama4-text" / "config.json"


def _tiny_text() -> dict[str, Any]:
    config: dict[str, Any] = json.loads(TINY_TEXT.read_text(encoding="utf-8"))
    return config


@pytest.mark.parametrize(
    ("path", "meta_count"),
    [
        (SCOUT, 108_641_793_536),
        (MAVERICK, 401_583_781_376),
        (TINY, 3_665_920),
        (TINY_TEXT, 3_444_992),
    ],
)
def test_parameters_equal_transformers_meta_count(path: Path, meta_count: int) -> None:
    assert count_parameters(model_from_config_file(path)) == meta_count


@pytest.mark.parametrize(
    ("path", "text_count"), [(SCOUT, 107_769_861_120), (MAVERICK, 400_711_848_960)]
)
def test_vision_tower_and_projector_counted_apart(path: Path, text_count: int) -> None:
    # Llama4ForCausalLM(text_config) on the meta device; the rest is the vision model, its
    # pixel-shuffle adapter and the projector (871,932,416 in both)
    model = model_from_config_file(path)
    assert model.vision is not None
    assert model.vision.params == 871_932_416
    assert count_parameters(model) - model.vision.params == text_count
    # 336 px tiles of 14 px patches: 576 patches, pixel-shuffled to 144 tokens; 16 tiles and
    # the whole image at most
    assert model.vision.image_tokens == 144 * 17


def test_active_parameters_by_hand() -> None:
    # per token: the attention (q, o 5120 x 5120; k, v 5120 x 1024), one routed expert and the
    # shared expert (3 x 5120 x 8192 each), the router (5120 x experts) and two norms per MoE
    # block; the dense MLP (3 x 5120 x 16384) per dense block; embedding, head, final norm
    attention = 2 * 5120 * 5120 + 2 * 5120 * 1024
    expert = 3 * 5120 * 8192
    outside = 2 * 202048 * 5120 + 5120
    scout = 48 * (attention + 2 * expert + 5120 * 16 + 2 * 5120) + outside
    maverick = 24 * (attention + 2 * expert + 5120 * 128 + 2 * 5120)
    maverick += 24 * (attention + 3 * 5120 * 16384 + 2 * 5120) + outside
    assert count_active_parameters(model_from_config_file(SCOUT)) == scout
    assert count_active_parameters(model_from_config_file(MAVERICK)) == maverick
    # the "17B" of both names
    assert 17.0e9 < scout < 17.3e9 and 17.0e9 < maverick < 17.3e9


def test_interleaved_layout_as_read() -> None:
    scout, maverick = model_from_config_file(SCOUT), model_from_config_file(MAVERICK)
    assert (scout.experts, scout.dense_mlp_layers, scout.qk_norm) == (16, 0, True)
    assert scout.shared_expert_intermediate_size == scout.intermediate_size == 8192
    # interleave_moe_layer_step 2: MoE blocks 1, 3, ..., 47; dense MLPs of intermediate_size_mlp
    assert maverick.moe_layer_indices == tuple(range(1, 48, 2))
    assert (maverick.dense_mlp_layers, maverick.dense_intermediate_size) == (24, 16384)
    assert maverick.experts == 128 and not maverick.qk_norm  # use_qk_norm false
    for model in (scout, maverick):
        assert model.nope_layers == tuple(range(3, 48, 4))
        assert model.attention_chunk_size == 8192
        assert model.layer_attention == ("chunked", "chunked", "chunked", "full") * 12
        assert model.experts_every_token and not model.peft_fused_experts
        assert "8,192 tokens" in model.notes
    kinds = [count for count, _ in architecture(maverick).block_kinds]
    assert kinds == [12, 12, 24]  # MoE with RoPE, MoE without (3, 7, ...), dense with RoPE


#: (method, LoRA targets, layer, traced bytes): bench/llama4_trace_rows.py (module docstring).
TRACED_LAYERS = [
    ("full", (), 1, 20_824_064),
    ("full", (), 2, 12_926_976),
    ("full", (), 3, 17_639_424),
    ("lora", ("q_proj", "v_proj"), 1, 15_804_416),
    ("lora", ("q_proj", "v_proj"), 2, 10_921_984),
    ("lora", ("q_proj", "v_proj"), 3, 12_619_776),
    ("lora", ("gate_proj", "up_proj", "down_proj"), 1, 16_312_320),
    ("lora", ("gate_proj", "up_proj", "down_proj"), 2, 12_050_432),
    ("lora", ("gate_proj", "up_proj", "down_proj"), 3, 13_062_144),
]


@pytest.mark.parametrize(("method", "targets", "layer", "traced"), TRACED_LAYERS)
def test_layer_activations_match_trace(
    method: str, targets: tuple[str, ...], layer: int, traced: int
) -> None:
    arch = architecture(model_from_config(_tiny_text(), name="tiny", source="test"))
    # block_kinds: (MoE, RoPE), (MoE, NoPE), (dense, RoPE): the tiny's layers 1, 3 and 2
    kind = {1: arch.block_kinds[0][1], 3: arch.block_kinds[1][1], 2: arch.block_kinds[2][1]}[layer]
    names = {linear.name for linear in resolve_lora_targets(arch, targets)} if targets else set()
    if kind.experts == arch.experts:
        adapted = tuple(linear for linear in kind.linears if linear.name in names)
    else:
        adapted = dense_block_adapted(arch, kind, names)
    counted = layer_activation_bytes(
        kind, 2, 512, 2, Attention.SDPA, lora_targets=adapted, lora_rank=16 if adapted else 0
    )
    assert counted == pytest.approx(traced, rel=0.01)


def test_chunked_layers_get_a_mask_from_the_chunk_size_on() -> None:
    # attention_chunk_size 128: shorter sequences run causal SDPA without a mask; from 128 tokens
    # on, each RoPE layer keeps K and V at all 8 heads and a b x 1 x s x s additive mask
    arch = architecture(model_from_config(_tiny_text(), name="tiny", source="test"))
    rope, nope = arch.block_kinds[0][1], arch.block_kinds[1][1]

    def extra(seq: int) -> int:
        qk_norm = 4 * 2 * seq * (256 + 64) + 4 * 2 * seq * (8 + 2)
        rope_bytes = layer_activation_bytes(rope, 2, seq, 2, Attention.SDPA)
        return rope_bytes - layer_activation_bytes(nope, 2, seq, 2, Attention.SDPA) - qk_norm

    assert extra(64) == 0
    assert extra(512) == 2 * 2 * 512 * 512 + 2 * 2 * (2 * 512) * (256 - 64)


@pytest.mark.parametrize(
    ("method", "targets", "traced_peak"),
    [("full", (), 99_762_176), ("lora", ("q_proj", "v_proj"), 70_169_088)],
)
def test_whole_plan_within_five_percent_of_trace(
    method: str, targets: tuple[str, ...], traced_peak: int
) -> None:
    model = model_from_config_file(TINY_TEXT)
    plan = Plan(model=str(TINY_TEXT), method=Method(method), batch=2, seq=512)
    if targets:
        plan = plan.model_copy(update={"lora_targets": targets})
    breakdown = comparable_estimate(plan, model).per_gpu.as_dict()
    assert breakdown["total"] - breakdown["overhead"] == pytest.approx(traced_peak, rel=0.05)


@pytest.mark.parametrize(
    ("path", "method", "batch", "seq", "traced_peak"),
    [
        # hwdash plan --model <folder> --method M [--lora-targets q_proj,v_proj] --batch B --seq S
        # --trace --json: traced at 4 and 8 layers, drawn to 48 (the vision tower is not traced)
        (SCOUT, "lora", 1, 1024, 272_475_877_376),
        (SCOUT, "full", 1, 8192, 1_292_708_382_208),  # chunked layers masked from 8192 tokens
        (MAVERICK, "lora", 1, 2048, 1_203_811_586_048),
        (MAVERICK, "inference", 1, 4096, 842_161_498_624),
    ],
)
def test_published_configs_within_two_percent_of_trace(
    path: Path, method: str, batch: int, seq: int, traced_peak: int
) -> None:
    plan = Plan(model=str(path), method=Method(method), batch=batch, seq=seq)
    if method == "lora":
        plan = plan.model_copy(update={"lora_targets": ("q_proj", "v_proj")})
    breakdown = comparable_estimate(plan, model_from_config_file(path)).per_gpu.as_dict()
    assert breakdown["total"] - breakdown["overhead"] == pytest.approx(traced_peak, rel=0.02)


@pytest.mark.parametrize(
    ("targets", "traced_trainable"),
    [(("q_proj", "v_proj"), 53_248), (("gate_proj", "up_proj", "down_proj"), 116_736)],
)
def test_lora_reaches_shared_expert_and_dense_mlps(
    targets: tuple[str, ...], traced_trainable: int
) -> None:
    # the traced model's trainable parameters (rank 16): PEFT has no fused-expert mapping for
    # llama4, so gate/up/down adapt the shared expert in the MoE blocks and the dense MLPs
    arch = architecture(model_from_config(_tiny_text(), name="tiny", source="test"))
    assert lora_adapter_params(arch, resolve_lora_targets(arch, targets), 16) == traced_trainable


def test_tracer_config_is_the_text_model() -> None:
    # the published configs' "attn_temperature_tuning": 4 is refused by transformers 5.24's
    # strict Llama4TextConfig; the tracer gets its truth value and the text model type
    raw = json.loads(SCOUT.read_text(encoding="utf-8"))
    fields = hf_config_of(raw)
    assert fields["model_type"] == "llama4_text"
    assert fields["attn_temperature_tuning"] is True
    assert "vision_config" not in fields and fields["hidden_size"] == 5120
    assert model_from_config_file(SCOUT).hf_config == fields


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_size": None}, "has no 'hidden_size'"),
        ({"num_experts_per_tok": 8}, "'num_experts_per_tok' \\(8\\) is more than the 4 experts"),
        ({"moe_layers": "odd"}, "'moe_layers' must be a list of whole numbers"),
        ({"no_rope_layers": [1, 0]}, "'no_rope_layers' must list 0 or 1 for each of the 4"),
        ({"num_local_experts": 1}, "'num_local_experts' must be at least 2"),
    ],
)
def test_broken_config_is_refused_by_name(change: dict[str, Any], message: str) -> None:
    config = {**_tiny_text(), **change}
    config = {key: value for key, value in config.items() if value is not None}
    with pytest.raises(UsageError, match=message):
        model_from_config(config, name="broken", source="test")


def test_cli_refuses_a_config_missing_a_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = json.loads(TINY.read_text(encoding="utf-8"))
    del raw["text_config"]["num_hidden_layers"]
    (tmp_path / "config.json").write_text(json.dumps(raw), encoding="utf-8")
    assert main(["plan", "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--model" in err and "'num_hidden_layers'" in err and "Traceback" not in err


@pytest.mark.parametrize("method", ["full", "lora", "inference"])
def test_cli_plans_llama4(method: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", str(TINY), "--method", method, "--json"]) == 0
    assert '"memory"' in capsys.readouterr().out


def test_transformers_prefill_runs_every_expert_engines_the_top_k() -> None:
    # generate() with transformers runs Llama4TextMoe: every expert on every prompt token; vLLM's
    # profile run goes through its fused top-k MoE kernel
    arch = architecture(model_from_config_file(SCOUT))
    top_k = dataclasses.replace(arch, experts_every_token=False)
    mlp = 3 * 2 * 4096 * 8192  # gate, up and the product of one expert over 4096 tokens
    assert inference_activation_bytes(arch, 1, 4096, 2, Attention.SDPA) == (
        inference_activation_bytes(top_k, 1, 4096, 2, Attention.SDPA) + 15 * mlp
    )
    vllm = packaged_engines()["vllm"]
    assert profile_activation_bytes(arch, 8192, 256, 2, vllm, 1) == profile_activation_bytes(
        top_k, 8192, 256, 2, vllm, 1
    )


def test_traced_depths_hold_whole_moe_interleaves() -> None:
    # layer types repeat every 4 layers (three chunked, one full); with a MoE block every 3rd the
    # stack repeats every 12, so the two traced depths must hold whole repeats of both
    from hwdash.tracing.tracer import _depths_to_trace

    types = ["chunked_attention"] * 3 + ["full_attention"]
    assert _depths_to_trace({"interleave_moe_layer_step": 3}, 96, types * 24, False) == (12, 24)
    assert _depths_to_trace({"interleave_moe_layer_step": 2}, 48, types * 12, False) == (4, 8)


def test_training_step_flops_run_every_expert_serving_the_top_k() -> None:
    """Llama4TextMoe runs all experts on every token (modeling_llama4.py), so a training step's
    N counts every routed expert: Scout's 48 MoE blocks hold 16 experts of 3 x 5120 x 8192
    (15 more than the active count's one), Maverick's 24 MoE blocks 128 (127 more). The LM head
    (202048 x 5120) is in N, the embedding lookup is not. Full training is 6N, LoRA 4N; an RL
    rollout through vLLM generates with the top-k, one through the policy's generate with all."""
    from hwdash.core.planning.run_time import flops_per_token

    attention = 2 * 5120 * 5120 + 2 * 5120 * 1024
    expert = 3 * 5120 * 8192
    head = 202048 * 5120
    scout_active = 48 * (attention + 2 * expert + 5120 * 16) + head
    scout_all = scout_active + 48 * 15 * expert
    maverick_active = 24 * (attention + 2 * expert + 5120 * 128)
    maverick_active += 24 * (attention + 3 * 5120 * 16384) + head
    maverick_all = maverick_active + 24 * 127 * expert
    scout, maverick = model_from_config_file(SCOUT), model_from_config_file(MAVERICK)

    def plan(method: str, **extra: Any) -> Plan:
        return Plan(model="m", method=Method(method), batch=1, seq=512, **extra)

    assert flops_per_token(plan("full"), scout) == 6 * scout_all
    assert flops_per_token(plan("lora"), scout) == 4 * scout_all
    assert flops_per_token(plan("full"), maverick) == 6 * maverick_all
    # serving (transformers' generate is bandwidth-timed; vLLM's FLOPs stay top-k elsewhere)
    assert flops_per_token(plan("inference"), scout) == 2 * scout_active
    # GRPO with LoRA and a reference: 4N training + 2N reference + 2N generation
    grpo = plan("grpo", rl_method=Method.LORA)
    assert flops_per_token(grpo, scout) == 6 * scout_all + 2 * scout_active
    policy = plan("grpo", rl_method=Method.LORA, vllm_memory_utilization=0.0)
    assert flops_per_token(policy, scout) == 8 * scout_all


def test_mfu_counts_the_models_flops_the_top_k() -> None:
    """The monitor's MFU takes the model's FLOPs (PaLM's definition): Scout's top-1 expert, 6N."""
    from hwdash.core.planning.run_time import flops_per_token

    scout = model_from_config_file(SCOUT)
    active = 48 * (2 * 5120 * 5120 + 2 * 5120 * 1024 + 2 * 3 * 5120 * 8192 + 5120 * 16)
    active += 202048 * 5120
    plan = Plan(model="m", method=Method.FULL, batch=1, seq=512)
    assert flops_per_token(plan, scout, model_flops=True) == 6 * active
