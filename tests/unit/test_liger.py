"""Issue 29: Liger-Kernel (``--liger``; the Trainer's ``use_liger_kernel``). Its RMSNorm keeps the
16-bit input and the reciprocal RMS (``ctx.save_for_backward(X, W, RSTD)``), not eager's fp32 upcast
and the normalised tensor; its fused SwiGLU keeps the gate and up outputs and recomputes SiLU
(``ctx.save_for_backward(a, b)``); its fused linear cross-entropy never builds the logits. Hand
computations on test_fsdp's small Llama (hidden 1024, SwiGLU width 4096, 4 layers), bf16."""

from __future__ import annotations

from pathlib import Path

from test_fsdp import SMALL

from hwdash.core import estimator as est
from hwdash.core.catalog import load_catalog
from hwdash.core.estimator import estimate_memory
from hwdash.core.estimator.activations import layer_activation_bytes, training_activation_bytes
from hwdash.core.estimator.savers import resolve_savers
from hwdash.core.plan import Attention, Loss, Plan
from hwdash.core.plan_unused import unused_settings
from hwdash.core.plans.exports import trainer_snippet, uncarried_settings
from hwdash.core.plans.imports import read_plan_file

ARCH = est.architecture(SMALL)
E = 2  # bf16 activations and weights
H = 1024
I = 4096  # noqa: E741 - the MLP's width, as the papers write it


def _plan(**changes: object) -> Plan:
    fields: dict[str, object] = {"model": "small-llama", "method": "full", "seq": 2048}
    fields.update(changes)
    return Plan(**fields)  # type: ignore[arg-type]


def test_a_layer_keeps_the_norms_16_bit_input_and_no_silu_output() -> None:
    t = 2048
    eager = layer_activation_bytes(ARCH, 1, t, E, Attention.FLASH)
    liger = layer_activation_bytes(ARCH, 1, t, E, Attention.FLASH, liger=True)
    # two norms: fp32 upcast (4 t h) and the normalised tensor (2 t h) become the 16-bit input
    # (2 t h): 4 t h each; the MLP: SiLU(gate)'s output (e t i) is recomputed
    assert eager - liger == 2 * 4 * t * H + E * t * I
    # a frozen base (LoRA): the norms keep no normalised tensor either way, 2 t h each
    targets = ARCH.linears
    frozen = layer_activation_bytes(ARCH, 1, t, E, Attention.FLASH, lora_targets=targets)
    frozen_liger = layer_activation_bytes(
        ARCH, 1, t, E, Attention.FLASH, lora_targets=targets, liger=True
    )
    assert frozen - frozen_liger == 2 * 2 * t * H + E * t * I


def test_every_layer_saves_it_and_checkpointing_saves_it_once() -> None:
    t = 2048
    per_layer = 2 * 4 * t * H + E * t * I
    plain = training_activation_bytes(ARCH, 1, t, E, Attention.FLASH, False)
    liger = training_activation_bytes(ARCH, 1, t, E, Attention.FLASH, False, liger=True)
    assert plain - liger == ARCH.layers * per_layer
    # checkpointed: the layers' inputs are the same; the recomputed layer saves it
    plain = training_activation_bytes(ARCH, 1, t, E, Attention.FLASH, True)
    liger = training_activation_bytes(ARCH, 1, t, E, Attention.FLASH, True, liger=True)
    assert plain - liger == per_layer


def test_the_plan_takes_the_fused_loss_unless_it_names_one() -> None:
    assert resolve_savers(_plan(liger=True)).loss is Loss.FUSED_LINEAR
    assert resolve_savers(_plan(liger=True, loss="standard")).loss is Loss.STANDARD
    assert resolve_savers(_plan()).loss is Loss.STANDARD
    base = estimate_memory(_plan(loss="fused-linear", grad_ckpt=False), SMALL)
    kernels = estimate_memory(_plan(liger=True, grad_ckpt=False), SMALL)
    assert kernels.allocated_bytes < base.allocated_bytes


