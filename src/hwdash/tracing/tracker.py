"""The tracker: torch's MemTracker, made to accept frozen parameters and to keep per-phase peaks.

``MemTracker`` (``torch.distributed._tools.mem_tracker``) follows every storage's life and files it
under parameters, buffers, gradients, optimizer states, activations (forward) or temporaries
(backward); :func:`_make_tracker` builds one that reads the peak of each phase and the breakdown at
that instant. torch is imported inside :func:`_make_tracker` only.
"""

from __future__ import annotations

import gc
from typing import Any

from hwdash.tracing.results import TRACE_COMPONENTS, TracePhase

#: MemTracker's reference types (``_MemRefType`` values in torch 2.13) -> our component names.
_TRACKER_CATEGORIES = {
    "Parameter": "parameters",
    "Buffer": "buffers",
    "Gradient": "gradients",
    "Optstate": "optimizer",
    "Activation": "activations",
    "Temp": "temporaries",
    "Other": "other",
}


class _NoHandle:
    """The hook handle recorded for a frozen parameter, which gets no gradient hook."""

    def remove(self) -> None:
        return None


class _PhasePeaks:
    """What :func:`_make_tracker` adds to MemTracker (placed before it in the class's bases).

    torch 2.13's MemTracker installs a gradient hook on every parameter of every module it enters,
    which fails on frozen parameters (LoRA bases, inference): those are recorded as hooked with no
    hook. After every op it also refreshes the peak of every module seen, which makes a trace
    quadratic in the module count; we only need the device peak per phase, so this keeps just that
    (``phase_label`` names the running phase).
    """

    # set by MemTracker.__init__ (torch.distributed._tools.mem_tracker)
    _param_to_grad_hook_handles: dict[Any, Any]
    _curr_mem_snap: dict[Any, dict[Any, int]]

    def __init__(self) -> None:
        super().__init__()
        self.phase_label: tuple[int, str] = (0, "")
        self.phase_peak = 0
        self.phase_snapshot: dict[str, int] = {}

    def _track_module_params_and_buffers(  # type: ignore[no-untyped-def]
        self, module: Any, install_grad_hooks: bool = True
    ):
        """Record frozen parameters as hooked with no hook, then let MemTracker track the rest."""
        for param in module.parameters():
            if not param.requires_grad and param not in self._param_to_grad_hook_handles:
                self._param_to_grad_hook_handles[param] = (_NoHandle(), _NoHandle())
        track = super()._track_module_params_and_buffers  # type: ignore[misc]
        return track(module, install_grad_hooks)

    def _update_peak_stats(self, peak_state: Any) -> None:
        """MemTracker's per-op refresh of every module's peak, replaced by the phase's peak."""
        self.record_current()

    def record_current(self) -> None:
        """Keep the live bytes (and their breakdown) as the phase's peak when they exceed it."""
        total, snapshot = self.current()
        if total > self.phase_peak or not self.phase_snapshot:
            self.phase_peak = total
            self.phase_snapshot = snapshot

    def current(self) -> tuple[int, dict[str, int]]:
        """Live bytes on every device, in all and by component (:data:`TRACE_COMPONENTS`)."""
        total = 0
        snapshot = dict.fromkeys(TRACE_COMPONENTS, 0)
        for device_snapshot in self._curr_mem_snap.values():
            for key, value in device_snapshot.items():
                name = str(getattr(key, "value", key))
                if name == "Total":
                    total += int(value)
                elif name in _TRACKER_CATEGORIES:
                    snapshot[_TRACKER_CATEGORIES[name]] += int(value)
        return total, snapshot

    def close_phase(self, step: int, phase: str, collect: bool) -> TracePhase:
        """End a phase: its peak and the bytes alive at its end; the next phase starts from here."""
        if collect:
            gc.collect()
        self.record_current()
        end_total, end_components = self.current()
        closed = TracePhase(
            step=step,
            phase=phase,
            total=self.phase_peak,
            components=self.phase_snapshot,
            end_total=end_total,
            end_components=end_components,
        )
        self.phase_peak = 0
        self.phase_snapshot = {}
        self.record_current()
        return closed


def _make_tracker() -> Any:
    """A MemTracker that accepts frozen parameters and keeps per-phase peaks itself
    (:class:`_PhasePeaks`)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class PhasePeakTracker(_PhasePeaks, MemTracker):  # type: ignore[misc]
        pass

    return PhasePeakTracker()
