"""Issue 29: DeepSpeed ZeRO's runtime buffers (:mod:`hwdash.core.estimator.zero_buffers`), each
against a hand computation from DeepSpeed's defaults (deepspeed/runtime/zero/config.py) or the
Hugging Face Trainer's "auto" (transformers/integrations/deepspeed.py); ``--from`` and
``--export deepspeed`` carry them; make-it-fit proposes a smaller bucket where that fits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from monitor_cli import run_plan

from hwdash.core.catalog import load_catalog
from hwdash.core.estimator import estimate_memory
from hwdash.core.estimator.architecture import architecture
from hwdash.core.estimator.software import packaged_software
from hwdash.core.estimator.zero_buffers import persistent_params, zero3_gathered
from hwdash.core.models.config import resolve_model
from hwdash.core.plan import Method, Offload, Plan
from hwdash.core.plan_unused import unused_settings
from hwdash.core.planning.fit_options import find_fit_options
from hwdash.core.plans.exports import uncarried_settings
from hwdash.core.plans.imports import read_plan_file
from hwdash.errors import UsageError

CATALOG = load_catalog(include_user=False)
MODEL = resolve_model("qwen2.5-0.5b", CATALOG)
# Qwen2.5-0.5B: hidden 896, 24 layers, 494,032,768 parameters, a tied 151,936 x 896 embedding
N = 494_032_768
HIDDEN = 896
EMBEDDING = 151_936 * 896  # 136,134,656: the largest module
# never partitioned under the default threshold (1e5 elements): per layer the q/k/v biases
# (896 + 128 + 128) and the two RMSNorm weights (2 x 896), and the final norm
PERSISTENT = 24 * (896 + 128 + 128 + 2 * 896) + 896  # 71,552

BUCKET = "ZeRO reduce bucket"


def _estimate(**changes: Any) -> Any:
    plan = Plan(**{"model": "qwen2.5-0.5b", "method": "full", "gpus": 8, **changes})
    return estimate_memory(plan, MODEL)


def _line(estimate: Any, start: str) -> int:
    """The detail line whose label starts with ``start``."""
    found = [value for label, value in estimate.details if label.startswith(start)]
    assert len(found) == 1, (start, estimate.details)
    return int(found[0])


def _bucket_at(estimate: Any) -> int:
    """The reduce bucket, wherever the estimate shows it (the peak may be any phase)."""
    return sum(value for label, value in estimate.details if label.startswith(BUCKET))


def _accumulated(plan: Plan) -> Any:
    """The accumulator of one trained model of ``plan`` (the estimator's own count)."""
    from hwdash.core import estimator as est
    from hwdash.core.estimator.states import LAYOUTS
    from hwdash.core.plan import Precision

    acc = est._Accumulator()
    arch = architecture(MODEL)
    est._train_one_model(
        plan, arch, plan.method, LAYOUTS[Precision.MIXED], plan.gpus, acc, "model", with_logits=True
    )
    return acc


def _phase_totals(plan: Plan) -> dict[str, float]:
    acc = _accumulated(plan)
    phases = ("start of backward", "end of backward", "optimizer step")
    return {phase: acc.phase_total(phase) for phase in phases}


def _master_gradients(plan: Plan) -> float:
    """The fp32 gradients the step of ``plan`` holds on one GPU."""
    return float(_accumulated(plan).master_gradients)


# -- the reduce bucket --------------------------------------------------------------------------


def test_stage_2s_reduce_bucket_is_deepspeeds_default_in_bf16() -> None:
    # 5e8 elements of the 16-bit gradients, one buffer (overlap_comm is off below stage 3)
    estimate = _estimate(zero=2, grad_accum=2)  # accumulation: gradients persist, backward peaks
    assert estimate.peak_phase != "optimizer step"
    assert _bucket_at(estimate) == 500_000_000 * 2
    # overlap_comm keeps a second one (stage_1_and_2.py setup_buckets' double buffers)
    overlapped = _estimate(zero=2, grad_accum=2, ds_overlap_comm=True)
    assert _bucket_at(overlapped) == 2 * 500_000_000 * 2
    assert overlapped.per_gpu.gradients - estimate.per_gpu.gradients == 500_000_000 * 2


def test_stage_2s_bucket_is_freed_before_the_step() -> None:
    # _release_ipg_buffers frees it at the end of backward's reduction (stage_1_and_2.py)
    plan = Plan(model="qwen2.5-0.5b", method="full", gpus=8, zero=2, precision="mixed")
    big, small = _phase_totals(plan), _phase_totals(plan.with_changes({"ds_reduce_bucket": 1000}))
    assert big["optimizer step"] == small["optimizer step"]
    assert big["start of backward"] - small["start of backward"] == (500_000_000 - 1000) * 2
    assert big["end of backward"] - small["end of backward"] == (500_000_000 - 1000) * 2


def test_stage_3_keeps_one_bucket_always() -> None:
    estimate = _estimate(zero=3)
    assert _line(estimate, BUCKET) == 500_000_000 * 2
    assert "x 1 buffer" in next(label for label, _ in estimate.details if label.startswith(BUCKET))


def test_auto_reduce_bucket_is_the_trainers_hidden_squared() -> None:
    estimate = _estimate(zero=3, ds_reduce_bucket="auto")
    assert _line(estimate, BUCKET) == HIDDEN * HIDDEN * 2


def test_without_contiguous_gradients_at_most_the_trained_gradients_wait() -> None:
    # LoRA: 8.8M adapters, far under one bucket; the preallocated buffer is the full 5e8 anyway
    lora = _estimate(method="lora", zero=2, grad_accum=2)
    plain = _estimate(method="lora", zero=2, grad_accum=2, ds_contiguous_gradients=False)
    trainable = plain.trainable_params
    assert _bucket_at(lora) == 500_000_000 * 2
    assert _bucket_at(plain) == trainable * 2


def test_stage_2_all_gather_bucket_is_gathered_in_place() -> None:
    estimate = _estimate(zero=2, grad_accum=2, ds_allgather_bucket=200_000_000)
    assert _line(estimate, "ZeRO all-gather bucket (2e8") == 0
    assert estimate.per_gpu == _estimate(zero=2, grad_accum=2).per_gpu


def test_zero_offload_stages_the_largest_gradient_on_the_gpu() -> None:
    estimate = _estimate(zero=2, offload=Offload.OPTIMIZER, grad_accum=2)
    assert _line(estimate, "ZeRO-Offload gradient staging") == EMBEDDING * 2


@pytest.mark.parametrize("zero", [2, 3])
def test_zero_offload_keeps_no_gradient_partition_on_the_gpu(zero: int) -> None:
    # stage_1_and_2.py / stage3.py under offload_optimizer: each reduced bucket goes to the host's
    # fp32 (and, at stage 3, 16-bit) gradient partition; the GPU keeps the buckets and the staging
    offload = _estimate(zero=zero, offload=Offload.OPTIMIZER, grad_accum=2)
    assert _line(offload, "model gradients") == 0
    kept = _estimate(zero=zero, grad_accum=2)
    # without offload: the 16-bit partition of 8 GPUs (kept between micro-batches)
    assert _line(kept, "model gradients") == 2 * N // 8


def test_zero_1_offload_keeps_its_16_bit_gradients_through_backward() -> None:
    # stage 1 reduces at the accumulation boundary only (process_gradients), so the 16-bit
    # gradients stay on the GPU however the optimizer states are offloaded
    offload = _estimate(zero=1, offload=Offload.OPTIMIZER, grad_accum=2)
    assert _line(offload, "model gradients") == _line(
        _estimate(zero=1, grad_accum=2), "model gradients"
    )
    assert _line(offload, "model gradients") > 0


# -- ZeRO-3's gathered and persistent parameters ------------------------------------------------


def test_persistent_parameters_are_the_small_tensors() -> None:
    arch = architecture(MODEL)
    assert persistent_params(arch, 100_000) == PERSISTENT
    assert persistent_params(arch, 0) == 0
    # the Trainer's auto: 10 x 896 = 8,960 keeps the same tensors here
    assert persistent_params(arch, 10 * HIDDEN) == PERSISTENT


def test_a_small_model_stays_gathered_into_backward() -> None:
    # max_reuse_distance 1e9: the last 5e8 elements stay gathered from forward into backward,
    # more than this model has: everything partitioned is gathered at the start of backward
    gathered = zero3_gathered(
        Plan(model="qwen2.5-0.5b", method="full", zero=3), architecture(MODEL)
    )
    assert gathered.running == EMBEDDING
    assert gathered.kept == N - PERSISTENT - EMBEDDING
    assert gathered.prefetched == 0
    assert gathered.start_of_backward == N - PERSISTENT


def test_reuse_distance_live_parameters_and_prefetch_bound_what_is_gathered() -> None:
    plan = Plan(model="qwen2.5-0.5b", method="full", zero=3, gpus=8, ds_max_reuse_distance=10**8)
    gathered = zero3_gathered(plan, architecture(MODEL))
    assert gathered.kept == 5 * 10**7  # half the reuse distance
    assert gathered.running == EMBEDDING
    assert gathered.prefetched == 5 * 10**7  # the default prefetch bucket
    # max live parameters leaves no room for a prefetch: none
    tight = plan.with_changes({"ds_max_live_params": 5 * 10**7 + EMBEDDING})
    assert zero3_gathered(tight, architecture(MODEL)).prefetched == 0
    # the Trainer's auto prefetch: int(0.9 x 896^2) = 722,534
    auto = plan.with_changes({"ds_prefetch_bucket": "auto"})
    assert zero3_gathered(auto, architecture(MODEL)).prefetched == int(0.9 * HIDDEN * HIDDEN)
    estimate = estimate_memory(plan, MODEL)
    assert _line(estimate, "model ZeRO-3 prefetch bucket (5e7") == 5 * 10**7 * 2


def test_zero3_weights_are_the_partition_plus_the_persistent_parameters() -> None:
    estimate = _estimate(zero=3)
    assert estimate.per_gpu.weights == pytest.approx(
        2 * (N - PERSISTENT) / 8 + 2 * PERSISTENT, abs=1
    )


def test_a_sub_group_bounds_stage_3s_fp32_gradients_at_the_step() -> None:
    # without offload, one sub-group's fp32 gradients at a time (stage3.py), plus at most one
    # parameter's partition of overrun; the whole 1/8 partition when it is smaller
    plan = Plan(model="qwen2.5-0.5b", method="full", zero=3, gpus=8, precision="mixed")
    assert _master_gradients(plan) == pytest.approx(4 * N / 8)
    small = plan.with_changes({"ds_sub_group_size": 10**6})
    assert _master_gradients(small) == pytest.approx(4 * (10**6 + EMBEDDING / 8))


def test_a_sub_group_bounds_stage_3s_foreach_step_temporary() -> None:
    # stage3.py's step hands torch's AdamW one sub-group's fp32 partition per call: foreach's
    # state-sized temporary (4 bytes per element) is one sub-group's, as the fp32 gradients are
    plan = Plan(
        model="qwen2.5-0.5b",
        method="full",
        zero=3,
        gpus=8,
        precision="mixed",
        optimizer_impl="foreach",
    )
    small = plan.with_changes({"ds_sub_group_size": 10**6})
    assert _accumulated(plan).step_temporaries == pytest.approx(4 * N / 8)
    assert _accumulated(small).step_temporaries == pytest.approx(4 * (10**6 + EMBEDDING / 8))
    # ZeRO-1 and 2 step the whole partition in one call
    stage2 = small.with_changes({"zero": 2})
    assert _accumulated(stage2).step_temporaries == pytest.approx(4 * N / 8)


def test_zero_settings_on_a_plan_without_zero_are_said_to_do_nothing() -> None:
    plan = Plan(model="qwen2.5-0.5b", method="full", zero=2)
    unused = dict(unused_settings(plan, ["ds_prefetch_bucket", "ds_reduce_bucket"]))
    assert "stage 3" in unused["ds_prefetch_bucket"]
    assert "ds_reduce_bucket" not in unused
    none = dict(unused_settings(Plan(model="qwen2.5-0.5b"), ["ds_reduce_bucket"]))
    assert "ZeRO" in none["ds_reduce_bucket"]


# -- --from and --export ------------------------------------------------------------------------


def _ds_config(path: Path, **zero: Any) -> Path:
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "train_batch_size": 8,
        "zero_optimization": {"stage": 3, **zero},
        "bf16": {"enabled": True},
    }
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


