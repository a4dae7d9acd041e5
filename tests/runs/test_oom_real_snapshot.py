"""``hwdash oom`` on a real snapshot from a real GPU (tests/data/oom/README.md), checked against the
file's own numbers (read here with the standard unpickler: the fixture is ours) and PyTorch's
``torch.cuda._memory_viz stats`` output for the same file."""

from __future__ import annotations

import gzip
import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest

from hwdash.cli import main
from hwdash.runs.oom_analysis import analyse
from hwdash.runs.oom_snapshot import read_snapshot

DATA = Path(__file__).resolve().parents[1] / "data" / "oom"
VIZ = Path(__file__).resolve().parents[2] / "bench/data/device_h200/oom/memory_viz_stats.txt"
GIB = 2**30


@pytest.fixture(scope="module")
def snapshot_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("oom") / "h200-llama-oom.pickle"
    with gzip.open(DATA / "h200-llama-oom.pickle.gz") as source, path.open("wb") as target:
        shutil.copyfileobj(source, target)
    return path


def _raw(path: Path) -> Any:
    with path.open("rb") as handle:
        return pickle.load(handle)  # our own fixture, never a user's file


def test_the_totals_are_the_files_own_and_pytorchs(snapshot_path: Path) -> None:
    raw = _raw(snapshot_path)
    segments = [s for s in raw["segments"] if s["device"] == 0]
    reserved = sum(s["total_size"] for s in segments)
    allocated = sum(
        b["size"] for s in segments for b in s["blocks"] if b["state"] == "active_allocated"
    )
    report = analyse(read_snapshot(snapshot_path))
    assert report.device == 0
    assert report.segments == len(segments) == 117
    assert report.reserved_bytes == reserved
    assert report.allocated_bytes == allocated
    # PyTorch's own summary of the same file (rounded as it prints them).
    viz = VIZ.read_text()
    assert "segments: 117" in viz
    assert f"total_reserved: {reserved / GIB:.1f}GiB" in viz
    assert f"total_allocated: {allocated / GIB:.1f}GiB" in viz
    # The failed request: "Tried to allocate 1.95 GiB" in PyTorch's error message.
    oom = [e for e in raw["device_traces"][0] if e["action"] == "oom"][-1]
    assert report.oom is not None
    assert report.oom.requested_bytes == oom["size"] == 2_097_152_000
    assert report.oom.free_bytes == oom["device_free"]


def test_the_categories_and_the_sites(snapshot_path: Path) -> None:
    report = analyse(read_snapshot(snapshot_path))
    assert sum(report.categories.values()) == report.allocated_bytes
    # Turned on after the model and AdamW's states existed: those blocks have no stack.
    assert report.categories["parameters"] == 0 and report.categories["optimizer"] == 0
    assert report.categories["activations"] > 0.8 * report.allocated_bytes
    # transformers 5.17 keeps a DynamicCache in a training forward (use_cache on): it is found.
    assert report.categories["kv_cache"] == 8 * 16 * 2**20 * 1  # 8 layers x K and V of 8 MiB
    top = report.sites[0]
    assert top.category == "activations"
    assert top.frames[0].filename.endswith("bench/oom_gpu_check.py")  # the user's frame first


def test_against_its_plan(
    snapshot_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "plan": {
                    "model": str(DATA / "h200-llama-oom.config.json"),
                    "method": "full",
                    "batch": 16,
                    "seq": 1024,
                    "flavors": ["h200"],
                }
            }
        )
    )
    assert main(["oom", str(snapshot_path), "--json", "--plan", str(plan)]) == 0
    document = json.loads(capsys.readouterr().out)
    against = document["plan"]
    assert against["name"] == "plan.json"
    assert set(against["categories"]) == {
        "parameters", "gradients", "optimizer", "activations", "kv_cache"
    }  # fmt: skip
    assert (
        against["categories"]["activations"]["measured_bytes"]
        == document["categories"]["activations"]
    )
    assert against["measured_need_bytes"] == (
        document["allocated_bytes"] + document["oom"]["requested_bytes"]
    )
    assert against["factor"] == pytest.approx(
        against["measured_need_bytes"] / against["planned_need_bytes"]
    )
    assert "without a Python stack" in against["unknown_note"]
    assert against["fit"]["target"] == "h200"


def test_the_biggest_surprise_is_named() -> None:
    from hwdash.core.plan import Plan
    from hwdash.runs.oom_plan import _surprise

    plan = Plan(model="qwen2.5-0.5b", batch=4, seq=2048)
    rows = (
        ("parameters", 1 * GIB, 1 * GIB),
        ("activations", 21 * GIB // 2, 5 * GIB),  # 2.1x
        ("kv_cache", GIB, 0),  # none expected, but a smaller excess
    )
    words = _surprise(rows, plan)
    assert words is not None and words.startswith("activations 2.1x the plan")
    assert "batch 4 x sequence 2048" in words
    assert _surprise((("parameters", GIB, GIB),), plan) is None
    # Under the floor: 200 MiB over a 100 MiB plan is no surprise worth naming.
    assert _surprise((("optimizer", 300 * 2**20, 100 * 2**20),), plan) is None
    assert (
        _surprise((("kv_cache", GIB, 0),), plan) == "KV cache 1.0 GiB live, the plan expected none"
    )
