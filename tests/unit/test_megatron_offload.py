"""Megatron-LM's optimizer CPU offload (``--offload optimizer`` with ``--tp``/``--pp`` and
``--zero 1``) against hand-computed numbers.

The source: megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py. With
``--use-precision-aware-optimizer`` (megatron/training/arguments.py requires it with
``--optimizer-cpu-offload``) the distributed optimizer gives the ``HybridDeviceOptimizer`` this
rank's 16-bit parameter shards; it moves ``--optimizer-offload-fraction`` of their elements to the
host as pinned fp32 copies (``param_update_in_fp32=True``), keeps their two Adam states there (torch
AdamW on the CPU, fp32) and copies each gradient into a pinned fp32 host buffer: 4 + 8 + 4 = 16
bytes per offloaded parameter. The rest keeps its fp32 copy and Adam states on the GPU (12 bytes),
and the fp32 main-gradient buffer (4 bytes for every parameter) stays on the GPU.

The model: Qwen2.5-72B (catalog/models.toml: 80 layers, hidden 8192, 64 heads, 8 KV heads of 128,
intermediate 29568, vocabulary 152064, q/k/v biases, untied LM head), tensor parallel 8 on 8 GPUs
as ms-swift's Megatron recipes run it: pp 1, dp 1.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hwdash.cli import main
from hwdash.core.catalog import load_catalog
from hwdash.core.estimator import architecture, estimate_memory
from hwdash.core.estimator.parallelism import megatron_stage, megatron_stage_params
from hwdash.core.plan import Plan
from hwdash.core.plan_unused import unused_settings
from hwdash.core.planning.fit_knobs import knobs_for
from hwdash.core.planning.run_time import slowdown_ids
from hwdash.core.plans.exports import uncarried_settings

pytestmark = pytest.mark.usefixtures("isolated_home")

QWEN_72B = load_catalog().find_model("qwen2.5-72b")
assert QWEN_72B is not None

# One block on one TP rank of 8: the linear weights over 8, q 8192^2, k and v 8192 x 1024 each,
# o 8192^2, gate and up 8192 x 29568 each, down 29568 x 8192: 877,658,112 / 8 = 109,707,264;
# the q/k/v biases (column-parallel) (8192 + 1024 + 1024) / 8 = 1,280; two RMSNorms 16,384 whole:
# 109,724,928. 80 blocks: 8,777,994,240; the vocabulary-parallel embedding and LM head
# 152064 x 8192 / 8 = 155,713,536 each; the final norm 8,192.
PARAMS_PER_GPU = 80 * 109_724_928 + 2 * 155_713_536 + 8_192
assert PARAMS_PER_GPU == 9_089_429_504


def _plan(**changes: object) -> Plan:
    fields: dict[str, object] = {
        "model": "qwen2.5-72b",
        "method": "full",
        "precision": "mixed",
        "batch": 1,
        "seq": 4096,
        "grad_ckpt": True,
        "tp": 8,
        "gpus": 8,
        "zero": 1,
        "offload": "optimizer",
    }
    fields.update(changes)
    return Plan.model_validate(fields)


def test_whole_shard_on_the_host_at_fraction_1() -> None:
    assert megatron_stage_params(architecture(QWEN_72B), 8, 1, 0) == PARAMS_PER_GPU
    estimate = estimate_memory(_plan(), QWEN_72B)
    memory = estimate.per_gpu
    # dp = 8 / (8 x 1) = 1: each GPU's distributed-optimizer shard is all its parameters
    assert memory.weights == 2 * PARAMS_PER_GPU  # bf16
    assert memory.gradients == 4 * PARAMS_PER_GPU  # the fp32 main-gradient buffer stays
    assert memory.optimizer == 0
    # host: 16 bytes per parameter of each of the 8 GPUs' shards
    assert estimate.host_bytes == 8 * 16 * PARAMS_PER_GPU == 1_163_446_976_512
    stage = megatron_stage(_plan(), architecture(QWEN_72B), 8, 0)
    assert stage.host == 16 * PARAMS_PER_GPU


def test_half_the_shard_on_the_host_at_fraction_half() -> None:
    estimate = estimate_memory(_plan(optimizer_offload_fraction=0.5), QWEN_72B)
    # the other half keeps its fp32 copy and Adam states on the GPU: 12 bytes each
    assert estimate.per_gpu.optimizer == 12 * PARAMS_PER_GPU // 2 == 54_536_577_024
    assert estimate.host_bytes == 8 * 16 * PARAMS_PER_GPU // 2
    # without offload the GPU holds all 12 bytes and the host nothing
    plain = estimate_memory(_plan(offload="none"), QWEN_72B)
    assert plain.per_gpu.optimizer == 12 * PARAMS_PER_GPU
    assert plain.host_bytes == 0
    assert plain.per_gpu.weights == estimate.per_gpu.weights
    assert plain.per_gpu.gradients == estimate.per_gpu.gradients


def test_data_parallel_shards_and_pipeline_stages_add_up_on_the_host() -> None:
    # 32 GPUs, tp 8 x pp 2 x dp 2: every GPU offloads half its stage's parameters (dp 2), and the
    # 16 GPUs of each stage together hold one copy of that stage: 16 bytes x the whole model
    plan = _plan(gpus=32, pp=2, grad_accum=4)
    arch = architecture(QWEN_72B)
    first = megatron_stage_params(arch, 8, 2, 0)
    last = megatron_stage_params(arch, 8, 2, 1)
    assert first == 40 * 109_724_928 + 155_713_536
    assert last == 40 * 109_724_928 + 155_713_536 + 8_192
    estimate = estimate_memory(plan, QWEN_72B)
    assert estimate.per_gpu.optimizer == 0
    assert estimate.host_bytes == 16 * (first + last) * 8  # 16 GPUs x shard of 1/2, per stage
    # fp32 parameters: no separate master on the GPU; the host still holds an fp32 copy
    fp32 = estimate_memory(_plan(precision="fp32", optimizer_offload_fraction=0.5), QWEN_72B)
    assert fp32.per_gpu.optimizer == 8 * PARAMS_PER_GPU // 2
    assert fp32.host_bytes == 8 * 16 * PARAMS_PER_GPU // 2


@pytest.mark.parametrize("fraction", [0, -0.5, 1.5])
def test_fraction_outside_0_1_is_refused_naming_the_flag(
    capsys: pytest.CaptureFixture[str], fraction: float
) -> None:
    with pytest.raises(ValidationError):
        _plan(optimizer_offload_fraction=fraction)
    argv = ["--model", "qwen2.5-72b", "--tp", "8", "--gpus", "8", "--zero", "1"]
    status = main(
        ["plan", *argv, "--offload", "optimizer", "--optimizer-offload-fraction", str(fraction)]
    )
    err = capsys.readouterr().err
    assert status == 2
    assert err.startswith("hwdash plan: error: --optimizer-offload-fraction: "), err


def test_what_stays_unmodelled_is_refused_clearly() -> None:
    with pytest.raises(ValidationError, match="stages 2-3 and parameter offload are not modelled"):
        _plan(zero=3, offload="params")
    with pytest.raises(ValidationError, match="stages 2-3 and parameter offload are not modelled"):
        _plan(zero=2)
    # the hybrid optimizer builds torch AdamW or SGD on the host
    with pytest.raises(ValidationError, match="adamw or sgd on the host, not adamw-8bit"):
        _plan(optimizer="adamw-8bit")
    # --offload optimizer still needs the distributed optimizer
    with pytest.raises(ValidationError, match="needs ZeRO stage 1"):
        _plan(zero=0)


def test_fraction_without_megatron_offload_is_unused() -> None:
    for plan in (_plan(offload="none"), _plan(tp=1, gpus=1, zero=2)):
        unused = dict(unused_settings(plan, ["optimizer_offload_fraction"]))
        assert "Megatron's optimizer CPU offload" in unused["optimizer_offload_fraction"]
    assert unused_settings(_plan(), ["optimizer_offload_fraction"]) == []


def test_megatron_offload_has_its_own_slowdown() -> None:
    assert slowdown_ids(_plan()) == {"megatron-offload-optimizer"}
    assert slowdown_ids(_plan(tp=1, gpus=8, zero=2)) == {"offload-optimizer"}
    assert load_catalog().slowdowns["megatron-offload-optimizer"].factor > 1


def test_fit_offers_megatron_offload_not_zero_stages() -> None:
    plan = _plan(offload="none", zero=0)
    knobs = {knob.name: knob for knob in knobs_for(plan, QWEN_72B, 16)}
    settings = knobs["zero"].settings
    assert [dict(setting.updates) for setting in settings] == [
        {"zero": 1, "gpus": 16},
        {"zero": 1, "offload": "optimizer", "optimizer_offload_fraction": 0.5, "gpus": 16},
        {"zero": 1, "offload": "optimizer", "optimizer_offload_fraction": 1.0, "gpus": 16},
    ]
    assert settings[1].slowdown_keys == ("megatron-offload-optimizer",)
    # every setting makes a valid plan (no ZeRO-2/3, which Megatron does not run)
    for setting in settings:
        plan.with_changes(dict(setting.updates))
    # a plan already offloading all of it has nothing left to offer
    assert "zero" not in {knob.name for knob in knobs_for(_plan(), QWEN_72B, 8)}


def test_exports_name_megatrons_arguments() -> None:
    words = " ".join(uncarried_settings(_plan(optimizer_offload_fraction=0.5), "deepspeed"))
    assert "--optimizer-cpu-offload --optimizer-offload-fraction 0.5" in words
    assert "--use-precision-aware-optimizer" in words
    assert "--optimizer-cpu-offload" not in " ".join(
        uncarried_settings(_plan(offload="none"), "deepspeed")
    )
