"""Watching a subset of the GPUs: --gpus, CUDA_VISIBLE_DEVICES, and what is said about it."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hwdash.cli import build_parser
from hwdash.commands import dashboard
from hwdash.errors import UsageError
from hwdash.telemetry.source import make_sampler
from hwdash.telemetry.subset import SubsetSampler, parse_selection, selection_from

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_entries_are_indices_or_uuids_and_all_means_every_gpu() -> None:
    assert parse_selection("0, 2") == ("0", "2")
    assert parse_selection("GPU-7e2f,3") == ("GPU-7e2f", "3")
    assert parse_selection("all") is None
    # "²" and "٣" are digits to str.isdigit but not to int(): refused, never a traceback
    for bad in ("", "0,,2", "x", "-1", "²", "0,٣"):
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
    unique = SubsetSampler(inner, ("GPU-7e2f1a90-4c3b-4d5e-9f60-000000000003",), "x").sample()
    assert [gpu.index for gpu in unique.gpus] == [3]


def test_an_entry_that_names_no_gpu_or_several_is_refused_on_the_first_sample() -> None:
    """Issue 23: `--gpus 9` on 8 GPUs and a UUID prefix shared by every GPU were accepted."""
    inner = make_sampler("h100x8", clock=lambda: 30.0)
    with pytest.raises(UsageError, match=r"^--gpus: there is no GPU 9 \(GPUs here: 0-7\)"):
        SubsetSampler(inner, ("0", "9"), "--gpus 0,9").sample()
    with pytest.raises(
        UsageError, match=r"^--gpus: GPU-7e2f matches 8 GPUs \(0, 1, 2, .*\): give more of its"
    ):
        SubsetSampler(inner, ("GPU-7e2f",), "--gpus GPU-7e2f").sample()
    with pytest.raises(
        UsageError, match=r"^CUDA_VISIBLE_DEVICES: no GPU's UUID starts with GPU-ff"
    ):
        SubsetSampler(inner, ("GPU-ff",), "CUDA_VISIBLE_DEVICES=GPU-ff").sample()
    # Checked once, on the first sample that lists GPUs: a GPU lost later is not a usage error.
    checked = SubsetSampler(inner, ("3",), "--gpus 3")
    assert [gpu.index for gpu in checked.sample().gpus] == [3]


def test_monitor_refuses_a_gpu_that_is_not_there_with_exit_2() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hwdash",
            "monitor",
            "--once",
            "--fake-nvml",
            "h100x8",
            "--gpus",
            "8",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=SRC),
    )
    assert done.returncode == 2, done.stdout
    assert done.stderr.strip().splitlines() == [
        "hwdash monitor: error: --gpus: there is no GPU 8 (GPUs here: 0-7)"
    ]
    assert done.stdout == ""


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


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("tab", [[], ["--tab", "monitor"]], ids=["chosen", "--tab monitor"])
def test_the_dashboard_refuses_it_before_starting(
    tab: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("XDG_STATE_HOME", "XDG_DATA_HOME", "XDG_CONFIG_HOME"):
        monkeypatch.setenv(name, str(tmp_path / name))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    argv = ["--fake-nvml", "h100x8", "--gpus", "1,GPU-7e2f", *tab]
    args = build_parser("dashboard").parse_args(argv)
    args.argv = argv
    with pytest.raises(UsageError, match=r"^--gpus: GPU-7e2f matches 8 GPUs"):
        dashboard.build_app(args, stdout=_Terminal(), initial_tab=None)
