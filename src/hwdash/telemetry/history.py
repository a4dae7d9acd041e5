"""Bounded history for trend lines: one ring per GPU and one for the host.

Each ring is a ``deque(maxlen=...)`` holding ``window_s / interval_s`` points (10 minutes by default),
so memory stays flat however long the monitor runs. Points are small frozen records, not whole
snapshots (no process lists are kept).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from hwdash.telemetry.types import GpuState, Snapshot

DEFAULT_WINDOW_S = 600.0


@dataclass(frozen=True)
class GpuPoint:
    """One GPU reading kept for trends."""

    timestamp: float
    state: GpuState
    pressure: float | None
    used_bytes: int | None
    total_bytes: int | None
    utilization_gpu: float | None
    temperature_c: float | None
    power_w: float | None


@dataclass(frozen=True)
class HostPoint:
    """One host reading kept for trends."""

    timestamp: float
    cpu_percent: float | None
    ram_used_bytes: int | None
    ram_total_bytes: int | None
    swap_used_bytes: int | None


class History:
    """Rings of recent points per GPU index and for the host."""

    def __init__(self, interval_s: float = 1.0, window_s: float = DEFAULT_WINDOW_S) -> None:
        if interval_s <= 0 or window_s <= 0:
            raise ValueError("history interval and window must be positive")
        self.capacity = max(1, math.ceil(window_s / interval_s))
        """Points kept per ring."""
        self._gpus: dict[int, deque[GpuPoint]] = {}
        self._host: deque[HostPoint] = deque(maxlen=self.capacity)

    def add(self, snapshot: Snapshot) -> None:
        """Record one snapshot (stale snapshots are skipped: they repeat old values)."""
        if snapshot.stale:
            return
        for gpu in snapshot.gpus:
            ring = self._gpus.get(gpu.index)
            if ring is None:
                ring = self._gpus[gpu.index] = deque(maxlen=self.capacity)
            ring.append(
                GpuPoint(
                    timestamp=snapshot.timestamp,
                    state=gpu.state,
                    pressure=gpu.pressure,
                    used_bytes=gpu.used_bytes,
                    total_bytes=gpu.total_bytes,
                    utilization_gpu=gpu.utilization_gpu,
                    temperature_c=gpu.temperature_c,
                    power_w=gpu.power_w,
                )
            )
        host = snapshot.host
        if host is not None:
            self._host.append(
                HostPoint(
                    timestamp=snapshot.timestamp,
                    cpu_percent=host.cpu_percent,
                    ram_used_bytes=host.ram_used_bytes,
                    ram_total_bytes=host.ram_total_bytes,
                    swap_used_bytes=host.swap_used_bytes,
                )
            )

    def gpu_indices(self) -> list[int]:
        """GPUs with any history."""
        return sorted(self._gpus)

    def gpu(self, index: int) -> tuple[GpuPoint, ...]:
        """Points for one GPU, oldest first (empty if never seen)."""
        return tuple(self._gpus.get(index, ()))

    def host(self) -> tuple[HostPoint, ...]:
        """Host points, oldest first."""
        return tuple(self._host)

    def pressures(self, index: int) -> list[float]:
        """A GPU's known pressures, oldest first (for a sparkline)."""
        return [point.pressure for point in self._gpus.get(index, ()) if point.pressure is not None]
