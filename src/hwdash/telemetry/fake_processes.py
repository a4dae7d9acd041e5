"""The host's and the probes' view of a fake NVML scenario's processes: who runs them and what
their PyTorch allocator publishes, so the monitor joins them with its real code."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hwdash.telemetry.host_sampler import EXITED, INVISIBLE, HostProcessInfo, ProcessTable
from hwdash.telemetry.probes import OomSnapshotFile, ProbeOom, ProbeReading, TorchDevice
from hwdash.telemetry.scenario_data import SCENARIO_DIR, _mib, integrate_watts, series_value
from hwdash.telemetry.types import RunProgress

if TYPE_CHECKING:
    from hwdash.telemetry.fake_scenario import (
        Scenario,
        ScenarioGpu,
        ScenarioProcess,
        ScenarioTorch,
    )


def _plan_reference(plan: str | None) -> str | None:
    """A scenario's plan: a packaged plan file beside the scenarios when one has that name (the
    demo's), else the reference as written (a saved plan's name, a path)."""
    if plan is None:
        return None
    packaged = SCENARIO_DIR / plan
    return str(packaged) if "/" not in plan and packaged.is_file() else plan


def _oom(snapshot: str, written: float) -> ProbeOom:
    """The probe's ``oom`` object for a scenario's snapshot (relative paths beside the scenarios)."""
    path = Path(snapshot) if Path(snapshot).is_absolute() else SCENARIO_DIR / snapshot
    size = path.stat().st_size if path.is_file() else 0
    return ProbeOom(
        recording=True,
        snapshots=(OomSnapshotFile(path=path, at=written, reason="oom", bytes=size),),
        error=None,
    )


class _Energy:
    """A GPU's scripted power integrated over scenario time (the fake NVML's own integrator),
    kept as it goes so a long demo does not integrate from zero each round."""

    def __init__(self, gpu: ScenarioGpu, start_s: float) -> None:
        self.gpu = gpu
        self.start_s = start_s
        self.at = start_s
        self.joules = 0.0

    def until(self, now: float) -> float:
        if now < self.at:  # scenario time went back (a test's clock): start again
            self.at, self.joules = self.start_s, 0.0
        if now > self.at:
            self.joules += integrate_watts(self.gpu.power_w, self.at, now)
            self.at = now
        return self.joules


def _progress(
    process: ScenarioProcess, torch: ScenarioTorch, now: float, wall: float, energy_j: float | None
) -> RunProgress:
    """What the scenario's probe publishes in its ``run`` object at scenario second ``now``
    (``wall``: the same moment on the clock the file's times use)."""

    def at(second: float) -> float:
        return wall - (now - second)

    rate = torch.steps_per_s
    steps = 0 if rate is None else int(max(0.0, now - torch.cuda_ready_s) * rate)
    if torch.max_steps is not None:
        steps = min(steps, torch.max_steps)
    per_step = torch.tokens_per_step
    return RunProgress(
        started_at=at(process.start_s),
        at=wall,
        command=process.cmdline or process.name,
        plan=_plan_reference(torch.plan),
        step=steps if rate is not None else None,
        tokens=None if per_step is None or rate is None else steps * per_step,
        tokens_per_s=None if per_step is None or rate is None or steps < 2 else rate * per_step,
        step_time_s=None if rate is None or steps < 2 else 1.0 / rate,
        first_step_at=None if rate is None or steps < 1 else at(torch.cuda_ready_s + 1.0 / rate),
        last_step_at=None if rate is None or steps < 1 else at(torch.cuda_ready_s + steps / rate),
        max_steps=torch.max_steps,
        energy_j=energy_j,
        world_size=torch.world_size,
    )


class ScenarioProcessTable:
    """Answers host look-ups for the scenario's PIDs from the scenario; other PIDs go to ``fallback``.

    So a demo shows users and command lines, and ``visible = false`` imitates another container,
    whatever PIDs happen to exist on the machine running the demo.
    """

    def __init__(
        self,
        scenario: Scenario,
        fallback: ProcessTable | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._fallback = fallback
        self._clock = clock
        self._known: dict[int, ScenarioProcess] = {
            process.pid: process for gpu in scenario.gpus for process in gpu.processes
        }

    def lookup(self, pids: set[int]) -> dict[int, HostProcessInfo]:
        result: dict[int, HostProcessInfo] = {}
        unknown = set()
        for pid in pids:
            process = self._known.get(pid)
            if process is None:
                unknown.add(pid)
            elif (
                process.exited_s is not None
                and self._clock is not None
                and self._clock() >= process.exited_s
            ):
                result[pid] = EXITED
            elif not process.visible:
                result[pid] = INVISIBLE
            else:
                result[pid] = HostProcessInfo(
                    visible=True,
                    name=process.name,
                    user=process.user,
                    cmdline=process.cmdline or process.name,
                    cpu_percent=process.cpu_percent,
                    rss_bytes=None if process.rss_mib is None else _mib(process.rss_mib),
                    container=process.container,
                )
        if unknown:
            if self._fallback is not None:
                result.update(self._fallback.lookup(unknown))
            else:
                result.update({pid: INVISIBLE for pid in unknown})
        return result


class FakeProbes:
    """The probe readings of a scenario's processes at the scenario's current second; the same
    ``read()`` as :class:`hwdash.telemetry.probes.ProbeDirectory`, so the monitor joins them with
    its real code. UUIDs are given as ``torch`` prints them (without NVML's ``GPU-`` prefix)."""

    def __init__(self, scenario: Scenario, clock: Callable[[], float]) -> None:
        self.scenario = scenario
        self._clock = clock
        self._peaks: dict[tuple[int, int], tuple[int, int]] = {}
        self._energy: dict[tuple[int, int], _Energy] = {}

    def _device(
        self, pid: int, index: int, gpu: ScenarioGpu, torch: ScenarioTorch, now: float
    ) -> TorchDevice:
        """What the process's allocator says about its GPU at scenario second ``now``."""
        allocated = _mib(series_value(torch.allocated_mib, now))
        reserved = max(allocated, _mib(series_value(torch.reserved_mib, now)))
        peak_allocated, peak_reserved = self._peaks.get((pid, index), (0, 0))
        peak_allocated, peak_reserved = max(peak_allocated, allocated), max(peak_reserved, reserved)
        self._peaks[pid, index] = (peak_allocated, peak_reserved)
        uuid = gpu.uuid or f"GPU-fake-{index}"
        return TorchDevice(
            uuid=uuid.removeprefix("GPU-"),
            allocated_bytes=allocated,
            reserved_bytes=reserved,
            max_allocated_bytes=peak_allocated,
            max_reserved_bytes=peak_reserved,
            alloc_retries=int(series_value(torch.alloc_retries, now)),
            ooms=torch.ooms,
            inactive_split_bytes=_mib(series_value(torch.inactive_split_mib, now)),
        )

    def read(self) -> dict[int, ProbeReading]:
        now = self._clock()
        devices: dict[int, list[TorchDevice]] = {}
        ready: dict[int, bool] = {}
        steps: dict[int, int | None] = {}
        runs: dict[int, RunProgress] = {}
        ooms: dict[int, ProbeOom] = {}
        joules: dict[int, float] = {}
        written = time.time()
        for index, gpu in enumerate(self.scenario.gpus):
            for process in gpu.processes:
                torch = process.torch
                if torch is None or not process.alive_at(now):
                    continue
                ready[process.pid] = now >= torch.cuda_ready_s
                steps[process.pid] = (
                    None
                    if torch.steps_per_s is None
                    else int(max(0.0, now - torch.cuda_ready_s) * torch.steps_per_s)
                )
                if not ready[process.pid]:
                    continue
                meter = self._energy.setdefault(
                    (process.pid, index), _Energy(gpu, max(process.start_s, torch.cuda_ready_s))
                )
                joules[process.pid] = joules.get(process.pid, 0.0) + meter.until(now)
                if torch.oom_snapshot is not None:
                    ooms[process.pid] = _oom(torch.oom_snapshot, written)
                runs[process.pid] = _progress(process, torch, now, written, joules[process.pid])
                devices.setdefault(process.pid, []).append(
                    self._device(process.pid, index, gpu, torch, now)
                )
        return {
            pid: ProbeReading(
                pid=pid,
                written_at=written,
                interval_s=1.0,
                cuda_ready=is_ready,
                step=steps.get(pid),
                devices=tuple(devices.get(pid, ())),
                run=runs.get(pid),
                oom=ooms.get(pid),
            )
            for pid, is_ready in ready.items()
        }
