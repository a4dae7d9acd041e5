"""What filled the device, from the scripted run of known sizes: to the byte."""

from __future__ import annotations

from pathlib import Path

import pytest
from oom_fixtures import EXPECTED, KIB, MIB, SITE, USER, ScriptedRun, training_oom, write

from hwdash.errors import UsageError
from hwdash.runs.oom_analysis import analyse, categorize, fold, is_library
from hwdash.runs.oom_snapshot import Frame, read_snapshot, to_snapshot


@pytest.fixture
def report_json(tmp_path: Path) -> dict:
    path = write(tmp_path / "s.pickle", training_oom().snapshot())
    return analyse(read_snapshot(path)).to_json()


def test_totals_failed_request_and_fragmentation_to_the_byte(report_json: dict) -> None:
    assert report_json["device"] == 0
    assert report_json["total_bytes"] is None  # a snapshot does not record the device's total
    assert report_json["reserved_bytes"] == EXPECTED["reserved"]
    assert report_json["allocated_bytes"] == sum(EXPECTED["categories"].values())
    assert report_json["oom"] == {
        "requested_bytes": EXPECTED["request"],
        "free_bytes": EXPECTED["device_free"],
    }
    assert report_json["fragmentation_bytes"] == EXPECTED["fragmentation"]
    assert report_json["plan"] is None


def test_categories_to_the_byte(report_json: dict) -> None:
    assert report_json["categories"] == EXPECTED["categories"]


def test_top_sites_grouped_by_stack_user_frames_first(report_json: dict) -> None:
    sites = report_json["sites"]
    summary = [(s["category"], s["bytes"], s["count"]) for s in sites]
    assert summary == [
        ("parameters", 1024 * MIB, 4),
        ("activations", 512 * MIB, 4),
        ("optimizer", 384 * MIB, 2),
        ("gradients", 128 * MIB, 2),
        ("kv_cache", 64 * MIB, 1),
        ("unknown", 3 * 512 * KIB, 3),
        ("unknown", 256 * KIB, 1),
    ]
    forward = [(f["filename"], f["line"], f["name"]) for f in sites[1]["frames"]]
    assert forward == [
        (f"{USER}/model.py", 41, "forward"),
        (f"{USER}/train.py", 55, "train_step"),
        (f"{USER}/train.py", 80, "main"),
        # folded: where the tensor was made, and the frame that made it an activation
        (f"{SITE}/torch/nn/functional.py", 2890, "linear"),
        (f"{SITE}/torch/nn/modules/linear.py", 125, "forward"),
    ]
    assert sites[-1]["frames"] == []  # no Python stack
    assert set(sites[0]) == {"frames", "bytes", "count", "category"}


def test_the_json_has_the_issue_keys(report_json: dict) -> None:
    assert list(report_json) == [
        "device",
        "total_bytes",
        "reserved_bytes",
        "allocated_bytes",
        "oom",
        "fragmentation_bytes",
        "categories",
        "sites",
        "largest_blocks",
        "plan",
    ]
    assert list(report_json["categories"]) == [
        "parameters",
        "gradients",
        "optimizer",
        "activations",
        "kv_cache",
        "unknown",
    ]


def test_largest_blocks_and_top(tmp_path: Path) -> None:
    snapshot = to_snapshot(training_oom().snapshot())
    report = analyse(snapshot, top=3)
    assert len(report.sites) == 3
    assert [(b.bytes, b.category) for b in report.largest_blocks] == [(256 * MIB, "parameters")] * 3
    assert report.live_blocks == 4 + 2 + 4 + 2 + 1 + 3 + 1
    assert report.awaiting_free_bytes == EXPECTED["awaiting_free"]


def test_device_choice() -> None:
    snapshot = to_snapshot(training_oom().snapshot())
    other = analyse(snapshot, device=1)
    assert other.device == 1 and other.oom is None and other.fragmentation_bytes is None
    assert other.reserved_bytes == 2 * MIB and other.categories["unknown"] == MIB
    with pytest.raises(UsageError, match=r"--device: the snapshot has no device 5 \(it has 0, 1\)"):
        analyse(snapshot, device=5)


def test_without_an_oom_the_snapshot_moment_and_the_fullest_device() -> None:
    run = ScriptedRun()
    run.segment(2 * MIB, kind="small")
    run.alloc(MIB, "batch")
    run.segment(64 * MIB, device=1)
    run.alloc(32 * MIB, "forward", device=1)
    report = analyse(to_snapshot(run.snapshot()))
    assert report.device == 1 and report.oom is None
    assert report.to_json()["oom"] is None and report.to_json()["fragmentation_bytes"] is None
    assert report.categories["activations"] == 32 * MIB


