"""The real NVML sampler driven by the fake pynvml through every failure mode (as gpustat's tests do)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest

from hwdash.core.units import MIB
from hwdash.telemetry.fake_nvml import FakeNvml, ManualClock, Scenario, make_fake_pynvml
from hwdash.telemetry.nvml_sampler import NO_DRIVER_MESSAGE, NvmlSampler
from hwdash.telemetry.types import GpuState, Snapshot


def gpu(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": "Test GPU", "memory_total_mib": 1000}
    base.update(fields)
    return base


def scenario(*gpus: dict[str, Any], **top: Any) -> Scenario:
    return Scenario.model_validate({"gpus": list(gpus), **top})


class Rig:
    """A fake NVML, its clock and a sampler on it; closed after the test."""

    def __init__(self, source: Scenario | str, round_timeout_s: float = 5.0) -> None:
        self.clock = ManualClock()
        self.fake: FakeNvml = make_fake_pynvml(source, self.clock)
        self.sampler = NvmlSampler(self.fake.module, round_timeout_s=round_timeout_s)

    def sample(self) -> Snapshot:
        return self.sampler.sample()

    def close(self) -> None:
        self.fake.release_hangs()
        self.sampler.close()


@pytest.fixture
def rigs() -> Iterator[list[Rig]]:
    made: list[Rig] = []
    yield made
    for rig in made:
        rig.close()


def rig_for(rigs: list[Rig], source: Scenario | str, **kwargs: Any) -> Rig:
    rig = Rig(source, **kwargs)
    rigs.append(rig)
    return rig


def test_healthy_gpu_reports_every_field(rigs: list[Rig]) -> None:
    rig = rig_for(
        rigs,
        scenario(
            gpu(
                name="NVIDIA A100-SXM4-80GB",
                uuid="GPU-abc",
                memory_total_mib=1000,
                memory_reserved_mib=50,
                used_mib=[[0, 100], [10, 300]],
                utilization=97,
                memory_utilization=40,
                temperature_c=64,
                power_w=310.5,
                power_limit_w=400,
                sm_clock_mhz=1410,
                memory_clock_mhz=1593,
                processes=[{"pid": 4242, "name": "python", "used_mib": 90}],
            ),
            driver_version="550.54.15",
        ),
    )
    rig.clock.advance(5)
    snapshot = rig.sample()
    assert snapshot.nvml.available and snapshot.nvml.driver_version == "550.54.15"
    assert not snapshot.stale and snapshot.errors == ()
    (sample,) = snapshot.gpus
    assert (sample.name, sample.uuid, sample.state) == (
        "NVIDIA A100-SXM4-80GB",
        "GPU-abc",
        GpuState.OK,
    )
    assert sample.total_bytes == 1000 * MIB
    assert sample.reserved_bytes == 50 * MIB
    assert sample.used_bytes == 200 * MIB
    assert sample.free_bytes == 750 * MIB
    assert sample.pressure == pytest.approx(0.25)
    assert (sample.utilization_gpu, sample.utilization_memory) == (97, 40)
    assert sample.temperature_c == 64
    assert sample.power_w == pytest.approx(310.5)
    assert sample.power_limit_w == 400
    assert (sample.sm_clock_mhz, sample.memory_clock_mhz) == (1410, 1593)
    (process,) = sample.processes
    assert (process.pid, process.kind, process.used_bytes, process.name) == (
        4242,
        "compute",
        90 * MIB,
        "python",
    )
    assert sample.errors == ()


def test_static_fields_are_read_once_and_init_happens_once(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, "h100x8")
    for _ in range(3):
        rig.clock.advance(1)
        assert len(rig.sample().gpus) == 8
    calls = rig.fake.calls
    assert calls["nvmlInit"] == 1
    assert calls["nvmlDeviceGetName"] == 8
    assert calls["nvmlDeviceGetUUID"] == 8
    assert calls["nvmlDeviceGetEnforcedPowerLimit"] == 8
    assert calls["nvmlDeviceGetPowerUsage"] == 24  # dynamic fields every round


def test_memory_follows_the_scenario_over_time(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, scenario(gpu(used_mib=[[0, 0], [10, 900]])))
    pressures = []
    for _ in range(3):
        pressures.append(rig.sample().gpus[0].pressure)
        rig.clock.advance(5)
    assert pressures == [pytest.approx(0.0), pytest.approx(0.45), pytest.approx(0.9)]


@pytest.mark.parametrize(
    ("failure", "words"),
    [
        ("no-library", NO_DRIVER_MESSAGE),
        ("driver-not-loaded", "NVIDIA driver not loaded: the planner still works"),
        ("library-mismatch", "versions do not match"),
    ],
)
def test_no_nvml_gives_an_unavailable_status_in_words(
    rigs: list[Rig], failure: str, words: str
) -> None:
    rig = rig_for(rigs, scenario(gpu(), failure=failure))
    for _ in range(2):
        snapshot = rig.sample()
        assert not snapshot.nvml.available
        assert snapshot.gpus == ()
        assert words in (snapshot.nvml.error or "")
    assert rig.fake.calls["nvmlInit"] == 1  # tried once, not every round


def test_real_pynvml_without_a_driver_degrades(rigs: list[Rig]) -> None:
    sampler = NvmlSampler(pynvml, round_timeout_s=5)
    try:
        snapshot = sampler.sample()
    finally:
        sampler.close()
    if snapshot.nvml.available:
        pytest.skip("this machine has an NVIDIA driver")
    assert snapshot.nvml.error == NO_DRIVER_MESSAGE or "planner still works" in (
        snapshot.nvml.error or ""
    )
    assert snapshot.gpus == ()


def test_old_driver_falls_back_to_memory_v1_and_v2_process_calls(rigs: list[Rig]) -> None:
    rig = rig_for(
        rigs,
        scenario(
            gpu(
                memory_reserved_mib=100,
                used_mib=300,
                processes=[
                    {"pid": 7, "used_mib": 250},
                    {"pid": 8, "kind": "graphics", "used_mib": 20},
                ],
            ),
            failure="old-driver",
        ),
    )
    for _ in range(3):
        sample = rig.sample().gpus[0]
        assert sample.state is GpuState.OK
        assert sample.reserved_bytes is None
        assert sample.used_bytes == 400 * MIB  # v1: used includes reserved
        assert sample.free_bytes == 600 * MIB
        assert sorted((p.pid, p.kind, p.used_bytes) for p in sample.processes) == [
            (7, "compute", 250 * MIB),
            (8, "graphics", 20 * MIB),
        ]
        assert dict(sample.errors)["memory_reserved"].startswith("unknown")
    calls = rig.fake.calls
    # The fallbacks cost one failed call each, once per sampler, not every round.
    assert calls["nvmlDeviceGetComputeRunningProcesses"] == 1
    assert calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 1
    assert calls["nvmlDeviceGetComputeRunningProcesses_v2"] == 3
    assert calls["nvmlDeviceGetMemoryInfo"] == 4  # one failed v2 call, then v1 each round


def test_bindings_without_any_usable_process_call_still_give_the_rest(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, scenario(gpu(used_mib=100, processes=[{"pid": 7}]), failure="old-driver"))
    for name in (
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetComputeRunningProcesses_v3",
    ):
        delattr(rig.fake.module, name)
    sample = rig.sample().gpus[0]
    assert sample.processes == ()
    assert dict(sample.errors)["compute_processes"] == "not in this driver"
    assert sample.used_bytes == 100 * MIB and sample.temperature_c == 40


def test_bindings_without_memory_v2_constant_use_v1(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, scenario(gpu(memory_reserved_mib=10, used_mib=100)))
    delattr(rig.fake.module, "nvmlMemory_v2")
    sample = rig.sample().gpus[0]
    assert sample.used_bytes == 110 * MIB and sample.reserved_bytes is None


def test_unsupported_fields_are_none_and_never_hide_the_others(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, "consumer-unsupported")
    sample = rig.sample().gpus[0]
    assert sample.state is GpuState.OK
    assert sample.power_w is None and sample.power_limit_w is None
    assert sample.utilization_gpu is None and sample.utilization_memory is None
    errors = dict(sample.errors)
    assert errors["power"] == errors["utilization"] == errors["power_limit"] == "not supported"
    assert sample.total_bytes == 12288 * MIB and sample.temperature_c == 55
    assert len(sample.processes) == 2


def test_everything_unsupported_but_memory(rigs: list[Rig]) -> None:
    everything = [
        "name",
        "uuid",
        "utilization",
        "temperature",
        "power",
        "power_limit",
        "clocks",
        "processes",
    ]
    rig = rig_for(rigs, scenario(gpu(unsupported=everything, used_mib=500)))
    sample = rig.sample().gpus[0]
    assert sample.pressure == pytest.approx(0.5)
    assert sample.name is None and sample.temperature_c is None and sample.sm_clock_mhz is None
    labels = {label for label, _ in sample.errors}
    assert {
        "name",
        "uuid",
        "utilization",
        "temperature",
        "power",
        "power_limit",
        "sm_clock",
        "memory_clock",
        "compute_processes",
        "graphics_processes",
    } <= labels


def test_a_gpu_lost_mid_run_becomes_a_lost_row_and_the_others_continue(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, "gpu-lost")
    first = rig.sample()
    assert [g.state for g in first.gpus] == [GpuState.OK, GpuState.OK]
    rig.clock.advance(25)
    for _ in range(2):
        later = rig.sample()
        healthy, lost = later.gpus
        assert healthy.state is GpuState.OK and healthy.pressure is not None
        assert lost.state is GpuState.LOST
        assert lost.name == "NVIDIA A100-SXM4-40GB"  # static fields survive
        assert lost.uuid == first.gpus[1].uuid
        assert lost.total_bytes is None and lost.pressure is None
        assert dict(lost.errors)["gpu"] == "GPU is lost"


def test_a_gpu_lost_before_the_first_round_is_still_listed(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, scenario(gpu(), gpu(lost_after_s=0)))
    ok, lost = rig.sample().gpus
    assert ok.state is GpuState.OK
    assert (lost.index, lost.state, lost.name) == (1, GpuState.LOST, None)


def test_process_memory_unknown_and_mig_instances(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, "mig")
    mig_gpu, whole_gpu = rig.sample().gpus
    assert [p.used_bytes for p in mig_gpu.processes] == [None, None]
    assert [m.name for m in mig_gpu.mig] == [
        "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
        "NVIDIA A100-SXM4-80GB MIG 2g.20gb",
        "NVIDIA A100-SXM4-80GB MIG 1g.10gb",
    ]
    assert mig_gpu.mig[1].total_bytes == 19968 * MIB
    assert mig_gpu.mig[1].used_bytes == 4200 * MIB
    assert all(m.uuid and m.uuid.startswith("MIG-") for m in mig_gpu.mig)
    assert whole_gpu.mig == ()
    assert whole_gpu.processes[0].used_bytes == 30000 * MIB


def test_an_unexpected_exception_in_one_field_is_recorded(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, scenario(gpu(used_mib=100)))

    def broken(handle: object, sensor: int) -> int:
        raise RuntimeError("odd binding")

    rig.fake.module.nvmlDeviceGetTemperature = broken
    sample = rig.sample().gpus[0]
    assert sample.temperature_c is None
    assert "odd binding" in dict(sample.errors)["temperature"]
    assert sample.used_bytes == 100 * MIB


def test_a_hung_call_gives_stale_values_without_piling_up_threads(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, scenario(gpu(used_mib=400, hang_after_s=5)), round_timeout_s=0.2)
    fresh = rig.sample()
    assert not fresh.stale
    worker = rig.sampler.worker_thread
    assert worker is not None and worker.is_alive()
    rig.clock.advance(10)
    threads_before = threading.active_count()
    stuck = rig.sample()
    assert stuck.stale
    assert stuck.gpus == fresh.gpus  # last good values
    assert "did not answer" in stuck.errors[0]
    for _ in range(5):  # while stuck, no new round and no new thread
        again = rig.sample()
        assert again.stale and "has not answered" in again.errors[0]
    assert threading.active_count() == threads_before
    assert rig.sampler.worker_thread is worker
    assert rig.fake.calls["nvmlDeviceGetCount"] == 2

    rig.fake.release_hangs()  # the driver call returns (with NVML's Timeout)
    worker_done = False
    for _ in range(50):
        recovered = rig.sample()
        if not recovered.stale:
            worker_done = True
            break
        threading.Event().wait(0.05)
    assert worker_done
    assert recovered.gpus[0].state is GpuState.OK
    assert "timed out" in dict(recovered.gpus[0].errors).values()


def test_a_hang_in_init_is_reported_not_waited_for(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, scenario(gpu()), round_timeout_s=0.2)
    release = threading.Event()
    real_init = rig.fake.module.nvmlInit

    def slow_init() -> None:
        release.wait()
        real_init()

    rig.fake.module.nvmlInit = slow_init
    snapshot = rig.sample()
    assert snapshot.stale and not snapshot.nvml.available
    assert "did not answer" in (snapshot.nvml.error or "")
    release.set()


def test_close_shuts_nvml_down_and_later_samples_say_closed(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, scenario(gpu()))
    rig.sample()
    rig.sampler.close()
    assert rig.fake.calls["nvmlShutdown"] == 1
    after = rig.sample()
    assert not after.nvml.available and after.nvml.error == "sampler closed"
