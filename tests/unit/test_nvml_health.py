"""The health readings (issue 28) through the real sampler and the fake pynvml: per-process SM and
memory-bandwidth utilization, clock-event reasons, PCIe, ECC, remapped rows, fan, P-state, energy;
NotSupported gives None; the JSON names; the replay reads them back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest

from hwdash.telemetry.fake_nvml import ENERGY_START_MJ, ManualClock, Scenario, make_fake_pynvml
from hwdash.telemetry.nvml_sampler import NvmlSampler
from hwdash.telemetry.replay import snapshot_from_dict
from hwdash.telemetry.snapshot_json import snapshot_to_dict
from hwdash.telemetry.types import GpuSample, PcieLink, RemappedRows

HEALTH_FIELDS = [
    "process_utilization",
    "clocks_event_reasons",
    "pcie",
    "pcie_throughput",
    "ecc",
    "remapped_rows",
    "fan",
    "pstate",
    "energy",
]


def gpu(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": "Test GPU", "memory_total_mib": 1000}
    base.update(fields)
    return base


class Rig:
    def __init__(self, scenario: Scenario | str) -> None:
        self.clock = ManualClock()
        self.fake = make_fake_pynvml(scenario, self.clock)
        self.sampler = NvmlSampler(self.fake.module, round_timeout_s=5.0)

    def gpu(self, index: int = 0) -> GpuSample:
        return self.sampler.sample().gpus[index]


@pytest.fixture
def rigs() -> Iterator[list[Rig]]:
    made: list[Rig] = []
    yield made
    for rig in made:
        rig.fake.release_hangs()
        rig.sampler.close()


def rig_for(rigs: list[Rig], *gpus: dict[str, Any], **top: Any) -> Rig:
    rig = Rig(Scenario.model_validate({"gpus": list(gpus), **top}))
    rigs.append(rig)
    return rig


def test_clocks_event_reasons_follow_the_scenario(rigs: list[Rig]) -> None:
    rig = rig_for(
        rigs,
        gpu(clocks_event_reasons=[[10, ["sw_power_cap", "hw_power_brake_slowdown"]], [30, []]]),
    )
    assert rig.gpu().clocks_event_reasons == ()
    rig.clock.advance(15)
    assert rig.gpu().clocks_event_reasons == ("sw_power_cap", "hw_power_brake_slowdown")
    rig.clock.advance(20)
    assert rig.gpu().clocks_event_reasons == ()
    assert rig.fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 3
    assert rig.fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 0


def test_clocks_event_reasons_fall_back_to_the_throttle_name(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, gpu(clocks_event_reasons=[[0, ["hw_thermal_slowdown"]]]))
    delattr(rig.fake.module, "nvmlDeviceGetCurrentClocksEventReasons")  # bindings before 12.535
    for name in dir(rig.fake.module):
        if name.startswith("nvmlClocksEventReason"):
            delattr(rig.fake.module, name)
    assert rig.gpu().clocks_event_reasons == ("hw_thermal_slowdown",)
    assert rig.gpu().clocks_event_reasons == ("hw_thermal_slowdown",)
    assert rig.fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 2
    assert "clocks_event_reasons" not in dict(rig.gpu().errors)


def test_old_driver_answers_only_the_throttle_name(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, gpu(clocks_event_reasons=[[0, ["sync_boost"]]]), failure="old-driver")
    assert rig.gpu().clocks_event_reasons == ("sync_boost",)
    rig.gpu()
    # The new name failed once (FunctionNotFound); the old one is remembered.
    assert rig.fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1
    assert rig.fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 2


def test_pcie_link_and_throughput(rigs: list[Rig]) -> None:
    rig = rig_for(
        rigs,
        gpu(
            pcie_gen=[[0, 4], [10, 1]],
            pcie_gen_max=4,
            pcie_width=[[0, 16], [10, 8]],
            pcie_width_max=16,
            pcie_tx_mib_s=100,
            pcie_rx_mib_s=[[0, 0], [10, 2000]],
        ),
    )
    assert rig.gpu().pcie == PcieLink(
        gen=4, gen_max=4, width=16, width_max=16, tx_bytes_per_s=100 * 1024 * 1024, rx_bytes_per_s=0
    )
    rig.clock.advance(10)
    link = rig.gpu().pcie
    assert link is not None
    assert (link.gen, link.gen_max, link.width, link.width_max) == (1, 4, 8, 16)
    assert link.rx_bytes_per_s == 2000 * 1024 * 1024  # NVML's KB/s times 1024
    assert rig.fake.calls["nvmlDeviceGetMaxPcieLinkGeneration"] == 1  # the maximum: read once


def test_pcie_max_generation_falls_back_to_the_gpus_own(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, gpu(pcie_gen_max=5, pcie_gen=5))
    delattr(rig.fake.module, "nvmlDeviceGetMaxPcieLinkGeneration")
    link = rig.gpu().pcie
    assert link is not None and link.gen_max == 5


def test_ecc_and_remapped_rows(rigs: list[Rig]) -> None:
    rig = rig_for(
        rigs,
        gpu(
            ecc_uncorrected=[[0, 0], [10, 0], [11, 3]],
            ecc_uncorrected_aggregate=[[0, 7], [11, 10]],
            remapped_rows={
                "corrected": 2,
                "uncorrected": [[0, 0], [11, 1]],
                "pending": [[0, 0], [11, 1]],
            },
        ),
    )
    sample = rig.gpu()
    assert (sample.ecc_uncorrected, sample.ecc_uncorrected_aggregate) == (0, 7)
    assert sample.remapped_rows == RemappedRows(2, 0, pending=False, failure=False)
    rig.clock.advance(20)
    sample = rig.gpu()
    assert (sample.ecc_uncorrected, sample.ecc_uncorrected_aggregate) == (3, 10)
    assert sample.remapped_rows == RemappedRows(2, 1, pending=True, failure=False)


def test_fan_pstate_and_energy(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, gpu(fan_percent=[[0, 40], [10, 90]], pstate=[[0, 8], [5, 0]], power_w=100))
    sample = rig.gpu()
    assert (sample.fan_percent, sample.pstate, sample.energy_mj) == (40.0, 8, ENERGY_START_MJ)
    rig.clock.advance(10)
    sample = rig.gpu()
    assert (sample.fan_percent, sample.pstate) == (90.0, 0)
    assert sample.energy_mj == ENERGY_START_MJ + 10 * 100 * 1000  # 10 s at 100 W, in mJ


def test_every_health_reading_not_supported_is_none_and_quiet(rigs: list[Rig]) -> None:
    rig = rig_for(
        rigs,
        gpu(
            unsupported=HEALTH_FIELDS,
            processes=[{"pid": 10, "used_mib": 100, "sm_percent": 50}],
        ),
    )
    sample = rig.gpu()
    assert sample.clocks_event_reasons is None and sample.pcie is None
    assert sample.ecc_uncorrected is None and sample.ecc_uncorrected_aggregate is None
    assert sample.remapped_rows is None and sample.fan_percent is None
    assert sample.pstate is None and sample.energy_mj is None
    assert sample.processes[0].sm_percent is None
    assert sample.processes[0].memory_bandwidth_percent is None
    # NotSupported is what most GPUs answer for some of these: not shown as an n/a field.
    assert sample.errors == ()
    assert sample.temperature_c == 40.0  # the other readings are still there


def test_a_real_failure_is_recorded_under_the_readings_label(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, gpu())

    def refuse(*_args: Any) -> None:
        raise pynvml.NVMLError_NoPermission()

    rig.fake.module.nvmlDeviceGetFanSpeed = refuse
    sample = rig.gpu()
    assert sample.fan_percent is None
    assert dict(sample.errors)["fan"] == "no permission"


def test_pcie_throughput_alone_unsupported(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, gpu(unsupported=["pcie_throughput"], pcie_gen=3))
    link = rig.gpu().pcie
    assert link == PcieLink(gen=3, gen_max=4, width=16, width_max=16)


def test_process_utilization_by_pid(rigs: list[Rig]) -> None:
    rig = rig_for(
        rigs,
        gpu(
            processes=[
                {"pid": 100, "used_mib": 100, "sm_percent": [[0, 90], [10, 30]]},
                {"pid": 200, "used_mib": 100, "sm_percent": 5, "memory_bandwidth_percent": 40},
                {"pid": 300, "used_mib": 100},  # NVML keeps no sample for it
            ]
        ),
    )
    rig.clock.advance(1)
    rows = {process.pid: process for process in rig.gpu().processes}
    assert (rows[100].sm_percent, rows[100].memory_bandwidth_percent) == (84.0, 0.0)
    assert (rows[200].sm_percent, rows[200].memory_bandwidth_percent) == (5.0, 40.0)
    assert rows[300].sm_percent is None and rows[300].memory_bandwidth_percent is None
    rig.clock.advance(9)
    rows = {process.pid: process for process in rig.gpu().processes}
    assert rows[100].sm_percent == 30.0


def test_process_utilization_asks_only_for_new_samples(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, gpu(processes=[{"pid": 100, "used_mib": 100, "sm_percent": 70}]))
    seen: list[int] = []
    original = rig.fake.module.nvmlDeviceGetProcessUtilization

    def spy(handle: Any, since_us: int) -> Any:
        seen.append(since_us)
        return original(handle, since_us)

    rig.fake.module.nvmlDeviceGetProcessUtilization = spy
    rig.clock.advance(1)
    assert rig.gpu().processes[0].sm_percent == 70.0
    # No newer sample (the clock did not move): NVML's NotFound, the value is unknown, no error.
    sample = rig.gpu()
    assert sample.processes[0].sm_percent is None and sample.errors == ()
    assert seen[0] == 0 and seen[1] > 0  # the second call asks only after the newest sample seen
    rig.clock.advance(1)
    assert rig.gpu().processes[0].sm_percent == 70.0


def test_process_utilization_takes_the_newest_sample_per_pid(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, gpu(processes=[{"pid": 100, "used_mib": 100, "sm_percent": 70}]))

    def two_samples(_handle: Any, _since: int) -> list[Any]:
        def row(stamp: int, sm: int) -> Any:
            return type("Sample", (), {"pid": 100, "timeStamp": stamp, "smUtil": sm, "memUtil": 1})

        return [row(2_000, 55), row(1_000, 10), row(3_000, 2**32 - 1)]  # last: not filled

    rig.fake.module.nvmlDeviceGetProcessUtilization = two_samples
    process = rig.gpu().processes[0]
    assert process.sm_percent is None  # the newest sample holds NVML's "not available"
    assert rig.sampler._reader.health.last_sample_us[0] == 3_000


def test_json_names_and_replay_round_trip(rigs: list[Rig]) -> None:
    rig = rig_for(
        rigs,
        gpu(
            clocks_event_reasons=[[0, ["sw_thermal_slowdown"]]],
            pcie_gen=2,
            ecc_uncorrected=1,
            remapped_rows={"failure": 1},
            fan_percent=55,
            pstate=2,
            processes=[{"pid": 100, "used_mib": 100, "sm_percent": 42}],
        ),
        gpu(unsupported=HEALTH_FIELDS),
    )
    rig.clock.advance(1)
    snapshot = rig.sampler.sample()
    data = json.loads(json.dumps(snapshot_to_dict(snapshot)))
    first, second = data["gpus"]
    assert first["clocks_event_reasons"] == ["sw_thermal_slowdown"]
    assert first["pcie"] == {
        "gen": 2,
        "gen_max": 4,
        "width": 16,
        "width_max": 16,
        "tx_bytes_per_s": 0,
        "rx_bytes_per_s": 0,
    }
    assert (first["ecc_uncorrected"], first["ecc_uncorrected_aggregate"]) == (1, 1)
    assert first["remapped_rows"] == {
        "corrected": 0,
        "uncorrected": 0,
        "pending": False,
        "failure": True,
    }
    assert (first["fan_percent"], first["pstate"]) == (55.0, 2)
    assert first["energy_mj"] == ENERGY_START_MJ  # the counter as first read
    assert first["xid_events"] == []
    assert first["processes"][0]["sm_percent"] == 42.0
    assert first["processes"][0]["memory_bandwidth_percent"] == 0.0
    for key in ("clocks_event_reasons", "pcie", "ecc_uncorrected", "remapped_rows", "fan_percent"):
        assert second[key] is None
    assert second["xid_events"] == []
    back = snapshot_from_dict(data)
    assert back.gpus[0].clocks_event_reasons == snapshot.gpus[0].clocks_event_reasons
    for field in ("pcie", "ecc_uncorrected", "remapped_rows", "fan_percent", "pstate", "energy_mj"):
        assert getattr(back.gpus[0], field) == getattr(snapshot.gpus[0], field)
    assert back.gpus[0].processes[0].sm_percent == 42.0
    assert back.gpus[1].pcie is None and back.gpus[1].clocks_event_reasons is None


def test_replay_tolerates_odd_health_values() -> None:
    data = {
        "timestamp": 1.0,
        "gpus": [
            {
                "index": 0,
                "clocks_event_reasons": ["hw_slowdown", 3, None],
                "pcie": {"gen": "4", "width": 8},
                "remapped_rows": [1, 2],
                "fan_percent": True,
                "pstate": -1,
                "processes": [{"pid": 5, "sm_percent": "high"}],
            }
        ],
    }
    gpu_back = snapshot_from_dict(data).gpus[0]
    assert gpu_back.clocks_event_reasons == ("hw_slowdown",)
    assert gpu_back.pcie == PcieLink(width=8)
    assert gpu_back.remapped_rows is None and gpu_back.fan_percent is None
    assert gpu_back.processes[0].sm_percent is None


def test_the_health_scenario_shows_one_trouble_per_gpu(rigs: list[Rig]) -> None:
    rig = Rig("health")
    rigs.append(rig)
    rig.clock.advance(5)
    gpus = rig.sampler.sample().gpus
    stray = {process.pid: process.used_bytes for process in gpus[0].processes}
    assert 7101 in stray and 7101 in {process.pid for process in gpus[1].processes}
    assert gpus[2].clocks_event_reasons == ("sw_power_cap", "hw_power_brake_slowdown")
    assert gpus[1].pcie is not None and gpus[1].pcie.gen == gpus[1].pcie.gen_max == 5
    assert gpus[3].ecc_uncorrected == 0
    assert gpus[4].processes[0].cpu_percent is None  # the host's view comes from the host sampler
    assert gpus[4].processes[0].sm_percent == 30.0 and gpus[4].utilization_gpu == 30.0
    assert gpus[5].utilization_gpu == 0.0 and gpus[5].clocks_event_reasons == ("gpu_idle",)
    assert all(gpu.fan_percent is None and gpu.errors == () for gpu in gpus)  # H100 SXM: no fan
    rig.clock.advance(120)
    gpus = rig.sampler.sample().gpus
    assert gpus[1].pcie is not None and (gpus[1].pcie.gen, gpus[1].pcie.width) == (3, 8)
    assert gpus[3].ecc_uncorrected == 2 and gpus[3].remapped_rows is not None
    assert gpus[3].remapped_rows.pending
    rig.clock.advance(600)
    assert rig.sampler.sample().gpus[2].clocks_event_reasons == ()
