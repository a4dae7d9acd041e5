"""The monitor's time cursor: ``[ ] { }`` look back in this box's history ring, ``end`` is live."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from snapshot_apps.fake_dashboard import fake_app, wait_for_frames

from hwdash.telemetry import history_ring
from hwdash.telemetry.fake_scenario import ManualClock
from hwdash.telemetry.history_ring import HistoryCache, HistoryRead, HistoryRing
from hwdash.telemetry.snapshot_json import snapshot_to_dict
from hwdash.telemetry.source import make_sampler
from hwdash.ui.app import HwdashApp
from hwdash.ui.time_cursor import TimeCursor

GIB = 2**30


async def _read_done(pilot: Any, app: HwdashApp) -> None:
    """Wait for the history reads in flight (worker threads) and what they hand to the UI."""
    for worker in list(app.workers):
        if worker.group == "history":
            await worker.wait()
    await pilot.pause()


class _HeldReader:
    """A reader that waits, on its worker thread, until the test lets read number n end (a
    slow disk); ``cut`` keeps only the first points of a read (to tell reads apart)."""

    def __init__(self, cut: dict[int, int] | None = None) -> None:
        self.go: list[threading.Event] = [threading.Event() for _ in range(4)]
        self.started: list[threading.Event] = [threading.Event() for _ in range(4)]
        self.calls = 0
        self.threads: list[str] = []
        self.cut = cut or {}
        self.inner: Callable[[Path], HistoryRead] = HistoryCache()

    def __call__(self, directory: Path) -> HistoryRead:
        number = self.calls
        self.calls += 1
        self.threads.append(threading.current_thread().name)
        self.started[number].set()
        self.go[number].wait(timeout=3)  # on the UI thread (before the fix) this froze the app
        read = self.inner(directory)
        if number in self.cut:
            read.points = read.points[: self.cut[number]]
        return read


def _record(directory: Path, count: int, start: float) -> list[dict[str, Any]]:
    """``count`` points 1 s apart from ``start``, GPU 0's memory used = n GiB at point n."""
    sampler = make_sampler("h100x8", clock=ManualClock(), environ={})
    template = snapshot_to_dict(sampler.sample())
    sampler.close()
    ring = HistoryRing(directory)
    assert ring.open()
    points = []
    for n in range(count):
        point = copy.deepcopy(template)
        point["timestamp"] = start + n
        point["gpus"][0]["memory_used_bytes"] = (n + 1) * GIB
        ring.add(point)
        points.append(point)
    ring.close()
    return points


def test_the_cursor_steps_jumps_and_returns_to_live(tmp_path: Path) -> None:
    start = time.time() - 1200
    _record(tmp_path, 1200, start)
    cursor = TimeCursor(tmp_path)
    assert cursor.live and cursor.frame() is None
    assert not cursor.step(1)  # forward from live: nowhere to go
    assert cursor.step(-1)
    frame = cursor.frame()
    assert frame is not None and frame.snapshot.timestamp == start + 1199
    assert frame.snapshot.gpus[0].used_bytes == 1200 * GIB
    assert len(frame.history_for(0)) == 120  # the sparkline: the points before it
    assert cursor.step(-2) and cursor.frame().snapshot.timestamp == start + 1197  # type: ignore[union-attr]
    assert cursor.jump(-600) and cursor.frame().snapshot.timestamp == start + 597  # type: ignore[union-attr]
    assert "History" in cursor.note() and "598/1200" in cursor.note()
    assert cursor.jump(-6000) and cursor.position == 0  # not before the first point
    assert cursor.jump(6000) and cursor.live  # past the newest: live
    assert cursor.note() == ""
    # From live, a jump back is from now.
    assert cursor.jump(-300)
    assert abs(cursor.frame().snapshot.timestamp - (time.time() - 300)) < 5  # type: ignore[union-attr]


def test_no_history_says_so() -> None:
    assert not TimeCursor(None).step(-1)
    assert not TimeCursor(Path("/nonexistent/history")).jump(-600)


async def test_the_monitor_looks_back_and_end_returns_to_live(tmp_path: Path) -> None:
    history = tmp_path / "history"
    start = time.time() - 900
    _record(history, 900, start)
    app, _clock = fake_app("h100x8", data_dir=tmp_path, start_s=30)
    app.time_cursor.directory = history
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for_frames(pilot, app, 1)
        live = app.monitor.frame
        assert live is not None
        await pilot.press("left_square_bracket")
        await _read_done(pilot, app)  # the history is read in a worker thread
        shown = app.monitor.frame
        assert shown is not None and shown.snapshot.timestamp == start + 899
        assert app.monitor.source_note.startswith("History ")
        await pilot.press("left_curly_bracket")
        await pilot.pause()
        assert app.monitor.frame is not None
        assert app.monitor.frame.snapshot.timestamp == start + 299
        # Live frames keep coming and are not shown while looking back.
        received = app.frames_received
        app.sampling.request_sample()  # type: ignore[union-attr]
        await wait_for_frames(pilot, app, received + 1)
        assert app.monitor.frame.snapshot.timestamp == start + 299
        await pilot.press("right_square_bracket")
        await pilot.pause()
        assert app.monitor.frame.snapshot.timestamp == start + 300
        await pilot.press("end")
        await pilot.pause()
        assert app.monitor.source_note == ""
        assert app.monitor.frame is not None
        assert app.monitor.frame.snapshot.timestamp > start + 899  # a live frame again


