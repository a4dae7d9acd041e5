"""The monitor's time cursor: ``[ ] { }`` look back in this box's history ring, ``end`` is live."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

from snapshot_apps.fake_dashboard import fake_app, wait_for_frames

from hwdash.telemetry.fake_scenario import ManualClock
from hwdash.telemetry.history_ring import HistoryRing
from hwdash.telemetry.snapshot_json import snapshot_to_dict
from hwdash.telemetry.source import make_sampler
from hwdash.ui.time_cursor import TimeCursor

GIB = 2**30


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
        await pilot.pause()
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
