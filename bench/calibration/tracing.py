"""Trace one calibration case on fake tensors and return its peak memory, phase by phase.

Everything runs under ``FakeTensorMode``: shapes, dtypes and strides are real, no storage is
allocated, so a 47B-parameter Mixtral step costs the same few seconds as a 0.5B one. ``MemTracker``
(``torch.distributed._tools.mem_tracker``) follows every storage's life and classifies it as
parameter, buffer, gradient, activation, temp (backward) or optimizer state.

Depth: the time of a trace grows with the number of layers, not with their size. A case is traced at
two small depths (whole multiples of the family's layer period) and each phase's peak is extrapolated
linearly to the catalog depth: every component of a uniform decoder stack grows by the same bytes per
layer, so the line through two depths is exact while the peak stays at the same point of the step.
``--validate-depth`` traces a few cases at full depth to check that.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from calibration.architectures import config_fields, family_of, layer_period
from calibration.cases import CalibrationCase
from hwdash.core.specs import ModelSpec

#: The CUDA caching allocator rounds every block up to a multiple of 512 bytes
#: (c10/cuda/CUDACachingAllocator.cpp, kMinBlockSize); MemTracker applies that to cuda devices only.
CUDA_MIN_BLOCK_BYTES = 512

#: :data:`hwdash.tracing.TRACE_COMPONENTS` (MemTracker's categories), renamed to the keys the
#: records and the CSV's ``peak_*`` columns use.
COMPONENT_NAMES = {
    "parameters": "parameter",
    "buffers": "buffer",
    "gradients": "gradient",
    "activations": "activation",
    "temporaries": "temp",
    "optimizer": "optimizer",
    "other": "other",
}

#: Dispatcher ops whose presence tells which attention kernel ran.
ATTENTION_OP_MARKERS = ("scaled_dot_product", "_softmax", "softmax")


@dataclass(frozen=True)
class PhasePeak:
    """Peak bytes during one phase of one step, with the breakdown at that instant."""

    step: int
    """1 for the first training step (optimizer states created lazily), 2 for a later one; 0 for inference."""
    phase: str
    """``forward`` (incl. loss), ``backward``, ``optimizer`` (step + zero_grad), ``prefill``, ``decode``."""
    total: int
    """Peak bytes of all live storages during the phase."""
    components: dict[str, int]
    """Bytes by MemTracker category at the peak instant (keys of :data:`COMPONENT_NAMES`)."""
    end_total: int = 0
    """Bytes alive when the phase ended (after forward: what backward will consume)."""
    end_components: dict[str, int] = field(default_factory=dict)
    """Bytes by category when the phase ended."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "step": self.step,
            "phase": self.phase,
            "total": self.total,
            "components": dict(self.components),
            "end_total": self.end_total,
            "end_components": dict(self.end_components),
        }


@dataclass
class DepthTrace:
    """What one trace at a given depth saw."""

    layers: int
    total_params: int
    trainable_params: int
    phases: list[PhasePeak]
    attention_ops: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _op_recorder() -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class AttentionOpRecorder(TorchDispatchMode):
        """Records the names of attention-related dispatcher ops that run."""

        def __init__(self) -> None:
            super().__init__()
            self.seen: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            name = str(func.overloadpacket.__name__)
            if any(marker in name for marker in ATTENTION_OP_MARKERS):
                self.seen.add(name)
            return func(*args, **(kwargs or {}))

    return AttentionOpRecorder()


#: The phases whose attention ops are recorded: the first forward (training) or the prefill; the
#: backward's kernels are named after the forward's and would only repeat them.
_RECORDED_PHASES = {(1, "forward"), (0, "prefill")}


#: Version of the tracing rules a record was made with; ``bench/calibrate.py`` re-traces records made
#: under older rules. 2: bf16/mixed LoRA and DoRA under autocast (:func:`forward_autocast`), full-depth
#: fallback when the two-depth line goes negative (:func:`measure`). 3 (issue 14): the step itself is
#: :func:`hwdash.tracing.trace_plan`'s (one tracer); rules-2 records are kept because
#: ``bench/trace_parity.py`` found the two tracers' peaks identical on the grid.
TRACE_RULES = 3
#: Records made under these rules are reused as they are (see :data:`TRACE_RULES`).
COMPATIBLE_TRACE_RULES = 2


