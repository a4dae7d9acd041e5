"""Tensor parallelism's non-torch buffers in serving plans (hwdash.core.estimator.serving
``tp_buffer_bytes``) against hand computations from the cited defaults.

One NCCL connection (catalog/software.toml [[nccl]], NCCL's src/init.cc defaults): LL 524,288 +
LL128 4,915,200 + Simple 4,194,304 = 9,633,792 bytes. A TP rank's ring holds one connection per
channel: 16 channels on NVLink, 2 on PCIe ([[interconnect]]). vLLM's custom all-reduce
(custom_all_reduce.py, max_size 8 MiB) adds two IPC buffers, 16 MiB, at TP 2, 4, 6 or 8 on a
fully NVLink-connected node. Per rank the buffers step up at TP 2 and stay flat: a ring rank
connects to one peer per channel and the custom all-reduce only maps its peers' buffers.
"""

from __future__ import annotations

import math

import pytest

from hwdash.core.catalog import load_catalog
from hwdash.core.estimator.architecture import architecture
from hwdash.core.estimator.serving import (
    MIB,
    ServingMemory,
    ServingSettings,
    counted_tp_buffers,
    default_fraction,
    packaged_engines,
    serving_memory,
    tp_buffer_bytes,
)
from hwdash.core.estimator.software import packaged_software
from hwdash.core.models.config import resolve_model

CATALOG = load_catalog(include_user=False)
LLAMA_70B = architecture(resolve_model("llama-3.1-70b", CATALOG))
H100 = CATALOG.accelerators["h100-sxm"]  # interconnect "nvlink"
RTX_4090 = CATALOG.accelerators["rtx-4090"]  # interconnect "pcie"
SOFTWARE = packaged_software()
CONNECTION = 524_288 + 4_915_200 + 4_194_304
NVLINK_RING = 16 * CONNECTION
CUSTOM_ALLREDUCE = 16 * MIB


def test_catalog_ids_are_the_ones_the_hand_numbers_assume() -> None:
    assert H100.interconnect == "nvlink" and RTX_4090.interconnect == "pcie"
    assert CONNECTION == 9_633_792


@pytest.mark.parametrize("engine", ["vllm", "vllm-v0", "sglang"])
def test_tp_buffers_by_hand(engine: str) -> None:
    row = packaged_engines()[engine]
    assert tp_buffer_bytes(row, 1, H100, SOFTWARE) == 0  # one GPU: no communicator
    for tp in (2, 4, 6, 8):
        assert tp_buffer_bytes(row, tp, H100, SOFTWARE) == NVLINK_RING + CUSTOM_ALLREDUCE
    # TP 3 is not a custom all-reduce size (_SUPPORTED_WORLD_SIZES): the NCCL ring only
    assert tp_buffer_bytes(row, 3, H100, SOFTWARE) == NVLINK_RING == 154_140_672
    # PCIe: a 2-channel ring and no custom all-reduce (no peer access on GeForce cards)
    assert tp_buffer_bytes(row, 2, RTX_4090, SOFTWARE) == 2 * CONNECTION == 19_267_584


def _memory(engine: str, tp: int, **override: object) -> ServingMemory:
    engines = dict(packaged_engines())
    engines[engine] = engines[engine].model_copy(update=override)
    settings = ServingSettings(engine, 8192, tp=tp)
    return serving_memory(LLAMA_70B, H100, settings, engines=engines)


def test_v0_counts_the_tp_buffers_inside_its_budget() -> None:
    # vllm/worker/worker.py: baseline snapshot before init_worker_distributed_environment
    one = _memory("vllm-v0", 1)
    assert one.non_torch_bytes == 256 * MIB  # TP 1 unchanged: non_torch_mib alone
    for tp in (2, 4, 8):
        counted = _memory("vllm-v0", tp)
        assert counted.non_torch_bytes == 256 * MIB + NVLINK_RING + CUSTOM_ALLREDUCE
        assert counted.tp_buffer_bytes == NVLINK_RING + CUSTOM_ALLREDUCE
        uncounted = _memory("vllm-v0", tp, tp_buffers="outside")
        assert counted.kv_cache_bytes > 0
        assert uncounted.kv_cache_bytes - counted.kv_cache_bytes == NVLINK_RING + CUSTOM_ALLREDUCE


def test_current_v1_leaves_them_outside_its_budget() -> None:
    # vllm/v1/worker/gpu_worker.py: distributed init before the snapshot (vllm PR 25359)
    assert _memory("vllm", 1).non_torch_bytes == 0 == _memory("vllm", 1).tp_buffer_bytes
    for tp in (2, 4, 8):
        memory = _memory("vllm", tp)
        assert memory.non_torch_bytes == 0
        assert memory.tp_buffer_bytes == NVLINK_RING + CUSTOM_ALLREDUCE
        assert memory.kv_cache_bytes > 0
        weights_and_peak = memory.weight_bytes + memory.activation_bytes
        assert memory.kv_cache_bytes == memory.budget_bytes - weights_and_peak
    # vLLM before that PR: as V0, inside
    before = _memory("vllm", 2, tp_buffers="in-budget")
    assert _memory("vllm", 2).kv_cache_bytes - before.kv_cache_bytes == (
        NVLINK_RING + CUSTOM_ALLREDUCE
    )


def test_sglang_pool_loses_its_fraction_of_them() -> None:
    # model_runner.py: mem_fraction_static x (free memory after distributed init) - weights
    engine = packaged_engines()["sglang"]
    buffers = NVLINK_RING + CUSTOM_ALLREDUCE
    for tp, fraction in ((2, 0.87), (4, 0.85), (8, 0.81)):
        assert default_fraction(engine, tp) == fraction
        memory = _memory("sglang", tp)
        assert memory.tp_buffer_bytes == buffers
        uncounted = _memory("sglang", tp, tp_buffers="outside")
        assert memory.kv_cache_bytes > 0
        lost = uncounted.kv_cache_bytes - memory.kv_cache_bytes
        assert lost == math.ceil(fraction * buffers)
        assert 0 < lost < buffers
    assert counted_tp_buffers(engine, buffers, 0.9) == math.ceil(0.9 * buffers)
    assert _memory("sglang", 1).tp_buffer_bytes == 0
