"""The history ring (:mod:`hwdash.telemetry.history_ring`): tiers, caps, kills, one writer, report."""

from __future__ import annotations

import argparse
import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hwdash.cli import main
from hwdash.commands.monitor import history_ring, say_history, with_history
from hwdash.errors import UsageError
from hwdash.telemetry.fake_scenario import ManualClock
from hwdash.telemetry.history_ring import (
    HistoryCache,
    HistoryRing,
    RecordingSampler,
    default_history_dir,
    downsample,
    gpu_use,
    read_history,
)
from hwdash.telemetry.replay import read_replay
from hwdash.telemetry.snapshot_json import snapshot_to_dict
from hwdash.telemetry.source import make_sampler
from hwdash.telemetry.types import Snapshot

T0 = 1_800_000_000.0
"""A scripted start on a 10-minute boundary (the raw tier's segments start on those)."""


def _lines(directory: Path, prefix: str) -> list[dict[str, Any]]:
    found = []
    for path in sorted(directory.glob(f"{prefix}*.jsonl")):
        found += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return found


def _disk_bytes(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.glob("*.jsonl"))


class _Scripted:
    """The fake NVML driven by a manual clock, its snapshots stamped with scenario time from T0:
    hours of samples in a moment."""

    def __init__(self, scenario: str, clock: ManualClock) -> None:
        self.inner = make_sampler(
            scenario, clock=clock, environ={}, wall_clock=lambda: T0 + clock()
        )
        self.clock = clock

    def sample(self) -> Snapshot:
        return self.inner.sample()

    def close(self) -> None:
        self.inner.close()


def test_a_two_hour_run_at_one_second_leaves_an_hour_of_samples_and_every_minute(
    tmp_path: Path,
) -> None:
    """7200 samples of the fake NVML, 1 s of scenario time apart (2 hours; 10x the 12 minutes a
    real run at 10x speed would take, with no sleeping): the raw tier keeps its last 10-minute
    segments back to the hour (60 to 70 minutes: 4200 samples here), the minute tier every minute
    (120), and reading the directory gives the 50 minutes the raw tier dropped as minute points and
    then every sample."""
    clock = ManualClock()
    ring = HistoryRing(tmp_path)
    assert ring.open()
    sampler = RecordingSampler(_Scripted("a100x4-training", clock), ring)
    for _ in range(7200):
        sampler.sample()
        clock.advance(1.0)
    sampler.close()

    raw = _lines(tmp_path, "raw-")
    minutes = _lines(tmp_path, "1m-")
    assert len(raw) == 4200
    assert raw[0]["timestamp"] == T0 + 3000 and raw[-1]["timestamp"] == T0 + 7199
    assert len(minutes) == 120
    assert [point["timestamp"] for point in minutes] == [T0 + 60 * n for n in range(120)]
    assert all(point["downsampled"] == {"seconds": 60.0, "samples": 60} for point in minutes)
    assert len(list(tmp_path.glob("raw-*.jsonl"))) == 7  # 10-minute segments, older ones gone

    # The reductions: a minute still in the raw tier against its minute point.
    minute = next(point for point in minutes if point["timestamp"] == T0 + 6000)
    samples = [point for point in raw if T0 + 6000 <= point["timestamp"] < T0 + 6060]
    assert len(samples) == 60
    for gpu in minute["gpus"]:
        readings = [g for s in samples for g in s["gpus"] if g["index"] == gpu["index"]]
        assert gpu["memory_used_bytes"] == max(g["memory_used_bytes"] for g in readings)
        assert gpu["memory_free_bytes"] == min(g["memory_free_bytes"] for g in readings)
        assert gpu["temperature_c"] == max(g["temperature_c"] for g in readings)
        assert gpu["power_w"] == max(g["power_w"] for g in readings)
        mean = sum(g["utilization_gpu"] for g in readings) / 60
        assert gpu["utilization_gpu"] == pytest.approx(mean)

    found = read_history(tmp_path)
    assert found.skipped == 0
    assert len(found.points) == 50 + 4200
    stamps = [point["timestamp"] for point in found.points]
    assert stamps == sorted(stamps)
    assert stamps[49] == T0 + 49 * 60 and stamps[50] == T0 + 3000

    # Replay reads the directory back as snapshots.
    snapshots, warnings = read_replay(tmp_path)
    assert len(snapshots) == 4250 and warnings == []
    assert len(snapshots[-1].gpus) == 4


