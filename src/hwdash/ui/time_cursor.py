"""The monitor's time cursor: looking back through this box's history ring while sampling goes on.

``[`` / ``]`` step one recorded point back / forward, ``{`` / ``}`` jump :data:`JUMP_S` back /
forward, ``end`` returns to live. The history directory
(:mod:`hwdash.telemetry.history_ring`) is read when the cursor first leaves live, and again each
time it leaves live anew (the ring keeps growing meanwhile); the reader keeps what it read, so
reading again opens only the segments that changed (:class:`HistoryCache`). The dashboard reads
in a worker thread and hands the points over with :meth:`TimeCursor.give`
(:mod:`hwdash.ui.time_cursor_keys`). A point is shown as the monitor shows a
live frame, with the pressure of the points before it as its sparkline; alert states are not decided
again (the recorded lost and error states stay).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hwdash.telemetry.history_ring import HistoryCache, HistoryRead
from hwdash.telemetry.replay import snapshot_from_dict
from hwdash.ui.sampling import FRAME_HISTORY_POINTS, MonitorFrame

JUMP_S = 600.0
"""What ``{`` and ``}`` move by (ten minutes)."""


class TimeCursor:
    """Where in the history the monitor is (None: live), and the frames to show there."""

    def __init__(
        self, directory: Path | None, reader: Callable[[Path], HistoryRead] | None = None
    ) -> None:
        self.directory = directory
        """The history directory (None: this dashboard has none, e.g. a replay)."""
        self.reader: Callable[[Path], HistoryRead] = reader or HistoryCache()
        """Reads the directory (blocking: the dashboard calls it from a worker thread)."""
        self._given: list[dict[str, Any]] | None = None
        self.points: list[dict[str, Any]] = []
        self.position: int | None = None
        """Index of the point shown; None while live."""

    @property
    def live(self) -> bool:
        return self.position is None

    @property
    def has_directory(self) -> bool:
        """Whether there is a history directory to read (one ``stat``)."""
        return self.directory is not None and self.directory.is_dir()

    def give(self, points: list[dict[str, Any]]) -> None:
        """The points the next move from live starts from, read elsewhere (instead of reading)."""
        self._given = points

    def _load(self) -> bool:
        if self._given is not None:
            self.points, self._given = self._given, None
            return bool(self.points)
        if self.directory is None or not self.directory.is_dir():
            return False
        self.points = self.reader(self.directory).points
        return bool(self.points)

    def step(self, by: int) -> bool:
        """Move ``by`` points (negative: back); from live, ``-1`` is the newest point. Moving past
        the newest point returns to live. False when there is no history to show."""
        if self.position is None:
            if by >= 0 or not self._load():
                return False
            self.position = max(0, len(self.points) + by)
            return True
        target = self.position + by
        if target >= len(self.points):
            self.position = None
        else:
            self.position = max(0, target)
        return True

    def jump(self, seconds: float) -> bool:
        """Move by ``seconds`` of recorded time (negative: back), to the point at or before it;
        from live, back from now. Past the newest point: live again."""
        if self.position is None:
            if seconds >= 0 or not self._load():
                return False
            at = time.time() + seconds
        else:
            at = self.points[self.position]["timestamp"] + seconds
            if at > self.points[-1]["timestamp"]:
                self.position = None
                return True
        stamps = [point["timestamp"] for point in self.points]
        self.position = max(0, bisect.bisect_right(stamps, at) - 1)
        return True

    def go_live(self) -> None:
        self.position = None

    def frame(self) -> MonitorFrame | None:
        """The point under the cursor as a frame (None while live)."""
        if self.position is None:
            return None
        snapshot = snapshot_from_dict(self.points[self.position])
        earlier = self.points[max(0, self.position + 1 - FRAME_HISTORY_POINTS) : self.position + 1]
        pressures: dict[int, list[float]] = {}
        for point in earlier:
            for gpu in point.get("gpus") or ():
                pressure = gpu.get("pressure") if isinstance(gpu, dict) else None
                if isinstance(gpu.get("index"), int) and isinstance(pressure, (int, float)):
                    pressures.setdefault(gpu["index"], []).append(float(pressure))
        return MonitorFrame(
            snapshot=snapshot,
            memory_history=tuple((index, tuple(values)) for index, values in pressures.items()),
        )

    def note(self) -> str:
        """What the monitor says while looking back (empty while live)."""
        if self.position is None:
            return ""
        point = self.points[self.position]
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(point["timestamp"]))
        minute = " (1-minute point)" if "downsampled" in point else ""
        return (
            f"History {when}{minute}, {self.position + 1}/{len(self.points)}: "
            "[ ] step, { } 10 min, end live"
        )
