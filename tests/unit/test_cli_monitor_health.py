"""`hwdash monitor --once` says what the dashboard knows of each GPU's health: its real activity
(GPM), NVLinks, Xid events and the diagnoses, under the GPU table, within 80 columns."""

from __future__ import annotations

import io
import json

import pytest
from monitor_cli import run_monitor
from rich.console import Console

from hwdash.commands.monitor_print import XIDS_SHOWN, health_lines, print_readable
from hwdash.core.live.diagnoses import Diagnosis, xid_catalog
from hwdash.telemetry.types import (
    GpuActivity,
    GpuSample,
    NvLinkState,
    NvmlStatus,
    Snapshot,
    XidEvent,
)

pytestmark = pytest.mark.usefixtures("private_state")

# The packaged health scenario steps 5 s of scenario time per sampling round: GPU 6 gets Xid 31
# at 30 s (round 6) and loses one of its 18 NVLinks at 90 s (round 18).
HEALTH_ROUNDS = ["--count", "20", "--interval", "0.01", "--fake-nvml", "health"]


def _block(out: str, gpu: int) -> list[str]:
    """The lines of GPU ``gpu``'s health block: its ``GPU n`` line and the indented ones under it."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"GPU {gpu}  "))
    block = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith("       ") or not line.strip():
            break
        block.append(line)
    return [line.rstrip() for line in block]


def test_health_scenario_shows_activity_nvlink_xid_and_diagnosis(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, _ = run_monitor(capsys, "--once", *HEALTH_ROUNDS)
    assert status == 0
    assert _block(out, 0) == ["GPU 0  SM active 71%, tensor 48%, DRAM 55% (GPM); NVLink 18/18 up"]
    gpu6 = _block(out, 6)
    assert gpu6[0] == "GPU 6  SM active 0%, tensor 0%, DRAM 0% (GPM); NVLink 17/18 up"
    meaning, hint = xid_catalog()[31].meaning, xid_catalog()[31].hint
    assert gpu6[1].startswith("       Xid 31 (") and gpu6[1].endswith(f"ago): {meaning}")
    # The diagnosis: kind, message and hint, wrapped under its own text.
    diagnosis = " ".join(line.strip() for line in gpu6[2:])
    assert diagnosis == f"xid: Xid 31: {meaning}; {hint}"
    assert len(gpu6) > 3  # the hint is longer than one 80-column line
    for line in out.splitlines():
        if (line.startswith("GPU ") and "┃" not in line) or line.startswith("       "):
            assert len(line.rstrip()) <= 80, line
    # Nothing to say of the Xid or a diagnosis on the GPUs without one.
    assert out.count("Xid 31") == 2 and "xid:" not in "\n".join(_block(out, 5))


def test_one_sample_says_utilization_is_not_sm_activity(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # GPM measures between two samples: a single one has NVML's utilization only.
    _, out, _ = run_monitor(capsys, "--once", "--fake-nvml", "health")
    assert _block(out, 0) == ["GPU 0  utilization 99% (not SM activity); NVLink 18/18 up"]
    assert "(GPM)" not in out and "Xid" not in out and "xid:" not in out


def test_healthy_box_without_gpm_or_nvlink_prints_no_health_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, _ = run_monitor(
        capsys, "--once", "--count", "3", "--interval", "0.01", "--fake-nvml", "a100x4-training"
    )
    assert status == 0
    for words in ("not SM activity", "(GPM)", "NVLink", "Xid", "xid:"):
        assert words not in out
    assert not any(line.startswith("GPU 0  ") for line in out.splitlines())


def test_healthy_h100_box_has_gpm_activity_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, out, _ = run_monitor(
        capsys, "--once", "--count", "3", "--interval", "0.01", "--fake-nvml", "h100x8"
    )
    for gpu in range(8):
        (line,) = _block(out, gpu)
        assert line.endswith("(GPM)")  # its scenario has no NVLinks
    assert "NVLink" not in out and "Xid" not in out and "xid:" not in out


def test_once_json_carries_what_the_text_shows(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_monitor(capsys, "--once", "--json", *HEALTH_ROUNDS)
    gpu6 = json.loads(out)["gpus"][6]
    assert gpu6["activity"] == {
        "source": "gpm",
        "sm_active": 0.0,
        "sm_occupancy": 0.0,
        "tensor_active": 0.0,
        "dram_active": 0.0,
    }
    assert gpu6["nvlink"] == {"links": 18, "active": 17}
    (xid,) = gpu6["xid_events"]
    assert xid["xid"] == 31 and xid["meaning"] == xid_catalog()[31].meaning
    assert [d["kind"] for d in gpu6["diagnoses"]] == ["xid"]
    assert gpu6["diagnoses"][0]["hint"] == xid_catalog()[31].hint


def _gpu(**fields: object) -> GpuSample:
    return GpuSample(index=0, name="NVIDIA H100 80GB HBM3", uuid=None, **fields)  # type: ignore[arg-type]


def test_newest_xids_first_and_an_unlisted_number_is_said_so() -> None:
    now = 1_000_000.0
    events = tuple(XidEvent(31, now - 600 + i) for i in range(XIDS_SHOWN + 1))
    events += (XidEvent(999, now - 12),)
    lines = health_lines(_gpu(xid_events=events), now)
    assert lines[0] == "Xid 999 (12 s ago): not in hwdash's Xid list"
    assert lines[1].startswith("Xid 31 (10 min ago): ")
    assert lines[-1] == f"(+{len(events) - XIDS_SHOWN} older Xid events: see --json)"
    assert len(lines) == XIDS_SHOWN + 1


def test_utilization_alone_is_no_line_but_is_labelled_beside_a_diagnosis() -> None:
    activity = GpuActivity(source="utilization", sm_active=40.0)
    assert health_lines(_gpu(activity=activity), 0.0) == []
    assert health_lines(_gpu(nvlink=NvLinkState(links=0, active=0)), 0.0) == []
    diagnosis = Diagnosis("throttled", "throttled (power cap) 30% of the last minute", 0.0, "")
    assert health_lines(_gpu(activity=activity, diagnoses=(diagnosis,)), 0.0) == [
        "utilization 40% (not SM activity)",
        "throttled: throttled (power cap) 30% of the last minute",
    ]


def test_health_lines_fit_an_80_column_terminal() -> None:
    diagnosis = Diagnosis("xid", "Xid 31: GPU memory page fault", 0.0, "word " * 40)
    gpu = _gpu(
        activity=GpuActivity(source="gpm", sm_active=5.0, tensor_active=1.0, dram_active=2.0),
        nvlink=NvLinkState(links=18, active=17),
        diagnoses=(diagnosis,),
        total_bytes=80 * 2**30,
        free_bytes=40 * 2**30,
    )
    snapshot = Snapshot(timestamp=0.0, nvml=NvmlStatus(available=True), gpus=(gpu,), host=None)
    for width in (80, 132):
        buffer = io.StringIO()
        print_readable(snapshot, [], Console(file=buffer, width=width, highlight=False))
        lines = buffer.getvalue().splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("GPU 0  "))
        block = lines[start : start + 5]
        assert block[0].rstrip() == "GPU 0  SM active 5%, tensor 1%, DRAM 2% (GPM); NVLink 17/18 up"
        assert all(len(line) <= 80 for line in block)
        assert block[1].startswith("       xid: Xid 31")
        assert all(line.startswith("       word") for line in block[2:])
