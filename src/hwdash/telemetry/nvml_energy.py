"""NVML's total energy counter per GPU, for the probe in a training process.

A sibling of :mod:`hwdash.telemetry.nvml_sampler` (the monitor's NVML reader), kept apart so the
training process loads neither the sampler's worker machinery nor its types; these are the only
two modules that call ``pynvml`` functions. Standard library only (``pynvml`` is imported on first
use unless given).
"""

from __future__ import annotations

from typing import Any


class EnergyMeter:
    """NVML's total energy counter per GPU (``nvmlDeviceGetTotalEnergyConsumption``: millijoules
    since the driver was loaded; Volta and later), for the probe in a training process.

    ``nvml`` is the pynvml module (default: ``import pynvml`` on first use). NVML is initialised
    once, lazily; NVML never initialises CUDA. :meth:`read` never raises: a GPU or driver without
    the counter (``NotSupported``, an unknown UUID, a lost GPU) reads None, and everything reads
    None when the bindings or the driver are missing.
    """

    def __init__(self, nvml: Any = None) -> None:
        self._nvml = nvml
        self._started: bool | None = None
        self._handles: dict[str, Any] = {}

    def _start(self) -> bool:
        if self._started is None:
            self._started = False
            try:
                if self._nvml is None:
                    import pynvml

                    self._nvml = pynvml
                self._nvml.nvmlInit()
                self._started = True
            except Exception:  # no library, no driver, a mismatch: no energy, nothing raised
                self._started = False
        return self._started

    def read(self, uuids: list[str] | tuple[str, ...]) -> dict[str, int | None]:
        """Millijoules per UUID (torch's spelling without ``GPU-`` is accepted), None where unknown."""
        if not self._start():
            return dict.fromkeys(uuids)
        readings: dict[str, int | None] = {}
        for uuid in uuids:
            try:
                handle = self._handles.get(uuid)
                if handle is None:
                    handle = self._nvml.nvmlDeviceGetHandleByUUID(nvml_uuid(uuid))
                    self._handles[uuid] = handle
                readings[uuid] = int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
            except Exception:  # NotSupported, NotFound, GpuIsLost, FunctionNotFound...
                readings[uuid] = None
        return readings


def nvml_uuid(uuid: str) -> str:
    """A device UUID as NVML spells it: torch's ``get_device_properties().uuid`` lacks the
    ``GPU-`` prefix that ``nvmlDeviceGetUUID`` shows (MIG devices keep their ``MIG-``)."""
    text = str(uuid).strip()
    if text.upper().startswith(("GPU-", "MIG-")):
        return text
    return "GPU-" + text
