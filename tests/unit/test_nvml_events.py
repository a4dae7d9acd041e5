"""Xid events, GPM activity and NVLink state (issue 28) through the real sampler and the fake pynvml,
each reading None where the GPU or the bindings lack the call; the reasons' share of the last minute;
the JSON names, the replay and the GPU row's words."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest

from hwdash.core.live.diagnoses import DiagnosisEngine, GpuReading
from hwdash.telemetry.fake_nvml import ManualClock, Scenario, make_fake_pynvml
from hwdash.telemetry.host_sampler import HostSampler
from hwdash.telemetry.nvml_events import XID_EVENTS_KEPT
from hwdash.telemetry.nvml_sampler import NvmlSampler
from hwdash.telemetry.replay import snapshot_from_dict
from hwdash.telemetry.snapshot_json import snapshot_to_dict
from hwdash.telemetry.system_sampler import SystemSampler
from hwdash.telemetry.types import GpuActivity, GpuSample, NvLinkState, XidEvent
from hwdash.ui.widgets.monitor_gpu import detail_text

EPOCH = 1_800_000_000.0
GPM = {
    "sm_active": [[0, 20], [100, 70]],
    "sm_occupancy": 40,
    "tensor_active": 35,
    "dram_active": 50,
}


def gpu(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": "Test GPU", "memory_total_mib": 1000, "utilization": 97}
    base.update(fields)
    return base


class Rig:
    def __init__(self, scenario: Scenario | str) -> None:
        self.clock = ManualClock()
        self.fake = make_fake_pynvml(scenario, self.clock)
        self.sampler = NvmlSampler(
            self.fake.module, round_timeout_s=5.0, wall_clock=lambda: EPOCH + self.clock()
        )

    def gpus(self, advance: float = 0.0) -> tuple[GpuSample, ...]:
        self.clock.advance(advance)
        return self.sampler.sample().gpus


@pytest.fixture
def rigs() -> Iterator[list[Rig]]:
    made: list[Rig] = []
    yield made
    for rig in made:
        rig.sampler.close()


def rig_for(rigs: list[Rig], *gpus: dict[str, Any]) -> Rig:
    rig = Rig(Scenario.model_validate({"gpus": list(gpus)}))
    rigs.append(rig)
    return rig


def _raise(error: type[Exception]) -> Any:
    def call(*_args: Any) -> Any:
        raise error()

    return call


# -- Xid events -------------------------------------------------------------------------------


def test_xid_events_arrive_on_their_gpu_newest_last(rigs: list[Rig]) -> None:
    rig = rig_for(
        rigs,
        gpu(),
        gpu(xids=[{"at_s": 10, "xid": 79}, {"at_s": 20, "xid": 13}, {"at_s": 20, "xid": 31}]),
    )
    timeouts: list[int] = []
    wait = rig.fake.module.nvmlEventSetWait_v2
    rig.fake.module.nvmlEventSetWait_v2 = lambda s, ms: (timeouts.append(ms), wait(s, ms))[1]
    first = rig.gpus()
    assert first[0].xid_events == () and first[1].xid_events == ()  # registered, none yet
    assert rig.gpus(10)[1].xid_events == (XidEvent(79, EPOCH + 10),)
    later = rig.gpus(15)
    assert later[1].xid_events == (
        XidEvent(79, EPOCH + 10),
        XidEvent(13, EPOCH + 25),
        XidEvent(31, EPOCH + 25),
    )
    assert later[0].xid_events == () and later[1].errors == ()
    assert rig.fake.calls["nvmlEventSetCreate"] == 1
    assert rig.fake.calls["nvmlDeviceRegisterEvents"] == 2  # once per GPU, not per round
    # Each round drains until NVML's Timeout with a 0 ms wait (never blocking a frame): round 2
    # takes one event, round 3 two (round 1 registered the GPUs after its drain found none).
    assert rig.fake.calls["nvmlEventSetWait_v2"] == (1 + 1) + (2 + 1)
    assert set(timeouts) == {0}


def test_only_the_newest_xid_events_are_kept(rigs: list[Rig]) -> None:
    xids = [{"at_s": 1 + n, "xid": 100 + n} for n in range(XID_EVENTS_KEPT + 4)]
    rig = rig_for(rigs, gpu(xids=xids))
    rig.gpus()
    events = rig.gpus(60)[0].xid_events
    assert events is not None and len(events) == XID_EVENTS_KEPT
    assert [event.xid for event in events] == list(range(104, 104 + XID_EVENTS_KEPT))


def test_a_gpu_that_refuses_the_registration_has_no_xid_reading(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, gpu(unsupported=["xid_events"], xids=[{"at_s": 5, "xid": 79}]), gpu())
    rig.gpus()
    refused, other = rig.gpus(10)
    assert refused.xid_events is None and refused.errors == ()  # NotSupported is quiet
    assert other.xid_events == ()


def test_bindings_without_event_sets_give_none_quietly(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, gpu(xids=[{"at_s": 5, "xid": 79}]))
    delattr(rig.fake.module, "nvmlEventSetCreate")
    rig.gpus()
    sample = rig.gpus(10)[0]
    assert sample.xid_events is None and sample.errors == ()


def test_an_event_set_that_fails_is_an_error_never_a_crash(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, gpu(), gpu())
    rig.fake.module.nvmlEventSetCreate = _raise(pynvml.NVMLError_Unknown)
    for sample in rig.gpus():
        assert sample.xid_events is None
        assert ("xid_events", "unknown NVML error") in sample.errors
        assert sample.total_bytes is not None  # the rest of the GPU is read


def test_a_wait_that_fails_keeps_the_events_seen_and_says_why(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, gpu(xids=[{"at_s": 5, "xid": 79}]))
    rig.gpus()
    assert rig.gpus(10)[0].xid_events == (XidEvent(79, EPOCH + 10),)
    rig.fake.module.nvmlEventSetWait_v2 = _raise(pynvml.NVMLError_Unknown)
    sample = rig.gpus(5)[0]
    assert sample.xid_events == (XidEvent(79, EPOCH + 10),)
    assert ("xid_events", "unknown NVML error") in sample.errors


def test_the_event_set_and_gpm_samples_are_freed_at_shutdown(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, gpu(gpm=GPM), gpu())
    rig.gpus()
    rig.gpus(1)
    rig.sampler.close()
    worker = rig.sampler.worker_thread
    assert worker is not None
    worker.join(5)
    assert rig.fake.calls["nvmlEventSetFree"] == 1
    assert [event_set.freed for event_set in rig.fake.events.event_sets] == [True]
    assert len(rig.fake.events.freed_samples) == 2 == rig.fake.calls["nvmlGpmSampleAlloc"]
    assert rig.fake.calls["nvmlShutdown"] == 1


# -- GPM --------------------------------------------------------------------------------------


def test_gpm_activity_between_two_rounds_and_the_plain_utilization_elsewhere(
    rigs: list[Rig],
) -> None:
    rig = rig_for(rigs, gpu(name="NVIDIA H100 80GB HBM3", gpm=GPM), gpu(name="NVIDIA A100"))
    hopper, ampere = rig.gpus()
    # The first round has one GPM sample: no metrics yet, the plain utilization said as such.
    assert hopper.activity == GpuActivity("utilization", sm_active=97.0)
    hopper, ampere = rig.gpus(50)
    assert hopper.activity == GpuActivity("gpm", 45.0, 40.0, 35.0, 50.0)
    assert ampere.activity == GpuActivity("utilization", sm_active=97.0)
    assert hopper.errors == () and ampere.errors == ()  # the A100's NotSupported is quiet
    assert rig.gpus(50)[0].activity == GpuActivity("gpm", 70.0, 40.0, 35.0, 50.0)
    assert rig.fake.calls["nvmlGpmQueryDeviceSupport"] == 2  # once per GPU
    assert rig.fake.calls["nvmlGpmSampleAlloc"] == 2  # two for the H100, none for the A100
    assert rig.fake.calls["nvmlGpmSampleGet"] == 3


def test_no_gpm_and_no_utilization_is_no_activity(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, gpu(gpm=GPM, unsupported=["gpm", "utilization"]))
    rig.gpus()
    assert rig.gpus(1)[0].activity is None


def test_bindings_without_gpm_fall_back_quietly(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, gpu(gpm=GPM))
    delattr(rig.fake.module, "nvmlGpmQueryDeviceSupport")
    rig.gpus()
    sample = rig.gpus(1)[0]
    assert sample.activity == GpuActivity("utilization", sm_active=97.0)
    assert sample.errors == ()


# -- NVLink -----------------------------------------------------------------------------------


def test_nvlink_links_and_how_many_are_up(rigs: list[Rig]) -> None:
    rig = rig_for(
        rigs,
        gpu(nvlink_links=18, nvlink_active=[[0, 18], [30, 18], [30, 16]]),
        gpu(),  # PCIe only: NotSupported for link 0
    )
    nvlinked, pcie_only = rig.gpus()
    assert nvlinked.nvlink == NvLinkState(links=18, active=18)
    assert pcie_only.nvlink is None and pcie_only.errors == () and nvlinked.errors == ()
    assert rig.gpus(35)[0].nvlink == NvLinkState(links=18, active=16)  # after the step
    # The count once (links 0..17 and the refused 18th; link 0 on the PCIe GPU), then one call
    # per link per round.
    assert rig.fake.calls["nvmlDeviceGetNvLinkState"] == 19 + 1 + 18 * 2


def test_bindings_without_nvlink_give_none(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, gpu(nvlink_links=4))
    delattr(rig.fake.module, "nvmlDeviceGetNvLinkState")
    sample = rig.gpus()[0]
    assert sample.nvlink is None and sample.errors == ()


def test_an_nvlink_error_is_recorded(rigs: list[Rig]) -> None:
    rig = rig_for(rigs, gpu(nvlink_links=4))
    rig.fake.module.nvmlDeviceGetNvLinkState = _raise(pynvml.NVMLError_NoPermission)
    sample = rig.gpus()[0]
    assert sample.nvlink is None and ("nvlink", "no permission") in sample.errors


# -- the reasons' share of the last minute ------------------------------------------------------


def test_clocks_event_share_over_the_throttled_rules_window() -> None:
    engine = DiagnosisEngine()
    for at in range(0, 65, 5):
        reasons: tuple[str, ...] = ("sw_power_cap",) if at >= 30 else ("gpu_idle",)
        if at >= 50:
            reasons = (*reasons, "hw_power_brake_slowdown")
        engine.update([GpuReading(index=0, uuid=None, at=float(at), clocks_event_reasons=reasons)])
        if at == 30:
            # 30 s of readings so far: 30 s before the first one count as without any reason.
            assert engine.clocks_event_share(0) == {"gpu_idle": 0.4167, "sw_power_cap": 0.0833}
    # At 60 s the window holds 5..60: idle 5..25 (5 readings of 5 s), capped 30..60 (7 readings).
    assert engine.clocks_event_share(0) == {
        "gpu_idle": 0.4167,
        "hw_power_brake_slowdown": 0.25,
        "sw_power_cap": 0.5833,
    }
    assert engine.clocks_event_share(1) is None
    engine.update([GpuReading(index=2, uuid=None, at=0.0, clocks_event_reasons=None)])
    assert engine.clocks_event_share(2) is None


def _health_sampler(clock: list[float]) -> SystemSampler:
    fake = make_fake_pynvml("health", lambda: clock[0])
    return SystemSampler(
        NvmlSampler(fake.module, wall_clock=lambda: EPOCH + clock[0]),
        HostSampler(fake.process_table()),
        fake,
    )


def test_the_health_scenario_end_to_end_in_json_and_back() -> None:
    clock = [0.0]
    sampler = _health_sampler(clock)
    for second in range(0, 100, 5):
        clock[0] = float(second)
        snapshot = sampler.sample()
    data = json.loads(json.dumps(snapshot_to_dict(snapshot)))
    throttled, crashed = data["gpus"][2], data["gpus"][6]
    assert throttled["clocks_event_share"] == {"hw_power_brake_slowdown": 1.0, "sw_power_cap": 1.0}
    assert data["gpus"][5]["clocks_event_share"] == {"gpu_idle": 1.0}
    assert data["gpus"][0]["clocks_event_share"] == {}
    assert crashed["xid_events"] == [
        {"xid": 31, "at": EPOCH + 30, "meaning": "GPU memory page fault"}
    ]
    assert crashed["nvlink"] == {"links": 18, "active": 17}
    assert throttled["activity"] == {
        "source": "gpm",
        "sm_active": 52.0,
        "sm_occupancy": 40.0,
        "tensor_active": 33.0,
        "dram_active": 50.0,
    }
    assert [d["kind"] for d in crashed["diagnoses"]] == ["xid"]
    assert crashed["diagnoses"][0]["message"] == "Xid 31: GPU memory page fault"
    back = snapshot_from_dict(data)
    for field in ("xid_events", "activity", "nvlink", "clocks_event_share"):
        for before, after in zip(snapshot.gpus, back.gpus, strict=True):
            assert getattr(after, field) == getattr(before, field), field


def test_json_of_what_cannot_be_read_and_of_an_unlisted_xid() -> None:
    sample = GpuSample(
        index=0,
        name=None,
        uuid=None,
        xid_events=(XidEvent(999, 5.0),),
        activity=GpuActivity("utilization", sm_active=98.0),
    )
    data = snapshot_to_dict(snapshot_from_dict({"timestamp": 1.0, "gpus": []}))
    assert data["gpus"] == []
    gpu_data = json.loads(json.dumps(snapshot_to_dict(_one(sample))))["gpus"][0]
    assert gpu_data["xid_events"] == [{"xid": 999, "at": 5.0, "meaning": None}]
    assert gpu_data["activity"]["source"] == "utilization"
    assert gpu_data["nvlink"] is None and gpu_data["clocks_event_share"] is None
    unread = json.loads(json.dumps(snapshot_to_dict(_one(GpuSample(0, None, None)))))["gpus"][0]
    assert unread["xid_events"] is None and unread["activity"] is None
    back = snapshot_from_dict({"timestamp": 1.0, "gpus": [unread]}).gpus[0]
    assert back.xid_events is None and back.activity is None and back.nvlink is None


def test_replay_tolerates_odd_event_values() -> None:
    odd = {
        "index": 0,
        "xid_events": [{"xid": "79", "at": 1.0}, {"xid": 13, "at": 2.0}, 5],
        "activity": {"source": "magic", "sm_active": "high", "dram_active": 5},
        "nvlink": {"links": 18},
        "clocks_event_share": {"sw_power_cap": 0.5, "hw_slowdown": None},
    }
    back = snapshot_from_dict({"timestamp": 1.0, "gpus": [odd]}).gpus[0]
    assert back.xid_events == (XidEvent(13, 2.0),)
    assert back.activity == GpuActivity("utilization", dram_active=5.0)
    assert back.nvlink == NvLinkState(links=18, active=0)
    assert back.clocks_event_share == {"sw_power_cap": 0.5}


def _one(sample: GpuSample) -> Any:
    from hwdash.telemetry.types import NvmlStatus, Snapshot

    return Snapshot(timestamp=1.0, nvml=NvmlStatus(available=True), gpus=(sample,))


def test_the_gpu_row_says_where_the_activity_comes_from() -> None:
    gpm = GpuSample(0, None, None, activity=GpuActivity("gpm", 63.4, 40.0, 45.0, 50.0))
    plain = GpuSample(0, None, None, activity=GpuActivity("utilization", sm_active=98.0))
    assert "SM active 63% (GPM)" in detail_text(gpm)
    assert "util 98% (NVML, not SM activity)" in detail_text(plain)
    assert "SM active" not in detail_text(GpuSample(0, None, None))


def test_a_short_detail_line_leaves_the_activity_out_before_the_uuid() -> None:
    from hwdash.ui.widgets.monitor_gpu import fit_detail, gpu_cells

    sample = GpuSample(
        0,
        "NVIDIA H100",
        "GPU-7e2f1a90-4c3b-4d5e-9f60-000000000003",
        reserved_bytes=0,
        activity=GpuActivity("gpm", 63.0),
    )
    cells = gpu_cells(sample, wide=True)
    assert cells.activity == "SM active 63% (GPM)"
    full = fit_detail(cells.detail, 120, cells.uuid, cells.activity)
    assert "SM active 63% (GPM)" in full and full.rstrip().endswith("000000000003")
    short = fit_detail(cells.detail, 40, cells.uuid, cells.activity)
    assert "SM active" not in short and short.rstrip().endswith("00003"), short