def _synthetic(count: int, start: float = T0, used: int = 10**9) -> list[dict[str, Any]]:
    """``count`` snapshot dicts 1 s apart, from one fake snapshot (cheaper than sampling)."""
    sampler = make_sampler("h100x8", clock=ManualClock(), environ={})
    template = snapshot_to_dict(sampler.sample())
    sampler.close()
    points = []
    for n in range(count):
        point = copy.deepcopy(template)
        point["timestamp"] = start + n
        for gpu in point["gpus"]:
            gpu["memory_used_bytes"] = used + n
        points.append(point)
    return points


def test_the_directory_stays_under_its_size_cap(tmp_path: Path) -> None:
    cap = 256 * 1024
    ring = HistoryRing(tmp_path, max_size_bytes=cap)
    assert ring.open()
    for n, point in enumerate(_synthetic(900)):
        ring.add(point)
        if n % 25 == 0:
            assert _disk_bytes(tmp_path) <= cap
            assert ring.total_bytes == _disk_bytes(tmp_path)
    ring.close()
    assert _disk_bytes(tmp_path) <= cap
    kept = read_history(tmp_path).points
    # The newest samples are the ones kept, in order, up to the last one.
    assert kept[-1]["timestamp"] == T0 + 899
    assert 10 < len(kept) < 900


def test_the_minute_tier_is_capped_by_age(tmp_path: Path) -> None:
    """A day of 1-minute points with a 12-hour age cap: closed 6-hour segments wholly older than
    12 hours are gone (raw samples only every 30 s to keep the test quick)."""
    ring = HistoryRing(tmp_path, max_age_s=12 * 3600)
    assert ring.open()
    template = _synthetic(1)[0]
    for n in range(0, 24 * 3600, 30):
        point = dict(template, timestamp=T0 + n)
        ring.add(point)
    ring.close()
    minutes = _lines(tmp_path, "1m-")
    assert minutes[-1]["timestamp"] == T0 + 24 * 3600 - 60
    oldest = minutes[0]["timestamp"]
    assert T0 + 6 * 3600 <= oldest <= T0 + 12 * 3600  # the first 6-hour segment was deleted


