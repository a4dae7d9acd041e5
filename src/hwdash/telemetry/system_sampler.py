"""The sampler the monitor and the dashboard use: GPUs from NVML joined with the host (psutil)."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from hwdash.core.live.diagnoses import DiagnosisEngine, DiagnosisEvent
from hwdash.telemetry.diagnosis_feed import diagnose
from hwdash.telemetry.host_sampler import HostProcessInfo, HostSampler
from hwdash.telemetry.nvml_sampler import NvmlSampler
from hwdash.telemetry.probes import ProbeJoiner, ProbeReading, uuid_key
from hwdash.telemetry.types import GpuSample, HostSample, ProcessSample, Snapshot

if TYPE_CHECKING:
    from hwdash.telemetry.fake_nvml import FakeNvml


UNIFIED_MEMORY_NOTE = "unified memory: NVML reports none; showing the host's RAM, which it shares"


def _join(process: ProcessSample, info: HostProcessInfo | None) -> ProcessSample:
    if info is None or not info.visible:
        return dataclasses.replace(process, visible=False, exited=info is not None and info.exited)
    return dataclasses.replace(
        process,
        visible=True,
        name=info.name or process.name,
        user=info.user,
        cmdline=info.cmdline,
        cpu_percent=info.cpu_percent,
        rss_bytes=info.rss_bytes,
        container=info.container,
        started_at=info.started_at,
    )


def _unverifiable(process: ProcessSample) -> ProcessSample:
    return dataclasses.replace(process, visible=False, verifiable=False)


def _host_memory(gpu: GpuSample, host: HostSample) -> GpuSample:
    """A unified-memory GPU (GH200, GB10) with the host's RAM as its memory, as nvitop and nvtop
    show such parts: the GPU allocates from that RAM, so its fill is what an allocation meets."""
    if host.ram_total_bytes is None or host.ram_available_bytes is None:
        return gpu
    return dataclasses.replace(
        gpu,
        memory_source="host",
        total_bytes=host.ram_total_bytes,
        free_bytes=host.ram_available_bytes,
        used_bytes=host.ram_total_bytes - host.ram_available_bytes,
        reserved_bytes=None,
        errors=(
            *((f, why) for f, why in gpu.errors if f != "memory"),
            ("memory", UNIFIED_MEMORY_NOTE),
        ),
    )


class SystemSampler:
    """Implements :class:`hwdash.telemetry.types.Sampler`: one snapshot of the GPUs and the host."""

    def __init__(
        self,
        gpu_sampler: NvmlSampler,
        host_sampler: HostSampler,
        fake: FakeNvml | None = None,
        *,
        host_pid_namespace: bool = True,
        probes: ProbeJoiner | None = None,
    ) -> None:
        self.gpu_sampler = gpu_sampler
        self.host_sampler = host_sampler
        self.fake = fake
        """The fake NVML behind this sampler when it runs a scenario (tests release hangs with it)."""
        self.host_pid_namespace = host_pid_namespace
        """False in a container with its own PID namespace: NVML's (host) PIDs are not looked up
        locally, where the same number belongs to an unrelated process."""
        self.probes = probes
        """Readings of :mod:`hwdash.probe` in training processes, joined by PID and GPU UUID (not
        in a PID namespace of its own, where the probe's PIDs are not NVML's)."""
        self.diagnoses = DiagnosisEngine()
        """The health rules, fed every round (:mod:`hwdash.telemetry.diagnosis_feed`)."""
        self.diagnosis_events: list[DiagnosisEvent] = []
        """The last round's raised and cleared diagnoses."""
        self.xid_seen: dict[int, float] = {}
        """GPU index -> the newest Xid event already fed to the rules (its time)."""

    def sample(self) -> Snapshot:
        """GPUs (never blocking longer than the NVML round timeout), host, processes joined by PID."""
        started = time.perf_counter()
        snapshot = self.gpu_sampler.sample()
        host = self.host_sampler.sample()
        pids = {process.pid for gpu in snapshot.gpus for process in gpu.processes}
        infos = self.host_sampler.processes(pids) if pids and self.host_pid_namespace else {}
        readings: dict[int, ProbeReading] = {}
        if self.probes is not None and self.host_pid_namespace:
            # Read even with no GPU process listed: a run that died leaves its file to clear (and
            # to record, see ProbeDirectory.take_ended).
            readings = self.probes.read()
        gpus: list[GpuSample] = []
        probed: set[tuple[int, str]] = set()
        for gpu in snapshot.gpus:
            if gpu.processes:
                if self.host_pid_namespace:
                    joined = tuple(
                        self._with_torch(_join(p, infos.get(p.pid)), gpu, readings, probed)
                        for p in gpu.processes
                    )
                else:
                    joined = tuple(_unverifiable(p) for p in gpu.processes)
                gpu = dataclasses.replace(gpu, processes=joined)
            if gpu.unified_memory and gpu.total_bytes is None:
                gpu = _host_memory(gpu, host)
            gpus.append(gpu)
        if self.probes is not None:
            self.probes.forget_except(probed)
        shown, self.diagnosis_events = diagnose(
            self.diagnoses, gpus, snapshot.timestamp, self.xid_seen
        )
        return dataclasses.replace(
            snapshot,
            gpus=shown,
            diagnosis_events=tuple(self.diagnosis_events),
            host=host,
            sample_seconds=time.perf_counter() - started,
        )

    def _with_torch(
        self,
        process: ProcessSample,
        gpu: GpuSample,
        readings: dict[int, ProbeReading],
        probed: set[tuple[int, str]],
    ) -> ProcessSample:
        """The process with its allocator's numbers on this GPU (or its MIG device), if probed."""
        reading = readings.get(process.pid)
        if reading is None or self.probes is None:
            return process
        uuid = gpu.uuid
        if process.mig_index is not None:
            mig = next((m for m in gpu.mig if m.index == process.mig_index), None)
            uuid = mig.uuid if mig is not None and mig.uuid else uuid
        torch = self.probes.sample_for(reading, process.pid, uuid)
        if torch is None:
            return process
        probed.add((process.pid, uuid_key(uuid) or ""))
        oom = reading.oom
        return dataclasses.replace(
            process,
            torch=torch,
            progress=reading.run,
            oom_recording=oom is not None and oom.recording,
            oom_snapshot=str(oom.snapshots[-1].path) if oom is not None and oom.snapshots else None,
        )

    def close(self) -> None:
        """Stop the NVML worker (``nvmlShutdown``)."""
        self.gpu_sampler.close()
