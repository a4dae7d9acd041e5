"""The memory savers of issue 13, each against numbers computed by hand from its formula."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from hwdash.core.catalog import Catalog, CatalogError, load_catalog, load_catalog_from
from hwdash.core.estimator import architecture, estimate_memory
from hwdash.core.estimator.savers import (
    COMPILED_STANDARD_BYTES_PER_LOGIT,
    STANDARD_BYTES_PER_LOGIT,
    loss_bytes_per_logit,
    packaged_frameworks,
    resolve_savers,
)
from hwdash.core.plan import Loss, Plan
from hwdash.core.results import MemoryEstimate
from hwdash.core.specs import ModelSpec


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(include_user=False)


@pytest.fixture(scope="module")
def llama1b(catalog: Catalog) -> ModelSpec:
    return catalog.models["llama-3.2-1b"]


def detail(estimate: MemoryEstimate, label: str) -> int:
    return dict(estimate.details)[label]


def test_bytes_per_logit_of_each_loss() -> None:
    assert loss_bytes_per_logit(Loss.STANDARD, False, 2) == STANDARD_BYTES_PER_LOGIT == 12
    assert loss_bytes_per_logit(Loss.STANDARD, True, 2) == COMPILED_STANDARD_BYTES_PER_LOGIT == 8
    assert loss_bytes_per_logit(Loss.LEGACY, False, 2) == 16
    # 16-bit logits + saved fp32 log-probabilities + one chunk of 8 (fp32 copy + gradient)
    assert loss_bytes_per_logit(Loss.CHUNKED, False, 2) == 2 + 4 + 8 / 8
    assert loss_bytes_per_logit(Loss.CHUNKED, True, 2) == 2 + 2 / 8
    assert loss_bytes_per_logit(Loss.FUSED_LINEAR, False, 2) == 0


def _logits(plan: Plan, model: ModelSpec) -> int:
    estimate = estimate_memory(plan, model)
    assert estimate.peak_phase == "start of backward"
    return detail(estimate, "model logits and loss")


def test_each_loss_in_the_estimate(llama1b: ModelSpec) -> None:
    arch = architecture(llama1b)
    tokens = 2 * 1024
    base = Plan(model="llama-3.2-1b", method="lora", batch=2, seq=1024)
    logits = {
        loss: _logits(base.with_changes({"loss": loss}), llama1b)
        for loss in ("standard", "legacy", "chunked", "fused-linear")
    }
    assert logits["standard"] == tokens * arch.vocab * 12
    assert logits["legacy"] == tokens * arch.vocab * 16
    assert logits["chunked"] == tokens * arch.vocab * 7
    # Liger: hidden-state gradient + one chunk of at most 2 t h logits, 16-bit
    assert logits["fused-linear"] == 3 * 2 * tokens * arch.hidden
    assert logits["fused-linear"] < logits["chunked"] < logits["standard"] < logits["legacy"]


def test_a_chunked_loss_holds_the_trained_output_layers_gradient(llama1b: ModelSpec) -> None:
    arch = architecture(llama1b)
    tokens = 8192
    plan = Plan(model="llama-3.2-1b", method="full", seq=tokens, loss="chunked")
    head_gradient = arch.vocab * arch.hidden * 2  # tied embedding, bf16 gradient
    assert _logits(plan, llama1b) == tokens * arch.vocab * 7 + head_gradient


def test_compile_fuses_the_norms_and_the_loss(llama1b: ModelSpec) -> None:
    arch = architecture(llama1b)
    tokens = 8192
    plan = Plan(model="llama-3.2-1b", method="full", seq=tokens)
    eager = estimate_memory(plan, llama1b)
    compiled = estimate_memory(plan.with_changes({"compile": True}), llama1b)
    assert eager.peak_phase == compiled.peak_phase == "start of backward"
    # two norms per layer keep the 16-bit input instead of the fp32 upcast and the bf16 output
    norms = arch.layers * 2 * (4 - 2 + 2) * tokens * arch.hidden
    assert detail(eager, "model activations") - detail(compiled, "model activations") == norms
    assert detail(compiled, "model logits and loss") == tokens * arch.vocab * 8


def test_compile_saves_nothing_on_the_norms_of_fp32_activations(llama1b: ModelSpec) -> None:
    # fp32 activations: the eager norm's upcast is a no-op (no 4-byte copy to fuse away) and the
    # compiled kernel keeps the 4-byte input it would keep anyway: the same norm bytes, also for
    # trained norm weights (full fine-tuning). Only the loss differs (the compiled one keeps
    # 8 bytes per logit, the eager fp32 one 4 + 8).
    plan = Plan(model="llama-3.2-1b", method="full", precision="fp32", seq=2048)
    eager = estimate_memory(plan, llama1b)
    compiled = estimate_memory(plan.with_changes({"compile": True}), llama1b)
    assert eager.peak_phase == compiled.peak_phase == "start of backward"
    assert detail(compiled, "model activations") == detail(eager, "model activations")
    # ... while the bf16 run of the same plan does save on them
    bf16 = plan.with_changes({"precision": "bf16"})
    assert detail(
        estimate_memory(bf16.with_changes({"compile": True}), llama1b), "model activations"
    ) < (detail(estimate_memory(bf16, llama1b), "model activations"))


def test_activation_offload_keeps_two_layers_on_the_gpu(llama1b: ModelSpec) -> None:
    arch = architecture(llama1b)
    tokens = 4096
    plan = Plan(model="llama-3.2-1b", method="lora", seq=4096, grad_ckpt=True)
    kept = estimate_memory(plan, llama1b)
    offloaded = estimate_memory(plan.with_changes({"activation_offload": True}), llama1b)
    checkpoint = 2 * tokens * arch.hidden  # one layer's bf16 input
    assert detail(kept, "model activations (checkpoints)") == arch.layers * checkpoint
    # two layers stay: the one backward is working on and the next, brought back early on a side
    # stream (torchtune's OffloadActivations(use_streams=True)); written out, not read from the
    # code's constant, so a changed constant fails here
    assert detail(offloaded, "model activations (checkpoints)") == 2 * checkpoint
    assert offloaded.host_bytes == (arch.layers - 2) * checkpoint
    assert offloaded.per_gpu.total < kept.per_gpu.total


def test_optimizer_in_backward_keeps_one_gradient(llama1b: ModelSpec) -> None:
    arch = architecture(llama1b)
    plan = Plan(model="llama-3.2-1b", method="full", seq=256, optimizer_impl="fused")
    normal = estimate_memory(plan, llama1b)
    fused = estimate_memory(plan.with_changes({"optimizer_in_backward": True}), llama1b)
    assert normal.peak_phase != "start of backward"
    assert normal.per_gpu.gradients == arch.total_params * 2
    # the tied embedding is the largest tensor: its bf16 gradient is all that is ever alive
    assert 0 <= fused.per_gpu.gradients <= arch.vocab * arch.hidden * 2
    assert fused.per_gpu.total < normal.per_gpu.total - arch.total_params


def test_optimizer_in_backward_refuses_gradient_accumulation() -> None:
    with pytest.raises(ValidationError, match="grad_accum 1"):
        Plan(model="7B", method="full", optimizer_in_backward=True, grad_accum=4)
    # a framework default it cannot use is dropped instead
    plan = Plan(model="7B", method="full", framework="torchtune", grad_accum=4)
    assert resolve_savers(plan).optimizer_in_backward is False
    assert resolve_savers(plan.with_changes({"grad_accum": 1})).optimizer_in_backward is True


def test_paged_states_are_counted_and_reported_as_managed(llama1b: ModelSpec) -> None:
    arch = architecture(llama1b)
    plan = Plan(model="llama-3.2-1b", method="full", seq=256)
    plain = estimate_memory(plan.with_changes({"optimizer": "adamw-8bit"}), llama1b)
    paged = estimate_memory(plan.with_changes({"optimizer": "adamw-8bit-paged"}), llama1b)
    assert paged.managed_bytes == 2 * arch.total_params
    assert plain.managed_bytes == 0
    # NVML's view: the states are on the GPU either way
    assert paged.per_gpu.optimizer == plain.per_gpu.optimizer == 2 * arch.total_params
    labels = [label for label, _ in paged.details]
    assert "model optimizer states (paged: CUDA managed memory)" in labels


def test_qlora_frozen_parts_in_bf16(llama1b: ModelSpec) -> None:
    arch = architecture(llama1b)
    plan = Plan(model="llama-3.2-1b", method="qlora", seq=256)
    fp32 = estimate_memory(plan, llama1b)
    bf16 = estimate_memory(plan.with_changes({"qlora_frozen_dtype": "bf16"}), llama1b)
    label = "model frozen base (qlora)"
    assert detail(fp32, label) - detail(bf16, label) == 2 * arch.unquantized_params


def test_bf16_adapters_halve_the_adapter_states(llama1b: ModelSpec) -> None:
    plan = Plan(model="llama-3.2-1b", method="lora", seq=256, lora_dropout=0)
    fp32 = estimate_memory(plan, llama1b)
    bf16 = estimate_memory(plan.with_changes({"adapter_dtype": "bf16"}), llama1b)
    trainable = fp32.trainable_params
    assert detail(fp32, "model adapters") == 4 * trainable
    assert detail(bf16, "model adapters") == 2 * trainable
    # AdamW states: fp32 4+4 bytes vs bf16 2+2
    assert detail(fp32, "model optimizer states") == 8 * trainable
    assert detail(bf16, "model optimizer states") == 4 * trainable
    # no fp32 adapters, no cast copies of their inputs or weights
    assert detail(bf16, "model activations") < detail(fp32, "model activations")


def test_shared_value_head_drops_the_second_backbone(llama1b: ModelSpec) -> None:
    arch = architecture(llama1b)
    plan = Plan(model="llama-3.2-1b", method="ppo", seq=512, vllm_memory_utilization=0)
    separate = estimate_memory(plan, llama1b)
    shared = estimate_memory(plan.with_changes({"value_head": "shared"}), llama1b)
    assert separate.trainable_params == 2 * arch.total_params
    assert shared.trainable_params == arch.total_params + arch.hidden + 1
    # the value backbone's bf16 weights alone
    assert separate.per_gpu.total - shared.per_gpu.total > 2 * arch.total_params


def test_framework_defaults_and_explicit_settings_win() -> None:
    plan = Plan(model="7B", method="lora", framework="torchtune")
    savers = resolve_savers(plan)
    assert savers.loss is Loss.CHUNKED
    assert savers.adapter_dtype.value == "bf16"
    assert resolve_savers(plan.with_changes({"loss": "standard"})).loss is Loss.STANDARD
    unsloth = resolve_savers(Plan(model="7B", method="qlora", framework="unsloth"))
    assert unsloth.loss is Loss.FUSED_LINEAR and unsloth.activation_offload
    assert unsloth.qlora_frozen_bytes == 2
    hf = resolve_savers(Plan(model="7B"))
    assert (hf.loss, hf.compile, hf.activation_offload, hf.qlora_frozen_bytes) == (
        Loss.STANDARD,
        False,
        False,
        4,
    )


def test_framework_changes_the_estimate(catalog: Catalog) -> None:
    model = catalog.models["llama-3.1-8b"]
    plan = Plan(model="llama-3.1-8b", method="qlora", seq=4096, grad_ckpt=True)
    hf = estimate_memory(plan, model).per_gpu.total
    unsloth = estimate_memory(plan.with_changes({"framework": "unsloth"}), model).per_gpu.total
    assert unsloth < hf * 0.8


def test_every_framework_is_in_the_catalog(catalog: Catalog) -> None:
    assert set(catalog.frameworks) == {
        "hf",
        "torchtune",
        "unsloth",
        "deepspeed",
        "fsdp",
        "megatron",
        "litgpt",
        "trl",
    }
    assert set(packaged_frameworks()) == set(catalog.frameworks)
    for framework in catalog.frameworks.values():
        for name in framework.given():
            assert framework.sources[name].strip()


def test_a_default_without_a_source_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "frameworks.toml"
    path.write_text(
        '[[framework]]\nid = "torchtune"\nname = "t"\nloss = "chunked"\n[framework.sources]\n',
        encoding="utf-8",
    )
    with pytest.raises(CatalogError, match="sources") as error:
        load_catalog_from([path])
    assert "loss" in str(error.value)


def test_a_wrong_framework_value_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "frameworks.toml"
    path.write_text(
        '[[framework]]\nid = "torchtune"\nname = "t"\nloss = "chunky"\n'
        '[framework.sources]\nloss = "x"\n',
        encoding="utf-8",
    )
    with pytest.raises(CatalogError, match="loss"):
        load_catalog_from([path])


def test_trl_plans_the_fused_lm_head_and_the_trainers_fused_adamw(catalog: Catalog) -> None:
    # TRL 1.7+'s SFTTrainer: the hf row's plan with no full logits and the Trainer's fused AdamW
    model = catalog.models["qwen2.5-7b"]
    plan = Plan(model="qwen2.5-7b", method="lora", seq=4096, grad_ckpt=True)
    trl = estimate_memory(plan.with_changes({"framework": "trl"}), model)
    same = plan.with_changes({"loss": "fused-linear", "optimizer_impl": "fused"})
    assert trl.per_gpu == estimate_memory(same, model).per_gpu
    hf = dict(estimate_memory(plan, model).details)
    # hf: 4096 tokens x 152,064 vocab x 12 bytes of fp32 logits and loss; trl: no such line
    assert hf["model logits and loss"] == 4096 * 152_064 * 12
    assert not [label for label, _ in trl.details if "logits" in label]
    # TRL 1.16's GRPOTrainer patches the same fused LM head: the policy's loss shrinks as SFT's does
    grpo = Plan(model="qwen2.5-0.5b", method="grpo")
    small = catalog.models["qwen2.5-0.5b"]
    hf_policy = dict(estimate_memory(grpo, small).details)["policy logits and loss"]
    trl_grpo = estimate_memory(grpo.with_changes({"framework": "trl"}), small)
    fused = estimate_memory(
        grpo.with_changes({"loss": "fused-linear", "optimizer_impl": "fused"}), small
    )
    assert trl_grpo.per_gpu == fused.per_gpu
    assert dict(trl_grpo.details)["policy logits and loss"] < hf_policy / 10
