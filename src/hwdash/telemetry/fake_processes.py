"""The host's and the probes' view of a fake NVML scenario's processes: who runs them and what
their PyTorch allocator publishes, so the monitor joins them with its real code."""

from __future__ import annotations

import time
from collections.abc import Callable

from hwdash.telemetry.fake_scenario import Scenario, ScenarioProcess, _mib, series_value
from hwdash.telemetry.host_sampler import EXITED, INVISIBLE, HostProcessInfo, ProcessTable
from hwdash.telemetry.probes import ProbeReading, TorchDevice


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

    def read(self) -> dict[int, ProbeReading]:
        now = self._clock()
        devices: dict[int, list[TorchDevice]] = {}
        ready: dict[int, bool] = {}
        steps: dict[int, int | None] = {}
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
                allocated = _mib(series_value(torch.allocated_mib, now))
                reserved = max(allocated, _mib(series_value(torch.reserved_mib, now)))
                peak_allocated, peak_reserved = self._peaks.get((process.pid, index), (0, 0))
                peak_allocated, peak_reserved = (
                    max(peak_allocated, allocated),
                    max(peak_reserved, reserved),
                )
                self._peaks[process.pid, index] = (peak_allocated, peak_reserved)
                uuid = gpu.uuid or f"GPU-fake-{index}"
                devices.setdefault(process.pid, []).append(
                    TorchDevice(
                        uuid=uuid.removeprefix("GPU-"),
                        allocated_bytes=allocated,
                        reserved_bytes=reserved,
                        max_allocated_bytes=peak_allocated,
                        max_reserved_bytes=peak_reserved,
                        alloc_retries=int(series_value(torch.alloc_retries, now)),
                        ooms=torch.ooms,
                        inactive_split_bytes=_mib(series_value(torch.inactive_split_mib, now)),
                    )
                )
        written = time.time()
        return {
            pid: ProbeReading(
                pid=pid,
                written_at=written,
                interval_s=1.0,
                cuda_ready=is_ready,
                step=steps.get(pid),
                devices=tuple(devices.get(pid, ())),
            )
            for pid, is_ready in ready.items()
        }
