"""`hwdash exporter`'s collector: the series and labels it serves, what it keeps private by default,
and that our own Prometheus reader gets the same GPUs and processes back."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pynvml
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hwdash.cli import build_parser
from hwdash.commands.exporter import parse_listen
from hwdash.core.live.diagnoses import DIAGNOSIS_KINDS
from hwdash.telemetry.exporter import SnapshotCollector
from hwdash.telemetry.fake_nvml import make_fake_pynvml
from hwdash.telemetry.host_sampler import HostSampler
from hwdash.telemetry.nvml_sampler import NvmlSampler
from hwdash.telemetry.probes import ProbeJoiner
from hwdash.telemetry.prometheus_source import PrometheusSampler
from hwdash.telemetry.source import make_sampler
from hwdash.telemetry.system_sampler import SystemSampler
from hwdash.telemetry.types import GpuState, Snapshot

SRC = str(Path(__file__).resolve().parents[2] / "src")


def scenario_snapshot(scenario: str, second: float) -> Snapshot:
    now = [0.0]
    sampler = make_sampler(scenario, clock=lambda: now[0])
    snapshot = sampler.sample()
    for moment in (second / 2, second):  # the fake moves on only when sampled again
        now[0] = moment
        snapshot = sampler.sample()
    return snapshot


def scrape(snapshot: Snapshot, *, process_details: bool = False) -> str:
    registry = CollectorRegistry(auto_describe=False)
    collector = SnapshotCollector("node-7", process_details=process_details)
    registry.register(collector)
    collector.update(snapshot)
    return generate_latest(registry).decode()


def samples(text: str) -> list[Any]:
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def label_names(text: str) -> dict[str, set[str]]:
    names: dict[str, set[str]] = {}
    for sample in samples(text):
        names.setdefault(sample.name, set()).update(sample.labels)
    return names


TRAINING = scenario_snapshot("a100x4-training", 30.0)


def test_dcgm_and_hwdash_series_carry_dcgm_exporters_label_names() -> None:
    names = label_names(scrape(TRAINING))
    gpu_labels = {"gpu", "UUID", "modelName", "Hostname"}
    for series in (
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "hwdash_gpu_memory_total_bytes",
        "hwdash_gpu_memory_pressure",
        "hwdash_gpu_alert",
        "hwdash_gpu_lost",
    ):
        assert names[series] == gpu_labels, series
    assert names["hwdash_exporter_stale"] == {"Hostname"}
    assert names["hwdash_process_memory_used_bytes"] == {"gpu", "UUID", "Hostname", "pid"}


def test_user_names_and_command_lines_are_not_published_by_default() -> None:
    text = scrape(TRAINING)
    assert TRAINING.gpus[0].processes[0].user == "alice"  # the scenario has both to leak
    assert "alice" not in text and "train.py" not in text
    pids = {s.labels["pid"] for s in samples(text) if s.name == "hwdash_process_memory_used_bytes"}
    assert pids == {str(p.pid) for gpu in TRAINING.gpus for p in gpu.processes}


def test_process_details_publish_the_user_and_a_cut_command_line() -> None:
    text = scrape(TRAINING, process_details=True)
    rows = [s for s in samples(text) if s.name == "hwdash_process_memory_used_bytes"]
    first = TRAINING.gpus[0].processes[0]
    row = next(s for s in rows if s.labels["pid"] == str(first.pid))
    assert row.labels["user"] == "alice"
    assert row.labels["command"] == (first.cmdline or "")[:200]
    assert set(row.labels) == {"gpu", "UUID", "Hostname", "pid", "user", "command"}


def test_a_lost_gpu_is_in_alert_and_lost() -> None:
    snapshot = scenario_snapshot("gpu-lost", 30.0)
    assert [gpu.state for gpu in snapshot.gpus] == [GpuState.OK, GpuState.LOST]
    values = {
        (s.name, s.labels["gpu"]): s.value
        for s in samples(scrape(snapshot))
        if s.name in ("hwdash_gpu_alert", "hwdash_gpu_lost")
    }
    assert values == {
        ("hwdash_gpu_alert", "0"): 0.0,
        ("hwdash_gpu_lost", "0"): 0.0,
        ("hwdash_gpu_alert", "1"): 1.0,
        ("hwdash_gpu_lost", "1"): 1.0,
    }


def as_prometheus_answer(text: str) -> bytes:
    """What a Prometheus server that scraped ``text`` answers to an instant query for all of it."""
    result = [
        {"metric": {"__name__": s.name, **s.labels}, "value": [1_700_000_000.0, repr(s.value)]}
        for s in samples(text)
    ]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})


@pytest.mark.parametrize("process_details", [False, True])
def test_processes_round_trip_through_our_prometheus_reader(process_details: bool) -> None:
    body = as_prometheus_answer(scrape(TRAINING, process_details=process_details)).encode()
    sampler = PrometheusSampler(
        "http://prometheus.invalid", environ={}, fetch=lambda request, timeout: body
    )
    read = sampler.sample()
    assert [gpu.used_bytes for gpu in read.gpus] == [gpu.used_bytes for gpu in TRAINING.gpus]
    for original, again in zip(TRAINING.gpus, read.gpus, strict=True):
        assert again.host == "node-7" and again.host_gpu == original.index
        assert [(p.pid, p.used_bytes) for p in again.processes] == [
            (p.pid, p.used_bytes) for p in original.processes
        ]
        for p_original, p_again in zip(original.processes, again.processes, strict=True):
            if p_original.torch is None:
                assert p_again.torch is None
            else:
                assert p_again.torch is not None
                assert p_again.torch.allocated_bytes == p_original.torch.allocated_bytes
                assert p_again.torch.reserved_bytes == p_original.torch.reserved_bytes
            assert p_again.user == (p_original.user if process_details else None)
            assert not p_again.verifiable  # another machine's PID: never acted on here


def test_the_default_listen_address_is_this_machine_only() -> None:
    args = build_parser().parse_args(["exporter"])
    host, port = parse_listen(args.listen)
    assert ipaddress.ip_address(host).is_loopback and port == 9835
    assert args.process_details is False


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_command_line_flag_reaches_the_served_metrics(tmp_path: Path) -> None:
    bodies = []
    for flags in ([], ["--process-details"]):
        port = free_port()
        command = [sys.executable, "-m", "hwdash", "exporter", "--demo", "--interval", "0.2"]
        server = subprocess.Popen(
            [*command, "--listen", f"127.0.0.1:{port}", *flags],
            env={**os.environ, "PYTHONPATH": SRC, "XDG_STATE_HOME": str(tmp_path)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + 30
            body = ""
            while "hwdash_process_memory_used_bytes{" not in body:
                assert server.poll() is None, server.stderr.read() if server.stderr else ""
                assert time.monotonic() < deadline, "the exporter did not serve in 30 s"
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                        body = r.read().decode()
                except OSError:
                    time.sleep(0.2)
            bodies.append(body)
        finally:
            server.terminate()
            server.wait(10)
    plain, detailed = bodies
    assert 'user="alice"' not in plain and 'user="alice"' in detailed


def test_the_health_readings_under_dcgm_exporters_names() -> None:
    # health.toml: GPU 1's link drops from gen 5 x16 to gen 3 x8 at 60 s; GPU 3's uncorrected ECC
    # count is 2 from 120 s. The diagnoses need time in the snapshot's clock: the count here is
    # what the rules hold after these rounds (none yet on a 3-round scrape), never negative.
    snapshot = scenario_snapshot("health", 130.0)
    by_name: dict[str, dict[str, float]] = {}
    for sample in samples(scrape(snapshot)):
        by_name.setdefault(sample.name, {})[sample.labels.get("gpu", "")] = sample.value
    assert by_name["DCGM_FI_DEV_PCIE_LINK_GEN"]["1"] == 3
    assert by_name["DCGM_FI_DEV_PCIE_LINK_WIDTH"]["1"] == 8
    assert by_name["DCGM_FI_DEV_PCIE_MAX_LINK_GEN"]["1"] == 5
    assert by_name["DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH"]["1"] == 16
    assert by_name["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"]["3"] == 2
    assert by_name["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]["0"] > 0
    assert set(by_name["hwdash_gpu_diagnoses"]) == {str(gpu.index) for gpu in snapshot.gpus}
    assert all(value >= 0 for value in by_name["hwdash_gpu_diagnoses"].values())


EPOCH = 1_800_000_000.0


def health_snapshot(second: int) -> Snapshot:
    """The ``health`` scenario sampled every 5 s up to ``second``, the diagnosis rules' clock
    (the snapshot's wall clock) moving with it, so the diagnoses are in force as on a real box."""
    clock = [0.0]
    fake = make_fake_pynvml("health", lambda: clock[0])
    sampler = SystemSampler(
        NvmlSampler(fake.module, wall_clock=lambda: EPOCH + clock[0]),
        HostSampler(fake.process_table()),
        fake,
        probes=ProbeJoiner(fake.probe_source()),
    )
    snapshot = sampler.sample()
    for moment in range(5, second + 1, 5):
        clock[0] = float(moment)
        snapshot = sampler.sample()
    return snapshot


HEALTH = health_snapshot(130)


def by_gpu(text: str, name: str) -> dict[str, float]:
    return {s.labels["gpu"]: s.value for s in samples(text) if s.name == name}


def test_the_new_health_series_under_dcgm_field_names() -> None:
    # health.toml at 130 s: GPU 2 power-capped and braked; GPU 3 with 2 volatile / 3 lifetime
    # uncorrected ECC errors, 1 row remapped after an uncorrectable error (pending) and 1 after a
    # correctable one; P-state 0 where scripted; no fan (H100 SXM).
    text = scrape(HEALTH)
    bits = pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
    reasons = by_gpu(text, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
    assert reasons["2"] == bits
    assert reasons["5"] == pynvml.nvmlClocksEventReasonGpuIdle
    assert reasons["0"] == 0
    assert by_gpu(text, "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL")["3"] == 3
    assert by_gpu(text, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS")["3"] == 1
    assert by_gpu(text, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS")["3"] == 1
    assert by_gpu(text, "DCGM_FI_DEV_ROW_REMAP_PENDING") == {
        str(i): float(i == 3)
        for i in range(7)  # GPU 6 (the Xid) has no remapping
    }
    assert set(by_gpu(text, "DCGM_FI_DEV_ROW_REMAP_FAILURE").values()) == {0.0}
    assert by_gpu(text, "DCGM_FI_DEV_PSTATE")["0"] == 0
    assert "DCGM_FI_DEV_FAN_SPEED" not in label_names(text)  # not supported: absent, not 0


def test_the_xid_gpm_and_nvlink_series() -> None:
    # health.toml at 130 s: GPU 6 raised Xid 31 at 30 s and lost one of its 18 NVLinks at 90 s;
    # GPU 0's GPM scripts SM active 71%, occupancy 42%, tensor 48%, DRAM 55% (DCGM: ratios).
    text = scrape(HEALTH)
    xids = by_gpu(text, "DCGM_FI_DEV_XID_ERRORS")
    assert xids == {str(i): (31.0 if i == 6 else 0.0) for i in range(7)}
    assert by_gpu(text, "DCGM_FI_PROF_SM_ACTIVE")["0"] == pytest.approx(0.71)
    assert by_gpu(text, "DCGM_FI_PROF_SM_OCCUPANCY")["0"] == pytest.approx(0.42)
    assert by_gpu(text, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")["0"] == pytest.approx(0.48)
    assert by_gpu(text, "DCGM_FI_PROF_DRAM_ACTIVE")["0"] == pytest.approx(0.55)
    assert by_gpu(text, "hwdash_gpu_nvlinks")["6"] == 18
    assert by_gpu(text, "hwdash_gpu_nvlinks_active")["6"] == 17
    assert by_gpu(text, "hwdash_gpu_nvlinks_active")["0"] == 18


def test_no_profiling_series_where_the_activity_is_nvmls_plain_utilization() -> None:
    # The first round has one GPM sample only: the activity is utilization.gpu, which is not SM
    # activity, so no DCGM_FI_PROF_* series may claim it is.
    first = health_snapshot(0)
    assert all(gpu.activity is None or gpu.activity.source == "utilization" for gpu in first.gpus)
    names = label_names(scrape(first))
    assert not any(name.startswith("DCGM_FI_PROF_") for name in names)
    assert "DCGM_FI_DEV_GPU_UTIL" in names


def test_each_gpu_has_one_diagnosis_series_per_kind_and_the_words_of_each_in_force() -> None:
    text = scrape(HEALTH)
    flags: dict[tuple[str, str], float] = {
        (s.labels["gpu"], s.labels["kind"]): s.value
        for s in samples(text)
        if s.name == "hwdash_gpu_diagnosis"
    }
    assert len(flags) == len(HEALTH.gpus) * len(DIAGNOSIS_KINDS)  # always present: no gaps
    in_force = {(str(gpu.index), d.kind) for gpu in HEALTH.gpus for d in gpu.diagnoses}
    # At 130 s: the stray context (GPU 0), the link (1), throttled (2), ECC (3), input-bound (4),
    # the Xid 31 of 30 s (6).
    assert {kind for _gpu, kind in in_force} == {
        "stray-context",
        "link",
        "throttled",
        "ecc",
        "input-bound",
        "xid",
    }
    assert {key for key, value in flags.items() if value == 1} == in_force
    assert set(flags.values()) == {0.0, 1.0}
    counts = by_gpu(text, "hwdash_gpu_diagnoses")
    info = [s for s in samples(text) if s.name == "hwdash_gpu_diagnosis_info"]
    assert len(info) == sum(counts.values()) == sum(len(gpu.diagnoses) for gpu in HEALTH.gpus)
    for sample in info:
        gpu = HEALTH.gpus[int(sample.labels["gpu"])]
        (diagnosis,) = [d for d in gpu.diagnoses if d.kind == sample.labels["kind"]]
        assert sample.value == 1
        assert sample.labels["message"] == diagnosis.message
        assert sample.labels["hint"] == diagnosis.hint
        assert float(sample.labels["since"]) == pytest.approx(diagnosis.since, abs=1e-3)
        assert sample.labels["pid"] == ("" if diagnosis.pid is None else str(diagnosis.pid))


def test_the_health_readings_and_diagnoses_round_trip_through_our_prometheus_reader() -> None:
    body = as_prometheus_answer(scrape(HEALTH)).encode()
    sampler = PrometheusSampler(
        "http://prometheus.invalid", environ={}, fetch=lambda request, timeout: body
    )
    read = sampler.sample()
    assert len(read.gpus) == len(HEALTH.gpus)
    for original, again in zip(HEALTH.gpus, read.gpus, strict=True):
        assert again.host == "node-7" and again.host_gpu == original.index
        assert again.diagnoses == original.diagnoses  # the remote host's own words
        assert again.clocks_event_reasons == original.clocks_event_reasons
        assert again.ecc_uncorrected == original.ecc_uncorrected
        assert again.ecc_uncorrected_aggregate == original.ecc_uncorrected_aggregate
        assert again.remapped_rows == original.remapped_rows
        assert again.energy_mj == original.energy_mj
        assert again.pstate == original.pstate
        assert again.fan_percent == original.fan_percent
        assert again.activity == original.activity
        assert again.nvlink == original.nvlink
        assert [(p.pid, p.sm_percent, p.memory_bandwidth_percent) for p in again.processes] == [
            (p.pid, p.sm_percent, p.memory_bandwidth_percent) for p in original.processes
        ]
        assert original.pcie is not None and again.pcie is not None
        assert (again.pcie.gen, again.pcie.gen_max, again.pcie.width, again.pcie.width_max) == (
            original.pcie.gen,
            original.pcie.gen_max,
            original.pcie.width,
            original.pcie.width_max,
        )
    assert any(gpu.diagnoses for gpu in read.gpus)
    assert any(p.sm_percent for gpu in read.gpus for p in gpu.processes)  # not all None