def test_layer_norm_models_are_planned_without_it_and_said_so() -> None:
    catalog = load_catalog(include_user=False)
    model = catalog.models["gpt2"]
    plan = Plan(model="gpt2", method="full", seq=1024)  # type: ignore[arg-type]
    with_liger = estimate_memory(plan.model_copy(update={"liger": True, "loss": "standard"}), model)
    assert with_liger.per_gpu == estimate_memory(plan, model).per_gpu
    assert any("--liger" in warning for warning in with_liger.warnings)


def test_trainer_and_llama_factory_configs_carry_it(tmp_path: Path) -> None:
    trainer = tmp_path / "args.json"
    trainer.write_text('{"per_device_train_batch_size": 2, "use_liger_kernel": true}')
    assert read_plan_file(trainer).updates["liger"] is True
    factory = tmp_path / "sft.yaml"
    factory.write_text(
        "model_name_or_path: meta-llama/Llama-3.1-8B\nstage: sft\nfinetuning_type: full\n"
        "enable_liger_kernel: true\n"
    )
    assert read_plan_file(factory).updates["liger"] is True
    # the Trainer snippet writes the switch and nothing is left uncarried; other exports list it
    plan = _plan(liger=True)
    assert "use_liger_kernel=True" in trainer_snippet(plan, "meta-llama/Llama-3.1-8B")
    assert "--liger" not in uncarried_settings(plan, "trainer")
    for kind in ("deepspeed", "accelerate"):
        assert "--liger" in uncarried_settings(plan, kind)
    # the Trainer's one switch for a fused loss brings the kernels: such a plan reads back with them
    fused = tmp_path / "fused.py"
    fused.write_text(trainer_snippet(_plan(loss="fused-linear"), "meta-llama/Llama-3.1-8B"))
    assert read_plan_file(fused).updates["liger"] is True


def test_axolotl_counts_the_norm_and_activation_kernels_together(tmp_path: Path) -> None:
    path = tmp_path / "axolotl.yaml"
    head = "base_model: meta-llama/Llama-3.1-8B\nsequence_len: 4096\n"
    path.write_text(head + "liger_rms_norm: true\nliger_glu_activation: true\n")
    imported = read_plan_file(path)
    assert imported.updates["liger"] is True
    assert imported.updates["loss"] is Loss.STANDARD  # no liger_fused_linear_cross_entropy
    path.write_text(
        head + "liger_rms_norm: true\nliger_glu_activation: true\n"
        "liger_fused_linear_cross_entropy: true\n"
    )
    assert read_plan_file(path).updates["loss"] is Loss.FUSED_LINEAR
    path.write_text(head + "liger_rms_norm: true\nliger_fused_linear_cross_entropy: true\n")
    imported = read_plan_file(path)
    assert "liger" not in imported.updates
    assert imported.updates["loss"] is Loss.FUSED_LINEAR
    assert any("liger_rms_norm alone" in note for note in imported.notes)


def test_megatron_and_inference_plans_say_the_flag_does_nothing() -> None:
    megatron = _plan(framework="megatron", tp=2, gpus=2, liger=True)
    assert [name for name, _ in unused_settings(megatron, ["liger"])] == ["liger"]
    # and it changes nothing there, the loss included
    assert (
        resolve_savers(megatron).loss is resolve_savers(megatron.with_changes({"liger": None})).loss
    )
    assert (
        estimate_memory(megatron, SMALL).per_gpu
        == estimate_memory(megatron.with_changes({"liger": None}), SMALL).per_gpu
    )
    served = _plan(method="inference", liger=True)
    assert [name for name, _ in unused_settings(served, ["liger"])] == ["liger"]
    assert unused_settings(_plan(liger=True), ["liger"]) == []


def test_an_encoder_is_planned_without_it_and_said_so() -> None:
    from hwdash.core.models.config import model_from_config_file

    root = Path(__file__).resolve().parents[2]
    model = model_from_config_file(root / "bench/data/encoder_tuning_configs/tiny-bert/config.json")
    plan = Plan(model="tiny-bert", method="full", seq=512)  # type: ignore[arg-type]
    with_liger = estimate_memory(plan.with_changes({"liger": True}), model)
    assert with_liger.per_gpu == estimate_memory(plan, model).per_gpu
    assert any("--liger" in warning for warning in with_liger.warnings)
