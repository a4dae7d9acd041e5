"""The monitor joins probe readings to NVML's processes by PID and GPU UUID (fake NVML scenario)."""

from __future__ import annotations

import json

import pytest

from hwdash.commands.monitor import print_readable
from hwdash.telemetry.snapshot_json import snapshot_to_dict
from hwdash.telemetry.source import make_sampler

TORCH_KEYS = {
    "allocated_bytes",
    "reserved_bytes",
    "max_allocated_bytes",
    "max_reserved_bytes",
    "alloc_retries",
    "ooms",
    "step",
}


def test_probed_ranks_get_their_allocator_numbers_and_the_others_none() -> None:
    now = [80.0]
    sampler = make_sampler("a100x4-training", clock=lambda: now[0])
    sampler.sample()
    now[0] = 82.0
    snapshot = sampler.sample()
    by_gpu = {gpu.index: gpu.processes[0] for gpu in snapshot.gpus}
    rank0, rank1 = by_gpu[0].torch, by_gpu[1].torch
    assert rank0 is not None and rank1 is not None
    assert by_gpu[2].torch is None and by_gpu[3].torch is None  # ranks without the probe
    # The allocator's pool is within what NVML charges the process; tensors within the pool.
    assert rank0.allocated_bytes <= rank0.reserved_bytes <= (by_gpu[0].used_bytes or 0)
    assert rank0.cache_bytes == rank0.reserved_bytes - rank0.allocated_bytes
    assert rank0.fragmentation is not None and 0 < rank0.fragmentation < 0.1
    # Rank 0's retries rose between the two samples (the scenario scripts them past 90%).
    assert rank0.alloc_retries > 0 and rank0.retries_rising
    assert rank1.alloc_retries == 0 and not rank1.retries_rising
    assert rank0.step == int((82 - 3) * 0.3)  # the scenario: 0.3 steps/s from CUDA at 3 s

    data = snapshot_to_dict(snapshot)
    processes = [process for gpu in data["gpus"] for process in gpu["processes"]]
    assert set(processes[0]["torch"]) == TORCH_KEYS
    assert processes[0]["torch"]["allocated_bytes"] == rank0.allocated_bytes
    assert processes[2]["torch"] is None
    json.dumps(data, allow_nan=False)


def test_before_the_script_initialises_cuda_there_is_nothing_to_join() -> None:
    sampler = make_sampler("a100x4-training", clock=lambda: 1.0)  # CUDA ready at 3 s
    snapshot = sampler.sample()
    assert all(p.torch is None for gpu in snapshot.gpus for p in gpu.processes)


def test_the_readable_view_says_what_the_allocator_says(capsys: pytest.CaptureFixture[str]) -> None:
    now = [80.0]
    sampler = make_sampler("a100x4-training", clock=lambda: now[0])
    sampler.sample()
    now[0] = 82.0
    print_readable(sampler.sample(), [])
    out = " ".join(capsys.readouterr().out.split())
    assert "PID 31337 on GPU 0 (PyTorch, step 23): allocated 67.6 GiB, reserved 74.3 GiB" in out
    assert "of the pool fragmented" in out
    assert "alloc retries and rising: the allocator frees its cache" in out
    assert "PID 31338 on GPU 1 (PyTorch" in out
    assert "PID 31339 on GPU 2 (PyTorch" not in out
