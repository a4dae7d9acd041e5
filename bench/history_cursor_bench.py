"""Benchmark the monitor's time cursor on a large history: the read and the frame stall.

Usage: .venv/bin/python bench/history_cursor_bench.py [--minutes 60] [--gpus-scenario h100x8]

1. Writes ``--minutes`` of samples 1 s apart with the ring's own writer
   (:class:`hwdash.telemetry.history_ring.HistoryRing`) into a scratch directory, from the fake
   scenario's snapshot (8 GPUs, a process each: the ring's measured ~10.5 KB a line).
2. Times :func:`read_history` on it (cold) and the time cursor's reader (cold, then again with
   nothing changed: the cache).
3. Runs the dashboard (``App.run_test`` on the same fake scenario), presses ``[`` and measures the
   longest gap of a 5 ms ticker on the event loop from the key until the historic frame is shown:
   the stall a user sees as a frozen frame.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

from hwdash.telemetry.fake_scenario import ManualClock
from hwdash.telemetry.history_ring import HistoryCache, HistoryRing, read_history
from hwdash.telemetry.snapshot_json import snapshot_to_dict
from hwdash.telemetry.source import make_sampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "ui"))


def write_history(directory: Path, scenario: str, seconds: int) -> float:
    """``seconds`` samples 1 s apart ending now; returns the first timestamp."""
    sampler = make_sampler(scenario, clock=ManualClock(), environ={})
    template = snapshot_to_dict(sampler.sample())
    sampler.close()
    ring = HistoryRing(directory)
    assert ring.open(), ring.note
    start = time.time() - seconds
    for n in range(seconds):
        point = copy.deepcopy(template)
        point["timestamp"] = start + n
        point["gpus"][0]["memory_used_bytes"] = (n + 1) * 2**20
        ring.add(point)
    ring.close()
    return start


def timed(function: object, repeat: int = 3) -> float:
    samples = []
    for _ in range(repeat):
        began = time.perf_counter()
        function()  # type: ignore[operator]
        samples.append(time.perf_counter() - began)
    return statistics.median(samples)


async def frame_stall(directory: Path, scenario: str, start: float, seconds: int) -> None:
    from snapshot_apps.fake_dashboard import fake_app, wait_for_frames

    app, _clock = fake_app(scenario, data_dir=directory.parent, start_s=30)
    app.time_cursor.directory = directory
    gaps: list[float] = []
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for_frames(pilot, app, 1)
        stop = False

        async def ticker() -> None:
            last = time.perf_counter()
            while not stop:
                await asyncio.sleep(0.005)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0.05)
        gaps.clear()
        began = time.perf_counter()
        await pilot.press("left_square_bracket")
        key_returned = time.perf_counter() - began
        while app.monitor.frame is None or app.monitor.frame.snapshot.timestamp != start + (
            seconds - 1
        ):
            await asyncio.sleep(0.005)
        shown = time.perf_counter() - began
        stop = True
        await task
    # pilot.press returns once the process's CPU is idle (Textual's wait_for_idle), so it also
    # waits for a read in a worker thread; the ticker's longest gap is the frame stall.
    print(
        f"dashboard `[`: pilot.press returned after {key_returned * 1000:.0f} ms, historic frame after "
        f"{shown * 1000:.0f} ms, longest event-loop stall {max(gaps) * 1000:.0f} ms "
        f"(5 ms ticker, {len(gaps)} ticks)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, default=60)
    parser.add_argument("--scenario", default="h100x8")
    args = parser.parse_args()
    seconds = args.minutes * 60
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch) / "history"
        began = time.perf_counter()
        start = write_history(directory, args.scenario, seconds)
        size = sum(p.stat().st_size for p in directory.glob("*.jsonl"))
        files = len(list(directory.glob("*.jsonl")))
        print(
            f"wrote {seconds} samples in {time.perf_counter() - began:.1f} s: "
            f"{size / 1e6:.1f} MB in {files} segments"
        )
        print(f"read_history: {timed(lambda: read_history(directory)) * 1000:.0f} ms (median of 3)")
        cache = HistoryCache()
        cold = timed(lambda: cache.read(directory), repeat=1)
        warm = timed(lambda: cache.read(directory))
        print(f"HistoryCache.read: cold {cold * 1000:.0f} ms, unchanged {warm * 1000:.1f} ms")
        asyncio.run(frame_stall(directory, args.scenario, start, seconds))


if __name__ == "__main__":
    main()
