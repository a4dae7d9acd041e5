"""``hwdash report``'s summary, computed from records and alert events (no files)."""

from __future__ import annotations

import datetime as dt

import pytest
from ledger_records import H100, make_record

from hwdash.errors import UsageError
from hwdash.runs.report import build_report, report_json, report_markdown, since_cutoff

NOW = 1_764_150_000.0
HOUR = 3600.0


@pytest.mark.parametrize(
    ("text", "back_s"),
    [
        ("30m", 1800.0),
        ("12h", 43200.0),
        ("2d", 172800.0),
        ("1.5h", 5400.0),
        ("90s", 90.0),
        ("1w", 604800.0),
    ],
)
def test_since_takes_a_duration_back_from_now(text: str, back_s: float) -> None:
    assert since_cutoff(text, NOW) == NOW - back_s


def test_since_takes_an_iso_date_in_local_time_or_with_an_offset() -> None:
    local = dt.datetime(2025, 11, 25, 18, 0).timestamp()
    assert since_cutoff("2025-11-25T18:00", NOW) == local
    assert since_cutoff("2025-11-25", NOW) == dt.datetime(2025, 11, 25).timestamp()
    assert (
        since_cutoff("2025-11-25T18:00:00Z", NOW)
        == dt.datetime(2025, 11, 25, 18, tzinfo=dt.timezone.utc).timestamp()
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("yesterday", "--since: 'yesterday' is neither a duration (30m, 12h, 2d) nor an ISO date"),
        ("12", "--since: '12' is neither a duration"),
        ("0h", "--since: '0h' is no time at all"),
        ("2099-01-01", "--since: 2099-01-01 is in the future"),
    ],
)
def test_a_bad_since_is_a_usage_error(text: str, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        since_cutoff(text, NOW)
    assert str(caught.value).startswith(message)


def test_per_gpu_runs_busy_and_idle_time_energy_cost_and_alerts() -> None:
    since = NOW - 12 * HOUR
    # Run a: 2 GPUs, started before the window, its last 2 h inside it.
    a = make_record(1, since - HOUR, seconds=3 * HOUR, gpus=(0, 1), energy_kwh=2.0, cost_usd=9.0)
    # Run b: GPU 0, 3 h, overlapping run a by 1 h; larger peak.
    b = make_record(
        2,
        since + HOUR,
        seconds=3 * HOUR,
        energy_kwh=0.9,
        cost_usd=13.5,
        measured_peak_bytes=70_000_000_000,
    )
    # Run c: another host's GPU 0 (another UUID), no energy or cost known.
    c = make_record(3, since + 5 * HOUR, seconds=HOUR, host="other", energy_kwh=None, cost_usd=None)
    c["gpus"] = [{"uuid": "GPU-ffff", "name": "NVIDIA A100-SXM4-80GB", "index": 0}]
    alerts = [
        {
            "kind": "raised",
            "gpu_index": 0,
            "host": "box",
            "timestamp": since + 2 * HOUR,
            "message": "GPU 0 at 95%",
        },
        {
            "kind": "cleared",
            "gpu_index": 0,
            "host": "box",
            "timestamp": since + 2.1 * HOUR,
            "message": "ok",
        },
        {
            "kind": "blind",
            "gpu_index": 1,
            "host": "box",
            "timestamp": since + 3 * HOUR,
            "message": "no data",
        },
        {
            "kind": "raised",
            "gpu_index": 5,
            "host": "box",
            "timestamp": since + 4 * HOUR,
            "message": "GPU 5",
        },
        {
            "kind": "raised",
            "gpu_index": 0,
            "host": "box",
            "timestamp": since - 1,
            "message": "before",
        },
        # No host: GPU 1 is one GPU of the window (box's); GPU 0 is two (box's and other's).
        {"kind": "lost", "gpu_index": 1, "timestamp": since + 6 * HOUR, "message": "GPU 1 lost"},
        {
            "kind": "raised",
            "gpu_index": 0,
            "timestamp": since + 7 * HOUR,
            "message": "which GPU 0?",
        },
    ]
    report = build_report([a, b, c], alerts, since, NOW)
    by_uuid = {gpu.uuid: gpu for gpu in report.gpus}
    box0, box1, other0 = by_uuid["GPU-0000-aaaa"], by_uuid["GPU-0001-aaaa"], by_uuid["GPU-ffff"]
    assert [gpu.uuid for gpu in report.gpus] == ["GPU-0000-aaaa", "GPU-0001-aaaa", "GPU-ffff"]
    assert box0.runs == [a["id"], b["id"]] and box1.runs == [a["id"]] and other0.runs == [c["id"]]
    # GPU 0: run a covers [since, since+2h], run b [since+1h, since+4h]: busy 4 h, idle 8 h.
    assert box0.busy_s == 4 * HOUR and box0.idle_s == 8 * HOUR
    assert box1.busy_s == 2 * HOUR and box1.idle_s == 10 * HOUR
    assert other0.busy_s == HOUR and other0.idle_s == 11 * HOUR
    # Run a's energy and cost split over its two GPUs.
    assert box0.energy_kwh == pytest.approx(1.0 + 0.9) and box0.cost_usd == pytest.approx(
        4.5 + 13.5
    )
    assert box1.energy_kwh == pytest.approx(1.0) and box1.cost_usd == pytest.approx(4.5)
    assert other0.energy_kwh is None and other0.cost_usd is None
    assert box0.peak_measured_bytes == 70_000_000_000 and box1.peak_measured_bytes == 61_000_000_000
    assert [e["message"] for e in box0.alerts] == ["GPU 0 at 95%"]
    assert [e["message"] for e in box1.alerts] == ["no data", "GPU 1 lost"]
    assert other0.alerts == []
    assert [e["message"] for e in report.other_alerts] == ["GPU 5", "which GPU 0?"]
    assert len(report.alerts) == 5
    assert report.energy_kwh == pytest.approx(2.9) and report.cost_usd == pytest.approx(22.5)
    document = report_json(report)
    assert document["gpus"][0] == {
        "uuid": "GPU-0000-aaaa",
        "name": H100,
        "index": 0,
        "host": "box",
        "runs": [a["id"], b["id"]],
        "busy_s": 4 * HOUR,
        "idle_s": 8 * HOUR,
        "peak_measured_bytes": 70_000_000_000,
        "energy_kwh": pytest.approx(1.9),
        "cost_usd": pytest.approx(18.0),
        "alerts": 1,
    }
    markdown = report_markdown(report)
    assert (
        "| box: 0 NVIDIA H100 80GB HBM3 | GPU-0000-aaaa | 2 | 4h00m | 8h00m | 65.2 GiB | 1.90 | $18.00 | 1 |"
        in markdown
    )
    assert (
        "| other: 0 NVIDIA A100-SXM4-80GB | GPU-ffff | 1 | 1h00m | 11h00m | 56.8 GiB | - | - | 0 |"
        in markdown
    )
    assert "idle = the part of the window with no recorded run on that GPU" in markdown


def test_a_record_with_fields_of_the_wrong_type_still_reports() -> None:
    broken = make_record(1, NOW - HOUR, tokens_per_s="fast", mfu=True, energy_kwh=[1], ended="late")
    broken["gpus"] = [{"uuid": 7}, "GPU-x", {"index": 2, "name": None}]
    report = build_report([broken], [], NOW - 12 * HOUR, NOW)
    [gpu] = report.gpus
    assert gpu.index == 2 and gpu.uuid is None and gpu.busy_s == 0.0 and gpu.idle_s == 12 * HOUR
    assert report.energy_kwh is None
    row = next(
        line
        for line in report_markdown(report).splitlines()
        if line.startswith(f"| {broken['id']}")
    )
    assert row.split(" | ")[1:6] == ["-", "1h00m", "llama-3.1-8b lora", "-", "-"]
