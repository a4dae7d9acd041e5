"""Issue 29: DeepSpeed's TiledMLP (``--tiled-mlp``; ALST, arXiv:2506.13996; ``TiledMLP`` in
deepspeed/runtime/sequence_parallel/ulysses_sp.py): the MLP runs in ``ceil(seq / hidden)`` tiles of
the sequence under no_grad and saves only its input, so a layer keeps none of the MLP's
intermediates nor down_proj's input, and one tile's intermediates exist at a time. Hand computations
on test_fsdp's small Llama (hidden 1024, SwiGLU width 4096, 4 layers), bf16 full training."""

from __future__ import annotations

import math
from pathlib import Path

from test_fsdp import SMALL

from hwdash.core import estimator as est
from hwdash.core.estimator import estimate_memory
from hwdash.core.estimator.activations import (
    layer_activation_bytes,
    mlp_tiles,
    training_activation_bytes,
)
from hwdash.core.plan import Attention, Plan
from hwdash.core.plans.exports import uncarried_settings
from hwdash.core.plans.imports import read_plan_file

ARCH = est.architecture(SMALL)
E = 2  # bf16 activations
I = 4096  # noqa: E741 - the MLP's width, as the papers write it


def test_the_tile_count_is_deepspeeds_ceil_of_sequence_over_hidden() -> None:
    assert mlp_tiles(ARCH, 8192) == 8
    assert mlp_tiles(ARCH, 8193) == 9
    assert mlp_tiles(ARCH, 100) == 1


def test_a_layer_keeps_one_tile_instead_of_the_mlps_intermediates() -> None:
    seq = 8192
    plain = layer_activation_bytes(ARCH, 1, seq, E, Attention.FLASH)
    tiled = layer_activation_bytes(ARCH, 1, seq, E, Attention.FLASH, tiled_mlp=True)
    # untiled: gate, up and SiLU(gate) (3 e t i) and the product down_proj keeps (e t i); tiled:
    # the same four of one tile of ceil(8192 / 8) = 1024 tokens
    assert plain - tiled == 4 * E * seq * I - 4 * E * 1024 * I


def test_the_running_tile_is_counted_once_over_the_layers() -> None:
    seq = 8192
    one_plain = layer_activation_bytes(ARCH, 1, seq, E, Attention.FLASH)
    tile = 4 * E * 1024 * I
    saved = training_activation_bytes(ARCH, 1, seq, E, Attention.FLASH, False, tiled_mlp=True)
    untiled = training_activation_bytes(ARCH, 1, seq, E, Attention.FLASH, False)
    assert untiled == 4 * one_plain
    assert saved == 4 * (one_plain - 4 * E * seq * I) + tile
    # with checkpointing: the layers' inputs and one recomputed layer, which holds one tile
    checkpointed = training_activation_bytes(ARCH, 1, seq, E, Attention.FLASH, True, tiled_mlp=True)
    recomputed = layer_activation_bytes(ARCH, 1, seq, E, Attention.FLASH, tiled_mlp=True)
    assert checkpointed == 4 * E * seq * 1024 + recomputed


def _plan(**changes: object) -> Plan:
    fields: dict[str, object] = {
        "model": "small-llama",
        "method": "full",
        "seq": 16384,
        "grad_ckpt": True,
        "loss": "fused-linear",
    }
    fields.update(changes)
    return Plan(**fields)  # type: ignore[arg-type]


def test_a_long_sequence_plan_needs_less_with_tiles() -> None:
    plain = estimate_memory(_plan(), SMALL)
    tiled = estimate_memory(_plan(tiled_mlp=True), SMALL)
    # a short model with fused-linear loss peaks at the end of backward: the first layer's backward
    first = "model first layer's backward"
    before, after = dict(plain.details)[first], dict(tiled.details)[first]
    tiles = math.ceil(16384 / 1024)
    assert before - after == 4 * E * 16384 * I - 4 * E * (16384 // tiles) * I
    assert tiled.allocated_bytes < plain.allocated_bytes


def test_moe_experts_are_planned_untiled_and_said_so() -> None:
    from hwdash.core.catalog import load_catalog

    catalog = load_catalog(include_user=False)
    model = catalog.models["mixtral-8x7b"]
    plan = Plan(model="mixtral-8x7b", method="lora", seq=8192, grad_ckpt=True)  # type: ignore[arg-type]
    tiled = estimate_memory(plan.model_copy(update={"tiled_mlp": True}), model)
    assert tiled.per_gpu == estimate_memory(plan, model).per_gpu
    assert any("--tiled-mlp" in warning for warning in tiled.warnings)


def test_axolotl_configs_carry_it_and_no_export_writes_it(tmp_path: Path) -> None:
    path = tmp_path / "axolotl.yaml"
    path.write_text(
        "base_model: meta-llama/Llama-3.1-8B\nsequence_len: 32768\ntiled_mlp: true\n",
        encoding="utf-8",
    )
    assert read_plan_file(path).updates["tiled_mlp"] is True
    for kind in ("trainer", "deepspeed", "accelerate"):
        assert "--tiled-mlp" in uncarried_settings(_plan(tiled_mlp=True), kind)
    assert "--tiled-mlp" not in uncarried_settings(_plan(), "trainer")


def test_megatron_and_inference_plans_say_the_flag_does_nothing() -> None:
    from hwdash.core.plan_unused import unused_settings

    megatron = Plan(
        model="small-llama", method="full", framework="megatron", tp=2, gpus=2, tiled_mlp=True
    )  # type: ignore[arg-type]
    assert [name for name, _ in unused_settings(megatron, ["tiled_mlp"])] == ["tiled_mlp"]
    served = Plan(model="small-llama", method="inference", tiled_mlp=True)  # type: ignore[arg-type]
    assert [name for name, _ in unused_settings(served, ["tiled_mlp"])] == ["tiled_mlp"]
    assert unused_settings(_plan(tiled_mlp=True), ["tiled_mlp"]) == []
