"""The whole GPU (issue 29): the CUDA context by compute capability, NCCL's communicator buffers, and
allocated vs reserved vs the whole GPU, each against a hand computation from its cited default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hwdash.cli import main
from hwdash.core.catalog import Catalog, CatalogError, load_catalog, load_catalog_from
from hwdash.core.data_files import packaged_catalog_dir
from hwdash.core.estimator import estimate_memory
from hwdash.core.estimator.software import packaged_software
from hwdash.core.plan import Framework, FsdpMode, Method, Offload, Plan
from hwdash.core.planning.fit import evaluate_flavor
from hwdash.core.planning.fit_options import find_fit_options
from hwdash.core.results import MemoryEstimate
from hwdash.core.units import MIB

# NVIDIA/nccl src/init.cc and src/include/device.h: one connection's buffers, by protocol.
LL = 8 * 512 * 8 * 16  # NCCL_LL_LINES_PER_THREAD x NCCL_LL_MAX_NTHREADS x NCCL_STEPS x 16 bytes
LL128 = 120 * 640 * 8 * 8  # NCCL_LL128_ELEMS_PER_THREAD x NCCL_LL128_MAX_NTHREADS x NCCL_STEPS x 8
SIMPLE = 4 * MIB  # DEFAULT_BUFFSIZE, 1 << 22
CONNECTION = LL + LL128 + SIMPLE  # 9,633,792 bytes
NVLINK_CHANNELS = 16  # NCCL_DEBUG on 8 NVLink H800s (NVIDIA/nccl issue #892)
PCIE_CHANNELS = 2  # NCCL_DEBUG on 8 PCIe GPUs (NVIDIA/nccl-tests issue #228)
H200_CONTEXT = 804_061_184  # 766.8125 MiB: NVML - max_memory_reserved, bench/data/device_h200
# bench/data/device_h100/nccl_groups.json: device memory outside the allocator after the world
# communicator (591,396,864 more than before it) and after each of two more (408,944,640 each)
COMMUNICATOR = 408_944_640
KERNELS = 591_396_864 - COMMUNICATOR


def _nccl(groups: int, buffers: int) -> tuple[str, int]:
    """The NCCL line of a plan with ``groups`` communicators holding ``buffers`` in all."""
    label = f"NCCL ({groups} communicator{'s' if groups > 1 else ''} and buffers)"
    return label, KERNELS + groups * COMMUNICATOR + buffers


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(include_user=False)


def _estimate(catalog: Catalog, accelerator: str | None, **fields: object) -> MemoryEstimate:
    plan = Plan(**{"model": "qwen2.5-0.5b", "method": Method.LORA, **fields})  # type: ignore[arg-type]
    return estimate_memory(
        plan,
        catalog.models["qwen2.5-0.5b"],
        accelerator=None if accelerator is None else catalog.accelerators[accelerator],
        software=catalog.software,
    )


def _nccl_line(estimate: MemoryEstimate) -> tuple[str, int] | None:
    lines = [(label, value) for label, value in estimate.details if label.startswith("NCCL")]
    assert len(lines) <= 1
    return lines[0] if lines else None


def test_the_defaults_are_nccls() -> None:
    nccl = packaged_software().nccl
    assert (nccl.ll_bytes, nccl.ll128_bytes, nccl.simple_bytes) == (524_288, 4_915_200, 4_194_304)
    assert CONNECTION == 9_633_792


def test_ddp_on_eight_nvlink_gpus(catalog: Catalog) -> None:
    estimate = _estimate(catalog, "h200", gpus=8)
    # one data-parallel ring: 16 channels x 1 connection x (LL + LL128 + Simple) = 154,140,672
    assert _nccl_line(estimate) == _nccl(1, NVLINK_CHANNELS * CONNECTION)
    assert NVLINK_CHANNELS * CONNECTION == 154_140_672


def test_deepspeed_zero_adds_its_clone_of_the_world_group(catalog: Catalog) -> None:
    # deepspeed/utils/groups.py _clone_world_group: a second communicator over the same 8 GPUs
    estimate = _estimate(catalog, "h200", gpus=8, zero=2)
    assert _nccl_line(estimate) == _nccl(2, 2 * NVLINK_CHANNELS * CONNECTION)


def test_ddp_on_pcie_gpus(catalog: Catalog) -> None:
    estimate = _estimate(catalog, "l40s", gpus=4)
    assert _nccl_line(estimate) == _nccl(1, PCIE_CHANNELS * CONNECTION)


def test_nccl_buffsize_changes_exactly_that_line(catalog: Catalog) -> None:
    default = _estimate(catalog, "h200", gpus=8)
    smaller = _estimate(catalog, "h200", gpus=8, nccl_buffsize=1 * MIB)
    assert _nccl_line(smaller) == _nccl(1, NVLINK_CHANNELS * (LL + LL128 + MIB))
    others = [line for line in default.details if not line[0].startswith("NCCL")]
    assert others == [line for line in smaller.details if not line[0].startswith("NCCL")]
    assert default.per_gpu.total - smaller.per_gpu.total == NVLINK_CHANNELS * (SIMPLE - MIB)
    assert default.reserved_bytes == smaller.reserved_bytes


def test_the_communicator_figures_are_the_h100_measurement() -> None:
    path = Path(__file__).parents[2] / "bench" / "data" / "device_h100" / "nccl_groups.json"
    steps = list(json.loads(path.read_text())[0]["stages"].values())
    # outside the allocator: before NCCL, + the world communicator, + a second, + a third
    assert steps[2] - steps[1] == steps[3] - steps[2] == COMMUNICATOR
    assert steps[1] - steps[0] == KERNELS + COMMUNICATOR
    nccl = packaged_software().nccl
    assert (nccl.communicator_bytes, nccl.kernels_bytes) == (COMMUNICATOR, KERNELS)


def test_one_gpu_has_no_communicator(catalog: Catalog) -> None:
    for accelerator in (None, "h200"):
        estimate = _estimate(catalog, accelerator, gpus=1)
        assert _nccl_line(estimate) is None
        assert estimate.per_gpu.total - estimate.reserved_bytes == H200_CONTEXT
    served = _estimate(catalog, "h200", gpus=1, method=Method.INFERENCE)
    assert _nccl_line(served) is None


def test_zero_and_fsdp_on_one_gpu_hold_their_communicators(catalog: Catalog) -> None:
    # one rank: no connection buffers, but each communicator's own memory and NCCL's code
    zero = _estimate(catalog, "h200", gpus=1, zero=2)
    assert _nccl_line(zero) == _nccl(2, 0)  # the world group and DeepSpeed's clone of it
    fsdp = _estimate(catalog, "h200", gpus=1, fsdp=FsdpMode.FULL)
    assert _nccl_line(fsdp) == _nccl(1, 0)
    # and their allocator pool is a parallel process's
    assert _pool(zero)[0] == _pool(fsdp)[0] == "allocator pool (22% of the tensors)"


def test_megatron_on_one_gpu_holds_its_barriers_communicator(catalog: Catalog) -> None:
    # megatron/training/initialize.py _compile_dependencies: a barrier on the default group, of one
    # rank: the communicator's own memory and NCCL's code, no connection buffers
    plan = Plan(model="qwen2.5-0.5b", method=Method.FULL, framework="megatron", gpus=1)
    assert plan.megatron
    estimate = estimate_memory(
        plan, catalog.models["qwen2.5-0.5b"], accelerator=catalog.accelerators["h200"]
    )
    assert _nccl_line(estimate) == _nccl(1, 0)
    plain = plan.model_copy(update={"framework": Framework.HF})
    assert not plain.megatron
    assert (
        _nccl_line(
            estimate_memory(
                plain, catalog.models["qwen2.5-0.5b"], accelerator=catalog.accelerators["h200"]
            )
        )
        is None
    )


def test_megatron_groups(catalog: Catalog) -> None:
    plan = Plan(model="qwen2.5-0.5b", method=Method.FULL, gpus=8, tp=2, pp=2)
    estimate = estimate_memory(
        plan, catalog.models["qwen2.5-0.5b"], accelerator=catalog.accelerators["h200"]
    )
    # the default group of all 8 (Megatron's barriers, 16 channels) + TP ring (16 channels) + PP
    # sends to the one other stage (16 channels per peer x 1 peer) + the data-parallel ring of
    # 8 / (2 x 2) = 2 GPUs (16 channels)
    assert _nccl_line(estimate) == _nccl(4, 4 * 16 * CONNECTION)
    middle = estimate_memory(
        plan.model_copy(update={"pp": 4, "tp": 1}),
        catalog.models["qwen2.5-0.5b"],
        accelerator=catalog.accelerators["h200"],
    )
    # a middle stage receives from the previous and the next stage: 2 peers; dp 2; the default
    assert _nccl_line(middle) == _nccl(3, (16 + 16 * 2 + 16) * CONNECTION)


def test_fsdp_hybrid_has_a_shard_and_a_replicate_group(catalog: Catalog) -> None:
    plan = Plan(
        model="qwen2.5-0.5b", method=Method.FULL, gpus=16, fsdp=FsdpMode.HYBRID, gpus_per_node=8
    )
    estimate = estimate_memory(
        plan, catalog.models["qwen2.5-0.5b"], accelerator=catalog.accelerators["l40s"]
    )
    # the shard and replicate groups beside the default group of accelerate's barriers
    assert _nccl_line(estimate) == _nccl(3, 3 * PCIE_CHANNELS * CONNECTION)


def test_three_totals_add_up(catalog: Catalog) -> None:
    estimate = _estimate(catalog, "h200", gpus=8)
    details = dict(estimate.details)
    # 8 GPUs: a parallel training group's pool fraction (catalog/software.toml [[allocator_pool]])
    pool = details["allocator pool (22% of the tensors)"]
    assert pool == round(0.22 * estimate.allocated_bytes)
    assert estimate.reserved_bytes == estimate.allocated_bytes + pool
    context = details["CUDA context and kernels (H200, CC 9.0)"]
    assert context == H200_CONTEXT
    nccl = KERNELS + COMMUNICATOR + NVLINK_CHANNELS * CONNECTION
    assert estimate.whole_gpu_bytes == estimate.reserved_bytes + context + nccl
    assert estimate.whole_gpu_bytes == estimate.per_gpu.total
    assert estimate.per_gpu.overhead == pool + context + nccl


def _pool(estimate: MemoryEstimate) -> tuple[str, int]:
    (line,) = [(k, v) for k, v in estimate.details if k.startswith("allocator pool")]
    return line


def test_a_parallel_training_group_takes_the_distributed_pool(
    catalog: Catalog, tmp_path: Path
) -> None:
    assert catalog.software is not None
    pool = catalog.software.pool
    assert (pool.single_gpu, pool.distributed) == (0.08, 0.22)
    assert (pool.param_offload, pool.megatron) == (0.12, 0.13)
    assert pool.param_offload_base_bytes == 3.5 * 2**30
    alone = _estimate(catalog, "h200")
    assert _pool(alone) == (
        "allocator pool (8% of the tensors)",
        round(0.08 * alone.allocated_bytes),
    )
    group = _estimate(catalog, "h200", gpus=2)
    assert _pool(group) == (
        "allocator pool (22% of the tensors)",
        round(0.22 * group.allocated_bytes),
    )
    # inference on two GPUs runs no gradient collectives: the single-GPU fraction
    served = _estimate(catalog, "h200", gpus=2, method=Method.INFERENCE)
    assert _pool(served)[0] == "allocator pool (8% of the tensors)"
    # a user catalog's entry overrides the packaged one by id
    (tmp_path / "pool.toml").write_text(
        '[[allocator_pool]]\nid = "caching-allocator"\nsingle_gpu = 0.02\n'
        'single_gpu_source = "mine"\ndistributed = 0.5\ndistributed_source = "mine"\n'
    )
    mine = load_catalog_from([packaged_catalog_dir(), tmp_path])
    assert _pool(_estimate(mine, "h200", gpus=2)) == (
        "allocator pool (50% of the tensors)",
        round(0.5 * group.allocated_bytes),
    )
    # an entry without param_offload or megatron pools those plans as any distributed process
    # (and without a base: the packaged param_offload base is not carried over)
    offloaded = _estimate(mine, "h200", gpus=2, method=Method.FULL, zero=3, offload=Offload.PARAMS)
    assert _pool(offloaded) == (
        "allocator pool (50% of the tensors)",
        round(0.5 * offloaded.allocated_bytes),
    )
    tensor_parallel = _estimate(mine, "h200", gpus=2, method=Method.FULL, tp=2)
    assert _pool(tensor_parallel)[0] == "allocator pool (50% of the tensors)"
    # a distributed base counts once on top of the fraction, for any kind without its own
    (tmp_path / "pool.toml").write_text(
        '[[allocator_pool]]\nid = "caching-allocator"\nsingle_gpu = 0.02\n'
        'single_gpu_source = "mine"\ndistributed = 0.5\ndistributed_source = "mine"\n'
        "distributed_base_bytes = 1073741824\n"
    )
    based = load_catalog_from([packaged_catalog_dir(), tmp_path])
    assert _pool(_estimate(based, "h200", gpus=2, method=Method.FULL, tp=2)) == (
        "allocator pool (1.00 GiB + 50% of the tensors)",
        2**30 + round(0.5 * tensor_parallel.allocated_bytes),
    )
    assert _pool(_estimate(based, "h200"))[0] == "allocator pool (2% of the tensors)"


def test_megatron_takes_its_own_pool(catalog: Catalog) -> None:
    # the Megatron-LM path, model-parallel or data-parallel alone under --framework megatron, on
    # any GPU count: the fraction fitted on the Megatron-LM readings
    for fields in (
        {"gpus": 2, "tp": 2},
        {"gpus": 8, "pp": 2, "zero": 1},
        {"gpus": 4, "framework": Framework.MEGATRON},
        {"gpus": 1, "framework": Framework.MEGATRON},
    ):
        plan = _estimate(catalog, "h200", method=Method.FULL, **fields)
        assert _pool(plan) == (
            "allocator pool (13% of the tensors)",
            round(0.13 * plan.allocated_bytes),
        ), fields
    # Megatron-LM runs neither ZeRO-2/3 nor FSDP: such a plan keeps the generic path and its pool
    zero3 = _estimate(
        catalog, "h200", gpus=4, method=Method.FULL, framework=Framework.MEGATRON, zero=3
    )
    assert _pool(zero3)[0] == "allocator pool (22% of the tensors)"


@pytest.mark.parametrize(
    "fields",
    [
        {"zero": 3, "offload": Offload.PARAMS},
        {"fsdp": FsdpMode.FULL, "fsdp_offload": True},
    ],
    ids=["zero3-offload-params", "fsdp-cpu-offload"],
)
def test_parameters_on_the_host_take_the_param_offload_pool(
    catalog: Catalog, fields: dict[str, object]
) -> None:
    # the base and fraction fitted on the seen readings whose parameters live on the host
    for gpus in (1, 4):
        offloaded = _estimate(catalog, "h200", gpus=gpus, method=Method.FULL, **fields)
        assert _pool(offloaded) == (
            "allocator pool (3.50 GiB + 12% of the tensors)",
            14 * 2**28 + round(0.12 * offloaded.allocated_bytes),
        )
        assert offloaded.reserved_bytes == offloaded.allocated_bytes + _pool(offloaded)[1]
    # the optimizer alone on the host keeps the parameters' buffers on the GPU: the distributed pool
    optimizer_only = _estimate(
        catalog, "h200", gpus=4, method=Method.FULL, zero=3, offload=Offload.OPTIMIZER
    )
    assert _pool(optimizer_only)[0] == "allocator pool (22% of the tensors)"
    # inference never takes a training process's pool
    served = _estimate(catalog, "h200", gpus=1, method=Method.INFERENCE)
    assert _pool(served)[0] == "allocator pool (8% of the tensors)"


def test_compute_capability_picks_its_row(catalog: Catalog, tmp_path: Path) -> None:
    (tmp_path / "ampere.toml").write_text(
        "[[cuda_context]]\n"
        'id = "ampere"\n'
        'compute_capabilities = ["8.0", "8.6"]\n'
        "bytes = 1073741824\n"
        'measured_on = "A100, CC 8.0"\n'
        'source = "a test reading"\n'
    )
    mine = load_catalog_from([packaged_catalog_dir(), tmp_path])
    a100 = _estimate(mine, "a100-80gb")
    assert dict(a100.details)["CUDA context and kernels (A100 80GB, CC 8.0)"] == 2**30
    # a compute capability without a row takes the default row, and says so
    t4 = dict(_estimate(mine, "t4").details)
    assert t4["CUDA context and kernels (T4, CC 7.5: as H200, CC 9.0)"] == H200_CONTEXT
    # the hardware-neutral estimate takes the default row
    neutral = dict(_estimate(mine, None).details)
    assert neutral["CUDA context and kernels (H200, CC 9.0, default)"] == H200_CONTEXT
    # the packaged catalog has no Ampere row: the A100 gets the default
    packaged = dict(_estimate(catalog, "a100-80gb").details)
    assert packaged["CUDA context and kernels (A100 80GB, CC 8.0: as H200, CC 9.0)"] == H200_CONTEXT


def test_fit_verdict_compares_the_whole_gpu(catalog: Catalog) -> None:
    plan = Plan(model="qwen2.5-0.5b", method=Method.LORA)
    flavor = catalog.flavors["h200x8"]
    accelerator = catalog.accelerators["h200"]
    fit, estimate = evaluate_flavor(
        plan, catalog.models["qwen2.5-0.5b"], flavor, accelerator, None, software=catalog.software
    )
    assert fit.need_bytes == estimate.whole_gpu_bytes
    assert fit.outside_allocator_bytes == (
        H200_CONTEXT + KERNELS + COMMUNICATOR + NVLINK_CHANNELS * CONNECTION
    )
    assert fit.need_bytes - fit.outside_allocator_bytes == estimate.reserved_bytes


def test_plan_json_has_the_three_totals(capsys: pytest.CaptureFixture[str]) -> None:
    arguments = ["plan", "--model", "qwen2.5-0.5b", "--method", "lora", "--gpus", "8"]
    assert main([*arguments, "--flavor", "h200x8", "--nccl-buffsize", "1048576", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    memory = document["memory"]
    assert memory["total"] == memory["whole_gpu"]
    assert memory["allocated"] < memory["reserved"] < memory["whole_gpu"]
    details = dict(document["details"])
    label, nccl = _nccl(1, NVLINK_CHANNELS * (LL + LL128 + MIB))
    assert details[label] == nccl
    assert memory["whole_gpu"] - memory["reserved"] == H200_CONTEXT + nccl
    assert document["plan"]["nccl_buffsize"] == 1048576


def test_text_report_shows_the_three_totals(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "qwen2.5-0.5b", "--method", "lora", "--gpus", "2"]) == 0
    out = capsys.readouterr().out
    rows = [row.strip() for row in out.splitlines()]
    for total in ("allocated", "reserved", "whole GPU"):
        assert any(row.startswith(total + " ") for row in rows)
    assert "max_memory_allocated" in out and "max_memory_reserved" in out
    assert "NCCL (1 communicator and buffers)" in out


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            '[[cuda_context]]\nid = "second"\ndefault = true\nbytes = 1\nmeasured_on = "x"\n'
            'source = "x"\n',
            "exactly one row with default = true (found: hopper, second)",
        ),
        (
            '[[cuda_context]]\nid = "clash"\ncompute_capabilities = ["9.0"]\nbytes = 1\n'
            'measured_on = "x"\nsource = "x"\n',
            "compute capability 9.0 is in two rows",
        ),
        (
            '[[cuda_context]]\nid = "bad"\ncompute_capabilities = ["nine"]\nbytes = 1\n'
            'measured_on = "x"\nsource = "x"\n',
            "'nine' is not a compute capability like '9.0'",
        ),
        (
            '[[nccl]]\nid = "other"\nll_bytes = 1\nll128_bytes = 1\nsimple_bytes = 1\n'
            'source = "x"\n',
            "[[nccl]] needs exactly one entry (found 2)",
        ),
        (
            '[[allocator_pool]]\nid = "other"\nsingle_gpu = 0.1\nsingle_gpu_source = "x"\n'
            'distributed = 0.2\ndistributed_source = "x"\n',
            "[[allocator_pool]] needs exactly one entry (found 2)",
        ),
        (
            '[[allocator_pool]]\nid = "caching-allocator"\nsingle_gpu = -0.1\n'
            'single_gpu_source = "x"\ndistributed = 0.2\ndistributed_source = "x"\n',
            "single_gpu",
        ),
        (
            '[[allocator_pool]]\nid = "caching-allocator"\nsingle_gpu = 0.1\n'
            'single_gpu_source = "x"\ndistributed = 0.2\ndistributed_source = "x"\n'
            "param_offload = 0.3\n",
            "param_offload needs its source",
        ),
        (
            '[[allocator_pool]]\nid = "caching-allocator"\nsingle_gpu = 0.1\n'
            'single_gpu_source = "x"\ndistributed = 0.2\ndistributed_source = "x"\n'
            "megatron = 0.1\n",
            "megatron needs its source",
        ),
        (
            '[[interconnect]]\nid = "nvlink"\ncoll_channels = 0\np2p_channels_per_peer = 1\n'
            'source = "x"\n',
            "coll_channels",
        ),
    ],
)
def test_broken_software_file_is_refused(tmp_path: Path, text: str, reason: str) -> None:
    path = tmp_path / "software.toml"
    path.write_text(text)
    with pytest.raises(CatalogError) as caught:
        load_catalog_from([packaged_catalog_dir(), path])
    message = str(caught.value)
    assert message.startswith(str(path))
    assert reason in message
    assert "\n" not in message


def test_an_unknown_interconnect_is_refused(tmp_path: Path) -> None:
    text = (packaged_catalog_dir() / "accelerators.toml").read_text()
    path = tmp_path / "accelerators.toml"
    path.write_text(text.replace('interconnect = "pcie"', 'interconnect = "infiniband"', 1))
    with pytest.raises(CatalogError) as caught:
        load_catalog_from([packaged_catalog_dir(), path])
    assert caught.value.field == "interconnect"
    assert "unknown interconnect 'infiniband'" in str(caught.value)


def test_make_it_fit_reads_the_catalogs_software(catalog: Catalog, tmp_path: Path) -> None:
    # a user default row that says the CUDA context takes 30 GiB: nothing fits a 24 GiB RTX 4090
    # (CC 8.9 has no row of its own)
    (tmp_path / "huge.toml").write_text(
        "[[cuda_context]]\n"
        'id = "hopper"\n'
        'compute_capabilities = ["9.0"]\n'
        "default = true\n"
        f"bytes = {30 * 2**30}\n"
        'measured_on = "H200, CC 9.0"\n'
        'source = "a test reading"\n'
    )
    mine = load_catalog_from([packaged_catalog_dir(), tmp_path])
    plan = Plan(model="qwen2.5-0.5b", method=Method.LORA)
    model = catalog.models["qwen2.5-0.5b"]
    target = "local-rtx-4090"
    packaged = find_fit_options(plan, model, catalog, target, [catalog.flavors[target]])
    assert packaged.fits_already
    huge = find_fit_options(plan, model, mine, target, [mine.flavors[target]])
    assert not huge.fits_already and not huge.options


def _ddp_line(estimate: MemoryEstimate) -> int | None:
    lines = [value for label, value in estimate.details if label.startswith("DDP gradient buckets")]
    assert len(lines) <= 1
    return lines[0] if lines else None


def test_ddp_buckets_copy_every_trained_gradient(catalog: Catalog) -> None:
    # torch/nn/parallel/distributed.py: without gradient_as_bucket_view the Reducer's buckets
    # (25 MiB each, together every trained parameter) are a second copy of the gradients, in the
    # gradients' dtype: bf16 full fine-tuning 2 bytes per parameter, PEFT's fp32 adapters 4
    full = _estimate(catalog, "h200", gpus=2, method=Method.FULL, precision="bf16", grad_accum=2)
    assert _ddp_line(full) == 2 * full.trainable_params
    lora = _estimate(catalog, "h200", gpus=2, grad_accum=2)
    assert _ddp_line(lora) == 4 * lora.trainable_params
    one = _estimate(catalog, "h200", gpus=1, method=Method.FULL, precision="bf16", grad_accum=2)
    assert _ddp_line(one) is None
    # alive in every phase: the gradients component grows by exactly the buckets
    assert full.per_gpu.gradients - one.per_gpu.gradients == 2 * full.trainable_params
    # DeepSpeed and FSDP reduce through their own buffers
    assert _ddp_line(_estimate(catalog, "h200", gpus=2, zero=2)) is None
    assert _ddp_line(_estimate(catalog, "h200", gpus=2, fsdp=FsdpMode.FULL)) is None
