"""A stand-in ``torch`` with only the calls :mod:`hwdash.probe` may make, scripted per device.

Any other attribute of ``torch`` or ``torch.cuda`` raises, so a probe that reached for more (or that
initialised CUDA itself, e.g. ``torch.cuda.init``) fails the tests; every call is recorded.

``StandInTorch(cuda, history=AllocatorHistory())`` is a torch built with CUDA for the out-of-memory
recorder (:mod:`hwdash.probe.oom`): ``torch.cuda.memory._record_memory_history`` and ``_snapshot``,
``torch._C._cuda_attach_out_of_memory_observer`` and ``_cuda_isHistoryEnabled``; the native calls
the public ones wrap are present (a CUDA build has them) but may not be called. Without ``history``,
``torch._C`` is missing as the recorder would find a CPU-only build.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
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


SNAPSHOT: dict[str, Any] = {
    "segments": [
        {
            "device": 0,
            "address": 139_800_000_000_000,
            "total_size": 20 * 2**20,
            "stream": 0,
            "segment_type": "large",
            "segment_pool_id": (0, 0),
            "allocated_size": 16 * 2**20,
            "active_size": 16 * 2**20,
            "blocks": [
                {
                    "address": 139_800_000_000_000,
                    "size": 16 * 2**20,
                    "requested_size": 16 * 2**20,
                    "state": "active_allocated",
                    "frames": [{"filename": "train.py", "line": 12, "name": "forward"}],
                },
                {
                    "address": 139_800_016_777_216,
                    "size": 4 * 2**20,
                    "requested_size": 4 * 2**20,
                    "state": "inactive",
                    "frames": [],
                },
            ],
        }
    ],
    "device_traces": [
        [
            {
                "action": "oom",
                "size": 64 * 2**20,
                "stream": 0,
                "device_free": 2**20,
                "frames": [{"filename": "train.py", "line": 12, "name": "forward"}],
            }
        ]
    ],
}
"""A small snapshot in the layout ``torch.cuda.memory._snapshot`` documents."""


@dataclass
class AllocatorHistory:
    """``torch.cuda.memory``'s history calls and the allocator's out-of-memory observers."""

    snapshot: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(SNAPSHOT))
    enabled: bool = False
    """What ``torch._C._cuda_isHistoryEnabled`` answers."""
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)
    observers: list[Callable[[int, int, int, int], None]] = field(default_factory=list)
    failing: str | None = None
    """A call that raises as a broken driver would."""

    def _call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.calls.append((name, args, kwargs))
        if name == self.failing:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def _record_memory_history(self, *args: Any, **kwargs: Any) -> None:
        self._call("_record_memory_history", args, kwargs)
        self.enabled = kwargs.get("enabled", args[0] if args else "all") is not None

    def _snapshot(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self._call("_snapshot", args, kwargs)
        return copy.deepcopy(self.snapshot)

    def attach(self, observer: Callable[[int, int, int, int], None]) -> None:
        self._call("_cuda_attach_out_of_memory_observer", (observer,), {})
        self.observers.append(observer)

    def is_enabled(self) -> bool:
        self._call("_cuda_isHistoryEnabled", (), {})
        return self.enabled

    def out_of_memory(self, device: int, alloc: int, limit: int, free: int) -> None:
        """What the caching allocator does before it raises ``OutOfMemoryError``: each observer
        gets the device, the bytes requested, the device's total (or allowed maximum) and the
        bytes free."""
        for observer in self.observers:
            observer(device, alloc, limit, free)

    def called(self, name: str) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        return [(args, kwargs) for called, args, kwargs in self.calls if called == name]


def _not_to_be_called(name: str) -> Callable[..., Any]:
    def call(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError(f"the probe may not call torch._C.{name} itself")

    return call


class StandInNative:
    """``torch._C`` of a CUDA build, with only what the out-of-memory recorder may touch."""

    def __init__(self, history: AllocatorHistory) -> None:
        self._cuda_attach_out_of_memory_observer = history.attach
        self._cuda_isHistoryEnabled = history.is_enabled
        self._cuda_record_memory_history = _not_to_be_called("_cuda_record_memory_history")
        self._cuda_memorySnapshot = _not_to_be_called("_cuda_memorySnapshot")

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"the probe may not use torch._C.{name}")


@dataclass
class StandInCuda:
    devices: list[Device] = field(default_factory=list)
    initialized: bool = False
    current: int = 0
    calls: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)
    failing: str | None = None
    """A call that raises as a broken driver would."""
    memory: Any = None
    """``torch.cuda.memory`` (an :class:`AllocatorHistory`) when the torch has one."""

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
    """``torch`` with only ``cuda`` (and ``_C`` when given an allocator ``history``)."""

    __version__ = "2.13.0+stand-in"

    def __init__(self, cuda: StandInCuda, history: AllocatorHistory | None = None) -> None:
        self.cuda = cuda
        if history is not None:
            cuda.memory = history
            self._C = StandInNative(history)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"the probe may not use torch.{name}")
