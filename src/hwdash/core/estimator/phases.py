"""The phases of a step whose peaks the estimate compares, and the bytes collected for each.

A training step has three candidate peaks (the start of backward, the end of backward, the optimizer
step) and inference one (prefill). Every part the estimator counts is recorded in an
:class:`_Accumulator` with the phases it is alive in; :func:`_peak_phase` picks the largest.

Sources: the fake-tensor traces of ``bench/data/calibration.csv`` (its ``peak_phase`` column) for
where each phase peaks; PyTorch's ``zero_grad(set_to_none=True)`` default and DeepSpeed's config docs
(https://www.deepspeed.ai/docs/config-json/, ``reduce_bucket_size``, ``contiguous_gradients``) for
when gradients outlive backward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hwdash.core.plan import Plan
from hwdash.core.results import MemoryBreakdown

#: Names of the phases whose peaks :func:`~hwdash.core.estimator.estimate_memory` compares (``MemoryEstimate.peak_phase``).
PHASE_BACKWARD = "start of backward"
PHASE_BACKWARD_END = "end of backward"
PHASE_OPTIMIZER_STEP = "optimizer step"
PHASE_INFERENCE = "prefill"
#: Which phases a recorded part is alive in. Weights, optimizer states and KV cache: every phase.
_EVERY_PHASE = frozenset(
    {PHASE_BACKWARD, PHASE_BACKWARD_END, PHASE_OPTIMIZER_STEP, PHASE_INFERENCE}
)
_BACKWARD_ONLY = frozenset({PHASE_BACKWARD, PHASE_INFERENCE})
_BACKWARD_END_ONLY = frozenset({PHASE_BACKWARD_END})
_PRODUCED = frozenset({PHASE_BACKWARD_END, PHASE_OPTIMIZER_STEP})
_STEP_ONLY = frozenset({PHASE_OPTIMIZER_STEP})


@dataclass
class _Accumulator:
    """Bytes collected while estimating one plan (floats until the end).

    Training has three candidate peaks (see :func:`_peak_phase`): the start of backward, where the
    saved activations and the loss's fp32 tensors are alive; the end of backward, where the
    gradients are (nearly) all there and the first layer is being differentiated (recomputed, with
    checkpointing); and the optimizer step, where every gradient, the states and the step's
    temporaries are. Gradients are split accordingly: ``persistent_gradients`` are alive in all
    three (gradient accumulation, DeepSpeed's buffers, RL), ``produced_gradients`` from the end of
    backward on (one micro-batch per step: they appear as the activations are freed),
    ``master_gradients`` (fp32 copies for a master copy) at the step only, ``unsynced_gradients``
    during backward only (FSDP's unsharded sums under ``no_sync``, reduce-scattered into their
    shards by the last micro-batch's backward, before the step).
    """

    weights: float = 0.0
    persistent_gradients: float = 0.0
    produced_gradients: float = 0.0
    master_gradients: float = 0.0
    unsynced_gradients: float = 0.0
    optimizer: float = 0.0
    step_temporaries: float = 0.0
    activations: float = 0.0
    last_layer_activations: float = 0.0
    kv_cache: float = 0.0
    host: float = 0.0
    managed: float = 0.0
    """Paged optimizer states (CUDA managed memory): in ``optimizer`` too (NVML sees them)."""

    def __post_init__(self) -> None:
        self.details: list[tuple[str, int, frozenset[str]]] = []
        self.warnings: list[str] = []

    def note(self, label: str, value: float, phases: frozenset[str] = _EVERY_PHASE) -> None:
        """Record a named sub-part for display, alive in ``phases``."""
        self.details.append((label, round(value), phases))

    def phase_total(self, phase: str) -> float:
        """Bytes alive at the peak of ``phase`` (overhead excluded)."""
        common = self.weights + self.optimizer + self.kv_cache + self.persistent_gradients
        if phase == PHASE_OPTIMIZER_STEP:
            return common + self.produced_gradients + self.master_gradients + self.step_temporaries
        if phase == PHASE_BACKWARD_END:
            return (
                common
                + self.unsynced_gradients
                + self.produced_gradients
                + self.last_layer_activations
            )
        return common + self.unsynced_gradients + self.activations


def _gradients_persist(plan: Plan) -> bool:
    """Whether gradients are alive during backward (and so at its start, with the activations).

    With one micro-batch per optimizer step and ``zero_grad(set_to_none=True)`` (the Trainer's and
    PyTorch's default), each gradient appears as backward frees the activations that produced it,
    so the start of backward holds activations and no gradients, and the step holds gradients and no
    activations. Traced on every full fine-tuning row of ``bench/data/calibration.csv``: gradient
    bytes are 0 at the backward peak. They persist with gradient accumulation (the earlier
    micro-batches' sums), with DeepSpeed ZeRO (its gradient partitions and reduce buckets live
    across backward; https://www.deepspeed.ai/docs/config-json/ ``reduce_bucket_size``,
    ``contiguous_gradients``) and, conservatively, for RL plans, which alternate several models.
    """
    return plan.grad_accum > 1 or plan.zero >= 1 or plan.is_rl


def _peak_phase(plan: Plan, acc: _Accumulator) -> str:
    """The phase whose bytes are the step's peak: the start or end of backward, or the step.

    The forward's own peak (16-bit logits, their fp32 copy and the log-softmax output) is below the
    start of backward, which holds the saved activations plus 12 bytes per logit
    (:data:`~hwdash.core.estimator.activations.LOSS_FP32_BYTES_PER_LOGIT`); traced on every training row of the calibration CSV. The
    first step is never higher than a later one for the same phase: the optimizer states are
    created lazily inside the first step, so they are absent from its forward and backward.
    """
    if not plan.is_training:
        return PHASE_INFERENCE
    phases = (PHASE_BACKWARD, PHASE_BACKWARD_END, PHASE_OPTIMIZER_STEP)
    return max(phases, key=acc.phase_total)


def _peak_breakdown(acc: _Accumulator, phase: str, overhead: float) -> MemoryBreakdown:
    """The components as they are at the peak of ``phase``, rounded up to whole bytes: the
    gradients produced by backward from its end on, the fp32 master gradients and the step's
    temporaries at the optimizer step only, the activations at the start of backward (or prefill),
    the first layer's at the end of backward, none at the step."""
    at_step = phase == PHASE_OPTIMIZER_STEP
    at_end = phase == PHASE_BACKWARD_END
    peak_gradients = acc.persistent_gradients
    if not at_step:
        peak_gradients += acc.unsynced_gradients
    if at_step or at_end:
        peak_gradients += acc.produced_gradients
    if at_step:
        peak_gradients += acc.master_gradients
    peak_activations = acc.activations
    if at_step:
        peak_activations = 0.0
    elif at_end:
        peak_activations = acc.last_layer_activations
    return MemoryBreakdown(
        weights=math.ceil(acc.weights),
        gradients=math.ceil(peak_gradients),
        optimizer=math.ceil(acc.optimizer + (acc.step_temporaries if at_step else 0.0)),
        activations=math.ceil(peak_activations),
        kv_cache=math.ceil(acc.kv_cache),
        overhead=math.ceil(overhead),
    )
