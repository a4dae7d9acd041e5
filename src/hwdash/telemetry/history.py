"""Bounded history for trend lines: one ring per GPU and one for the host.

Each ring is a ``deque(maxlen=...)`` holding ``window_s / interval_s`` points (10 minutes by default),
so memory stays flat however long the monitor runs. Points are small frozen records, not whole
snapshots (no process lists are kept).
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from dataclasses import dataclass

from hwdash.core.live.forecast import forecast_full
from hwdash.telemetry.types import GpuState, Snapshot

DEFAULT_WINDOW_S = 600.0
FORECAST_WINDOW_S = 60.0
"""The recent window the OOM forecast fits its trend over."""
FORECAST_EVERY_S = 5.0
"""On a cluster (more than :data:`FIT_EVERY_ROUND_GPUS` GPUs), how often each GPU's forecast is
fitted again; between fits its last slope is applied to the memory free now."""
FIT_EVERY_ROUND_GPUS = 64
"""Up to this many GPUs in a snapshot every forecast is fitted every round (0.2-0.3 ms a GPU: 17 ms
for 64 GPUs with a full history, measured on a shared 2-core machine)."""
PROCESS_POINTS = 120
"""Points kept per process (its sparkline and detail view); fewer than a GPU's: there can be many."""


def process_key(gpu_index: int, mig_index: int | None, pid: int) -> str:
    """``gpu:pid``, or ``gpu/slot:pid`` on a MIG device: one process on one GPU (the row key)."""
    gpu = str(gpu_index) if mig_index is None else f"{gpu_index}/{mig_index}"
    return f"{gpu}:{pid}"


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
        self._processes: dict[str, deque[tuple[float, int | None]]] = {}
        self._forecasts: dict[int, tuple[float | None, float]] = {}
        """Per GPU on a cluster: the fitted slope (None: no forecast) and when to fit it again."""

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
        seen = set()
        for gpu in snapshot.gpus:
            for process in gpu.processes:
                key = process_key(gpu.index, process.mig_index, process.pid)
                seen.add(key)
                points = self._processes.get(key)
                if points is None:
                    points = self._processes[key] = deque(maxlen=min(self.capacity, PROCESS_POINTS))
                points.append((snapshot.timestamp, process.used_bytes))
        for gone in set(self._processes) - seen:
            del self._processes[gone]  # the process ended (a new one with its PID starts afresh)
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

    def clear(self) -> None:
        """Forget every point (a replay that jumped starts its history again)."""
        self._gpus.clear()
        self._host.clear()
        self._processes.clear()
        self._forecasts.clear()

    def gpu_indices(self) -> list[int]:
        """GPUs with any history."""
        return sorted(self._gpus)

    def gpu(self, index: int) -> tuple[GpuPoint, ...]:
        """Points for one GPU, oldest first (empty if never seen)."""
        return tuple(self._gpus.get(index, ()))

    def host(self) -> tuple[HostPoint, ...]:
        """Host points, oldest first."""
        return tuple(self._host)

    def process(self, key: str) -> tuple[tuple[float, int | None], ...]:
        """(timestamp, NVML used bytes) of one process (key from :func:`process_key`), oldest first."""
        return tuple(self._processes.get(key, ()))

    def process_keys(self) -> list[str]:
        """Processes with history (those in the last snapshot)."""
        return list(self._processes)

    def with_forecasts(self, snapshot: Snapshot, window_s: float = FORECAST_WINDOW_S) -> Snapshot:
        """``snapshot`` with each GPU's OOM forecast from this history (add the snapshot first).
        Memory counts as full when nothing is free (``total - free``: used plus reserved).

        The forecast follows the current climb (:func:`hwdash.core.live.forecast.forecast_full`) and is
        fitted again every round: it never counts down like a timer between fits, which left it
        running while the climb slowed and made it jump back up at the next fit."""
        if snapshot.stale:
            return snapshot
        gpus = []
        now = snapshot.timestamp
        every_round = len(snapshot.gpus) <= FIT_EVERY_ROUND_GPUS
        for gpu in snapshot.gpus:
            if gpu.host_stale is not None:
                # Its host stopped reporting: the last values are frozen, so there is no climb.
                self._forecasts.pop(gpu.index, None)
                gpus.append(dataclasses.replace(gpu, forecast_full_s=None))
                continue
            cached = self._forecasts.get(gpu.index)
            if not every_round and cached is not None and now < cached[1]:
                # Between a cluster GPU's fits: its last slope over the memory free now.
                slope = cached[0]
                free = gpu.free_bytes
                left = None if slope is None or free is None else round(free / slope, 1)
                gpus.append(dataclasses.replace(gpu, forecast_full_s=left))
                continue
            points = []
            for point in reversed(self._gpus.get(gpu.index, ())):
                if point.timestamp < now - window_s:
                    break  # the ring holds minutes; the forecast reads the last window only
                if point.pressure is not None and point.total_bytes:
                    taken = round(point.pressure * point.total_bytes)
                    points.append((point.timestamp, taken, point.total_bytes))
            points.reverse()
            forecast = forecast_full(points, window_s=window_s) if len(points) > 1 else None
            seconds = None if forecast is None else round(forecast.seconds_to_full, 1)
            if not every_round:
                # GPUs take turns: GPU i's first refit comes i/5 of a period early, so a cluster's
                # hundreds of GPUs are not all fitted again in the same round.
                spread = 0.0 if cached is not None else (gpu.index % 5) * FORECAST_EVERY_S / 5
                slope = None if forecast is None else forecast.slope_bytes_per_s
                self._forecasts[gpu.index] = (slope, now + FORECAST_EVERY_S - spread)
            gpus.append(dataclasses.replace(gpu, forecast_full_s=seconds))
        return dataclasses.replace(snapshot, gpus=tuple(gpus))

    def pressures(self, index: int) -> list[float]:
        """A GPU's known pressures, oldest first (for a sparkline)."""
        return [point.pressure for point in self._gpus.get(index, ()) if point.pressure is not None]
