"""The run against its plan, live: the demo scenario's probed ranks through the monitor's own
sampler and JSON, every number checked against arithmetic done here by hand."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from hwdash.runs.watch import RunWatcher
from hwdash.telemetry.snapshot_json import RUN_KEYS, snapshot_to_dict
from hwdash.telemetry.source import make_sampler

MIB = 2**20
PLAN_FILE = (
    Path(__file__).resolve().parents[2] / "src/hwdash/telemetry/scenarios/a100x4-training.plan.json"
)

# llama-3.1-8b (catalog): hidden 4096, MLP 14336, 32 layers, 32 query / 8 KV heads of 128, vocab
# 128256. Matmul parameters a token meets: per layer q and o (4096x4096 each), k and v
# (4096x1024 each), gate, up and down (4096x14336 each); then the LM head (4096x128256).
N_MATMUL = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336) + 4096 * 128256
A100_BF16_TFLOPS = 312  # NVIDIA A100 datasheet, dense BF16 tensor core


def _runs_at(second: float, **watcher: Any) -> dict[int, dict[str, Any]]:
    """``processes[].run`` of the monitor's JSON at scenario second ``second``, by GPU."""
    sampler = RunWatcher(
        make_sampler("a100x4-training", clock=lambda: second), record=None, **watcher
    )
    document = json.loads(json.dumps(snapshot_to_dict(sampler.sample())))
    return {
        gpu["index"]: process["run"]
        for gpu in document["gpus"]
        for process in gpu["processes"]
        if process["run"] is not None
    }


def _area(points: list[tuple[float, float]], start: float, end: float) -> float:
    """The integral of a piecewise-linear power series (watts) from ``start`` to ``end``."""

    def at(t: float) -> float:
        for (t0, p0), (t1, p1) in itertools.pairwise(points):
            if t0 <= t <= t1:
                return p0 + (p1 - p0) * (t - t0) / (t1 - t0)
        raise AssertionError(t)

    cuts = sorted({start, end, *(t for t, _ in points if start < t < end)})
    return sum((at(a) + at(b)) / 2 * (b - a) for a, b in itertools.pairwise(cuts))


def test_the_monitor_json_holds_each_run_against_its_plan_as_computed_by_hand() -> None:
    runs = _runs_at(60.0)
    assert set(runs) == {0, 1}  # ranks 0 and 1 run the probe; 2 and 3 do not
    run = runs[0]
    assert list(run)[: len(RUN_KEYS)] == list(RUN_KEYS)
    # 0.3 steps/s from CUDA's start at 3 s: 17 whole steps by 60 s, 32768 tokens each.
    assert run["step"] == 17
    assert run["tokens"] == 17 * 32768
    assert run["tokens_per_s"] == pytest.approx(0.3 * 32768, rel=0.01)
    # MFU: 6N FLOPs a token (full training), over 4 GPUs of 312 TFLOPS.
    mfu = 0.3 * 32768 * 6 * N_MATMUL / (4 * A100_BF16_TFLOPS * 1e12)
    assert run["mfu"] == pytest.approx(mfu, rel=0.01)
    # The plan's 500M tokens at the current rate.
    assert run["eta_s"] == pytest.approx((500e6 - 17 * 32768) / (0.3 * 32768), rel=0.01)
    # a100x4 at $10.00/h, the run on all 4 of its GPUs: 60 s so far and the ETA to go.
    assert run["cost_usd"] == pytest.approx(10.0 * 60 / 3600, rel=0.01)
    assert run["cost_to_go_usd"] == pytest.approx(10.0 * run["eta_s"] / 3600, rel=0.01)
    # GPU 0's scripted power [[0, 62], [10, 355], [120, 372]] W from CUDA's start (3 s) to 60 s.
    joules = _area([(0, 62), (10, 355), (120, 372)], 3.0, 60.0)
    assert run["energy_kwh"] == pytest.approx(joules / 3.6e6, rel=0.01)
    # Reserved peak: the scenario's rank 0 pool at 60 s, 75488 MiB (it only climbs).
    assert run["measured_peak_bytes"] == 75488 * MIB
    planned = run["planned_peak_bytes"]
    # what lies outside the allocator left out: the CUDA context and kernels (the default row,
    # 766.8125 MiB: the A100 has no row of its own) and NCCL: its device code (174 MiB), the
    # 4 NVLink GPUs' data-parallel communicator (390 MiB) and its ring (16 channels x (LL 512 KiB
    # + LL128 4,915,200 B + Simple 4 MiB)), both measured or cited in catalog/software.toml
    outside = 804_061_184 + 182_452_224 + 408_944_640 + 16 * (524_288 + 4_915_200 + 4 * MIB)
    assert planned == run["planned_total_bytes"] - outside
    assert run["peak_error"] == pytest.approx(75488 * MIB / planned - 1, rel=0.01)
    assert run["plan"] == str(PLAN_FILE)
    assert run["plan_error"] is None


def test_a_price_given_charges_the_run_its_share_of_the_machine() -> None:
    # --price 8: the machine's four GPUs; the job's world size is 4, so it pays the whole price.
    run = _runs_at(60.0, price=8.0)[0]
    assert run["cost_usd"] == pytest.approx(8.0 * 60 / 3600, rel=0.01)
    assert run["price_per_hour"] == 8.0


def test_a_plan_that_cannot_be_read_is_said_and_the_rest_still_shown(tmp_path: Path) -> None:
    missing = tmp_path / "gone.json"
    sampler = RunWatcher(make_sampler("a100x4-training", clock=lambda: 60.0), record=None)
    sampler.attach(31337, str(missing))
    processes = {p.pid: p for gpu in sampler.sample().gpus for p in gpu.processes}
    run = processes[31337].run
    assert run is not None
    assert run.plan == str(missing)
    assert run.plan_error is not None and "gone.json" in run.plan_error
    assert run.mfu is None and run.planned_peak_bytes is None
    assert run.tokens_per_s == pytest.approx(0.3 * 32768)
    # The other rank keeps the plan it names.
    assert processes[31338].run is not None and processes[31338].run.plan_error is None


def test_before_cuda_starts_there_is_no_run_yet() -> None:
    assert _runs_at(1.0) == {}
