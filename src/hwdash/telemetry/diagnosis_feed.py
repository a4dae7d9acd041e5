"""The GPUs of a snapshot as the diagnosis rules read them (:mod:`hwdash.core.live.diagnoses`), and
the diagnoses in force put back on each GPU (``GpuSample.diagnoses``, ``gpus[].diagnoses`` in JSON).

The system sampler feeds every round through one :class:`DiagnosisEngine`: time is the snapshot's
(scenario time on the fake GPUs), so a scripted scenario raises each diagnosis at its second.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from hwdash.core.live.diagnoses import DiagnosisEngine, DiagnosisEvent, GpuReading, ProcessReading
from hwdash.telemetry.types import GpuSample, GpuState, ProcessSample


def _process(process: ProcessSample, cores: int | None) -> ProcessReading:
    return ProcessReading(
        pid=process.pid,
        used_bytes=process.used_bytes,
        cpu_percent=process.cpu_percent,
        cpu_count=cores,
        job=None,
        sm_percent=process.sm_percent,
    )


def new_xids(gpu: GpuSample, seen: dict[int, float]) -> tuple[int, ...]:
    """The Xid numbers of the GPU's events newer than the newest seen before (``seen``: GPU index
    -> the newest event's time, updated here); every event the first time the GPU is seen."""
    events = gpu.xid_events or ()
    last = seen.get(gpu.index)
    if events:
        seen[gpu.index] = max(event.at for event in events)
    return tuple(event.xid for event in events if last is None or event.at > last)


def reading_of(
    gpu: GpuSample, at: float, cores: int | None, xid: tuple[int, ...] = ()
) -> GpuReading:
    """One GPU of a round, in the rules' terms (``xid``: the Xid numbers new this round)."""
    pcie = gpu.pcie
    remapped = gpu.remapped_rows
    return GpuReading(
        index=gpu.index,
        uuid=gpu.uuid,
        at=at,
        utilization_gpu=gpu.utilization_gpu,
        clocks_event_reasons=gpu.clocks_event_reasons,
        pcie_gen=None if pcie is None else pcie.gen,
        pcie_gen_max=None if pcie is None else pcie.gen_max,
        pcie_width=None if pcie is None else pcie.width,
        pcie_width_max=None if pcie is None else pcie.width_max,
        ecc_uncorrected=gpu.ecc_uncorrected,
        remapped_failure=None if remapped is None else remapped.failure,
        xid=xid,
        processes=tuple(_process(p, cores) for p in gpu.processes if p.verifiable),
    )


def diagnose(
    engine: DiagnosisEngine,
    gpus: Sequence[GpuSample],
    at: float,
    xid_seen: dict[int, float] | None = None,
) -> tuple[tuple[GpuSample, ...], list[DiagnosisEvent]]:
    """The GPUs with the diagnoses in force after this round and each clock-event reason's share
    of the last minute (the throttled rule's window), and the round's events. A GPU that is lost
    or unreadable is left to the alert rule (its readings would all be None). ``xid_seen`` is the
    caller's memory of the Xid events already fed (see :func:`new_xids`); None: every event
    listed is fed as new."""
    cores = os.cpu_count()
    seen = {} if xid_seen is None else xid_seen
    readable = [gpu for gpu in gpus if gpu.state not in (GpuState.LOST, GpuState.ERROR)]
    events = engine.update([reading_of(gpu, at, cores, new_xids(gpu, seen)) for gpu in readable])
    active = engine.active
    shown = tuple(
        dataclasses.replace(
            gpu,
            diagnoses=tuple(active.get(gpu.index, ())),
            clocks_event_share=None
            if gpu.clocks_event_reasons is None
            else engine.clocks_event_share(gpu.index),
        )
        for gpu in gpus
    )
    return shown, events
