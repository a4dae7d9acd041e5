"""The real NVML sampler driven by the fake pynvml through every failure mode (as gpustat's tests do)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest

from hwdash.core.units import MIB
from hwdash.telemetry.fake_nvml import FakeNvml, ManualClock, Scenario, make_fake_pynvml
from hwdash.telemetry.nvml_sampler import NO_DRIVER_MESSAGE, NvmlSampler, bindings_problem
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


# -- real-driver semantics the fake now expresses (issue: reliability) ------------------------------


def test_mig_instances_are_found_in_sparse_slots_with_their_instance_ids(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, "mig")
    mig_gpu, _whole = rig.sample().gpus
    assert [(m.index, m.gpu_instance_id) for m in mig_gpu.mig] == [(0, 1), (3, 5), (5, 13)]
    # Slot 5 is past the number of instances: stopping at the first empty slot would miss it.
    assert mig_gpu.mig[2].name == "NVIDIA A100-SXM4-80GB MIG 1g.10gb"


def test_mig_processes_come_from_each_mig_device_when_the_parent_list_is_refused(
    rigs: list[Rig],
) -> None:
    rig = rig_for(rigs, "mig")
    mig_gpu, _whole = rig.sample().gpus
    # The parent's list is root-only on MIG (the fake refuses it, as NVML does): never asked.
    # One call per MIG device of GPU 0 and one for the whole GPU 1.
    assert rig.fake.calls["nvmlDeviceGetComputeRunningProcesses"] == 3 + 1
    by_pid = {p.pid: p for p in mig_gpu.processes}
    assert (by_pid[52001].mig_index, by_pid[52001].gpu_instance_id) == (0, 1)
    assert (by_pid[52002].mig_index, by_pid[52002].gpu_instance_id) == (3, 5)
    assert by_pid[52001].compute_instance_id == 0
    assert not any(field.endswith("_processes") for field, _why in mig_gpu.errors)


def mig_scenario(current: bool, pending: bool) -> Scenario:
    return scenario(
        gpu(
            memory_total_mib=81920,
            mig_mode_current=current,
            mig_mode_pending=pending,
            mig=[{"name": "MIG 3g.40gb", "memory_total_mib": 40192, "slot": 2}],
            processes=[{"pid": 10, "used_mib": 100, "mig": 2 if current else None}],
        )
    )


def test_the_current_mig_mode_counts_not_the_pending_one(rigs: list[Rig]) -> None:
    # MIG on now, off after the next reset: the instances are still there.
    (on_now,) = rig_for(rigs, mig_scenario(current=True, pending=False)).sample().gpus
    assert [m.index for m in on_now.mig] == [2]
    assert [(p.pid, p.mig_index) for p in on_now.processes] == [(10, 2)]
    # MIG off now, on after the next reset: a whole GPU, processes from the parent.
    (off_now,) = rig_for(rigs, mig_scenario(current=False, pending=True)).sample().gpus
    assert off_now.mig == ()
    assert [(p.pid, p.mig_index) for p in off_now.processes] == [(10, None)]


def test_the_fake_refuses_a_mig_parents_process_list_unless_privileged() -> None:
    for privileged in (False, True):
        fake = make_fake_pynvml(
            scenario(
                gpu(
                    mig=[{"name": "MIG 1g.10gb", "memory_total_mib": 9728}],
                    processes=[{"pid": 7, "mig": 0}],
                ),
                privileged=privileged,
            )
        )
        nvml = fake.module
        nvml.nvmlInit()
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        if privileged:
            assert [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)] == [7]
        else:
            with pytest.raises(pynvml.NVMLError_NoPermission):
                nvml.nvmlDeviceGetComputeRunningProcesses(handle)


def test_nvml_not_available_sentinel_is_unknown_memory_not_16_exabytes(rigs: list[Rig]) -> None:
    rig = rig_for(
        rigs,
        scenario(gpu(processes=[{"pid": 5, "used_not_available_raw": True}])),
    )
    (only,) = rig.sample().gpus
    (process,) = only.processes
    assert process.used_bytes is None
    assert only.processes_reliable


def test_rows_read_at_the_wrong_struct_stride_are_reported_not_shown(rigs: list[Rig]) -> None:
    processes = [{"pid": 100 + i, "used_mib": 500 + i} for i in range(4)]
    rig = rig_for(
        rigs,
        scenario(
            gpu(memory_total_mib=81920, processes=processes, process_struct_mismatch=True),
            gpu(memory_total_mib=81920, processes=processes),
        ),
    )
    scrambled, fine = rig.sample().gpus
    assert scrambled.processes == ()
    assert not scrambled.processes_reliable
    reason = dict(scrambled.errors)["processes"]
    assert reason.startswith("unreliable: impossible PID")
    # The same rows read at the right stride pass the check unchanged.
    assert fine.processes_reliable
    assert [(p.pid, p.used_bytes) for p in fine.processes] == [
        (100 + i, (500 + i) * MIB) for i in range(4)
    ]


def test_a_process_using_more_than_the_gpu_has_makes_the_list_unreliable(rigs: list[Rig]) -> None:
    rig = rig_for(
        rigs, scenario(gpu(memory_total_mib=1000, processes=[{"pid": 9, "used_mib": 5000}]))
    )
    (only,) = rig.sample().gpus
    assert only.processes == ()
    assert "more memory than the GPU has" in dict(only.errors)["processes"]


def test_known_bad_bindings_make_every_process_list_unreliable(rigs: list[Rig]) -> None:
    clock = ManualClock()
    fake = make_fake_pynvml(scenario(gpu(processes=[{"pid": 9, "used_mib": 10}])), clock)
    sampler = NvmlSampler(fake.module, bindings_version="12.535.77")
    try:
        snapshot = sampler.sample()
    finally:
        sampler.close()
    (only,) = snapshot.gpus
    assert only.processes == ()
    assert "nvidia-ml-py 12.535.77" in dict(only.errors)["processes"]
    assert snapshot.nvml.bindings_version == "12.535.77"


@pytest.mark.parametrize(
    ("version", "bad"),
    [("12.535.77", True), ("12.535.108", False), ("11.525.150", False), ("13.615.71", False)],
)
def test_bindings_floor(version: str, bad: bool) -> None:
    assert (bindings_problem(version) is not None) is bad


def test_compute_and_graphics_contexts_of_one_pid_are_one_row(rigs: list[Rig]) -> None:
    rig = rig_for(
        rigs,
        scenario(
            gpu(
                processes=[
                    {"pid": 300, "kind": "compute", "used_mib": 200},
                    {"pid": 300, "kind": "graphics", "used_mib": 200},
                    {"pid": 301, "kind": "graphics", "used_mib": 20},
                ]
            )
        ),
    )
    (only,) = rig.sample().gpus
    assert [(p.pid, p.kind, p.used_bytes) for p in only.processes] == [
        (300, "compute+graphics", 200 * MIB),  # counted once, not 400 MiB
        (301, "graphics", 20 * MIB),
    ]


def test_a_reused_pid_shows_the_new_processs_name(rigs: list[Rig]) -> None:
    rig = rig_for(
        rigs,
        scenario(
            gpu(
                processes=[
                    {"pid": 4242, "name": "old-trainer", "end_s": 10},
                    {"pid": 4242, "name": "new-server", "start_s": 20},
                ]
            )
        ),
    )
    assert [p.name for p in rig.sample().gpus[0].processes] == ["old-trainer"]
    rig.clock.advance(15)
    assert rig.sample().gpus[0].processes == ()  # gone from NVML's list: its name is forgotten
    rig.clock.advance(10)
    assert [p.name for p in rig.sample().gpus[0].processes] == ["new-server"]


@pytest.mark.parametrize(
    "memory", [{"unsupported": ["memory"]}, {"memory_total_mib": 0}], ids=["not-supported", "zero"]
)
def test_a_unified_memory_part_is_flagged(rigs: list[Rig], memory: dict[str, Any]) -> None:
    rig = rig_for(rigs, scenario(gpu(name="NVIDIA GB10", **memory)))
    (only,) = rig.sample().gpus
    assert only.unified_memory
    assert only.total_bytes is None and only.pressure is None