async def test_without_a_history_the_keys_warn(tmp_path: Path) -> None:
    app, _clock = fake_app("h100x8", data_dir=tmp_path, start_s=30)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for_frames(pilot, app, 1)
        before = app.monitor.frame
        await pilot.press("left_square_bracket")
        await pilot.pause()
        assert app.monitor.frame is before
        assert any("no history" in str(n.message) for n in app._notifications)


async def test_the_key_returns_at_once_while_a_slow_read_runs(tmp_path: Path) -> None:
    history = tmp_path / "history"
    start = time.time() - 900
    _record(history, 900, start)
    reader = _HeldReader()
    app, _clock = fake_app("h100x8", data_dir=tmp_path, start_s=30)
    app.time_cursor = TimeCursor(history, reader=reader)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for_frames(pilot, app, 1)
        began = time.perf_counter()
        await pilot.press("left_square_bracket")
        assert time.perf_counter() - began < 1.0  # the read is held for 3 s
        assert reader.started[0].wait(timeout=5)
        assert reader.threads[0] != threading.main_thread().name
        # Meanwhile the monitor says it reads and stays live: a new sample is shown.
        assert app.reading_history and app.time_cursor.live
        assert app.monitor.source_note.startswith("Reading history in ")
        received = app.frames_received
        app.sampling.request_sample()  # type: ignore[union-attr]
        await wait_for_frames(pilot, app, received + 1)
        assert app.monitor.frame is app._live_frame
        await pilot.press("left_square_bracket")  # a second `[` waits for the read
        reader.go[0].set()
        await _read_done(pilot, app)
        assert not app.reading_history
        shown = app.monitor.frame
        assert shown is not None and shown.snapshot.timestamp == start + 898
        assert app.monitor.source_note.startswith("History ")
        assert reader.calls == 1


async def test_a_newer_move_wins_over_an_older_read(tmp_path: Path) -> None:
    history = tmp_path / "history"
    start = time.time() - 900
    _record(history, 900, start)
    reader = _HeldReader(cut={0: 100})  # the first read, were it used, would end at point 100
    app, _clock = fake_app("h100x8", data_dir=tmp_path, start_s=30)
    app.time_cursor = TimeCursor(history, reader=reader)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for_frames(pilot, app, 1)
        await pilot.press("left_square_bracket")
        assert reader.started[0].wait(timeout=5)
        await pilot.press("end")  # back to live before the read ends: it is dropped
        assert not app.reading_history and app.monitor.source_note == ""
        await pilot.press("left_curly_bracket")  # a newer read
        assert reader.started[1].wait(timeout=5)
        reader.go[1].set()
        await _read_done(pilot, app)
        newer = app.monitor.frame
        assert newer is not None and abs(newer.snapshot.timestamp - (time.time() - 600)) < 5
        reader.go[0].set()  # the older read ends last: ignored
        await _read_done(pilot, app)
        assert app.monitor.frame is newer
        assert len(app.time_cursor.points) == 900
        assert not any("could not" in str(n.message) for n in app._notifications)


async def test_a_corrupt_segment_or_a_failing_read_is_a_message(tmp_path: Path) -> None:
    history = tmp_path / "history"
    start = time.time() - 300
    _record(history, 300, start)
    segment = min(history.glob("raw-*.jsonl"))
    with segment.open("ab") as handle:
        handle.write(b"{not json at all}\n")
    with max(history.glob("raw-*.jsonl")).open("ab") as handle:
        handle.write(b'{"timestamp": 1')  # a line cut by a kill: skipped without a word
    (history / "raw-0000000000001.jsonl").mkdir()  # a segment that cannot be read
    app, _clock = fake_app("h100x8", data_dir=tmp_path, start_s=30)
    app.time_cursor.directory = history
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for_frames(pilot, app, 1)
        await pilot.press("left_square_bracket")
        await _read_done(pilot, app)
        shown = app.monitor.frame
        assert shown is not None and shown.snapshot.timestamp == start + 299
        (said,) = [str(n.message) for n in app._notifications if "history in" in str(n.message)]
        assert "1 unreadable line(s) skipped" in said and "raw-0000000000001.jsonl" in said

    def broken(directory: Path) -> HistoryRead:
        raise OSError(5, "Input/output error")

    app, _clock = fake_app("h100x8", data_dir=tmp_path, start_s=30)
    app.time_cursor = TimeCursor(history, reader=broken)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for_frames(pilot, app, 1)
        live = app.monitor.frame
        await pilot.press("left_square_bracket")
        await _read_done(pilot, app)
        assert app.time_cursor.live and app.monitor.frame is live
        assert app.monitor.source_note == "" and not app.reading_history
        assert any(
            "could not read the history" in str(n.message)
            and "Input/output error" in str(n.message)
            for n in app._notifications
        )


async def test_looking_back_again_reads_only_what_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    history = tmp_path / "history"
    start = time.time() - 900
    _record(history, 900, start)
    parsed: list[int] = []
    parse = history_ring._parse

    def counting(lines: Any, *args: Any) -> Any:
        lines = list(lines)
        parsed.append(len(lines))
        return parse(lines, *args)

    monkeypatch.setattr(history_ring, "_parse", counting)
    app, _clock = fake_app("h100x8", data_dir=tmp_path, start_s=30)
    app.time_cursor.directory = history
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for_frames(pilot, app, 1)
        await pilot.press("left_square_bracket")
        await _read_done(pilot, app)
        assert sum(parsed) >= 900
        parsed.clear()
        await pilot.press("end")
        await pilot.press("left_square_bracket")  # nothing changed: no line is read again
        await _read_done(pilot, app)
        assert sum(parsed) == 0
        assert app.monitor.frame is not None
        assert app.monitor.frame.snapshot.timestamp == start + 899
