"""A compiled scenario (the validated models dumped to JSON) runs the fake NVML without pydantic,
and the fake answers from it exactly as from the models: the bench's nvitop shim relies on both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hwdash.telemetry.fake_nvml import ManualClock, load_any_scenario, load_scenario, scenario_names
from hwdash.telemetry.fake_scenario import compile_scenario
from hwdash.telemetry.scenario_data import (
    ScenarioError,
    from_compiled,
    load_compiled_scenario,
)
from hwdash.telemetry.snapshot_json import gpu_to_dict
from hwdash.telemetry.source import make_sampler

ROOT = Path(__file__).resolve().parents[2]
SHIM = ROOT / "bench" / "pynvml_shim"
HEAVY = (
    "pydantic",
    "hwdash.telemetry.fake_scenario",
    "hwdash.core.catalog",
    "hwdash.core.estimator",
)


def _compiled(name: str, folder: Path) -> Path:
    path = folder / f"{name}.json"
    path.write_text(json.dumps(compile_scenario(load_scenario(name))), encoding="utf-8")
    return path


WALL_CLOCK_KEYS = {"since", "at", "clocks_event_share"}
"""Readings stamped or windowed by the wall clock (a diagnosis raised, an Xid seen, the share of the
last minute), which differs between two runs of the same scenario."""


def _without_wall_clock(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_wall_clock(v) for k, v in value.items() if k not in WALL_CLOCK_KEYS}
    if isinstance(value, list):
        return [_without_wall_clock(item) for item in value]
    return value


def _gpus_over_time(loaded: Any, name: str) -> list[list[dict[str, Any]]]:
    """Every GPU's JSON over a few scenario seconds (a ramp, a saw-tooth, a lost GPU, an exit)."""
    clock = ManualClock()
    sampler = make_sampler(name, clock=clock, loaded=loaded)
    rounds = []
    try:
        for second in (0.0, 7.5, 31.0, 95.0, 250.0):
            clock.now_s = second
            rounds.append([_without_wall_clock(gpu_to_dict(gpu)) for gpu in sampler.sample().gpus])
    finally:
        sampler.close()
    return rounds


@pytest.mark.parametrize("name", scenario_names())
def test_the_fake_answers_the_same_from_a_compiled_scenario(name: str, tmp_path: Path) -> None:
    validated = load_scenario(name)
    compiled = load_compiled_scenario(_compiled(name, tmp_path))
    assert type(compiled).__module__ == "hwdash.telemetry.scenario_data"
    assert _gpus_over_time(compiled, name) == _gpus_over_time(validated, name)


def test_compiled_objects_carry_every_field_and_the_behaviours() -> None:
    validated = load_scenario("mig")
    compiled = from_compiled(json.loads(json.dumps(compile_scenario(validated)["scenario"])))
    gpu, model = compiled.gpus[0], validated.gpus[0]
    # Generic: each field of the model is there, nested models included, without a list of names.
    assert set(vars(gpu)) == set(type(model).model_fields)
    assert set(vars(gpu.remapped_rows)) == set(type(model.remapped_rows).model_fields)
    assert gpu.mig_current == model.mig_current
    assert sorted(gpu.mig_slots()) == sorted(model.mig_slots())
    process = compiled.gpus[0].processes[0]
    assert process.alive_at(0.0) == validated.gpus[0].processes[0].alive_at(0.0)


def test_a_compiled_scenario_loads_without_pydantic(tmp_path: Path) -> None:
    path = _compiled("health", tmp_path)
    code = (
        "import sys\n"
        "from hwdash.telemetry.fake_nvml import make_fake_pynvml\n"
        f"fake = make_fake_pynvml({str(path)!r})\n"
        "fake.module.nvmlInit()\n"
        "handle = fake.module.nvmlDeviceGetHandleByIndex(0)\n"
        "fake.module.nvmlDeviceGetComputeRunningProcesses(handle)\n"
        f"print(','.join(sorted(m for m in sys.modules if m in {HEAVY!r})))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""


def test_the_nvitop_shim_loads_no_pydantic(tmp_path: Path) -> None:
    """nvitop's process under the bench's shim holds only what nvitop would load on a real box."""
    path = _compiled("a100x8-sawtooth", tmp_path)
    code = (
        "import sys, pynvml\n"
        "pynvml.nvmlInit()\n"
        "handle = pynvml.nvmlDeviceGetHandleByIndex(0)\n"
        "assert pynvml.nvmlDeviceGetMemoryInfo(handle).total > 0\n"
        "pynvml.nvmlDeviceGetComputeRunningProcesses(handle)\n"
        f"print(','.join(sorted(m for m in sys.modules if m in {HEAVY!r})))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(SHIM), HWDASH_FAKE_NVML=str(path))
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert result.stdout.strip() == ""


def test_a_broken_compiled_scenario_is_a_usage_error_naming_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    with pytest.raises(ScenarioError, match=r"missing\.json"):
        load_any_scenario(missing)
    broken = tmp_path / "broken.json"
    broken.write_text("{", encoding="utf-8")
    with pytest.raises(ScenarioError, match=r"broken.json: not valid JSON"):
        load_any_scenario(broken)
    other = tmp_path / "other.json"
    other.write_text('{"gpus": []}', encoding="utf-8")
    with pytest.raises(ScenarioError, match=r"other.json: not a compiled fake NVML scenario"):
        load_any_scenario(other)
