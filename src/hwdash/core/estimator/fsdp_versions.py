"""What FSDP1 and FSDP2 hold beyond the sharded states and the gathered units
(:func:`hwdash.core.estimator.parallelism.add_fsdp_training`): padding, staging buffers, the
all-gathers the CPU may run ahead with, the fp32 reduce-scatter and a full state dict at save.

Sources (PyTorch 2.13, ``torch/distributed/fsdp``):

* FSDP1 (``FullyShardedDataParallel``), ``_flat_param.py``: each unit's parameters are flattened
  into one ``FlatParameter`` padded to a multiple of the shard count (``numel_to_pad =
  world_size - total_numel % world_size``), so each rank's shard is ``ceil(numel / N)`` elements.
  ``_runtime_utils.py``: ``_unshard`` waits on ``_free_event_queue`` when ``limit_all_gathers``
  is on, and ``_limiter_utils.py`` lets at most two all-gathers be in flight
  (``_max_num_inflight_all_gathers = 2``); off, nothing bounds how far the CPU thread issues
  all-gathers ahead of the GPU. ``_post_backward_hook`` casts the unsharded gradient to
  ``reduce_dtype`` when it differs (``flat_param.grad.to(handle._reduce_dtype)``, the original
  kept until the hook returns) and ``_get_reduce_scatter_tensors`` allocates the new sharded
  gradient (``torch.empty_like(chunks[0])``). Before the hook, the unit's flat gradient is assembled
  from its views' gradients: ``_get_unflat_views_unaligned`` makes the views with ``torch.split``,
  whose backward concatenates them into a new flat tensor while they are held. With
  ``CPUOffload(offload_params=True)`` the shard is copied to the GPU before the all-gather and the
  gradient shard back to pinned host memory.
* FSDP2 (``fully_shard``), ``_fully_shard/_fsdp_collectives.py``: ``foreach_all_gather``
  allocates the all-gather output (the whole unit, ``world_size`` x the padded shard) and
  ``foreach_all_gather_copy_out`` copies it into each parameter's own unsharded tensor, so a
  gathered unit exists twice until the copy is done; ``foreach_reduce`` allocates the
  reduce-scatter input (the unit's padded unsharded gradients in ``reduce_dtype``) and output
  (``1/N`` of it), the unsharded gradients freed only after the copy-in. Each parameter is
  sharded on dim 0, padded to a multiple of ``N`` (``_get_dim0_padded_size``): no flat padding.
* Mixed precision: ``MixedPrecision(reduce_dtype=...)`` / ``MixedPrecisionPolicy(reduce_dtype=...)``;
  torchtitan's default reduce dtype is float32 (``torchtitan/config/job_config.py``,
  ``mixed_precision_reduce``), accelerate sets it to ``param_dtype``
  (``accelerate/utils/dataclasses.py``).
* ``FULL_STATE_DICT`` at save: accelerate's ``FullStateDictConfig(offload_to_cpu=True,
  rank0_only=True)`` (``accelerate/utils/dataclasses.py``, ``set_state_dict_type``): each unit is
  gathered in full precision on the GPU, one at a time, and copied to rank 0's host memory, which
  ends up holding the whole model. accelerate's default state dict is full for FSDP1 and sharded
  for FSDP2 (same file).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hwdash.core.estimator import phases as est_phases
from hwdash.core.estimator import states as est_states
from hwdash.core.estimator.architecture import Architecture
from hwdash.core.plan import FsdpStateDict, Method, Plan
from hwdash.core.units import GIB

#: FSDP1's rate limiter: at most this many all-gathers in flight
#: (torch/distributed/fsdp/_limiter_utils.py, ``_max_num_inflight_all_gathers``).
FSDP1_INFLIGHT_ALL_GATHERS = 2
#: Without the limiter nothing bounds the CPU's run-ahead; hwdash counts as many units again as
#: the limiter would have allowed in flight (an assumption, said in a warning).
FSDP1_UNLIMITED_EXTRA_UNITS = FSDP1_INFLIGHT_ALL_GATHERS

#: Bytes of an fp32 reduce-scatter (``reduce_dtype=torch.float32``).
FP32_BYTES = 4


@dataclass(frozen=True)
class FsdpUnits:
    """What one model's FSDP units look like to the version terms."""

    shard: int
    """GPUs one shard group spans."""
    gathered_bytes: float
    """Bytes per parameter of a gathered unit (``param_dtype``)."""
    sharded_bytes: float
    """Bytes per parameter of the sharded parameters (full precision under a mixed policy)."""
    reduced_unit: float
    """Parameters of the unit whose gradient is reduce-scattered at the end of backward (0: the
    gradients are too small to count, a LoRA-style plan's adapters)."""
    counted_gathered: float = 0.0
    """Bytes of gathered units the version-neutral count already holds during forward and backward
    (``parallelism._gathered_bytes``: the largest unit, one prefetched block and the final norm)."""
    root_bytes: float = 0.0
    """Bytes per parameter of the root unit's parameters (embedding, output layer, final norm) as
    gathered: ``param_dtype``, or a quantized plan's frozen dtype (they are never quantized)."""
    one_unit: bool = False
    """No auto-wrap policy (``--fsdp-wrap none``): the whole model is the root unit, gathered once
    and kept to the end of backward (``counted_gathered`` is all of it)."""
    root_unit: bool = False
    """The embedding, output layer and final norm left in the root unit (``--fsdp-wrap
    transformer``, :func:`root_unit_bytes`)."""
    kept_gathered: bool = False
    """Every unit stays gathered from its forward to its backward (``--fsdp shard-grad-op``,
    :func:`kept_gathered_bytes`)."""
    kept_to_the_end: bool = False
    """FSDP1 under ``no_sync`` (accumulating unsharded gradients): a ``kept_gathered`` unit is not
    freed in its post-backward either (:func:`kept_gathered_bytes`)."""


