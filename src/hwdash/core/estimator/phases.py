"""The phases whose peaks the estimate compares, and the bytes collected for each.

A training step has three candidate peaks (the start of backward, the end of backward, the optimizer
step) and inference one (prefill). Every part the estimator counts is recorded in an
:class:`_Accumulator` with the phases it is alive in; :func:`_peak_phase` picks the largest.

Two phases lie outside the step and can hold the peak too (issue 29):

* **model load** (``from_pretrained``): only what the load itself holds, recorded explicitly with
  :meth:`_Accumulator.add_phase_bytes` (the weights as loaded) and
  :meth:`_Accumulator.add_phase_transient` (the largest transient: a 16-bit weight being quantized,
  PEFT's fp32 upcast). Nothing else exists yet: no adapters, gradients, optimizer states or cache.
* **checkpoint save** (the Trainer's ``save_model`` / ``_save`` and the optimizer's state dict,
  between two steps): what every phase holds (weights, optimizer states, a colocated engine's
  reservation, the buffers that persist across steps; not the gradients the Trainer's
  ``zero_grad`` has freed, :attr:`_Accumulator.save_freed_gradients`) plus what a term records for
  the save with the same two methods (FSDP's ``FULL_STATE_DICT`` gather on rank 0, a ZeRO-3 16-bit
  gather). The single-GPU save itself copies nothing on the GPU: safetensors' ``save_file``
  (``safetensors/torch.py``, ``_tobytes``) moves each tensor to the CPU on its own, transformers'
  ``save_pretrained`` (``modeling_utils.py``) only calls ``.contiguous()`` (a no-op on a parameter),
  and ``torch.save`` of the optimizer's ``state_dict()`` copies each storage to the CPU.

Sources: the fake-tensor traces of ``bench/data/calibration.csv`` (its ``peak_phase`` column) for
where each phase peaks; PyTorch's ``zero_grad(set_to_none=True)`` default and DeepSpeed's config docs
(https://www.deepspeed.ai/docs/config-json/, ``reduce_bucket_size``, ``contiguous_gradients``) for
when gradients outlive backward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hwdash.core.plan import Plan
from hwdash.core.results import MemoryBreakdown

#: Names of the phases whose peaks :func:`~hwdash.core.estimator.estimate_memory` compares (``MemoryEstimate.peak_phase``).
PHASE_BACKWARD = "start of backward"
PHASE_BACKWARD_END = "end of backward"
PHASE_OPTIMIZER_STEP = "optimizer step"
PHASE_INFERENCE = "prefill"
PHASE_MODEL_LOAD = "model load"
PHASE_CHECKPOINT_SAVE = "checkpoint save"
#: Every name ``MemoryEstimate.peak_phase`` (and ``--json``'s ``peak_phase``) can take.
PEAK_PHASES = (
    PHASE_BACKWARD,
    PHASE_BACKWARD_END,
    PHASE_OPTIMIZER_STEP,
    PHASE_INFERENCE,
    PHASE_MODEL_LOAD,
    PHASE_CHECKPOINT_SAVE,
)
#: The phases outside the step, whose bytes are recorded explicitly (:class:`_PhaseRecords`).
OUTSIDE_STEP_PHASES = (PHASE_MODEL_LOAD, PHASE_CHECKPOINT_SAVE)
#: The step's phases (and prefill): what the step holds from start to end is alive in all of them.
_STEP_PHASES = frozenset(
    {PHASE_BACKWARD, PHASE_BACKWARD_END, PHASE_OPTIMIZER_STEP, PHASE_INFERENCE}
)
#: Which phases a recorded part is alive in. Weights, optimizer states and KV cache: every phase of
#: the step and the checkpoint save between two steps (not the model load, which records its own).
_EVERY_PHASE = _STEP_PHASES | {PHASE_CHECKPOINT_SAVE}
#: The components a phase outside the step may record bytes under (``MemoryBreakdown``'s, less the
#: overhead, which the estimate adds to every phase).
_COMPONENTS = ("weights", "gradients", "optimizer", "activations", "kv_cache")
_BACKWARD_ONLY = frozenset({PHASE_BACKWARD, PHASE_INFERENCE})
_BACKWARD_END_ONLY = frozenset({PHASE_BACKWARD_END})
_PRODUCED = frozenset({PHASE_BACKWARD_END, PHASE_OPTIMIZER_STEP})
_STEP_ONLY = frozenset({PHASE_OPTIMIZER_STEP})


@dataclass
class _PhaseRecords:
    """What one phase outside the step records: bytes held (summed) and transients (the largest).

    Held bytes add up (every model's weights as loaded); transients do not: they happen one at a
    time (one weight quantized at a time, one parameter upcast at a time), so only the largest
    counts, on top of everything held.
    """

    held: dict[str, float] = field(default_factory=lambda: dict.fromkeys(_COMPONENTS, 0.0))
    held_notes: list[tuple[str, float]] = field(default_factory=list)
    transient: tuple[str, str, float] | None = None
    """The largest transient: (component, label, bytes)."""

    @property
    def total(self) -> float:
        """Held bytes plus the largest transient."""
        return sum(self.held.values()) + (self.transient[2] if self.transient else 0.0)


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
    save_freed_gradients: float = 0.0
    """The part of ``persistent_gradients`` gone by a checkpoint save: gradient-accumulation sums,
    which the Trainer frees with ``zero_grad`` after the optimizer step and before it saves
    (transformers' ``trainer.py``, ``_inner_training_loop``: ``optimizer.step()``, ``model.zero_grad()``,
    then ``_maybe_log_save_evaluate``). DeepSpeed's and Megatron's gradient buffers stay."""
    side_stream_pool: float = 0.0
    """Bytes the caching allocator keeps reserved in a side stream's pool once the first step has
    run (FSDP1's all-gather stream): blocks of one stream are never handed to another, so they
    stay reserved while the compute stream allocates (``reserved``, not ``allocated``)."""
    side_stream_live: float = 0.0
    """The part of ``side_stream_pool`` that is allocated (counted in the tensors) during forward
    and backward; at the optimizer step none of it is."""

    def __post_init__(self) -> None:
        self.details: list[tuple[str, int, frozenset[str]]] = []
        self.warnings: list[str] = []
        self.outside: dict[str, _PhaseRecords] = {
            phase: _PhaseRecords() for phase in OUTSIDE_STEP_PHASES
        }

    def note(self, label: str, value: float, phases: frozenset[str] = _EVERY_PHASE) -> None:
        """Record a named sub-part for display, alive in ``phases``."""
        self.details.append((label, round(value), phases))

    def add_phase_bytes(self, phase: str, component: str, value: float, label: str) -> None:
        """Add ``value`` bytes held during ``phase`` (model load or checkpoint save) under
        ``component`` (``weights``, ``gradients``, ``optimizer``, ``activations``, ``kv_cache``),
        shown as ``label`` when that phase is the peak. Held bytes add up."""
        records = self._records(phase, component)
        records.held[component] += value
        records.held_notes.append((label, value))

    def add_phase_transient(self, phase: str, component: str, value: float, label: str) -> None:
        """Offer a transient of ``value`` bytes during ``phase`` (under ``component``): one that
        exists on top of everything held, one at a time, so only the largest offered counts."""
        records = self._records(phase, component)
        if records.transient is None or value > records.transient[2]:
            records.transient = (component, label, value)

    def _records(self, phase: str, component: str) -> _PhaseRecords:
        if phase not in self.outside:
            raise ValueError(f"{phase!r} is not a phase outside the step: {OUTSIDE_STEP_PHASES}")
        if component not in _COMPONENTS:
            raise ValueError(f"{component!r} is not a memory component: {_COMPONENTS}")
        return self.outside[phase]

    def phase_total(self, phase: str) -> float:
        """Bytes alive at the peak of ``phase`` (overhead excluded)."""
        if phase == PHASE_MODEL_LOAD:
            return self.outside[phase].total
        if phase == PHASE_CHECKPOINT_SAVE:
            return self._between_steps() + self.outside[phase].total
        common = self.weights + self.optimizer + self.kv_cache + self.persistent_gradients
        if phase == PHASE_OPTIMIZER_STEP:
            return common + self.produced_gradients + self.master_gradients + self.step_temporaries
        if phase == PHASE_BACKWARD_END:
            return common + self.backward_end_gradients() + self.last_layer_activations
        return common + self.unsynced_gradients + self.activations

    def backward_end_gradients(self) -> float:
        """The gradients (beyond the persistent ones) at the end of a backward: under ``no_sync``
        the end of a micro-batch before the last holds the unsharded sums and no shard yet, the
        end of the last one the shards and no sum (each unit's sum is freed once reduce-scattered:
        ``FullyShardedDataParallel`` post-backward), so the larger of the two; else the
        gradients backward produced."""
        if self.unsynced_gradients:
            return max(self.unsynced_gradients, self.produced_gradients)
        return self.produced_gradients

    def _between_steps(self) -> float:
        """What stays on the GPU between two optimizer steps (a checkpoint save's base)."""
        return (
            self.weights
            + self.optimizer
            + self.kv_cache
            + self.persistent_gradients
            - self.save_freed_gradients
        )


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
    """The phase whose bytes are the peak: the start or end of backward, or the step (prefill for
    inference), or a phase outside the step (model load, checkpoint save) where it holds more.
    On a tie the step's phase wins (the phases outside it are listed last).

    The forward's own peak (16-bit logits, their fp32 copy and the log-softmax output) is below the
    start of backward, which holds the saved activations plus 12 bytes per logit
    (:data:`~hwdash.core.estimator.activations.LOSS_FP32_BYTES_PER_LOGIT`); traced on every training row of the calibration CSV. The
    first step is never higher than a later one for the same phase: the optimizer states are
    created lazily inside the first step, so they are absent from its forward and backward.
    """
    if not plan.is_training:
        return max((PHASE_INFERENCE, PHASE_MODEL_LOAD), key=acc.phase_total)
    phases = (
        PHASE_BACKWARD,
        PHASE_BACKWARD_END,
        PHASE_OPTIMIZER_STEP,
        PHASE_MODEL_LOAD,
        PHASE_CHECKPOINT_SAVE,
    )
    return max(phases, key=acc.phase_total)


def _phase_details(acc: _Accumulator, phase: str) -> list[tuple[str, int]]:
    """The named sub-parts alive at ``phase``: the notes of the parts alive then, and what the
    phase recorded for itself (held bytes, then its largest transient)."""
    details = [(label, value) for label, value, phases in acc.details if phase in phases]
    records = acc.outside.get(phase)
    if records is not None:
        details.extend((label, round(value)) for label, value in records.held_notes)
        if records.transient is not None:
            details.append((records.transient[1], round(records.transient[2])))
    return details


def _peak_breakdown(acc: _Accumulator, phase: str, overhead: float) -> MemoryBreakdown:
    """The components as they are at the peak of ``phase``, rounded up to whole bytes: the
    gradients produced by backward from its end on, the fp32 master gradients and the step's
    temporaries at the optimizer step only, the activations at the start of backward (or prefill),
    the first layer's at the end of backward, none at the step. Outside the step: the model load
    holds only what it recorded; a checkpoint save what stays between steps plus its records."""
    if phase in acc.outside:
        return _outside_breakdown(acc, phase, overhead)
    at_step = phase == PHASE_OPTIMIZER_STEP
    at_end = phase == PHASE_BACKWARD_END
    peak_gradients = acc.persistent_gradients
    if at_end:
        peak_gradients += acc.backward_end_gradients()
    elif at_step:
        peak_gradients += acc.produced_gradients
    else:
        peak_gradients += acc.unsynced_gradients
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


def _outside_breakdown(acc: _Accumulator, phase: str, overhead: float) -> MemoryBreakdown:
    """The components at a phase outside the step (see :func:`_peak_breakdown`)."""
    parts = dict(acc.outside[phase].held)
    transient = acc.outside[phase].transient
    if transient is not None:
        parts[transient[0]] += transient[2]
    if phase == PHASE_CHECKPOINT_SAVE:
        parts["weights"] += acc.weights
        parts["optimizer"] += acc.optimizer
        parts["kv_cache"] += acc.kv_cache
        parts["gradients"] += acc.persistent_gradients - acc.save_freed_gradients
    return MemoryBreakdown(
        weights=math.ceil(parts["weights"]),
        gradients=math.ceil(parts["gradients"]),
        optimizer=math.ceil(parts["optimizer"]),
        activations=math.ceil(parts["activations"]),
        kv_cache=math.ceil(parts["kv_cache"]),
        overhead=math.ceil(overhead),
    )
