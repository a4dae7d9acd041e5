"""The live view of each probed run against its plan: a sampler around the monitor's sampler.

:class:`RunWatcher` takes any sampler (the protocol of :mod:`hwdash.telemetry.types`), and fills
``ProcessSample.run`` of every process whose probe publishes progress (:mod:`hwdash.probe`), with
the rules of :mod:`hwdash.runs.metrics`. A plan is read once per reference (a saved plan's name or a
plan file; a failure is retried after :data:`RETRY_PLAN_S`); the dashboard may attach a plan to a
process by hand. A probe file left behind by a process that died without its probe's exit handler
(``kill -9``, a crash in C) becomes a ledger record with ``exit: "killed"``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hwdash.errors import UsageError
from hwdash.runs.metrics import Hardware, run_view
from hwdash.telemetry.probes import uuid_key
from hwdash.telemetry.types import GpuSample, ProcessSample, Sampler, Snapshot

if TYPE_CHECKING:
    # The planner (pydantic models, the catalog, the estimator) loads on the first probed run:
    # the monitor draws its first frame without it.
    from hwdash.core.catalog import Catalog
    from hwdash.runs.plans import PlanFacts

log = logging.getLogger(__name__)

RETRY_PLAN_S = 30.0
"""A plan that could not be read is tried again after this many seconds (it may be saved later)."""

PlanResolver = Callable[[str], "PlanFacts"]


class RunWatcher:
    """Implements the sampler protocol: the inner sampler's snapshot with each probed run's view.

    ``price``: the machine's price per hour (``--price``; the plan's flavor's price otherwise).
    ``catalog``: for the GPUs' peak TFLOPS and the plans (None: loaded on first need).
    ``resolve``: a plan reference to its facts (default :func:`hwdash.runs.plans.plan_facts`).
    ``record``: called with the raw record of a run whose probe file was left behind (default:
    :func:`hwdash.runs.recorder.record_run`; None records nothing).
    """

    def __init__(
        self,
        inner: Sampler,
        *,
        price: float | None = None,
        catalog: Catalog | None = None,
        resolve: PlanResolver | None = None,
        record: Callable[[dict[str, Any]], object] | bool | None = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner = inner
        self.price = price
        self._catalog = catalog
        self._resolve = resolve
        self._record = record
        self._clock = clock
        self._facts: dict[str, tuple[PlanFacts | None, str | None, float]] = {}
        self._attached: dict[int, str] = {}
        self._nvml_peaks: dict[tuple[int, str], int] = {}
        self._peak_tflops: dict[str, float | None] = {}

    def __getattr__(self, name: str) -> Any:
        # The dashboard and the monitor reach the inner sampler's extras (the fake, the probes).
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    # -- plans -------------------------------------------------------------------------------------

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            from hwdash.core.catalog import load_catalog

            self._catalog = load_catalog()
        return self._catalog

    def attach(self, pid: int, reference: str | None) -> None:
        """Hold ``pid``'s run against this plan (the dashboard's "attach plan"); None detaches."""
        if reference is None:
            self._attached.pop(pid, None)
        else:
            self._attached[pid] = reference

    def facts(self, reference: str) -> tuple[PlanFacts | None, str | None]:
        """The plan's facts, or (None, why it could not be read)."""
        cached = self._facts.get(reference)
        now = self._clock()
        if cached is not None and (cached[0] is not None or now - cached[2] < RETRY_PLAN_S):
            return cached[0], cached[1]
        try:
            if self._resolve is not None:
                found: PlanFacts | None = self._resolve(reference)
            else:
                from hwdash.runs.plans import plan_facts

                found = plan_facts(reference, catalog=self.catalog)
            why = None
        except (UsageError, OSError, ValueError) as exc:
            found, why = None, str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        self._facts[reference] = (found, why, now)
        return found, why

    def peak_tflops(self, gpu_name: str | None) -> float | None:
        """One GPU's dense half-precision TFLOPS from the accelerator catalog (by NVML name)."""
        if not gpu_name:
            return None
        if gpu_name not in self._peak_tflops:
            accelerator = self.catalog.match_nvml_name(gpu_name)
            self._peak_tflops[gpu_name] = (
                None if accelerator is None else accelerator.matmul_tflops()[0]
            )
        return self._peak_tflops[gpu_name]

    # -- sampling ----------------------------------------------------------------------------------

    def sample(self) -> Snapshot:
        snapshot = self.inner.sample()
        self._record_left_behind()
        if not any(p.progress is not None for gpu in snapshot.gpus for p in gpu.processes):
            return snapshot
        machine_gpus = len(snapshot.gpus) or None
        gpus = tuple(self._gpu(gpu, machine_gpus) for gpu in snapshot.gpus)
        return dataclasses.replace(snapshot, gpus=gpus)

    def _gpu(self, gpu: GpuSample, machine_gpus: int | None) -> GpuSample:
        if not any(p.progress is not None for p in gpu.processes):
            return gpu
        hardware = Hardware(
            peak_tflops=self.peak_tflops(gpu.name),
            price_per_hour=self.price,
            machine_gpus=machine_gpus if self.price is not None else None,
        )
        processes = tuple(self._process(p, gpu, hardware) for p in gpu.processes)
        return dataclasses.replace(gpu, processes=processes)

    def _process(self, process: ProcessSample, gpu: GpuSample, hardware: Hardware) -> ProcessSample:
        progress = process.progress
        if progress is None:
            return process
        key = (process.pid, uuid_key(gpu.uuid) or str(gpu.index))
        if process.used_bytes is not None:
            self._nvml_peaks[key] = max(self._nvml_peaks.get(key, 0), process.used_bytes)
        reference = self._attached.get(process.pid) or progress.plan
        facts, why = self.facts(reference) if reference else (None, None)
        if reference and reference != progress.plan:
            progress = dataclasses.replace(progress, plan=reference)
        torch = process.torch
        view = run_view(
            progress,
            facts,
            hardware,
            measured_peak_bytes=None if torch is None else torch.max_reserved_bytes,
            measured_nvml_peak_bytes=self._nvml_peaks.get(key),
            plan_error=why,
        )
        return dataclasses.replace(process, run=view)

    def _record_left_behind(self) -> None:
        """Ledger records for runs whose process died without its probe's exit handler."""
        if self._record is None or self._record is False:
            return
        probes = getattr(self.inner, "probes", None)
        take = getattr(probes, "take_ended", None)
        if take is None:
            return
        ended = take()
        if not ended:
            return
        from hwdash.runs.recorder import raw_from_reading, record_run

        record = record_run if self._record is True else self._record
        for reading in ended:
            raw = raw_from_reading(reading, exit="killed")
            if raw is None:
                continue
            try:
                record(raw)
            except Exception as exc:  # the monitor keeps running; the ledger is best effort
                log.warning("the ledger record of PID %s was not written: %s", reading.pid, exc)

    def close(self) -> None:
        self.inner.close()
