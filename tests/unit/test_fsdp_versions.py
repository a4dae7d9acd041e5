"""Issue 29: FSDP1 vs FSDP2 (:mod:`hwdash.core.estimator.fsdp_versions`): each term against a hand
computation from PyTorch's source (torch/distributed/fsdp: _flat_param.py, _runtime_utils.py,
_limiter_utils.py, _fully_shard/_fsdp_collectives.py); the two versions differ by exactly those
terms; accelerate's and the Trainer's configs carry the version."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from test_fsdp import BLOCK, GATHERED, SMALL, _plan

from hwdash.core import estimator as est
from hwdash.core.estimator import estimate_memory
from hwdash.core.estimator.fsdp_versions import dim0_padding_elements, flat_padding_elements
from hwdash.core.estimator.phases import PHASE_CHECKPOINT_SAVE
from hwdash.core.estimator.software import packaged_software
from hwdash.core.plan import FsdpStateDict, Plan
from hwdash.core.plans.exports import accelerate_config, trainer_snippet
from hwdash.core.plans.imports import read_plan_file

ARCH = est.architecture(SMALL)
#: SMALL's embedding and (untied) output layer, 32,000 x 1,024: its largest units
TOP = 32_768_000


def _accumulated(plan: Plan) -> Any:
    acc = est._Accumulator()
    est.parallelism.add_fsdp_training(
        plan, ARCH, plan.method, plan.gpus, acc, "model", with_logits=True,
        train_one=est._train_one_model,
    )  # fmt: skip
    return acc


def _notes(plan: Plan) -> dict[str, int]:
    """Every detail line of ``plan``, in whichever phases it is alive."""
    return {label: value for label, value, _phases in _accumulated(plan).details}


def _line(notes: dict[str, int], part: str) -> int:
    found = [value for label, value in notes.items() if part in label]
    assert len(found) == 1, (part, notes)
    return found[0]


def test_fsdp1_pads_each_flat_parameter_to_the_shard_count() -> None:
    # over 7 GPUs a block's 16,779,264 elements shard into ceil(../7) = 2,397,038 (2/7 of an
    # element of padding per rank), the embedding's and the output layer's 32,768,000 into
    # 4,681,143 (1/7 each)
    assert flat_padding_elements(ARCH, 7) == pytest.approx(4 * 2 / 7 + 2 * 1 / 7)
    assert flat_padding_elements(ARCH, 4) == 0  # every unit divides by 4


def test_fsdp2_pads_each_parameters_dim_0_to_the_shard_count() -> None:
    # over 3 GPUs, per layer: q/k/v/o (1,024 rows of 1,024: 2 rows more), gate/up (4,096 rows:
    # 2 more), down (1,024 rows of 4,096: 2 more), two norms (1,024: 2 more); the final norm;
    # the embedding and output layer (32,000 rows of 1,024: 1 more); each rank a third of it
    per_layer = 4 * 2 * 1024 + 2 * 2 * 1024 + 2 * 4096 + 2 * 2
    expected = (4 * per_layer + 2 + 2 * 1024) / 3
    assert dim0_padding_elements(ARCH, 3) == pytest.approx(expected)
    assert dim0_padding_elements(ARCH, 4) == 0


def test_the_versions_differ_by_exactly_their_terms() -> None:
    v1 = estimate_memory(
        _plan(precision="bf16", fsdp_version=1, grad_accum=1, batch=16, seq=2048), SMALL
    )
    v2 = estimate_memory(
        _plan(precision="bf16", fsdp_version=2, grad_accum=1, batch=16, seq=2048), SMALL
    )
    assert v1.peak_phase == v2.peak_phase == "start of backward"
    # FSDP2's all-gather output of the prefetched block, copied out into the parameters, against
    # FSDP1's root unit (embedding + output layer + final norm, gathered from forward through
    # backward) beside two blocks, where the version-neutral count has the largest unit, one block
    # and the final norm: (2 TOP + 1024 + 2 BLOCK) - (TOP + BLOCK + 1024) = TOP + BLOCK, bf16
    assert v2.per_gpu.activations - v1.per_gpu.activations == 2 * BLOCK - 2 * (TOP + BLOCK)
    assert v2.per_gpu.weights == v1.per_gpu.weights  # 4 GPUs: no padding in either
    # the same unit layout (the root holding the embedding and output layer) for both versions
    one = _notes(_plan(fsdp_version=1))
    two = _notes(_plan(fsdp_version=2, fsdp_wrap="transformer"))
    differing = {label for label in one.keys() ^ two.keys()} | {
        label for label in one.keys() & two.keys() if one[label] != two[label]
    }
    assert differing, "the versions count the same"
    assert all("FSDP1" in label or "FSDP2" in label for label in differing), differing


def test_reduce_scatter_staging_by_version_and_reduce_dtype() -> None:
    n = 4
    # FSDP1, bf16 reduce: the largest unit's flat gradient (the root's: embedding, output layer
    # and final norm, 2 TOP + 1024) concatenated from its views' (split's backward, a second bf16
    # copy while the views' are held) outweighs the new 1/N shard
    root = 2 * TOP + 1024
    assert _line(_notes(_plan(precision="bf16", fsdp_version=1)), "FSDP1 flat gradient") == (
        max(2 * root, 2 * root // n)
    )
    # FSDP1, fp32 reduce: the unsharded gradient cast to fp32 (the bf16 one kept until the hook
    # returns) and the fp32 shard, more than the concatenation's copy
    fp32 = _plan(precision="bf16", fsdp_version=1, fsdp_reduce_fp32=True)
    assert _line(
        _notes(fp32), "FSDP1 flat gradient's assembly or reduce-scatter staging (4-byte)"
    ) == (4 * root + 4 * root // n)
    # FSDP2: the reduce-scatter input (the whole unit) and output (1/N), in the reduce dtype
    assert _line(_notes(_plan(precision="bf16")), "FSDP2 reduce-scatter") == 2 * TOP + 2 * TOP // n
    fp32_2 = _plan(precision="bf16", fsdp_reduce_fp32=True)
    assert _line(_notes(fp32_2), "FSDP2 reduce-scatter staging (4-byte)") == 4 * TOP + TOP


def test_fsdp2_accumulates_in_an_fp32_reduce_dtype() -> None:
    plan = _plan(precision="bf16", sync_each_batch=False, fsdp_reduce_fp32=True)
    unsynced = "model unsharded gradients (no_sync between micro-batches)"
    assert _notes(plan)[unsynced] == 4 * 132_654_080


def test_fsdp1_without_limit_all_gathers_counts_two_more_units() -> None:
    limited = estimate_memory(_plan(precision="bf16", fsdp_version=1, grad_accum=1), SMALL)
    plan = _plan(precision="bf16", fsdp_version=1, grad_accum=1, fsdp_limit_all_gathers=False)
    unlimited = estimate_memory(plan, SMALL)
    assert unlimited.per_gpu.activations - limited.per_gpu.activations == 2 * 2 * BLOCK
    assert any("limit_all_gathers" in warning for warning in unlimited.warnings)


def test_fsdp1_keeps_its_root_unit_gathered_beside_two_blocks() -> None:
    # accelerate's/PEFT's/answer.ai's FSDP1 auto-wrap wraps the blocks; the embedding, output
    # layer and final norm stay in the root, which _post_forward_reshard never frees: FSDP1 holds
    # (TOP + TOP + 1024) + 2 BLOCK parameters gathered, the neutral count TOP + BLOCK + 1024
    for precision, gathered in (("bf16", 2), ("mixed", 2), ("fp32", 4)):
        notes = _notes(_plan(precision=precision, fsdp_version=1))
        assert _line(notes, "FSDP1 root unit") == gathered * (TOP + BLOCK)
        assert not any("root unit" in label for label in _notes(_plan(precision=precision)))
    # QLoRA: the root's parameters are never quantized: they are gathered in the frozen dtype
    # (bf16 here), the blocks in NF4 (the plan's average bytes per parameter)
    qlora = _plan(method="qlora", fsdp_version=1, qlora_frozen_dtype="bf16")
    _base, per_param = est.states._base_weight_bytes(
        ARCH, qlora.method, est.LAYOUTS[qlora.precision]
    )
    neutral = (TOP + BLOCK + 1024) * per_param
    expected = (2 * TOP + 1024) * 2 + 2 * BLOCK * per_param - neutral
    assert _line(_notes(qlora), "FSDP1 root unit") == round(expected)
    # one GPU gathers nothing
    assert not any("root unit" in label for label in _notes(_plan(fsdp_version=1, gpus=1)))


def test_fsdp1_all_gather_stream_keeps_one_freed_unit_reserved() -> None:
    # the all-gather stream's pool: the root unit (2 TOP + 1024), the running and prefetched
    # blocks and the block freed last, waiting on its record_stream event (limit_all_gathers: 2 in
    # flight + 1); allocated during forward/backward: the root and two blocks
    acc = _accumulated(_plan(precision="bf16", fsdp_version=1))
    assert acc.side_stream_pool == 2 * (2 * TOP + 1024) + 3 * 2 * BLOCK
    assert acc.side_stream_live == 2 * (2 * TOP + 1024) + 2 * 2 * BLOCK
    plan = _plan(precision="bf16", fsdp_version=1, grad_accum=1, batch=16, seq=2048)
    v1 = estimate_memory(plan, SMALL)
    assert v1.peak_phase == "start of backward"
    pool = round(packaged_software().pool.distributed * v1.allocated_bytes)
    # reserved, not allocated: the one block freed last
    assert v1.reserved_bytes - v1.allocated_bytes - pool == 2 * BLOCK
    v2 = estimate_memory(plan.model_copy(update={"fsdp_version": 2}), SMALL)
    pool2 = round(packaged_software().pool.distributed * v2.allocated_bytes)
    assert v2.reserved_bytes - v2.allocated_bytes == pool2
    # CPU offload: the pre-unshard stream's H2D shard copies too, 3 in its pool, 2 allocated
    offload = _accumulated(_plan(precision="bf16", fsdp_version=1, fsdp_offload=True))
    assert offload.side_stream_pool - acc.side_stream_pool == 3 * 2 * BLOCK / 4
    assert offload.side_stream_live - acc.side_stream_live == 2 * 2 * BLOCK / 4
    # one GPU: nothing gathered, no all-gather stream
    assert _accumulated(_plan(precision="bf16", fsdp_version=1, gpus=1)).side_stream_pool == 0


def test_a_mixed_policy_shards_a_lora_base_in_fp32_and_gathers_it_in_bf16() -> None:
    # MixedPrecision(param_dtype=bf16) over a model loaded in fp32: the sharded flat parameter
    # keeps fp32 (4 bytes), only the all-gathered copy is bf16 (2 bytes), for a frozen base too
    n = ARCH.total_params
    mixed = _notes(_plan(method="lora", precision="mixed", fsdp_version=1))
    bf16 = _notes(_plan(method="lora", precision="bf16", fsdp_version=1))
    shard = "model weights (1/4 shard)"
    assert mixed[shard] - bf16[shard] == (4 - 2) * n // 4
    gathered = "model gathered units (running + prefetched, 2-byte)"
    assert mixed[gathered] == bf16[gathered] == 2 * GATHERED


def test_fsdp1_keeps_bitsandbytes_quant_state_whole_on_every_gpu() -> None:
    # Linear4bit.quant_state is a module attribute, not a parameter: FSDP1 shards and offloads the
    # packed NF4 weights but not the 0.127 bits per quantized weight of double-quantized constants
    constants = ARCH.quantizable_params * 0.127 / 8
    line = "FSDP1 NF4 quant_state"
    sharded = _accumulated(_plan(method="qlora", fsdp_version=1))
    assert _line(_notes(_plan(method="qlora", fsdp_version=1)), line) == round(constants * 3 / 4)
    fsdp2 = _accumulated(_plan(method="qlora", fsdp_version=2))
    assert sharded.weights - fsdp2.weights == pytest.approx(constants * 3 / 4)
    # CPU offload: the shards go to the host, the constants stay, whole
    offload = _plan(method="qlora", fsdp_version=1, fsdp_offload=True)
    assert _accumulated(offload).weights == pytest.approx(constants)
    assert _accumulated(offload).host == pytest.approx(
        _accumulated(offload.model_copy(update={"fsdp_version": 2})).host - constants / 4
    )
    assert not any(line in label for label in _notes(_plan(method="lora", fsdp_version=1)))


def test_full_state_dict_gathers_one_unit_in_the_checkpoint_save_phase() -> None:
    # FSDP1's default (accelerate's) is FULL_STATE_DICT: one unit gathered in the sharded dtype,
    # on top of what the save holds (the checkpoint-save phase's transient), never in the step
    full_plan = _plan(precision="mixed", fsdp_version=1)
    sharded_plan = _plan(precision="mixed", fsdp_version=1, fsdp_state_dict=FsdpStateDict.SHARDED)
    full, sharded = _accumulated(full_plan), _accumulated(sharded_plan)
    gathered = full.outside[PHASE_CHECKPOINT_SAVE].transient
    assert gathered is not None and gathered[0] == "weights" and gathered[2] == 4 * TOP
    assert "FULL_STATE_DICT" in gathered[1]
    assert sharded.outside[PHASE_CHECKPOINT_SAVE].transient is None
    saved = full.phase_total(PHASE_CHECKPOINT_SAVE) - sharded.phase_total(PHASE_CHECKPOINT_SAVE)
    assert saved == 4 * TOP
    assert any("FULL_STATE_DICT" in w for w in estimate_memory(full_plan, SMALL).warnings)
    assert estimate_memory(sharded_plan, SMALL).per_gpu == estimate_memory(full_plan, SMALL).per_gpu
    v2 = estimate_memory(_plan(precision="mixed"), SMALL)  # FSDP2: sharded by default
    assert not any("FULL_STATE_DICT" in warning for warning in v2.warnings)


def test_cpu_offload_stages_the_shards_in_flight() -> None:
    notes = _notes(_plan(precision="bf16", fsdp_offload=True))
    # two blocks' shards copied in, one gradient shard of the largest unit copied out
    assert _line(notes, "CPU-offload staging") == (2 * BLOCK * 2) // 4 + 2 * TOP // 4


def _accelerate_file(path: Path, **fsdp: object) -> Path:
    config = {
        "distributed_type": "FSDP",
        "num_processes": 4,
        "mixed_precision": "bf16",
        "fsdp_config": {"fsdp_sharding_strategy": "FULL_SHARD", **fsdp},
    }
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def test_accelerate_configs_carry_the_version_and_state_dict(tmp_path: Path) -> None:
    # no fsdp_version: accelerate's default, 1
    assert read_plan_file(_accelerate_file(tmp_path / "a.yaml")).updates["fsdp_version"] == 1
    two = read_plan_file(
        _accelerate_file(
            tmp_path / "b.yaml", fsdp_version=2, fsdp_state_dict_type="FULL_STATE_DICT"
        )
    ).updates
    assert two["fsdp_version"] == 2
    assert two["fsdp_state_dict"] is FsdpStateDict.FULL
    written = accelerate_config(_plan(fsdp_version=1), 4)["fsdp_config"]
    assert written["fsdp_version"] == 1
    assert written["fsdp_state_dict_type"] == "FULL_STATE_DICT"
    assert accelerate_config(_plan(), 4)["fsdp_config"]["fsdp_state_dict_type"] == (
        "SHARDED_STATE_DICT"
    )


def test_the_trainer_snippet_says_fsdp1_and_reads_back(tmp_path: Path) -> None:
    snippet = trainer_snippet(_plan(fsdp_version=1), "small-llama")
    assert "fsdp_config={'version': 1}" in snippet.replace('"', "'")
    path = tmp_path / "train.py"
    path.write_text(snippet, encoding="utf-8")
    assert read_plan_file(path).updates["fsdp_version"] == 1


def offered_by_fit(plan: Plan, knob_name: str) -> list[dict[str, object]]:
    """The settings make-it-fit's FSDP knob ``knob_name`` offers for ``plan``."""
    from hwdash.core.planning.fit_knobs import _fsdp_buffer_knobs

    return [
        dict(setting.updates)
        for knob in _fsdp_buffer_knobs(plan)
        if knob.name == knob_name
        for setting in knob.settings
    ]


