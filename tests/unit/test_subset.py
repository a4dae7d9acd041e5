"""Watching a subset of the GPUs: --gpus, CUDA_VISIBLE_DEVICES, and what is said about it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hwdash.errors import UsageError
from hwdash.telemetry.source import make_sampler
from hwdash.telemetry.subset import SubsetSampler, parse_selection, selection_from

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_entries_are_indices_or_uuids_and_all_means_every_gpu() -> None:
    assert parse_selection("0, 2") == ("0", "2")
    assert parse_selection("GPU-7e2f,3") == ("GPU-7e2f", "3")
    assert parse_selection("all") is None
    for bad in ("", "0,,2", "x", "-1"):
        with pytest.raises(UsageError, match="--gpus"):
            parse_selection(bad)


def test_the_flag_wins_over_cuda_visible_devices() -> None:
    environ = {"CUDA_VISIBLE_DEVICES": "1,3"}
    assert selection_from(None, environ) == (("1", "3"), "CUDA_VISIBLE_DEVICES=1,3")
    assert selection_from("0", environ) == (("0",), "--gpus 0")
    assert selection_from("all", environ) == (None, None)
    assert selection_from(None, {"CUDA_VISIBLE_DEVICES": " "}) == (None, None)
    with pytest.raises(UsageError, match="CUDA_VISIBLE_DEVICES"):
        selection_from(None, {"CUDA_VISIBLE_DEVICES": "zero"})


def test_the_subset_keeps_the_chosen_gpus_by_index_or_uuid_prefix() -> None:
    inner = make_sampler("h100x8", clock=lambda: 30.0)
    by_index = SubsetSampler(inner, ("0", "2"), "--gpus 0,2").sample()
    assert [gpu.index for gpu in by_index.gpus] == [0, 2]
    assert by_index.subset == "2 of 8 GPUs (--gpus 0,2)"
    uuid = "GPU-7e2f1a90-4c3b-4d5e-9f60-000000000005"
    by_uuid = SubsetSampler(inner, (uuid.lower(),), "x").sample()
    assert [gpu.uuid for gpu in by_uuid.gpus] == [uuid]
    assert len(SubsetSampler(inner, ("GPU-7e2f",), "x").sample().gpus) == 8  # a shared prefix
    none = SubsetSampler(inner, ("9",), "--gpus 9").sample()
    assert none.gpus == () and none.subset == "no GPU matches --gpus 9 (the machine has 8)"


def test_monitor_json_shows_only_the_subset_and_says_so() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hwdash", "monitor", "--once", "--json", "--fake-nvml", "h100x8"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=SRC, CUDA_VISIBLE_DEVICES="3,1"),
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert [gpu["index"] for gpu in data["gpus"]] == [1, 3]
    assert data["subset"] == "2 of 8 GPUs (CUDA_VISIBLE_DEVICES=3,1)"
