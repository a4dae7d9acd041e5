"""Issue 26 end to end: a stand-in training loop (only the probe's calls) on a fake GPU, watched by
the monitor's own sampler, recorded in the ledger when it exits, and fed back to ``hwdash plan
--calibrated``. The expected numbers are computed here by hand from the loop's own clock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from hwdash.cli import main
from hwdash.runs.watch import RunWatcher
from hwdash.telemetry.fake_nvml import make_fake_pynvml
from hwdash.telemetry.host_sampler import HostSampler, PsutilProcessTable
from hwdash.telemetry.nvml_sampler import NvmlSampler
from hwdash.telemetry.probes import ProbeDirectory, ProbeJoiner
from hwdash.telemetry.snapshot_json import snapshot_to_dict
from hwdash.telemetry.system_sampler import SystemSampler

ROOT = Path(__file__).resolve().parents[2]
UUID = "5a1c2e0b-7d3f-4c21-9a6e-00000000e2e0"
GIB = 1024**3
PLAN_FLAGS = [
    "--model", "qwen2.5-0.5b", "--method", "full", "--batch", "4", "--seq", "1024",
    "--tokens", "2000000", "--flavor", "a100-large",
]  # fmt: skip
STEPS, TOKENS_PER_STEP, STEPS_PER_S = 60, 4096, 20.0

# qwen2.5-0.5b (catalog): hidden 896, MLP 4864, 24 layers, 14 query / 2 KV heads of 64, vocab
# 151936. Matmul parameters a token meets: q and o (896x896), k and v (896x128), gate, up and down
# (896x4864) per layer, and the LM head (896x151936; tied to the embedding, still a matmul).
N_MATMUL = 24 * (2 * 896 * 896 + 2 * 896 * 128 + 3 * 896 * 4864) + 896 * 151936
A100_BF16_TFLOPS = 312  # the A100 datasheet's dense BF16 rate (catalog a100-80gb)
A100_LARGE_PRICE = 2.50  # catalog flavor a100-large, $/hour, one A100 80GB
A100_DEFAULT_MFU = 0.4  # catalog a100-80gb default_mfu

SCENARIO = """
description = "one fake A100 for the end-to-end run test"
[[gpus]]
name = "NVIDIA A100-SXM4-80GB"
uuid = "GPU-{uuid}"
memory_total_mib = 81920
power_w = 300
power_limit_w = 400
{process}
"""
PROCESS = """
[[gpus.processes]]
pid = {pid}
name = "python"
used_mib = 32000
"""

CHILD = """
import json, sys, time
sys.path.insert(0, {tests!r})
from stand_in_torch import GIB, Device, StandInCuda, StandInTorch
from hwdash.telemetry.fake_nvml import make_fake_pynvml
sys.modules["pynvml"] = make_fake_pynvml({scenario!r}).module  # NVML's energy counter, faked
cuda = StandInCuda(devices=[Device({uuid!r}, allocated=28 * GIB, reserved=30 * GIB,
                                   max_allocated=29 * GIB, max_reserved=31 * GIB)],
                   initialized=True)
sys.modules["torch"] = StandInTorch(cuda)
import hwdash.probe
hwdash.probe.start(0.2, directory={probes!r}, plan={plan!r})
time.sleep(0.5)  # the probe sees the device (its energy baseline) before the first step
stamps = []
start = time.monotonic()
for index in range({steps}):
    time.sleep(max(0.0, start + index / {rate} - time.monotonic()))
    hwdash.probe.step(tokens={tokens})
    stamps.append(time.time())