def test_make_it_fit_offers_a_sharded_state_dict_where_the_save_gathers() -> None:
    def offered(plan: Plan) -> list[dict[str, object]]:
        return offered_by_fit(plan, "fsdp_state_dict")

    # FSDP1's default is FULL_STATE_DICT (accelerate's): the knob turns it sharded
    assert offered(_plan(precision="mixed", fsdp_version=1)) == [
        {"fsdp_state_dict": FsdpStateDict.SHARDED}
    ]
    # FSDP2 saves sharded already, as does an FSDP1 plan told so
    assert offered(_plan(precision="mixed")) == []
    sharded = _plan(precision="mixed", fsdp_version=1, fsdp_state_dict=FsdpStateDict.SHARDED)
    assert offered(sharded) == []


def test_the_all_gather_pool_is_all_reserved_at_an_optimizer_step_peak() -> None:
    # at the step no gathered unit is allocated, but the all-gather stream keeps its cached blocks
    from hwdash.core.estimator.estimate import _memory_estimate

    plan = _plan(precision="bf16", fsdp_version=1)
    acc = est._Accumulator()
    acc.optimizer, acc.step_temporaries = 1000.0, 500.0
    acc.side_stream_pool, acc.side_stream_live = 300.0, 200.0
    step = _memory_estimate(plan, ARCH, acc, 4, 0, "bf16", None, None)
    assert step.peak_phase == "optimizer step"
    # a training process on 4 GPUs: the parallel group's pool fraction (catalog/software.toml)
    fraction = packaged_software().pool.distributed
    assert step.reserved_bytes - step.allocated_bytes == round(fraction * 1500) + 300
    acc.activations = acc.last_layer_activations = 5000.0
    backward = _memory_estimate(plan, ARCH, acc, 4, 0, "bf16", None, None)
    assert backward.peak_phase != "optimizer step"
    assert backward.reserved_bytes - backward.allocated_bytes == round(
        fraction * backward.allocated_bytes
    ) + (300 - 200)