def test_a_kill_mid_write_leaves_a_cut_line_that_readers_skip(tmp_path: Path) -> None:
    ring = HistoryRing(tmp_path)
    assert ring.open()
    points = _synthetic(30)
    for point in points[:20]:
        ring.add(point)
    ring.close()
    # The kill: half of the next line written, no newline.
    (segment,) = tmp_path.glob("raw-*.jsonl")
    half = json.dumps(points[20])
    with segment.open("a") as handle:
        handle.write(half[: len(half) // 2])
    found = read_history(tmp_path)
    assert len(found.points) == 20 and found.skipped == 1
    snapshots, warnings = read_replay(tmp_path)
    assert len(snapshots) == 20 and warnings == []

    # The next process records on; the cut line stays skipped and nothing else is lost.
    again = HistoryRing(tmp_path)
    assert again.open()
    for point in points[21:]:
        again.add(point)
    again.close()
    found = read_history(tmp_path)
    assert [p["timestamp"] for p in found.points] == [T0 + n for n in range(30) if n != 20]
    assert found.skipped == 1


def test_the_cache_reads_only_what_changed_and_agrees_with_read_history(tmp_path: Path) -> None:
    ring = HistoryRing(tmp_path)
    assert ring.open()
    points = _synthetic(700)  # two raw segments (10 minutes each) and a minute segment
    for point in points[:650]:
        ring.add(point)
    cache = HistoryCache()

    def same(found: Any) -> None:
        expected = read_history(tmp_path)
        assert found.points == expected.points and found.skipped == expected.skipped

    first = cache.read(tmp_path)
    same(first)
    assert first.read_bytes == _disk_bytes(tmp_path) and len(first.points) == 650
    again = cache.read(tmp_path)  # nothing changed: no segment is read
    same(again)
    assert again.read_bytes == 0

    before = _disk_bytes(tmp_path)
    for point in points[650:]:  # the ring records on: only the new lines are read
        ring.add(point)
    ring.close()
    grown = cache.read(tmp_path)
    same(grown)
    assert grown.read_bytes == _disk_bytes(tmp_path) - before
    assert [p["timestamp"] for p in grown.points] == [T0 + n for n in range(700)]

    # A cut line at the end is counted, and a pruned segment is forgotten.
    newest = max(tmp_path.glob("raw-*.jsonl"))
    with newest.open("a") as handle:
        handle.write('{"timestamp": 1')
    same(cache.read(tmp_path))
    cut = cache.read(tmp_path)
    assert cut.skipped == 1 and cut.cut == 1
    min(tmp_path.glob("raw-*.jsonl")).unlink()
    pruned = cache.read(tmp_path)
    same(pruned)
    raw = [p["timestamp"] for p in pruned.points if "downsampled" not in p]
    assert raw[0] == T0 + 600 and "downsampled" in pruned.points[0] and not pruned.errors


def test_the_cache_names_a_segment_it_cannot_read(tmp_path: Path) -> None:
    ring = HistoryRing(tmp_path)
    assert ring.open()
    for point in _synthetic(5):
        ring.add(point)
    ring.close()
    (tmp_path / "raw-0000000000001.jsonl").mkdir()  # a segment's name on something unreadable
    found = HistoryCache().read(tmp_path)
    assert len(found.points) == 5
    assert len(found.errors) == 1 and found.errors[0].startswith("raw-0000000000001.jsonl: ")


def test_two_writers_on_one_box_one_records(tmp_path: Path) -> None:
    first = HistoryRing(tmp_path)
    second = HistoryRing(tmp_path)
    assert first.open()
    assert not second.open()  # at once: no waiting for the lock
    assert second.note is not None and f"process {os.getpid()}" in second.note
    points = _synthetic(3)
    for point in points:
        first.add(point)
        second.add(point)
    first.close()
    assert len(_lines(tmp_path, "raw-")) == 3  # not 6
    third = HistoryRing(tmp_path)
    assert third.open()  # the lock went with the first writer
    third.close()


def _args(**values: Any) -> argparse.Namespace:
    base = {
        "history_dir": None,
        "history_max_age": None,
        "history_max_size": None,
        "no_history": False,
    }
    return argparse.Namespace(**{**base, **values})


def test_which_processes_record_and_the_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The box's own NVML records to the default directory (HWDASH_HISTORY_DIR, set by conftest).
    ring = history_ring(_args(), simulated=False)
    assert ring is not None and ring.directory == default_history_dir()
    assert ring.directory == Path(os.environ["HWDASH_HISTORY_DIR"])
    # A fake scenario only where a directory is named; --no-history never.
    assert history_ring(_args(), simulated=True) is None
    named = history_ring(_args(history_dir=str(tmp_path)), simulated=True)
    assert named is not None and named.directory == tmp_path
    assert history_ring(_args(no_history=True), simulated=False) is None
    sized = history_ring(_args(history_max_age="36h", history_max_size="1M"), simulated=False)
    assert sized is not None
    assert (sized.max_age_s, sized.max_size_bytes) == (36 * 3600, 1024 * 1024)
    for flag, value in (("history_max_age", "soon"), ("history_max_size", "1K")):
        with pytest.raises(UsageError) as caught:
            history_ring(_args(**{flag: value}), simulated=False)
        assert caught.value.flag == "--" + flag.replace("_", "-")

    # A second sampler on the box: wrapped, not recording, and says so once.
    sampler = make_sampler("a100x4-training", clock=ManualClock(), environ={})
    _first, first_ring = with_history(sampler, _args(history_dir=str(tmp_path)), simulated=True)
    _second, second_ring = with_history(sampler, _args(history_dir=str(tmp_path)), simulated=True)
    assert first_ring is not None and first_ring.recording
    assert second_ring is not None and not second_ring.recording
    say_history(first_ring)
    say_history(second_ring)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already records this box" in err
    first_ring.close()


def test_default_directory_follows_xdg_state_home() -> None:
    assert default_history_dir({"XDG_STATE_HOME": "/s"}) == Path("/s/hwdash/history")
    assert default_history_dir({"HWDASH_HISTORY_DIR": "/h", "XDG_STATE_HOME": "/s"}) == Path("/h")


def test_monitor_records_a_named_directory_and_replays_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    history = tmp_path / "history"
    argv = ["monitor", "--fake-nvml", "a100x4-training", "--interval", "0.05", "--count", "3"]
    assert main([*argv, "--json", "--history-dir", str(history)]) == 0
    assert len(_lines(history, "raw-")) == 3
    assert main([*argv, "--json"]) == 0  # a fake scenario without the flag: not recorded
    assert len(_lines(history, "raw-")) == 3
    capsys.readouterr()
    assert main(["monitor", "--replay", str(history), "--speed", "0", "--json"]) == 0
    replayed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(replayed) == 3 and len(replayed[0]["gpus"]) == 4


def test_report_reads_busy_idle_and_peak_from_the_history(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two hours of history ending now: a process on every GPU for the first hour, none in the
    second; the minute tier holds the first hour, the raw tier the second."""
    now = time.time()
    start = now - 7200
    ring = HistoryRing(tmp_path)
    assert ring.open()
    busy = _synthetic(1, used=40 * 2**30)[0]
    idle = copy.deepcopy(busy)
    for gpu in idle["gpus"]:
        gpu["processes"] = []
        gpu["utilization_gpu"] = 0.0
        gpu["memory_used_bytes"] = 2**30
    for n in range(0, 7200, 2):
        point = copy.deepcopy(busy if n < 3600 else idle)
        point["timestamp"] = start + n
        ring.add(point)
    ring.close()

    assert main(["report", "--since", "12h", "--json", "--history-dir", str(tmp_path)]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["sources"]["history"] == str(tmp_path)
    gpus = document["gpus"]
    assert len(gpus) == 8
    for gpu in gpus:
        assert gpu["observed_s"] == pytest.approx(7200, abs=70)
        assert gpu["busy_s"] == pytest.approx(3600, abs=70)
        assert gpu["idle_s"] == pytest.approx(3600, abs=70)
        assert gpu["peak_measured_bytes"] == 40 * 2**30
        assert gpu["runs"] == []
    assert main(["report", "--since", "12h", "--history-dir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "history ring watched" in text and f"history: {tmp_path}" in text
    # Without a history (the default directory is empty here), no GPU: as before.
    assert main(["report", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpus"] == []


def test_gpu_use_counts_a_gap_as_unwatched() -> None:
    points = _synthetic(10) + _synthetic(10, start=T0 + 1000)
    uses = gpu_use(points, T0, T0 + 2000)
    assert all(use.observed_s == pytest.approx(20) for use in uses)


def test_downsample_keeps_the_worst_state_and_every_process() -> None:
    first, second = _synthetic(2)
    second["gpus"][0]["state"] = "lost"
    second["gpus"][0]["processes"] = [{"pid": 4242, "used_bytes": 5}]
    point = downsample([first, second], T0)
    assert point["gpus"][0]["state"] == "lost"
    pids = {process["pid"] for process in point["gpus"][0]["processes"]}
    assert 4242 in pids and len(pids) == 1 + len(first["gpus"][0]["processes"])


def _wait_for(predicate: Any, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_two_monitors_one_records_and_a_killed_one_leaves_a_readable_history(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real ``hwdash monitor`` process records; a second monitor meanwhile says once that it does
    not and writes nothing; the first is killed (SIGKILL, whatever it was writing) and the
    history reads without an error, and the next monitor records again."""
    history = tmp_path / "history"
    argv = ["monitor", "--fake-nvml", "a100x4-training", "--history-dir", str(history)]
    first = subprocess.Popen(
        [sys.executable, "-m", "hwdash", *argv, "--interval", "0.02", "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_for(lambda: len(_lines(history, "raw-")) >= 5)
        assert main([*argv, "--interval", "0.02", "--count", "3"]) == 0
        err = capsys.readouterr().err
        assert err.count("already records this box") == 1
        assert f"process {first.pid}" in err
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    found = read_history(history)
    assert len(found.points) >= 5 and found.skipped <= 1
    stamps = [point["timestamp"] for point in found.points]
    assert stamps == sorted(stamps)
    before = len(found.points)
    assert main([*argv, "--interval", "0.02", "--count", "3", "--json"]) == 0
    assert "already records" not in capsys.readouterr().err  # the kill let go of the lock
    assert len(read_history(history).points) == before + 3


def test_a_box_without_a_driver_records_nothing(tmp_path: Path) -> None:
    ring = HistoryRing(tmp_path)
    sampler = RecordingSampler(make_sampler("no-driver", clock=ManualClock(), environ={}), ring)
    assert ring.open()
    for _ in range(3):
        assert sampler.sample().gpus == ()
    sampler.close()
    assert _lines(tmp_path, "raw-") == [] and _lines(tmp_path, "1m-") == []


def test_reading_a_window_leaves_older_points_out(tmp_path: Path) -> None:
    template = _synthetic(1)[0]
    ring = HistoryRing(tmp_path)
    assert ring.open()
    for n in range(0, 4 * 3600, 10):
        ring.add({**template, "timestamp": T0 + n})
    ring.close()
    found = read_history(tmp_path, since=T0 + 3 * 3600, until=T0 + 3 * 3600 + 600)
    stamps = [point["timestamp"] for point in found.points]
    assert stamps[0] >= T0 + 3 * 3600 - 60 and stamps[-1] <= T0 + 3 * 3600 + 600
    assert len(stamps) == 61  # the raw tier's points every 10 s, both ends in
