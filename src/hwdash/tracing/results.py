"""What a trace measured: phases, the result, and the error a trace that cannot run raises.

Pure (no torch): the CLI, the TUI and the calibration harness read these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hwdash.errors import UsageError

#: Components of a traced peak, in display order.
TRACE_COMPONENTS = (
    "parameters",
    "buffers",
    "gradients",
    "optimizer",
    "activations",
    "temporaries",
    "other",
)


class TraceUnavailable(UsageError):
    """The plan cannot be traced here (a package is missing, or the setting is not traceable)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, flag="--trace")


@dataclass(frozen=True)
class TracePhase:
    """The peak of one phase of the traced step."""

    step: int
    """1 for the first training step (Adam creates its states in it), 2 for a later one, 0 for
    inference."""
    phase: str
    """``forward`` (incl. the loss), ``backward``, ``optimizer`` (step and zero_grad), ``prefill``
    or ``decode``."""
    total: int
    """Peak bytes of all live storages during the phase."""
    components: dict[str, int]
    """Bytes by component (:data:`TRACE_COMPONENTS`) at the peak instant."""
    end_total: int = 0
    """Bytes alive when the phase ended (after forward: what backward will consume)."""
    end_components: dict[str, int] = field(default_factory=dict)
    """Bytes by component when the phase ended."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (the peak only; the end-of-phase bytes are for the calibration harness)."""
        return {
            "step": self.step,
            "phase": self.phase,
            "total": self.total,
            "components": dict(self.components),
        }


@dataclass(frozen=True)
class TraceResult:
    """What a fake-tensor trace of one plan measured."""

    peak_bytes: int
    """Peak bytes of live tensor storages on the device, over the whole traced step(s)."""
    components: dict[str, int]
    """Bytes by component (:data:`TRACE_COMPONENTS`) at the peak instant."""
    peak_step: int
    """Step of the peak (see :attr:`TracePhase.step`)."""
    peak_phase: str
    """Phase of the peak (see :attr:`TracePhase.phase`)."""
    phases: tuple[TracePhase, ...]
    """Every phase's own peak, in the order they ran."""
    device: str
    """Device type the fake tensors lived on (``cuda`` or ``cpu``)."""
    layers: int
    """Decoder layers of the model the result stands for."""
    traced_layers: tuple[int, ...]
    """Depths actually traced: the full depth, or two small depths extrapolated to ``layers``."""
    total_params: int
    """Parameters of the traced model (adapters included)."""
    trainable_params: int
    """Parameters that receive gradients."""
    seconds: float
    """Wall time of the trace."""
    notes: tuple[str, ...] = ()
    """How the trace differs from the plan or from a real run."""
    versions: dict[str, str] = field(default_factory=dict)
    """torch, transformers and peft versions used."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (the ``trace`` object of ``hwdash plan --trace --json``)."""
        return {
            "peak_bytes": self.peak_bytes,
            "components": dict(self.components),
            "peak_step": self.peak_step,
            "peak_phase": self.peak_phase,
            "phases": [phase.as_dict() for phase in self.phases],
            "device": self.device,
            "layers": self.layers,
            "traced_layers": list(self.traced_layers),
            "total_params": self.total_params,
            "trainable_params": self.trainable_params,
            "seconds": round(self.seconds, 3),
            "notes": list(self.notes),
            "versions": dict(self.versions),
        }