def forward_autocast(case: CalibrationCase) -> bool:
    """Whether the forward runs under bf16 autocast, as the Hugging Face Trainer would run it.

    Decided by :func:`hwdash.tracing.trace_settings` (``amp``; bf16 LoRA and DoRA, whose fp32 PEFT
    adapters make autocast decide whether the inputs they keep are 2 or 4 bytes per element).
    """
    from hwdash.core.plan import Plan
    from hwdash.tracing import trace_settings

    return trace_settings(Plan(**case.plan_fields())).autocast


def _hooks(recorder: Any, inventory: Any) -> Any:
    """The harness's extras as :class:`hwdash.tracing.TraceHooks`: the attention-op recorder and,
    for the findings, the inventory of live storages (with the phase labels it files them under).

    The recorder is a dispatch mode entered only for the recorded phases (:data:`_RECORDED_PHASES`)
    and left when the next phase starts: kept on for the whole run, an extra Python dispatch mode
    changed Phi-2's amp LoRA step-2 peak by -1.9% (tensor lifetimes under autocast), so it runs
    exactly where the harness's own step used to enter it.
    """
    from hwdash.tracing import TraceHooks

    recording = contextlib.ExitStack()

    @contextlib.contextmanager
    def around_run(model: Any) -> Iterator[None]:
        with contextlib.ExitStack() as extras:
            if inventory is not None:
                for param in model.parameters():
                    inventory.add(param, "parameter")
                extras.enter_context(inventory)
            try:
                yield
            finally:
                recording.close()

    def on_phase(step: int, phase: str) -> None:
        recording.close()
        if (step, phase) in _RECORDED_PHASES:
            recording.enter_context(recorder)
        if inventory is not None:
            inventory.phase = f"step {step} {phase}"

    return TraceHooks(around_run=around_run, on_phase=on_phase)


def _phase_peak(phase: Any) -> PhasePeak:
    """A :class:`hwdash.tracing.TracePhase` in the harness's record terms."""
    return PhasePeak(
        step=phase.step,
        phase=phase.phase,
        total=phase.total,
        components={COMPONENT_NAMES[k]: v for k, v in phase.components.items()},
        end_total=phase.end_total,
        end_components={COMPONENT_NAMES[k]: v for k, v in phase.end_components.items()},
    )


def trace_at_depth(
    case: CalibrationCase, spec: ModelSpec, layers: int, inventory: Any = None
) -> DepthTrace:
    """Trace ``case`` with ``layers`` decoder blocks on fake tensors.

    The step is :func:`hwdash.tracing.trace_plan`'s (the tracer ``hwdash plan --trace`` runs), at
    exactly this depth, with the harness's transformers config
    (:func:`calibration.architectures.config_fields`), the SDPA kernel the case asks for and the
    harness's extras as hooks. ``inventory`` (from :func:`calibration.inventory.make_inventory`) also
    records every live storage at the peak.
    """
    from hwdash.core.plan import Plan
    from hwdash.tracing import trace_plan

    started = time.perf_counter()
    recorder = _op_recorder()
    # Collect what earlier traces left, then freeze the survivors (imported modules, the catalog) so
    # that the collections at DoRA's phase boundaries scan only this trace's objects.
    gc.collect()
    gc.freeze()
    try:
        trace = trace_plan(
            Plan(**case.plan_fields()),
            spec,
            device="cpu",
            full_depth=True,
            sdpa_math=case.sdpa_backend == "math",
            hf_config=config_fields(spec, layers),
            hooks=_hooks(recorder, inventory),
            # CPU's own dropout, as every row of bench/data/calibration.csv was traced: its fp32
            # masks are converted to CUDA's bool ones when scored (estimator_errors.py)
            cuda_dropout=False,
        )
    finally:
        gc.unfreeze()
    return DepthTrace(
        layers=layers,
        total_params=trace.total_params,
        trainable_params=trace.trainable_params,
        phases=[_phase_peak(phase) for phase in trace.phases],
        attention_ops=sorted(recorder.seen),
        seconds=time.perf_counter() - started,
    )


def depths_for(spec: ModelSpec, small: int = 2) -> tuple[int, int]:
    """The two depths a case is traced at: ``small`` and twice that, rounded to the layer period."""
    period = layer_period(spec)
    first = max(period, math.ceil(small / period) * period)
    return first, 2 * first