@pytest.mark.usefixtures("quiet_machine")
def test_non_default_buckets_change_exactly_their_lines(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def details(path: Path) -> dict[str, int]:
        status, out, err = run_plan(
            capsys, "--model", "qwen2.5-0.5b", "--method", "full", "--from", str(path), "--json"
        )
        assert status == 0, err
        return {label: value for label, value in json.loads(out)["details"]}

    default = details(_ds_config(tmp_path / "default.json"))
    changed = details(
        _ds_config(
            tmp_path / "changed.json",
            reduce_bucket_size=2e8,
            stage3_max_reuse_distance=1e8,
            stage3_prefetch_bucket_size=3e7,
        )
    )
    moved = {
        label
        for label in default.keys() | changed.keys()
        if default.get(label) != changed.get(label)
    }
    ds_lines = {label for label in moved if "ZeRO" in label}
    # the bucket and the gathered parameters' lines, and the allocator's share of their total
    assert moved - ds_lines == {
        f"allocator pool ({packaged_software().pool.distributed:.0%} of the tensors)"
    }
    assert (
        changed[next(label for label in changed if label.startswith(BUCKET + " (2e8"))] == 4 * 10**8
    )
    assert any("prefetch bucket (3e7" in label for label in ds_lines)


def test_from_reads_auto_as_the_trainers_values(tmp_path: Path) -> None:
    path = _ds_config(
        tmp_path / "auto.json",
        reduce_bucket_size="auto",
        stage3_prefetch_bucket_size="auto",
        stage3_param_persistence_threshold="auto",
        overlap_comm=True,
        contiguous_gradients=True,
    )
    updates = read_plan_file(path).updates
    assert updates["ds_reduce_bucket"] == "auto"
    assert updates["ds_prefetch_bucket"] == "auto"
    assert updates["ds_persistence_threshold"] == "auto"
    # DeepSpeed's own defaults at stage 3 stay unset
    assert "ds_overlap_comm" not in updates and "ds_contiguous_gradients" not in updates


def test_a_bad_bucket_is_a_usage_error_naming_the_key(tmp_path: Path) -> None:
    path = _ds_config(tmp_path / "bad.json", reduce_bucket_size="large")
    with pytest.raises(UsageError, match=r"zero_optimization\.reduce_bucket_size"):
        read_plan_file(path)


def test_a_trainer_configs_inline_deepspeed_block_carries_the_buckets(tmp_path: Path) -> None:
    path = tmp_path / "args.json"
    path.write_text(
        json.dumps(
            {
                "per_device_train_batch_size": 1,
                "deepspeed": {"zero_optimization": {"stage": 3, "sub_group_size": 1e8}},
            }
        ),
        encoding="utf-8",
    )
    assert read_plan_file(path).updates["ds_sub_group_size"] == 10**8


@pytest.mark.usefixtures("quiet_machine")
def test_export_then_from_keeps_the_buckets(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    given = [
        "--model", "qwen2.5-0.5b", "--method", "full", "--zero", "3", "--gpus", "8",
        "--ds-reduce-bucket", "auto", "--ds-prefetch-bucket", "2e7", "--ds-max-live-params",
        "3e8", "--ds-max-reuse-distance", "1e8", "--ds-persistence-threshold", "0",
        "--ds-sub-group-size", "1e8", "--no-ds-contiguous-gradients", "--no-ds-overlap-comm",
        "--ds-allgather-bucket", "1e8",
    ]  # fmt: skip
    path = tmp_path / "ds.json"
    status, _, err = run_plan(capsys, *given, "--export", "deepspeed", "-o", str(path))
    assert status in (0, 1), err
    zero = json.loads(path.read_text(encoding="utf-8"))["zero_optimization"]
    # auto written as the number the Trainer would fill in
    assert zero["reduce_bucket_size"] == HIDDEN * HIDDEN
    status, out, err = run_plan(
        capsys, "--model", "qwen2.5-0.5b", "--method", "full", "--from", str(path), "--json"
    )
    assert status == 0, err
    back = json.loads(out)["plan"]
    assert back["ds_reduce_bucket"] == HIDDEN * HIDDEN
    assert back["ds_prefetch_bucket"] == 2 * 10**7
    assert back["ds_max_live_params"] == 3 * 10**8
    assert back["ds_max_reuse_distance"] == 10**8
    assert back["ds_persistence_threshold"] == 0
    assert back["ds_sub_group_size"] == 10**8
    assert back["ds_allgather_bucket"] == 10**8
    assert back["ds_contiguous_gradients"] is False
    assert back["ds_overlap_comm"] is False
    status, original, _ = run_plan(capsys, *given, "--json")
    assert json.loads(original)["memory"] == json.loads(out)["memory"]


# -- make it fit --------------------------------------------------------------------------------


def test_make_it_fit_proposes_a_smaller_reduce_bucket() -> None:
    # a 7B LoRA under ZeRO-2 with overlap_comm on four L4s at 512 tokens: two 5e8-element bf16
    # buckets (1.9 GiB) leave it tight; the Trainer's hidden^2 bucket (3584^2) gives it room
    plan = Plan(
        model="qwen2.5-7b",
        method=Method.LORA,
        zero=2,
        ds_overlap_comm=True,
        gpus=4,
        grad_ckpt=True,
        seq=512,
    )
    model = resolve_model(plan.model, CATALOG)
    search = find_fit_options(plan, model, CATALOG, "l4x4", [CATALOG.flavors["l4x4"]], limit=20)
    changes = [{change.field: change.new for change in option.changes} for option in search.options]
    assert {"ds_reduce_bucket": 3584 * 3584} in changes


def test_an_accelerate_configs_deepspeed_file_carries_the_buckets(tmp_path: Path) -> None:
    _ds_config(tmp_path / "ds.json", reduce_bucket_size=1e8)
    path = tmp_path / "default_config.yaml"
    path.write_text(
        "distributed_type: DEEPSPEED\nnum_processes: 8\n"
        "deepspeed_config:\n  deepspeed_config_file: ds.json\n  zero3_init_flag: true\n",
        encoding="utf-8",
    )
    updates = read_plan_file(path).updates
    assert updates["zero"] == 3
    assert updates["ds_reduce_bucket"] == 10**8


def test_an_accelerate_export_names_each_buffer_setting_it_cannot_write_by_its_flag() -> None:
    # accelerate's deepspeed_config block has no buffer keys: the export's warning says each set
    # buffer as the flag that would set it again (the "on" form of a switch, with its value)
    plan = Plan(
        model="qwen2.5-0.5b",
        method=Method.FULL,
        zero=3,
        gpus=8,
        ds_reduce_bucket=10**8,
        ds_allgather_bucket=2 * 10**8,
        ds_overlap_comm=False,
        ds_contiguous_gradients=True,
        ds_prefetch_bucket=2 * 10**7,
        ds_max_live_params=3 * 10**8,
        ds_max_reuse_distance=10**8,
        ds_persistence_threshold=0,
        ds_sub_group_size=10**8,
    )
    missing = uncarried_settings(plan, "accelerate")
    for words in (
        "--ds-reduce-bucket 100000000",
        "--ds-allgather-bucket 200000000",
        "--ds-overlap-comm false",
        "--ds-contiguous-gradients true",
        "--ds-prefetch-bucket 20000000",
        "--ds-max-live-params 300000000",
        "--ds-max-reuse-distance 100000000",
        "--ds-persistence-threshold 0",
        "--ds-sub-group-size 100000000",
    ):
        assert words in missing, (words, missing)
    # unset buffers are not named; the DeepSpeed export writes them all as keys
    assert not any(
        "--ds-" in words
        for words in uncarried_settings(
            Plan(model="qwen2.5-0.5b", method=Method.FULL, zero=3, gpus=8), "accelerate"
        )
    )
    assert not any("--ds-" in words for words in uncarried_settings(plan, "deepspeed"))
