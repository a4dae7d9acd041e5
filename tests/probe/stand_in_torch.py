"""A stand-in ``torch`` with only the calls :mod:`hwdash.probe` may make, scripted per device.

Any other attribute of ``torch`` or ``torch.cuda`` raises, so a probe that reached for more (or that
initialised CUDA itself, e.g. ``torch.cuda.init``) fails the tests; every call is recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

GIB = 1024**3


@dataclass
class Device:
    """One scripted CUDA device as the process's allocator sees it."""

    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    total_memory: int = 80 * GIB
    allocated: int = 0
    reserved: int = 0
    max_allocated: int = 0
    max_reserved: int = 0
    retries: int = 0
    ooms: int = 0
    inactive_split: int = 0
    free: int = 70 * GIB


ALLOWED = {
    "is_available",
    "is_initialized",
    "device_count",
    "current_device",
    "get_device_properties",
    "memory_allocated",
    "memory_reserved",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_stats",
    "mem_get_info",
}


@dataclass
class StandInCuda:
    devices: list[Device] = field(default_factory=list)
    initialized: bool = False
    current: int = 0
    calls: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)
    failing: str | None = None
    """A call that raises as a broken driver would."""

    def __getattr__(self, name: str) -> Any:
        if name not in ALLOWED:
            raise AttributeError(f"the probe may not call torch.cuda.{name}")
        implementation = getattr(self, "_" + name)

        def call(*args: Any) -> Any:
            self.calls.append((name, args))
            if name == self.failing:
                raise RuntimeError("CUDA error: unspecified launch failure")
            return implementation(*args)

        return call

    def _is_available(self) -> bool:
        return bool(self.devices)

    def _is_initialized(self) -> bool:
        return self.initialized

    def _device_count(self) -> int:
        return len(self.devices)

    def _current_device(self) -> int:
        return self.current

    def _get_device_properties(self, index: int) -> Any:
        device = self.devices[index]
        return SimpleNamespace(uuid=device.uuid, name=device.name, total_memory=device.total_memory)

    def _memory_allocated(self, index: int) -> int:
        return self.devices[index].allocated

    def _memory_reserved(self, index: int) -> int:
        return self.devices[index].reserved

    def _max_memory_allocated(self, index: int) -> int:
        return self.devices[index].max_allocated

    def _max_memory_reserved(self, index: int) -> int:
        return self.devices[index].max_reserved

    def _memory_stats(self, index: int) -> dict[str, int]:
        device = self.devices[index]
        stats = {f"unrelated.stat.{n}": n for n in range(120)}  # as long as the real dict
        stats.update(
            {
                "num_alloc_retries": device.retries,
                "num_ooms": device.ooms,
                "inactive_split_bytes.all.current": device.inactive_split,
            }
        )
        return stats

    def _mem_get_info(self, index: int) -> tuple[int, int]:
        device = self.devices[index]
        return device.free, device.total_memory

    def called(self, name: str) -> list[tuple[Any, ...]]:
        return [args for called, args in self.calls if called == name]


class StandInTorch:
    """``torch`` with only ``cuda``."""

    def __init__(self, cuda: StandInCuda) -> None:
        self.cuda = cuda

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"the probe may not use torch.{name}")