def test_fragmentation_counts_a_segment_that_could_serve_as_usable() -> None:
    run = ScriptedRun()
    run.segment(100 * MIB)
    first = run.alloc(40 * MIB, "forward")
    run.alloc(10 * MIB, "forward")
    run.free(first)  # a 40 MiB hole and a 50 MiB tail
    run.segment(100 * MIB, stream=7)  # another stream: its 100 MiB cannot serve stream 0
    run.oom(45 * MIB, 0)
    report = analyse(to_snapshot(run.snapshot()))
    assert report.fragmentation_bytes == 100 * MIB  # the first segment's 50 MiB run could serve
    run.oom(60 * MIB, 0)
    assert analyse(to_snapshot(run.snapshot())).fragmentation_bytes == 190 * MIB


def _frames(*spec: tuple[str, str]) -> tuple[Frame, ...]:
    return tuple(Frame(filename, 1, name) for filename, name in spec)


@pytest.mark.parametrize(
    ("frames", "category"),
    [
        (_frames((f"{SITE}/transformers/cache_utils.py", "update")), "kv_cache"),
        (_frames((f"{USER}/gen.py", "extend_past_key_values")), "kv_cache"),
        (_frames((f"{SITE}/torch/optim/adam.py", "_single_tensor_adam")), "optimizer"),
        (_frames((f"{SITE}/accelerate/optimizer.py", "step")), "optimizer"),
        (_frames((f"{SITE}/torch/_tensor.py", "backward")), "gradients"),
        (_frames(("??", "torch::autograd::Engine::thread_main")), "gradients"),
        (_frames((f"{USER}/fn.py", "backward")), "gradients"),
        (_frames((f"{SITE}/transformers/modeling_utils.py", "from_pretrained")), "parameters"),
        (_frames((f"{SITE}/torch/nn/modules/linear.py", "__init__")), "parameters"),
        (_frames((f"{SITE}/torch/nn/modules/module.py", "to")), "parameters"),
        (_frames((f"{USER}/model.py", "forward")), "activations"),
        (_frames((f"{USER}/model.py", "__init__")), "unknown"),
        ((), "unknown"),
        # the first rule that any frame matches wins: a KV cache update inside a forward
        (
            _frames(
                (f"{SITE}/transformers/cache_utils.py", "update"),
                (f"{SITE}/torch/nn/modules/module.py", "_call_impl"),
            ),
            "kv_cache",
        ),
    ],
)
def test_category_rules(frames: tuple[Frame, ...], category: str) -> None:
    assert categorize(frames)[0] == category


def test_library_frames() -> None:
    assert is_library(Frame(f"{SITE}/torch/nn/functional.py", 1, "linear"))
    assert is_library(Frame("/usr/lib/python3.11/contextlib.py", 1, "inner"))
    assert is_library(Frame("/usr/lib/python3/dist-packages/numpy/core.py", 1, "f"))
    assert is_library(Frame("<frozen runpy>", 1, "_run_code"))
    assert is_library(Frame("/pytorch/c10/cuda/CUDACachingAllocator.cpp", 1, "malloc"))
    assert not is_library(Frame(f"{USER}/train.py", 1, "main"))
    assert not is_library(Frame("<stdin>", 1, "<module>"))


def test_fold_keeps_user_frames_and_two_library_frames() -> None:
    frames = _frames(
        (f"{SITE}/torch/nn/functional.py", "linear"),
        (f"{SITE}/peft/tuners/lora/layer.py", "forward"),
        (f"{SITE}/torch/nn/modules/module.py", "_call_impl"),
        (f"{USER}/train.py", "main"),
    )
    category, by = categorize(frames)
    assert category == "activations" and by == frames[1]
    assert fold(frames, by) == (frames[3], frames[0], frames[1])


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"device": 0, "device_limit_bytes": 80 * 2**30, "device_free_bytes": MIB}, 80 * 2**30),
        ({"device": 1, "device_limit_bytes": 80 * 2**30}, None),  # another device's limit
        ({"device": 0, "device_limit_bytes": True}, None),
        ({"device": 0, "device_limit_bytes": -5}, None),
        ({"device": "0", "device_limit_bytes": 5}, None),
        ("not a dict", None),
    ],
)
def test_the_probe_s_device_limit_is_the_total_when_it_is_believable(
    tmp_path: Path, extra: object, expected: int | None
) -> None:
    document = {**training_oom().snapshot(), "hwdash": extra}
    report = analyse(read_snapshot(write(tmp_path / "s.pickle", document)))
    assert report.total_bytes == expected
    assert report.to_json()["total_bytes"] == expected
