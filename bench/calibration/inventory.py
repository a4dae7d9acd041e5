"""What exactly is alive at the peak: every live storage, with the op that made it and its shape.

MemTracker gives totals per category; the findings need to know *which* tensors make the peak (how
many vocabulary-sized logits buffers, which attention intermediates). :class:`PeakInventory` is a
dispatch mode that remembers each storage created under it (op, shape, dtype, bytes) until the
storage dies, and keeps a copy of the live set at the highest total it has seen.
"""

from __future__ import annotations

import math
import weakref
from collections import Counter
from dataclasses import dataclass
from typing import Any

from calibration.tracing import CUDA_MIN_BLOCK_BYTES


@dataclass(frozen=True)
class LiveStorage:
    """One storage alive at the peak."""

    op: str
    """The dispatcher op that created it (``external`` for parameters and optimizer states)."""
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    """Bytes after the CUDA allocator's 512-byte rounding."""
    phase: str
    """Label of the phase it was created in."""


def make_inventory() -> Any:
    """A new :class:`PeakInventory` (built lazily so that importing this module needs no torch)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.weak import WeakIdKeyDictionary

    class PeakInventory(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.live: dict[int, LiveStorage] = {}
            self.refs = WeakIdKeyDictionary()
            self.total = 0
            self.peak_total = 0
            self.peak_live: list[LiveStorage] = []
            self.peak_phase = ""
            self.phase = "setup"
            # Highest total and the live set at that instant, per phase label.
            self.phase_peaks: dict[str, tuple[int, list[LiveStorage]]] = {}

        def _forget(self, key: int, _ref: Any) -> None:
            entry = self.live.pop(key, None)
            if entry is not None:
                self.total -= entry.nbytes

        def add(self, tensor: Any, op: str) -> None:
            storage = tensor.untyped_storage()
            if storage in self.refs:
                return
            key = id(storage)
            nbytes = math.ceil(storage.nbytes() / CUDA_MIN_BLOCK_BYTES) * CUDA_MIN_BLOCK_BYTES
            self.refs[storage] = weakref.ref(storage, lambda r, k=key: self._forget(k, r))
            self.live[key] = LiveStorage(
                op=op,
                shape=tuple(int(d) for d in tensor.shape),
                dtype=str(tensor.dtype).replace("torch.", ""),
                nbytes=nbytes,
                phase=self.phase,
            )
            self.total += nbytes
            best = self.phase_peaks.get(self.phase)
            if best is None or self.total > best[0]:
                self.phase_peaks[self.phase] = (self.total, list(self.live.values()))
            if self.total > self.peak_total:
                self.peak_total = self.total
                self.peak_live = list(self.live.values())
                self.peak_phase = self.phase

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            import torch

            out = func(*args, **(kwargs or {}))
            flat, _ = tree_flatten(out)
            name = str(func.overloadpacket.__name__)
            for item in flat:
                if isinstance(item, torch.Tensor):
                    self.add(item, name)
            return out

    return PeakInventory()


def summarize(live: list[LiveStorage], top: int = 12) -> list[dict[str, Any]]:
    """The largest groups of live storages by (op, shape, dtype), with counts and bytes."""
    groups: Counter[tuple[str, tuple[int, ...], str]] = Counter()
    sizes: dict[tuple[str, tuple[int, ...], str], int] = {}
    for entry in live:
        key = (entry.op, entry.shape, entry.dtype)
        groups[key] += 1
        sizes[key] = entry.nbytes
    ranked = sorted(groups, key=lambda k: groups[k] * sizes[k], reverse=True)
    return [
        {
            "op": key[0],
            "shape": list(key[1]),
            "dtype": key[2],
            "count": groups[key],
            "bytes": groups[key] * sizes[key],
        }
        for key in ranked[:top]
    ]