print(json.dumps(stamps), flush=True)
time.sleep({linger})
"""


def _plan_file(folder: Path) -> Path:
    from hwdash.core.catalog import load_catalog
    from hwdash.core.plan import Plan
    from hwdash.core.planning.fit import evaluate_plan

    plan = Plan(
        model="qwen2.5-0.5b",
        method="full",
        batch=4,
        seq=1024,
        tokens=2_000_000,
        flavors=("a100-large",),
    )
    evaluate_plan(plan, load_catalog())  # a plan the estimator accepts
    path = folder / "qwen-full.plan.json"
    path.write_text(json.dumps({"plan": plan.model_dump(mode="json")}))
    return path


def _cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    ledger = tmp_path / "state" / "runs.jsonl"
    monkeypatch.setenv("HWDASH_RUNS", str(ledger))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("HWDASH_PRICE", raising=False)
    probes = tmp_path / "run" / "probes"
    probes.parent.mkdir(mode=0o700)
    gpu_only = tmp_path / "gpu.toml"
    gpu_only.write_text(SCENARIO.format(uuid=UUID, process=""))
    return {"ledger": ledger, "probes": probes, "gpu_only": gpu_only, "tmp": tmp_path}


def test_a_probed_loop_is_watched_recorded_and_calibrates_the_next_plan(
    world: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    tmp = world["tmp"]
    plan = _plan_file(tmp)
    code = textwrap.dedent(CHILD).format(
        tests=str(ROOT / "tests" / "probe"),
        scenario=str(world["gpu_only"]),
        uuid=UUID,
        probes=str(world["probes"]),
        plan=str(plan),
        steps=STEPS,
        rate=STEPS_PER_S,
        tokens=TOKENS_PER_STEP,
        linger=0.6,
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    # The monitor: the same fake GPU with the child's PID on it, the real probe folder.
    with_pid = tmp / "monitor.toml"
    with_pid.write_text(SCENARIO.format(uuid=UUID, process=PROCESS.format(pid=child.pid)))
    fake = make_fake_pynvml(with_pid)
    sampler = RunWatcher(
        SystemSampler(
            NvmlSampler(fake.module),
            HostSampler(PsutilProcessTable()),
            probes=ProbeJoiner(ProbeDirectory(world["probes"])),
        ),
        record=None,
    )
    try:
        run = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and child.poll() is None:
            document = snapshot_to_dict(sampler.sample())
            rows = [p for g in document["gpus"] for p in g["processes"] if p["run"]]
            if rows and rows[0]["run"]["step"] == STEPS:
                run = rows[0]["run"]
                break
            time.sleep(0.1)
        stdout, stderr = child.communicate(timeout=60)
    finally:
        sampler.close()
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, stderr
    stamps = json.loads(stdout.strip().splitlines()[-1])
    assert run is not None, "the monitor never saw the run's last step"

    # By hand, from the loop's own clock: tokens after the first step over the time they took.
    rate = (STEPS - 1) * TOKENS_PER_STEP / (stamps[-1] - stamps[0])
    assert run["tokens"] == STEPS * TOKENS_PER_STEP
    assert run["tokens_per_s"] == pytest.approx(rate, rel=0.01)
    mfu = rate * 6 * N_MATMUL / (A100_BF16_TFLOPS * 1e12)
    assert run["mfu"] == pytest.approx(mfu, rel=0.01)
    assert run["eta_s"] == pytest.approx((2_000_000 - STEPS * TOKENS_PER_STEP) / rate, rel=0.01)
    assert run["cost_usd"] == pytest.approx(A100_LARGE_PRICE * run["elapsed_s"] / 3600, rel=0.01)
    assert run["cost_to_go_usd"] == pytest.approx(A100_LARGE_PRICE * run["eta_s"] / 3600, rel=0.01)
    # 300 W the whole time, from the probe's first sight of the device: at most its elapsed time.
    assert 0 < run["energy_kwh"] <= 300 * run["elapsed_s"] / 3.6e6 * 1.01
    assert run["measured_peak_bytes"] == 31 * GIB
    assert run["peak_error"] == pytest.approx(31 * GIB / run["planned_peak_bytes"] - 1, rel=0.01)
    assert run["measured_nvml_peak_bytes"] == 32000 * 2**20

    # The process ended: its record is in the ledger, as `hwdash runs --json` lists it.
    records = _cli_json(capsys, "runs", "--json")
    assert [r["pid"] for r in records] == [child.pid]
    record = records[0]
    assert record["exit"] == "normal" and record["plan"] == str(plan)
    assert record["model"] == "qwen2.5-0.5b" and record["method"] == "full"
    assert record["tokens"] == STEPS * TOKENS_PER_STEP and record["steps"] == STEPS
    assert record["tokens_per_s"] == pytest.approx(rate, rel=0.01)
    assert record["mfu"] == pytest.approx(mfu, rel=0.01)
    assert record["gpus"][0]["uuid"] == f"GPU-{UUID}"
    assert record["measured_peak_bytes"] == 31 * GIB
    assert record["cost_usd"] == pytest.approx(
        A100_LARGE_PRICE * record["duration_s"] / 3600, rel=0.01
    )
    assert record["energy_kwh"] > 0

    # Fed back: hours scale by the plan's assumed MFU over the measured one.
    plain = _cli_json(capsys, "plan", *PLAN_FLAGS, "--json")
    calibrated = _cli_json(capsys, "plan", *PLAN_FLAGS, "--json", "--calibrated")
    assert plain["measured_here"]["runs"] == 1
    hours = {d["id"]: d["hours"] for d in plain["flavors"]}["a100-large"]
    hours_now = {d["id"]: d["hours"] for d in calibrated["flavors"]}["a100-large"]
    assert hours_now / hours == pytest.approx(A100_DEFAULT_MFU / record["mfu"], rel=0.01)
    assert calibrated["calibrated"] is True