def state_dict_kind(plan: Plan) -> FsdpStateDict:
    """The plan's state dict, or accelerate's default for its FSDP version."""
    if plan.fsdp_state_dict is not None:
        return plan.fsdp_state_dict
    return FsdpStateDict.FULL if plan.fsdp_version == 1 else FsdpStateDict.SHARDED


def reduce_bytes(plan: Plan, gathered_bytes: float) -> float:
    """Bytes per element of the reduce-scatter: fp32 with ``--fsdp-reduce-fp32``, else the
    gathered dtype."""
    return float(FP32_BYTES) if plan.fsdp_reduce_fp32 else gathered_bytes


def flat_padding_elements(arch: Architecture, shard: int, *, one_unit: bool = False) -> float:
    """FSDP1: the padding each rank's shards carry, over every unit (the blocks, the embedding,
    the output layer; ``one_unit``: the whole model): ``ceil(numel / N) - numel / N`` per unit."""
    units = [arch.block_params] * arch.layers + [arch.embedding_params, arch.lm_head_params]
    if one_unit:
        units = [arch.total_params]
    return sum(math.ceil(numel / shard) - numel / shard for numel in units if numel)


def dim0_padding_elements(arch: Architecture, shard: int) -> float:
    """FSDP2: each parameter's dim 0 padded to a multiple of ``N``: the padding per rank over
    every parameter (linear weights are ``out x in``, fused experts ``experts x ...``, biases and
    norms one dim, the embedding and output layer ``vocab x hidden``)."""

    def pad(rows: int, per_row: int) -> float:
        return (math.ceil(rows / shard) * shard - rows) * per_row / shard

    per_layer = 0.0
    for linear in arch.linears:
        if linear.copies > 1:
            per_layer += pad(linear.copies, linear.in_features * linear.out_features)
        else:
            per_layer += pad(linear.out_features, linear.in_features)
        if linear.bias:
            per_layer += pad(linear.out_features * linear.copies, 1)
    norms = max(1, arch.norm_params_per_layer // max(1, arch.hidden))
    per_layer += norms * pad(arch.hidden, 1)
    total = per_layer * arch.layers
    if arch.final_norm_params:
        total += pad(arch.hidden, arch.final_norm_params // max(1, arch.hidden))
    for top in (arch.embedding_params, arch.lm_head_params):
        if top:
            total += pad(arch.vocab, top // max(1, arch.vocab))
    return total


def add_version_terms(
    plan: Plan,
    arch: Architecture,
    method: Method,
    units: FsdpUnits,
    acc: est_phases._Accumulator,
    label: str,
) -> None:
    """FSDP1's or FSDP2's own terms for one model (see the module docstring)."""
    both = est_phases._BACKWARD_ONLY | est_phases._BACKWARD_END_ONLY
    version = f"FSDP{plan.fsdp_version}"
    reduce = reduce_bytes(plan, units.gathered_bytes)
    if plan.fsdp_version == 1:
        staging = _fsdp1_terms(plan, arch, units, acc, label, reduce)
    else:
        staging = _fsdp2_terms(plan, arch, units, acc, label, reduce)
    acc.last_layer_activations += staging
    what = (
        "flat gradient's assembly or reduce-scatter" if plan.fsdp_version == 1 else "reduce-scatter"
    )
    acc.note(
        f"{label} {version} {what} staging ({int(reduce)}-byte)",
        staging,
        est_phases._BACKWARD_END_ONLY,
    )
    if plan.fsdp_offload:
        # the shards of the units in flight copied in, one gradient shard copied out
        # (the whole model's shard with no auto-wrap policy: one unit, copied in once)
        flights = 1 if units.one_unit else FSDP1_INFLIGHT_ALL_GATHERS
        unit_params = arch.total_params if units.one_unit else arch.block_params
        in_flight = flights * unit_params * units.sharded_bytes
        offload = in_flight / units.shard + units.reduced_unit * reduce / units.shard
        acc.activations += offload
        acc.last_layer_activations += offload
        acc.note(f"{label} {version} CPU-offload staging (shards in flight)", offload, both)
        if plan.fsdp_version == 1 and units.shard > 1:
            # _runtime_utils.py _unshard: pre_unshard copies the shard in on pre_unshard_stream
            # (before the limiter waits) and _flat_param.py _all_gather_flat_param record_streams
            # it onto the all-gather stream: the pre-unshard stream's pool keeps the copies in
            # flight and the one freed last, whose all-gather may still be reading it
            one = unit_params * units.sharded_bytes / units.shard
            acc.side_stream_pool += (flights + 1 - units.one_unit) * one
            acc.side_stream_live += flights * one
    _add_kept_gathered(plan, arch, units, acc, label)
    if plan.fsdp_version == 1:
        _note_quant_state(plan, arch, method, units, acc, label)
    if state_dict_kind(plan) is FsdpStateDict.FULL and method is Method.FULL:
        _note_full_state_dict(arch, units, acc, label, version)


def _fsdp1_terms(
    plan: Plan,
    arch: Architecture,
    units: FsdpUnits,
    acc: est_phases._Accumulator,
    label: str,
    reduce: float,
) -> float:
    """FSDP1's flat-parameter padding and unlimited all-gathers; returns the larger of its flat
    gradient's assembly (a second copy of the unit's unsharded gradient) and its reduce-scatter
    staging bytes (the unsharded gradient cast to ``reduce_dtype`` where it differs, and the new
    shard)."""
    both = est_phases._BACKWARD_ONLY | est_phases._BACKWARD_END_ONLY
    version = "FSDP1"
    unit = units.reduced_unit
    padding = (
        flat_padding_elements(arch, units.shard, one_unit=units.one_unit) * units.sharded_bytes
    )
    acc.note(f"{label} {version} flat-parameter padding (to a multiple of {units.shard})", padding)
    if not plan.fsdp_offload:
        acc.weights += padding
    root = _add_root_unit(arch, units, acc, f"{label} {version}")
    pool = fsdp1_all_gather_pool_bytes(arch, units)
    if pool:
        acc.side_stream_pool += pool
        acc.side_stream_live += units.counted_gathered + root
    if plan.fsdp_limit_all_gathers is False:
        extra = FSDP1_UNLIMITED_EXTRA_UNITS * arch.block_params * units.gathered_bytes
        acc.activations += extra
        acc.last_layer_activations += extra
        acc.note(f"{label} {version} all-gathers ahead (no limit_all_gathers)", extra, both)
        acc.warnings.append(
            f"{version} without limit_all_gathers: nothing bounds how far the CPU issues "
            f"all-gathers ahead; counted as {FSDP1_UNLIMITED_EXTRA_UNITS} more units "
            f"gathered ({extra / GIB:.1f} GiB), it can be more"
        )
    staging = unit * (reduce if reduce != units.gathered_bytes else 0.0)
    # the flat gradient is assembled from its views' gradients: _flat_param.py
    # _get_unflat_views_unaligned makes the views with torch.split, whose backward
    # (split_with_sizes_backward) concatenates every view's gradient into a new flat tensor while
    # they are still held, a second copy of the unit's gradient until the views' are freed; the
    # reduce-scatter's buffers come after, so the end of backward holds the larger of the two
    cat = unit * units.gathered_bytes
    return max(cat, staging + unit * reduce / units.shard)


def root_end_params(arch: Architecture) -> int:
    """The embedding, output layer and final norm: what the root unit holds under ``--fsdp-wrap
    transformer``, and what a quantized plan keeps in :attr:`FsdpUnits.root_bytes`."""
    return arch.embedding_params + arch.lm_head_params + arch.final_norm_params


def root_unit_bytes(arch: Architecture, units: FsdpUnits) -> float:
    """What the root unit adds to the gathered units counted for every version, where it holds the
    embedding, output layer and final norm (``units.root_unit``: ``--fsdp-wrap transformer``).

    FSDP1's auto-wrap as the FSDP1 recipes configure it wraps the decoder blocks only (accelerate's
    ``TRANSFORMER_BASED_WRAP`` with the model's ``_no_split_modules``, PEFT's
    ``fsdp_auto_wrap_policy`` in ``peft/utils/other.py``, answer.ai fsdp_qlora ``train.py``'s
    ``transformer_auto_wrap_policy`` on ``LlamaDecoderLayer``; their LoRA-layer units are the
    adapters', too small to count); the embedding, the output layer and the final norm stay in the
    root unit. ``_runtime_utils.py`` ``_post_forward_reshard`` never frees the root's unsharded
    flat parameter after forward (``free_unsharded_flat_param = not state._is_root and ...``): it
    stays gathered from the first forward to the end of backward, beside the running block and the
    prefetched one. FSDP2 through accelerate before 1.14 wraps the blocks and then the model
    (``fsdp2_prepare_model`` at v1.13.0: ``fully_shard(model)`` last), whose root unit FSDP2 either
    never reshards after forward (``_fsdp_state.py`` ``_lazy_init``) or gathers again at the start
    of backward, to be resharded only in its post-backward at the end. So either version holds
    ``(embedding + output + final norm) x root_bytes + 2 x block x gathered_bytes``; the
    version-neutral count (``units.counted_gathered``) is subtracted.
    Nothing on one GPU (the parameters are their own gathered copy), nor with the whole model the
    one unit (the version-neutral count holds all of it)."""
    if units.shard <= 1 or not units.counted_gathered or units.one_unit or not units.root_unit:
        return 0.0
    root = root_end_params(arch) * units.root_bytes
    fsdp1 = root + 2 * arch.block_params * units.gathered_bytes
    return max(0.0, fsdp1 - units.counted_gathered)


def _whole_model_gathered(arch: Architecture, units: FsdpUnits) -> float:
    """Bytes of every unit gathered at once: the blocks in ``param_dtype``, the embedding, output
    layer and final norm as :attr:`FsdpUnits.root_bytes` says."""
    ends = root_end_params(arch)
    return (arch.total_params - ends) * units.gathered_bytes + ends * units.root_bytes


def kept_gathered_bytes(arch: Architecture, units: FsdpUnits) -> float:
    """What ``--fsdp shard-grad-op`` adds at the start of backward to the gathered units counted
    for every version (``units.counted_gathered``) and the root unit (:func:`root_unit_bytes`).

    FSDP1 ``ShardingStrategy.SHARD_GRAD_OP``: ``_runtime_utils.py`` ``_post_forward_reshard``
    frees a unit's unsharded flat parameter after forward only for the strategies in
    ``RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES`` (``FULL_SHARD``, ``HYBRID_SHARD``), so each unit
    gathered in forward stays until its post-backward reshards it; FSDP2 with
    ``reshard_after_forward=False`` keeps the unsharded parameters between its post-forward and
    its post-backward the same way (``_fsdp_param_group.py``). When forward ends every unit is
    gathered, and the activations are all still held: the start of backward holds the whole
    model gathered. Backward frees the units one by one, so the end of backward holds only the
    units counted for every version; except FSDP1 under ``no_sync`` (``units.kept_to_the_end``):
    ``_should_free_in_backward`` frees in the post-backward only when gradients are synced or the
    strategy reshards after forward, so every unit stays gathered to the end of backward and
    between micro-batches. Nothing on one GPU, nor with the whole model one unit
    (``units.counted_gathered`` holds all of it)."""
    if not units.kept_gathered or units.shard <= 1 or not units.counted_gathered:
        return 0.0
    whole = _whole_model_gathered(arch, units)
    return max(0.0, whole - units.counted_gathered - root_unit_bytes(arch, units))


def _add_kept_gathered(
    plan: Plan,
    arch: Architecture,
    units: FsdpUnits,
    acc: est_phases._Accumulator,
    label: str,
) -> None:
    """Add :func:`kept_gathered_bytes` to the start of backward (FSDP1's all-gather stream holds
    them: its pool, :func:`fsdp1_all_gather_pool_bytes`, is the whole model)."""
    kept = kept_gathered_bytes(arch, units)
    if not kept:
        return
    acc.activations += kept
    phases = est_phases._BACKWARD_ONLY
    if units.kept_to_the_end:
        acc.last_layer_activations += kept
        phases = est_phases._BACKWARD_ONLY | est_phases._BACKWARD_END_ONLY
    if plan.fsdp_version == 1:
        acc.side_stream_live += kept
    acc.note(
        f"{label} FSDP{plan.fsdp_version} units kept gathered after forward (shard-grad-op)",
        kept,
        phases,
    )


def _add_root_unit(
    arch: Architecture, units: FsdpUnits, acc: est_phases._Accumulator, label: str
) -> float:
    """Add the root unit kept gathered (:func:`root_unit_bytes`) to forward and backward; return
    it."""
    root = root_unit_bytes(arch, units)
    if root:
        both = est_phases._BACKWARD_ONLY | est_phases._BACKWARD_END_ONLY
        acc.activations += root
        acc.last_layer_activations += root
        acc.note(f"{label} root unit (embedding, output layer) kept gathered", root, both)
    return root


def fsdp1_all_gather_pool_bytes(arch: Architecture, units: FsdpUnits) -> float:
    """FSDP1: the all-gather stream's pool in the caching allocator (reserved, partly allocated).

    ``_runtime_utils.py`` ``_unshard`` all-gathers each unit inside ``unshard_stream``, so its
    padded unsharded flat parameter is allocated from that stream's pool;
    ``_flat_param.py`` ``_free_unsharded_flat_param`` frees it with
    ``_no_dispatch_record_stream(unsharded_flat_param, current_stream)``: the block goes back to
    the all-gather stream's pool only once the compute stream has passed the free (the
    allocator's stream-use events), and the caching allocator never hands one stream's cached
    block to another (PyTorch CUDA semantics notes, "Memory management"; ``Tensor.record_stream``
    docs). With ``limit_all_gathers`` (the default, ``_limiter_utils.py``: at most
    ``FSDP1_INFLIGHT_ALL_GATHERS`` unshards ahead of the frees) the stream holds the running unit,
    the prefetched one and the unit freed last, whose event is still pending: ``(2 + 1)`` blocks,
    plus the root unit. ``max_memory_allocated`` stops counting the freed block at the free,
    ``max_memory_reserved`` does not; at the optimizer step none of the pool is allocated and the
    compute stream cannot reuse it. With the whole model one unit, the pool is that unit, gathered
    once."""
    if units.shard <= 1 or not units.counted_gathered:
        return 0.0
    if units.one_unit:
        return units.counted_gathered
    if units.kept_gathered:
        return _whole_model_gathered(arch, units)  # every unit's block, kept to its backward
    root = root_end_params(arch) * units.root_bytes if units.root_unit else 0.0
    blocks = FSDP1_INFLIGHT_ALL_GATHERS + 1
    return root + blocks * arch.block_params * units.gathered_bytes


def _fsdp2_terms(
    plan: Plan,
    arch: Architecture,
    units: FsdpUnits,
    acc: est_phases._Accumulator,
    label: str,
    reduce: float,
) -> float:
    """FSDP2's dim-0 padding and all-gather output buffer; returns its reduce-scatter staging
    bytes (the input, the unit in ``reduce_dtype``, and the output, 1/N of it)."""
    both = est_phases._BACKWARD_ONLY | est_phases._BACKWARD_END_ONLY
    version = "FSDP2"
    padding = dim0_padding_elements(arch, units.shard) * units.sharded_bytes
    acc.note(f"{label} {version} dim-0 padding (to a multiple of {units.shard})", padding)
    _add_root_unit(arch, units, acc, f"{label} {version}")
    if not plan.fsdp_offload:
        acc.weights += padding
    if units.one_unit:
        _fsdp2_one_unit_gather(arch, units, acc, label)
    else:
        gather_staging = arch.block_params * units.gathered_bytes if units.shard > 1 else 0.0
        acc.activations += gather_staging
        acc.last_layer_activations += gather_staging
        acc.note(
            f"{label} {version} all-gather output (one unit, copied out)", gather_staging, both
        )
    unit = units.reduced_unit
    return unit * reduce * (1 + 1 / units.shard) if units.shard > 1 else 0.0


def _fsdp2_one_unit_gather(
    arch: Architecture, units: FsdpUnits, acc: est_phases._Accumulator, label: str
) -> None:
    """FSDP2 with the whole model one unit: its all-gather output (the whole model, copied out
    into the parameters, ``foreach_all_gather_copy_out``) exists beside the gathered parameters
    once, at the first forward, before any activation; the root is never resharded, so backward
    gathers nothing. hwdash has no phase of its own for the first forward: the start-of-backward
    peak counts the larger of the two (the output beyond the activations it replaces)."""
    if units.shard <= 1:
        return
    output = arch.total_params * units.gathered_bytes
    beyond = max(0.0, output - (acc.activations - units.counted_gathered))
    acc.activations += beyond
    acc.note(
        f"{label} FSDP2 all-gather output of the one unit (first forward), beyond the activations",
        beyond,
        est_phases._BACKWARD_ONLY,
    )


def fsdp1_quant_state_bytes(arch: Architecture, method: Method) -> float:
    """QLoRA under FSDP1: bitsandbytes' NF4 constants, whole on every GPU.

    ``bitsandbytes/nn/modules.py``: a ``Linear4bit`` keeps its ``quant_state`` (the absmax
    constants, double-quantized) as a module attribute, not a parameter; FSDP flattens, shards and
    offloads parameters only, so the packed weights are sharded (``quant_storage``) while
    ``fix_4bit_weight_quant_state_from_module`` reattaches the module's state in forward ("the
    quant state got lost when the parameter got converted. This happens for example for fsdp").
    ``Params4bit.to`` moves the state with the weights onto the GPU when FSDP moves the module
    (``device_id``), and there it stays. Its size is the QLoRA paper's 0.127 bits per quantized
    weight (``states.NF4_CONSTANT_BYTES_PER_PARAM``)."""
    if method is not Method.QLORA:
        return 0.0
    return arch.quantizable_params * est_states.NF4_CONSTANT_BYTES_PER_PARAM


def _note_quant_state(
    plan: Plan,
    arch: Architecture,
    method: Method,
    units: FsdpUnits,
    acc: est_phases._Accumulator,
    label: str,
) -> None:
    """:func:`fsdp1_quant_state_bytes` on the GPU, less the shard of it the sharded weights
    already count (on the host under CPU offload, where it is not)."""
    constants = fsdp1_quant_state_bytes(arch, method)
    if not constants:
        return
    counted = 0.0 if plan.fsdp_offload else constants / units.shard
    if plan.fsdp_offload:
        acc.host -= constants / units.shard
    acc.weights += constants - counted
    acc.note(
        f"{label} FSDP1 NF4 quant_state (not a parameter: whole on each GPU, beyond its shard)",
        constants - counted,
    )


def _note_full_state_dict(
    arch: Architecture, units: FsdpUnits, acc: est_phases._Accumulator, label: str, version: str
) -> None:
    """FULL_STATE_DICT at save: one unit gathered in full precision on the GPU at a time (a
    transient of the checkpoint-save phase), the whole model on rank 0's host (a warning)."""
    largest = max(arch.block_params, arch.embedding_params, arch.lm_head_params)
    if units.one_unit:
        largest = arch.total_params  # the one unit is the whole model
    on_gpu = largest * units.sharded_bytes
    on_host = arch.total_params * units.sharded_bytes
    acc.add_phase_transient(
        est_phases.PHASE_CHECKPOINT_SAVE,
        "weights",
        on_gpu,
        f"{label} {version} FULL_STATE_DICT save: one unit gathered",
    )
    acc.warnings.append(
        f"{version} FULL_STATE_DICT: each save gathers one unit at a time on the GPU "
        f"({on_gpu / GIB:.1f} GiB over the sharded states) and the whole model into rank 0's host "
        f"RAM ({on_host / GIB:.1f} GiB); --fsdp-state-dict sharded gathers nothing"
    )
