"""The health rules fed by the monitor's own sampler on the packaged ``health`` scenario: each
diagnosis raised at its scripted second, on the GPU row's data and in ``monitor --json``."""

from __future__ import annotations

import json

from hwdash.telemetry.fake_nvml import make_fake_pynvml
from hwdash.telemetry.host_sampler import HostSampler
from hwdash.telemetry.nvml_sampler import NvmlSampler
from hwdash.telemetry.probes import ProbeJoiner
from hwdash.telemetry.snapshot_json import snapshot_to_dict
from hwdash.telemetry.system_sampler import SystemSampler
from hwdash.ui.widgets.monitor_gpu import detail_text

EPOCH = 1_800_000_000.0


def _sampler(clock: list[float]) -> SystemSampler:
    fake = make_fake_pynvml("health", lambda: clock[0])
    return SystemSampler(
        NvmlSampler(fake.module, wall_clock=lambda: EPOCH + clock[0]),
        HostSampler(fake.process_table()),
        fake,
        probes=ProbeJoiner(fake.probe_source()),
    )


def test_each_scripted_problem_is_raised_once_at_its_time() -> None:
    clock = [0.0]
    sampler = _sampler(clock)
    raised: dict[str, tuple[float, int]] = {}
    cleared: dict[str, float] = {}
    for second in range(0, 700, 5):
        clock[0] = float(second)
        sampler.sample()
        for event in sampler.diagnosis_events:
            target = raised if event.event == "raised" else cleared
            assert event.kind not in target, f"{event.kind} {event.event} twice"
            target[event.kind] = (second, event.gpu_index) if event.event == "raised" else second
    # health.toml: a stray context on GPU 0 from the start, GPU 2 throttled 0-600 s, GPU 4's
    # loader at 100% CPU with the GPU at 30%, GPU 1's link down to gen 3 x8 from 60 s under load,
    # GPU 3's uncorrected ECC from 120 s, GPU 5's notebook holding 2 GiB at 0% from the start,
    # GPU 6's Xid 31 at 30 s (cleared after xid_quiet_s, 300 s, without another).
    assert raised == {
        "stray-context": (5, 0),
        "throttled": (10, 2),
        "input-bound": (60, 4),
        "link": (75, 1),
        "ecc": (125, 3),
        "idle-holding": (600, 5),
        "xid": (30, 6),
    }
    assert cleared == {"throttled": 655, "xid": 330}


def test_the_json_and_the_gpu_row_say_it() -> None:
    clock = [0.0]
    sampler = _sampler(clock)
    for second in range(0, 130, 5):
        clock[0] = float(second)
        snapshot = sampler.sample()
    document = json.loads(json.dumps(snapshot_to_dict(snapshot)))
    kinds = {gpu["index"]: [d["kind"] for d in gpu["diagnoses"]] for gpu in document["gpus"]}
    assert kinds == {0: ["stray-context"], 1: ["link"], 2: ["throttled"], 3: ["ecc"],
                     4: ["input-bound"], 5: [], 6: ["xid"]}  # fmt: skip
    stray = document["gpus"][0]["diagnoses"][0]
    assert set(stray) == {"kind", "message", "since", "hint"}
    assert "set_device(local_rank)" in stray["hint"]
    assert stray["since"] == EPOCH  # since the context was first seen (raised after a 5 s hold)
    row = detail_text(snapshot.gpus[2])
    assert row.startswith("⚠ clocks throttled")


def test_diagnoses_reach_the_alert_log_and_on_alert_with_their_kind(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import time as wall

    from hwdash.core.live.alerts import AlertEngine
    from hwdash.telemetry.alert_actions import AlertActions, AlertCommand, AlertLog

    out = tmp_path / "kinds.txt"
    log = AlertLog(tmp_path / "alerts.jsonl")
    command = AlertCommand(f'echo "$HWDASH_EVENT $HWDASH_KIND $HWDASH_GPU" >> {out}')
    actions = AlertActions(log, command)
    engine = AlertEngine()
    clock = [0.0]
    sampler = _sampler(clock)
    for second in range(0, 80, 5):
        clock[0] = float(second)
        actions.handle(engine.update(sampler.sample()))
    actions.close(10)
    deadline = wall.monotonic() + 10
    while wall.monotonic() < deadline and len(out.read_text().splitlines()) < 5:
        wall.sleep(0.05)
    assert sorted(out.read_text().splitlines()) == [
        "raised input-bound 4",
        "raised link 1",
        "raised stray-context 0",
        "raised throttled 2",
        "raised xid 6",
    ]
    lines = [json.loads(line) for line in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    by_kind = {line["diagnosis"]: line for line in lines if "diagnosis" in line}
    assert set(by_kind) == {"stray-context", "throttled", "input-bound", "link", "xid"}
    assert "Xid 31: GPU memory page fault" in by_kind["xid"]["message"]
    assert by_kind["link"]["kind"] == "raised" and by_kind["link"]["gpu_index"] == 1
    assert "set_device(local_rank)" in by_kind["stray-context"]["message"]
