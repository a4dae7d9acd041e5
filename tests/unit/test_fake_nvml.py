"""The fake pynvml: scenarios load, series interpolate, and it raises NVML's real error classes."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from hwdash.core.units import MIB
from hwdash.errors import UsageError
from hwdash.telemetry.fake_nvml import (
    FakeDeviceHandle,
    ManualClock,
    Scenario,
    ScenarioError,
    load_scenario,
    make_fake_pynvml,
    scenario_names,
    scenario_path,
    series_value,
)

REQUIRED_SCENARIOS = {
    "a100x4-training",
    "h100x8",
    "mig",
    "gpu-lost",
    "consumer-unsupported",
    "no-driver",
}


def test_the_packaged_scenarios_exist_and_load() -> None:
    assert set(scenario_names()) >= REQUIRED_SCENARIOS
    for name in scenario_names():
        scenario = load_scenario(name)
        assert scenario.description, name


def test_packaged_scenarios_have_the_promised_shapes() -> None:
    assert len(load_scenario("h100x8").gpus) == 8
    assert len(load_scenario("a100x4-training").gpus) == 4
    assert any(gpu.mig for gpu in load_scenario("mig").gpus)
    assert any(gpu.lost_after_s is not None for gpu in load_scenario("gpu-lost").gpus)
    assert load_scenario("no-driver").failure == "no-library"
    consumer = load_scenario("consumer-unsupported").gpus[0]
    assert {"power", "utilization"} <= set(consumer.unsupported)


def test_demo_scenario_climbs_past_90_percent_within_about_a_minute() -> None:
    fake = make_fake_pynvml("a100x4-training", clock=ManualClock(60.0))
    fake.module.nvmlInit()
    for index in range(4):
        info = fake.module.nvmlDeviceGetMemoryInfo(
            fake.module.nvmlDeviceGetHandleByIndex(index), version=pynvml.nvmlMemory_v2
        )
        assert 1 - info.free / info.total > 0.90


def test_series_interpolate_linearly_and_hold_their_ends() -> None:
    series = [(0.0, 100.0), (10.0, 200.0), (20.0, 0.0)]
    assert series_value(series, -5) == 100
    assert series_value(series, 5) == 150
    assert series_value(series, 15) == 100
    assert series_value(series, 99) == 0
    assert series_value(42.0, 1234) == 42


def test_scenario_path_resolves_names_and_files(tmp_path: Path) -> None:
    assert scenario_path("h100x8").name == "h100x8.toml"
    own = tmp_path / "box.toml"
    own.write_text('[[gpus]]\nname = "X"\nmemory_total_mib = 1024\n')
    assert scenario_path(str(own)) == own
    with pytest.raises(ScenarioError, match=r"packaged scenarios: .*h100x8"):
        scenario_path("no-such-box")
    with pytest.raises(ScenarioError, match="does not exist"):
        scenario_path(str(tmp_path / "missing.toml"))


def test_scenario_errors_are_usage_errors_naming_file_and_field(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("[[gpus]\nname = ")
    with pytest.raises(UsageError, match=r"broken\.toml: not valid TOML"):
        load_scenario(str(broken))
    extra = tmp_path / "extra.toml"
    extra.write_text('[[gpus]]\nname = "X"\nmemory_total_mib = 1024\ncolour = "green"\n')
    with pytest.raises(ScenarioError, match=r"extra.toml: gpus\.0\.colour"):
        load_scenario(str(extra))
    unordered = tmp_path / "unordered.toml"
    unordered.write_text(
        '[[gpus]]\nname = "X"\nmemory_total_mib = 1024\nused_mib = [[10, 1], [0, 2]]\n'
    )
    with pytest.raises(ScenarioError, match="time order"):
        load_scenario(str(unordered))
    bad_failure = tmp_path / "bad_failure.toml"
    bad_failure.write_text('failure = "on-fire"\n')
    with pytest.raises(ScenarioError, match="failure"):
        load_scenario(str(bad_failure))


def _one_gpu(**gpu: object) -> Scenario:
    base: dict[str, object] = {"name": "Test GPU", "memory_total_mib": 1000}
    base.update(gpu)
    return Scenario.model_validate({"gpus": [base]})


def test_the_fake_raises_the_real_pynvml_error_classes() -> None:
    fake = make_fake_pynvml(_one_gpu(unsupported=["power"], lost_after_s=10), ManualClock())
    nvml = fake.module
    assert nvml.NVMLError is pynvml.NVMLError
    assert nvml.NVMLLibraryMismatchError is pynvml.NVMLLibraryMismatchError
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetPowerUsage(handle)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(3)


def test_lost_gpu_raises_gpu_is_lost_from_its_time_on() -> None:
    clock = ManualClock()
    fake = make_fake_pynvml(_one_gpu(lost_after_s=10), clock)
    fake.module.nvmlInit()
    handle = fake.module.nvmlDeviceGetHandleByIndex(0)
    assert fake.module.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU) == 40
    clock.advance(10)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.module.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)


@pytest.mark.parametrize(
    ("failure", "error"),
    [
        ("no-library", pynvml.NVMLError_LibraryNotFound),
        ("driver-not-loaded", pynvml.NVMLError_DriverNotLoaded),
        ("library-mismatch", pynvml.NVMLError_LibRmVersionMismatch),
    ],
)
def test_machine_wide_failures_fail_init(failure: str, error: type[Exception]) -> None:
    fake = make_fake_pynvml(Scenario.model_validate({"failure": failure}))
    with pytest.raises(error):
        fake.module.nvmlInit()


def test_memory_info_v1_counts_reserved_as_used_and_v2_separates_it() -> None:
    fake = make_fake_pynvml(_one_gpu(memory_reserved_mib=100, used_mib=300), ManualClock())
    fake.module.nvmlInit()
    handle = fake.module.nvmlDeviceGetHandleByIndex(0)
    v1 = fake.module.nvmlDeviceGetMemoryInfo(handle)
    v2 = fake.module.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    assert (v2.total, v2.reserved, v2.used, v2.free) == (
        1000 * MIB,
        100 * MIB,
        300 * MIB,
        600 * MIB,
    )
    assert (v1.total, v1.used, v1.free) == (1000 * MIB, 400 * MIB, 600 * MIB)


def test_old_driver_lacks_memory_v2_and_v3_process_calls() -> None:
    scenario = Scenario.model_validate(
        {
            "failure": "old-driver",
            "gpus": [
                {
                    "name": "Old",
                    "memory_total_mib": 1000,
                    "processes": [{"pid": 10, "used_mib": 5}],
                }
            ],
        }
    )
    fake = make_fake_pynvml(scenario, ManualClock())
    nvml = fake.module
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        nvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    with pytest.raises(pynvml.NVMLLibraryMismatchError) as caught:
        nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    assert not isinstance(caught.value, pynvml.NVMLError)  # a plain Exception, as in the bindings
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle)
    (process,) = nvml.nvmlDeviceGetComputeRunningProcesses_v2(handle)
    assert (process.pid, process.usedGpuMemory) == (10, 5 * MIB)


def test_processes_come_and_go_and_unknown_memory_is_none() -> None:
    clock = ManualClock()
    scenario = _one_gpu(
        processes=[
            {"pid": 1, "start_s": 0, "end_s": 5},
            {"pid": 2, "start_s": 3, "kind": "graphics", "used_mib": 7},
        ]
    )
    fake = make_fake_pynvml(scenario, clock)
    nvml = fake.module
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    (first,) = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    assert first.pid == 1 and first.usedGpuMemory is None
    assert nvml.nvmlDeviceGetGraphicsRunningProcesses(handle) == []
    clock.advance(6)
    assert nvml.nvmlDeviceGetComputeRunningProcesses(handle) == []
    assert [p.pid for p in nvml.nvmlDeviceGetGraphicsRunningProcesses(handle)] == [2]


def test_time_step_advances_scenario_time_once_per_round() -> None:
    fake = make_fake_pynvml(
        Scenario.model_validate(
            {
                "time_step_s": 5,
                "gpus": [{"name": "X", "memory_total_mib": 100, "used_mib": [[0, 0], [10, 50]]}],
            }
        )
    )
    nvml = fake.module
    nvml.nvmlInit()
    seen = []
    for _ in range(3):
        nvml.nvmlDeviceGetCount()
        seen.append(nvml.nvmlDeviceGetMemoryInfo(FakeDeviceHandle(0)).used // MIB)
    assert seen == [25, 50, 50]


def test_waves_saw_and_swing_as_real_readings_do() -> None:
    from hwdash.telemetry.fake_nvml import Wave, series_value

    saw = Wave(base=[[0, 100], [10, 200]], amplitude=20, period_s=4, start_s=10)
    assert series_value(saw, 5) == 150  # the ramp, before the swing starts
    assert [series_value(saw, t) for t in (10, 11, 12, 13, 14)] == [200, 205, 210, 215, 200]
    sine = Wave(base=50, amplitude=10, period_s=4, shape="sine")
    assert series_value(sine, 1) == pytest.approx(60) and series_value(sine, 3) == pytest.approx(40)
    noisy = Wave(base=50, amplitude=0, period_s=1, jitter=5)
    values = [series_value(noisy, t) for t in range(20)]
    assert all(45 <= v <= 55 for v in values) and len(set(values)) > 10
    assert values == [series_value(noisy, t + 0.5) for t in range(20)]  # same within a second


def test_the_sawtooth_scenario_moves_every_second() -> None:
    clock = ManualClock(90)
    fake = make_fake_pynvml("a100x8-sawtooth", clock)
    nvml = fake.module
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    seen = set()
    for _ in range(5):
        clock.advance(1)
        seen.add(
            (
                nvml.nvmlDeviceGetMemoryInfo(handle).used,
                nvml.nvmlDeviceGetPowerUsage(handle),
                nvml.nvmlDeviceGetUtilizationRates(handle).gpu,
            )
        )
    assert len(seen) == 5
    assert len(load_scenario("a100x8-sawtooth").gpus) == 8
