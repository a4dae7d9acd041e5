"""Trace one training (or inference) step of a plan on fake tensors: ``hwdash plan --trace``.

PyTorch's ``FakeTensorMode`` runs a real Hugging Face model with real shapes, dtypes and devices but
allocates no storage, so a 70B step costs seconds and no GPU. ``MemTracker``
(``torch.distributed._tools.mem_tracker``) follows every storage's life and files it under
parameters, buffers, gradients, optimizer states, activations (forward) or temporaries (backward);
we read the peak of each phase and the breakdown at that instant. The method is the one of
``docs/accuracy.md`` (and its harness in ``bench/``), rewritten here so the product does not import
``bench``.

torch, transformers and peft are optional: they are imported inside functions only, so importing
this module costs nothing, and a missing package becomes a :class:`TraceUnavailable` (one line, exit
status 2). The Plan -> model-config mapping (:func:`build_hf_config_dict`, :func:`trace_settings`) is
pure and runs without them.

:func:`trace_plan` is blocking and safe to call from a worker thread; traces run one at a time (a
lock), because the CPU path patches one MemTracker function for the whole process. A caller such as
the TUI's trace action runs, in its worker::

    trace = trace_plan(plan, model)                      # seconds; TraceUnavailable says why not
    estimate = comparable_estimate(plan, model)          # the estimate the trace stands for
    rows = comparison_rows(trace, estimate.per_gpu.as_dict())  # (label, estimated, traced)

and shows ``str(error)`` of a :class:`TraceUnavailable` as a one-line message.

The package, by concern: :mod:`~hwdash.tracing.settings` (what to trace: the plan mapped onto one
step, pure), :mod:`~hwdash.tracing.model_config` (the transformers config built),
:mod:`~hwdash.tracing.depths` (two small depths and the line through them),
:mod:`~hwdash.tracing.tracer` (:func:`trace_plan`: device, kernels, depths, the result),
:mod:`~hwdash.tracing.step` (the step runner: build the fake model, run its steps),
:mod:`~hwdash.tracing.cuda_emulation` (CUDA's allocator and kernels on a CPU trace),
:mod:`~hwdash.tracing.tracker` (the MemTracker that keeps per-phase peaks),
:mod:`~hwdash.tracing.results` and :mod:`~hwdash.tracing.comparison` (the trace beside its estimate).
Every name is importable from ``hwdash.tracing`` itself.

May import: the core (``hwdash.core`` and its sub-packages) and ``hwdash.errors``; never telemetry,
the UI or the commands.
"""

from hwdash.tracing.comparison import (
    comparable_estimate,
    comparison_rows,
    relative_error,
    trace_document,
)
from hwdash.tracing.cuda_emulation import (
    CUDA_MIN_BLOCK_BYTES,
    _cuda_block_rounding,
    _cuda_fused_dropout,
)
from hwdash.tracing.depths import extrapolate_phases, layer_period, trace_depths
from hwdash.tracing.model_config import build_hf_config_dict, hf_model_type, local_config_dict
from hwdash.tracing.results import TRACE_COMPONENTS, TracePhase, TraceResult, TraceUnavailable
from hwdash.tracing.settings import TraceSettings, trace_settings, traced_plan
from hwdash.tracing.step import MLM_MASKED_EVERY, TraceHooks
from hwdash.tracing.tracer import check_trace_dependencies, trace_plan

__all__ = [
    "CUDA_MIN_BLOCK_BYTES",
    "MLM_MASKED_EVERY",
    "TRACE_COMPONENTS",
    "TraceHooks",
    "TracePhase",
    "TraceResult",
    "TraceSettings",
    "TraceUnavailable",
    "_cuda_block_rounding",
    "_cuda_fused_dropout",
    "build_hf_config_dict",
    "check_trace_dependencies",
    "comparable_estimate",
    "comparison_rows",
    "extrapolate_phases",
    "hf_model_type",
    "layer_period",
    "local_config_dict",
    "relative_error",
    "trace_depths",
    "trace_document",
    "trace_plan",
    "trace_settings",
    "traced_plan",
]