def _line(a: int, b: int, la: int, lb: int, layers: int) -> int:
    # Exact integer extrapolation: per-layer bytes are whole numbers.
    return a + (b - a) * (layers - la) // (lb - la)


def extrapolate(a: DepthTrace, b: DepthTrace, layers: int) -> DepthTrace:
    """Each phase's peak and components, and the parameter counts, on the line through two depths."""
    if [(p.step, p.phase) for p in a.phases] != [(p.step, p.phase) for p in b.phases]:
        raise ValueError("the two traces did not run the same phases")
    phases = []
    for pa, pb in zip(a.phases, b.phases, strict=True):
        components = {
            name: _line(pa.components[name], pb.components[name], a.layers, b.layers, layers)
            for name in pa.components
        }
        end_components = {
            name: _line(
                pa.end_components[name], pb.end_components[name], a.layers, b.layers, layers
            )
            for name in pa.end_components
        }
        phases.append(
            PhasePeak(
                step=pa.step,
                phase=pa.phase,
                total=_line(pa.total, pb.total, a.layers, b.layers, layers),
                components=components,
                end_total=_line(pa.end_total, pb.end_total, a.layers, b.layers, layers),
                end_components=end_components,
            )
        )
    return DepthTrace(
        layers=layers,
        total_params=_line(a.total_params, b.total_params, a.layers, b.layers, layers),
        trainable_params=_line(a.trainable_params, b.trainable_params, a.layers, b.layers, layers),
        phases=phases,
        attention_ops=sorted(set(a.attention_ops) | set(b.attention_ops)),
        seconds=a.seconds + b.seconds,
    )


def negative_components(trace: DepthTrace) -> list[str]:
    """The phases whose extrapolated peak breakdown has a negative component, as readable text."""
    found = []
    for phase in trace.phases:
        bad = sorted(name for name, value in phase.components.items() if value < 0)
        if bad:
            found.append(f"step {phase.step} {phase.phase}: {', '.join(bad)}")
    return found


def measure(case: CalibrationCase, spec: ModelSpec, *, full_depth: bool = False) -> dict[str, Any]:
    """Trace a case (two small depths and extrapolation, or the full depth) and return its record."""
    import peft
    import torch
    import transformers

    depth_note = ""
    if full_depth or spec.layers <= depths_for(spec)[1]:
        trace = trace_at_depth(case, spec, spec.layers)
        traced_depths = [spec.layers]
    else:
        low, high = depths_for(spec)
        trace = extrapolate(
            trace_at_depth(case, spec, low), trace_at_depth(case, spec, high), spec.layers
        )
        traced_depths = [low, high]
        negative = negative_components(trace)
        if negative:
            # The phase peaked at different instants at the two depths (seen in checkpointed
            # backward: the loss gradient at one depth, a recomputed layer at the other), so the
            # line through them means nothing; only a full-depth trace gives that phase's peak.
            depth_note = f"negative when extrapolated ({'; '.join(negative)}): traced at full depth"
            trace = trace_at_depth(case, spec, spec.layers)
            traced_depths = [spec.layers]
    peak = max(trace.phases, key=lambda p: p.total)
    first_step = [p.total for p in trace.phases if p.step in (0, 1)]
    later_step = [p.total for p in trace.phases if p.step == 2]
    return {
        "case_id": case.case_id,
        "plan": case.plan_fields(),
        "optimizer_impl": case.optimizer_impl,
        "lora_dropout": case.lora_dropout,
        "sdpa_backend": case.sdpa_backend,
        "family": family_of(spec),
        "layers": spec.layers,
        "traced_depths": traced_depths,
        "total_params": trace.total_params,
        "trainable_params": trace.trainable_params,
        "peak_bytes": peak.total,
        "peak_step": peak.step,
        "peak_phase": peak.phase,
        "peak_components": peak.components,
        "first_step_peak_bytes": max(first_step),
        "later_step_peak_bytes": max(later_step) if later_step else None,
        "phases": [p.as_dict() for p in trace.phases],
        "attention_ops": trace.attention_ops,
        "trace_seconds": round(trace.seconds, 3),
        "autocast": forward_autocast(case),
        "trace_rules": TRACE_RULES,
        "depth_note": depth_note,
        "step_peak_bytes": max(
            (p.total for p in trace.phases if p.phase == "optimizer"), default=None
        ),
        "fake_device": "cpu",
        "cuda_block_rounding": CUDA_MIN_BLOCK_BYTES,
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
        },
    }
