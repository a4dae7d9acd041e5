"""The sampler the monitor and the dashboard use: GPUs from NVML joined with the host (psutil)."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from hwdash.telemetry.host_sampler import HostProcessInfo, HostSampler
from hwdash.telemetry.nvml_sampler import NvmlSampler
from hwdash.telemetry.types import GpuSample, ProcessSample, Snapshot

if TYPE_CHECKING:
    from hwdash.telemetry.fake_nvml import FakeNvml


def _join(process: ProcessSample, info: HostProcessInfo | None) -> ProcessSample:
    if info is None or not info.visible:
        return dataclasses.replace(process, visible=False)
    return dataclasses.replace(
        process,
        visible=True,
        name=info.name or process.name,
        user=info.user,
        cmdline=info.cmdline,
        cpu_percent=info.cpu_percent,
        rss_bytes=info.rss_bytes,
    )


class SystemSampler:
    """Implements :class:`hwdash.telemetry.types.Sampler`: one snapshot of the GPUs and the host."""

    def __init__(
        self, gpu_sampler: NvmlSampler, host_sampler: HostSampler, fake: FakeNvml | None = None
    ) -> None:
        self.gpu_sampler = gpu_sampler
        self.host_sampler = host_sampler
        self.fake = fake
        """The fake NVML behind this sampler when it runs a scenario (tests release hangs with it)."""

    def sample(self) -> Snapshot:
        """GPUs (never blocking longer than the NVML round timeout), host, processes joined by PID."""
        started = time.perf_counter()
        snapshot = self.gpu_sampler.sample()
        host = self.host_sampler.sample()
        pids = {process.pid for gpu in snapshot.gpus for process in gpu.processes}
        infos = self.host_sampler.processes(pids) if pids else {}
        gpus: list[GpuSample] = []
        for gpu in snapshot.gpus:
            if gpu.processes:
                joined = tuple(_join(process, infos.get(process.pid)) for process in gpu.processes)
                gpu = dataclasses.replace(gpu, processes=joined)
            gpus.append(gpu)
        return dataclasses.replace(
            snapshot,
            gpus=tuple(gpus),
            host=host,
            sample_seconds=time.perf_counter() - started,
        )

    def close(self) -> None:
        """Stop the NVML worker (``nvmlShutdown``)."""
        self.gpu_sampler.close()
