"""Sharding beyond DeepSpeed ZeRO: PyTorch FSDP, and Megatron-LM tensor and pipeline parallelism.

:func:`hwdash.core.estimator.estimate_memory` hands a training plan here when it sets ``--fsdp`` or
``--tp``/``--pp``; everything else stays in the estimator. Sources:

* FSDP: Zhao et al. 2023, "PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel",
  arXiv:2304.11277. Section 3.2: parameters, gradients and optimizer states are sharded over the
  sharding group (full shard: every rank; hybrid shard: the ranks of one node, replicated across
  nodes); each FSDP unit is all-gathered before its forward and its backward and freed after, its
  unsharded gradient reduce-scattered after its backward. Section 3.3 (mixed precision): the
  sharded parameters stay in full precision and the unsharded, all-gathered copies are in the
  low-precision ``param_dtype``. Section 3.4: prefetching keeps one more unit gathered (the next in
  forward, the previous in backward). Section 3.5 (CPU offload): sharded parameters, gradients and
  the optimizer step live on the host.
  PyTorch's ``fully_shard`` docs (https://docs.pytorch.org/docs/stable/distributed.fsdp.fully_shard.html):
  ``MixedPrecisionPolicy(param_dtype=...)`` for the gathered copies, ``CPUOffloadPolicy`` (sharded
  parameters, gradients and optimizer states on CPU, the step on CPU), and the root unit's
  ``reshard_after_forward`` treated as False (its parameters stay gathered from forward into
  backward: torch/distributed/fsdp/_fully_shard/_fsdp_state.py ``_lazy_init`` clears the root
  groups' ``post_forward_mesh_info``; FSDP1's ``_runtime_utils.py`` ``_post_forward_reshard``
  never frees the root's flat parameter). Without an auto-wrap policy (``--fsdp-wrap none``:
  accelerate's ``NO_WRAP``, its default when the config names none, accelerate/utils/
  dataclasses.py ``FullyShardedDataParallelPlugin``; Lightning's ``FSDPStrategy(auto_wrap_policy=
  None)``) the root is the only unit: the whole model is gathered from the first forward to the
  end of backward, and its whole unsharded gradient waits for one reduce-scatter. torchtune
  ``torchtune/training/_distributed.py`` (``shard_model``): every ``TransformerSelfAttentionLayer``,
  plus ``tok_embeddings`` and ``output`` when the config lists them in ``custom_sharded_layers``
  (its Llama 3 full fine-tuning configs do), becomes its own unit; the root keeps the rest (the
  final norm) and is not resharded after forward. The model is
  loaded in the config's ``dtype`` (bf16), so parameters, gradients and AdamW states are all bf16:
  no fp32 master copy (unlike DeepSpeed's bf16 + ZeRO, which
  :func:`~hwdash.core.estimator.training._effective_layout` turns into ``mixed``).
* Megatron-LM: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models", arXiv:2205.05198: section 4.1 (activations of one GPT layer, ``sbh(34 + 5as/h)`` bytes),
  4.2.2 and Table 2 (tensor parallelism: ``sbh(10 + 24/t + 5as/(ht))``; with sequence parallelism
  ``sbh/t (34 + 5as/h)``; selective recomputation drops the ``5as/h`` term; full recomputation keeps
  ``2sbh`` per layer), 4.2.3 (1F1B: the first pipeline stage holds ``p`` micro-batches of its
  ``L/p`` layers, so ``L`` layers' worth) and 4.3 (the embedding's dropout mask on the first stage,
  and the output layer plus the fp32 logits of the vocab-parallel cross entropy on the last:
  ``4sbh/t (1 + v/h)``). Model states: Megatron's distributed optimizer docs
  (https://docs.nvidia.com/megatron-core/developer-guide/latest/api-guide/dist_optimizer.html):
  bf16 parameters with fp32 main gradients take 18 bytes per parameter, ``6 + 12/d`` with the
  distributed optimizer (the fp32 master copy and Adam states sharded over the ``d`` data-parallel
  ranks, gradients and parameters not); fp32 parameters 16, ``8 + 8/d``. Tensor parallelism splits
  each linear layer over ``t`` (column-parallel: QKV and the MLP's first projection, with their
  biases; row-parallel: the attention output and the MLP's second projection, whose biases and the
  norms are replicated) and the vocabulary-parallel embedding and output layer (Shoeybi et al. 2019,
  "Megatron-LM", arXiv:1909.08053, section 3).
* Megatron's optimizer CPU offload (``--optimizer-cpu-offload``, ``--optimizer-offload-fraction``):
  megatron/core/optimizer/__init__.py builds a ``HybridDeviceOptimizer`` (torch AdamW or SGD on
  the host, the fused optimizer on the GPU) with ``param_update_in_fp32=True``, and
  megatron/training/arguments.py requires ``--use-precision-aware-optimizer`` with it, so the
  distributed optimizer (megatron/core/optimizer/distrib_optimizer.py) hands it this rank's
  16-bit parameter shards with no fp32 main copy of its own. megatron/core/optimizer/
  cpu_offloading/hybrid_optimizer.py (``_get_sub_optimizer_param_groups``) walks those shards in
  order and moves them to the host until the fraction of the rank's shard elements is reached:
  each becomes a pinned fp32 copy there (the master weights) whose Adam states the host optimizer
  keeps, and ``_set_sub_optimizer_grads`` copies its gradient into a pinned fp32 host buffer kept
  from step to step; the updated values are copied back into the GPU's 16-bit parameters. The rest
  keeps an fp32 copy and its states on the GPU, as without offload. The fp32 main-gradient buffer
  of the data-parallel wrapper stays on the GPU either way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from hwdash.core.estimator import fsdp_versions, long_context
from hwdash.core.estimator import phases as est_phases
from hwdash.core.estimator import states as est_states
from hwdash.core.estimator.architecture import Architecture
from hwdash.core.estimator.savers import Savers, resolve_savers
from hwdash.core.estimator.states import LAYOUTS, Layout
from hwdash.core.fsdp_modes import keeps_ends_in_root
from hwdash.core.plan import Attention, FsdpMode, FsdpWrap, Method, Offload, Plan, Precision
from hwdash.core.units import GIB

#: The unsharded estimator's "one trained model" (``training._train_one_model``), handed in by
#: its caller so that this module does not import the training module that imports it.
TrainOne = Callable[..., int]

# --------------------------------------------------------------------------------------------------
# FSDP.
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FsdpLayout:
    """Bytes per parameter under FSDP for a plan's precision."""

    sharded: Layout
    """The sharded states: parameters, gradients, optimizer states (no master copy: FSDP has none
    of its own; the parameters themselves are the full-precision copy under a mixed policy)."""
    gathered_bytes: int
    """Bytes per parameter of an all-gathered (unsharded) unit: ``param_dtype``."""
    compute: Layout
    """The layout the layers compute in (decides the activations)."""


#: FSDP's layouts by precision. ``bf16``: the model loaded in bf16, everything bf16 (torchtune's
#: ``dtype: bf16``). ``mixed``: fp32 sharded parameters, gradients and Adam states with bf16
#: gathered copies (``MixedPrecisionPolicy(param_dtype=torch.bfloat16)``; the sharded gradient takes
#: the sharded parameter's dtype); the layers compute on bf16 weights, no autocast copies. ``amp``:
#: an fp32 model under autocast, gathered in fp32. ``fp32``: everything fp32.
FSDP_LAYOUTS: dict[Precision, FsdpLayout] = {
    Precision.BF16: FsdpLayout(LAYOUTS[Precision.BF16], 2, LAYOUTS[Precision.BF16]),
    Precision.MIXED: FsdpLayout(
        Layout(weight_bytes=4, gradient_bytes=4, master_bytes=0, state_bytes=4, activation_bytes=2),
        2,
        LAYOUTS[Precision.BF16],
    ),
    Precision.AMP: FsdpLayout(LAYOUTS[Precision.AMP], 4, LAYOUTS[Precision.AMP]),
    Precision.FP32: FsdpLayout(LAYOUTS[Precision.FP32], 4, LAYOUTS[Precision.FP32]),
}


def fsdp_shard_size(gpus: int, mode: FsdpMode, gpus_per_node: int | None) -> int:
    """GPUs one shard group spans: all of them (full shard), or one node's (hybrid shard)."""
    if mode is FsdpMode.HYBRID and gpus_per_node is not None:
        return max(1, min(gpus, gpus_per_node))
    return max(1, gpus)


def one_unit(plan: Plan) -> bool:
    """Whether FSDP wraps the whole model as one unit (``--fsdp-wrap none``)."""
    return plan.fsdp_wrap is FsdpWrap.NONE


def root_keeps_ends(plan: Plan) -> bool:
    """Whether the plan's FSDP root unit holds the embedding and output layer
    (:func:`~hwdash.core.fsdp_modes.keeps_ends_in_root`)."""
    return keeps_ends_in_root(plan.fsdp_wrap, plan.fsdp_version)


def fsdp_gathered_params(arch: Architecture, *, whole: bool = False) -> int:
    """Parameters gathered at once: the running unit, the prefetched one, and the root.

    Units are the blocks plus the embedding and the output layer on their own (torchtune's
    ``custom_sharded_layers``); the largest running unit next to one prefetched block, and the root
    (the final norm), which stays gathered from forward into backward. ``whole``: no auto-wrap
    policy, the root is the whole model (:func:`one_unit`).
    """
    if whole:
        return arch.total_params
    largest = max(arch.block_params, arch.embedding_params, arch.lm_head_params)
    return min(arch.total_params, largest + arch.block_params + arch.final_norm_params)


def _activations_only(
    plan: Plan,
    arch: Architecture,
    method: Method,
    layout: Layout,
    acc: est_phases._Accumulator,
    label: str,
    *,
    with_logits: bool,
    train_one: TrainOne,
) -> int:
    """Add the activations (and their notes) of one trained model as the unsharded estimator counts
    them in ``layout``, without its model states; return its trainable parameters.

    Sharding changes where the states live, not what a layer saves for backward, so the activation
    count (and any loss or saver another module adds to it) is reused as is.
    """
    plain = plan.model_copy(
        update={
            "fsdp": FsdpMode.NONE,
            "fsdp_offload": False,
            "zero": 0,
            "offload": Offload.NONE,
            "tp": 1,
            "pp": 1,
        }
    )
    scratch = est_phases._Accumulator()
    # the activations as the plain plan counts them, but with the output layer's gradient kept
    # where the root unit holds it (training._kept_head_gradient)
    savers = replace(resolve_savers(plain), fsdp_root_keeps_head=root_keeps_ends(plan))
    trainable = train_one(
        plain, arch, method, layout, 1, scratch, label, with_logits=with_logits, savers=savers
    )
    acc.activations += scratch.activations
    acc.last_layer_activations += scratch.last_layer_activations
    activation_phases = (est_phases._BACKWARD_ONLY, est_phases._BACKWARD_END_ONLY)
    acc.details.extend(item for item in scratch.details if item[2] in activation_phases)
    acc.warnings.extend(w for w in scratch.warnings if w not in acc.warnings)
    return trainable


def add_fsdp_training(
    plan: Plan,
    arch: Architecture,
    method: Method,
    gpus: int,
    acc: est_phases._Accumulator,
    label: str,
    *,
    with_logits: bool,
    train_one: TrainOne,
    savers: Savers | None = None,
) -> int:
    """Model states of one model trained under FSDP, plus its activations; return its trainable
    parameters.

    Per GPU, with ``N`` the shard group (:func:`fsdp_shard_size`):

    * weights: the parameter shard ``P w / N``; the gathered units (:func:`fsdp_gathered_params`,
      in ``param_dtype``) are alive during forward and backward only, and are shown with the
      activations (the optimizer step runs on the shards);
    * gradients: the gradient shard ``T g / N``, produced during backward (kept across micro-batches
      with gradient accumulation), plus, at the end of backward, the unsharded gradient of one unit
      waiting for its reduce-scatter;
    * optimizer: ``T K / N`` and the step's temporaries over the local shard.

    With CPU offload the shards and the step live on the host: the GPU keeps the gathered units and
    one unit's unsharded gradient.

    Gradient accumulation under ``no_sync`` (:func:`keeps_unsharded_gradients`): from the first
    micro-batch to the last one's backward every trained parameter's gradient is kept unsharded,
    ``T`` times the gathered dtype's bytes, on the GPU (even with CPU offload: only the sharded
    gradients are offloaded); it replaces the unit's waiting gradient (it is one of them), and the
    optimizer step sees the shards only.
    """
    if savers is None:
        savers = resolve_savers(plan)
    fsdp = FSDP_LAYOUTS[plan.precision]
    shard = fsdp_shard_size(gpus, plan.fsdp, plan.gpus_per_node)
    no_sync = keeps_unsharded_gradients(plan, savers, shard)
    trainable = _activations_only(
        plan, arch, method, fsdp.compute, acc, label, with_logits=with_logits, train_one=train_one
    )
    shared = _adapters_share_units(plan, arch, method, savers, acc)
    states = _fsdp_states(plan, arch, method, fsdp, trainable, no_sync=no_sync, shared=shared)
    gathered = _gathered_bytes(arch, method, states, shard, whole=one_unit(plan))
    _note_gathered(acc, label, fsdp, gathered, states, shard, whole=one_unit(plan))
    if no_sync:
        _note_unsynced(plan, acc, label, states.unsynced_bytes)
    if plan.fsdp_offload:
        acc.host += states.params_bytes + states.gradient_bytes + states.state_bytes
        acc.note(f"{label} parameters, gradients, optimizer states: on the host", 0)
    else:
        _note_sharded_states(plan, arch, method, acc, label, states, shard, trainable, no_sync)
    if not (one_unit(plan) or root_keeps_ends(plan) or plan.fsdp is FsdpMode.SHARD_GRAD_OP):
        # the root unit kept gathered is counted where it holds them (fsdp_versions.root_unit_bytes)
        acc.warnings.append(_root_unit_warning(arch, states.gathered_per_param))
    units = _units(plan, arch, method, states, shard, savers, shared=shared, no_sync=no_sync)
    fsdp_versions.add_version_terms(plan, arch, method, units, acc, label)
    return trainable


def _units(
    plan: Plan,
    arch: Architecture,
    method: Method,
    states: _FsdpStates,
    shard: int,
    savers: Savers,
    *,
    shared: bool,
    no_sync: bool,
) -> fsdp_versions.FsdpUnits:
    """What the FSDP version's own terms (:mod:`.fsdp_versions`) need of the plan's units
    (``shared``: :func:`_adapters_share_units`; ``no_sync``: :func:`keeps_unsharded_gradients`)."""
    whole = one_unit(plan)
    largest_unit = _largest_unit(plan, arch)
    # the one unit's gradient is reduce-scattered whole when it has one (full training, or FSDP1's
    # flat parameter holding trained adapters: _adapters_share_units). Not states.unit_gradient,
    # which no_sync zeroes while the unsharded gradient waits: the last micro-batch still reduces
    reduced = method is Method.FULL or (whole and shared)
    sharded_bytes = (
        states.layout.weight_bytes if method is Method.FULL else states.gathered_per_param
    )
    quantized = method in (Method.QLORA, Method.LORA_8BIT) or (
        method is not Method.FULL and arch.checkpoint_bits is not None
    )
    # the embedding, output layer and final norm are never quantized: they stay in the dtype the
    # quantized plan keeps its other frozen parameters in (--qlora-frozen-dtype); otherwise they
    # are gathered like any other parameter
    root_bytes = float(savers.qlora_frozen_bytes) if quantized else states.gathered_per_param
    return fsdp_versions.FsdpUnits(
        shard=shard,
        gathered_bytes=states.gathered_per_param,
        sharded_bytes=sharded_bytes,
        reduced_unit=float(largest_unit) if reduced else 0.0,
        counted_gathered=_gathered_bytes(arch, method, states, shard, whole=whole),
        root_bytes=root_bytes,
        one_unit=whole,
        root_unit=root_keeps_ends(plan) and not whole,
        kept_gathered=plan.fsdp is FsdpMode.SHARD_GRAD_OP and not whole,
        kept_to_the_end=plan.fsdp_version == 1 and no_sync,
    )


def _largest_unit(plan: Plan, arch: Architecture) -> int:
    """Parameters of the largest FSDP unit: a block, the embedding or the output layer (the root
    holding both, with the final norm, under ``--fsdp-wrap transformer``: :func:`root_keeps_ends`);
    the whole model with no auto-wrap policy (:func:`one_unit`)."""
    if one_unit(plan):
        return arch.total_params
    if root_keeps_ends(plan):
        # the root unit's flat gradient: the embedding, output layer and final norm together
        return max(arch.block_params, fsdp_versions.root_end_params(arch))
    return max(arch.block_params, arch.embedding_params, arch.lm_head_params)


def _root_unit_warning(arch: Architecture, gathered_per_param: float) -> str:
    """What wrapping the embedding and output layer in the root unit would add."""
    root_extra = (arch.embedding_params + arch.lm_head_params) * gathered_per_param
    return (
        "FSDP counted with the embedding and output layer as their own units (--fsdp-wrap "
        "transformer-ends: torchtitan, torchtune's custom_sharded_layers, accelerate 1.14 and "
        "later); left in the root unit (--fsdp-wrap transformer: accelerate's FSDP2 before 1.14) "
        f"they stay gathered from forward through backward: up to {root_extra / GIB:.1f} GiB "
        "more per GPU"
    )


def _gathered_bytes(
    arch: Architecture, method: Method, states: _FsdpStates, shard: int, *, whole: bool = False
) -> float:
    """Bytes of the gathered units (running + prefetched; the whole model as one unit) per GPU."""
    gathered = fsdp_gathered_params(arch, whole=whole) * states.gathered_per_param
    if (
        shard == 1
        and states.gathered_per_param == states.layout.weight_bytes
        and method is Method.FULL
    ):
        gathered = 0.0  # one rank, one dtype: the "gathered" unit is the parameter itself
    return gathered


@dataclass(frozen=True)
class _FsdpStates:
    """One model's states under FSDP, unsharded (the caller divides by the shard group)."""

    layout: Layout
    """The sharded states' layout (the adapters' for a LoRA-style method)."""
    params_bytes: float
    gathered_per_param: float
    """Bytes per parameter of a gathered unit."""
    unit_gradient: float
    """One unit's unsharded gradient waiting for its reduce-scatter (0: none kept apart)."""
    gradient_bytes: float
    unsynced_bytes: float
    """The unsharded gradients ``no_sync`` keeps between micro-batches (0 without it)."""
    state_bytes: float
    """Master copy and optimizer states."""


def _fsdp_states(
    plan: Plan,
    arch: Architecture,
    method: Method,
    fsdp: FsdpLayout,
    trainable: int,
    *,
    no_sync: bool,
    shared: bool = False,
) -> _FsdpStates:
    """The bytes of the parameters, gradients and optimizer states FSDP shards, for full
    fine-tuning or a LoRA-style method (see :func:`add_fsdp_training`); ``shared``: the adapters
    sit in their blocks' FSDP1 units (:func:`_adapters_share_units`)."""
    if method is Method.FULL:
        state_layout = fsdp.sharded
        params_bytes = float(arch.total_params * state_layout.weight_bytes)
        gathered_per_param = float(fsdp.gathered_bytes)
        unit_gradient = float(_largest_unit(plan, arch) * fsdp.gathered_bytes)
    else:
        # LoRA-style: the frozen base is sharded as loaded (bf16, or NF4/int8 for the quantized
        # methods), the adapters in PEFT's fp32 like the unsharded estimate; the gathered units
        # carry the base bytes; the adapters' gradients are too small to keep apart.
        state_layout = est_states.ADAPTER_LAYOUT
        base_bytes, gathered_per_param = est_states._base_weight_bytes(
            arch, method, LAYOUTS[plan.precision]
        )
        if method in (Method.LORA, Method.DORA) and arch.checkpoint_bits is None:
            # an unquantized frozen base is sharded as loaded and gathered in param_dtype: under
            # a mixed policy the model is loaded in fp32 and MixedPrecision(param_dtype=bf16)
            # casts only the all-gathered copy (torch/distributed/fsdp/_flat_param.py
            # ``_use_low_precision_shard``: the sharded flat parameter keeps its dtype; Zhao et
            # al. 2023 section 3.3), so the shard is fsdp.sharded's bytes, the gather fsdp's
            base_bytes = float(arch.total_params * fsdp.sharded.weight_bytes)
            gathered_per_param = float(fsdp.gathered_bytes)
        params_bytes = base_bytes + trainable * state_layout.weight_bytes
        unit_gradient = 0.0
    frozen_in_units = _frozen_in_units(plan, arch, shared)
    if frozen_in_units and one_unit(plan):
        # that one flat parameter's whole gradient waits for the reduce-scatter
        unit_gradient = (frozen_in_units + trainable) * fsdp.gathered_bytes
    unsynced_bytes = 0.0
    if no_sync:
        unsynced_bytes = trainable * _unsynced_bytes_per_param(plan, method, fsdp, state_layout)
        unit_gradient = 0.0
    unsynced_bytes += frozen_in_units * fsdp.gathered_bytes if no_sync else 0.0
    k_bytes = state_layout.master_bytes + est_states.optimizer_state_bytes_per_param(
        plan.optimizer, state_layout
    )
    return _FsdpStates(
        layout=state_layout,
        params_bytes=params_bytes,
        gathered_per_param=gathered_per_param,
        unit_gradient=unit_gradient,
        gradient_bytes=trainable * state_layout.gradient_bytes
        + frozen_in_units * fsdp.sharded.weight_bytes,
        unsynced_bytes=unsynced_bytes,
        state_bytes=float(trainable * k_bytes),
    )


def _frozen_in_units(plan: Plan, arch: Architecture, shared: bool) -> float:
    """Frozen parameters whose flat parameter takes a gradient (:func:`_adapters_share_units`): a
    block's flat parameter takes one for all its parameters, frozen ones included; with the whole
    model one unit, one flat parameter holds them all."""
    if not shared:
        return 0.0
    return float(arch.total_params if one_unit(plan) else arch.layers * arch.block_params)


def _unsynced_bytes_per_param(
    plan: Plan, method: Method, fsdp: FsdpLayout, state_layout: Layout
) -> float:
    """Bytes per trained parameter of the sums ``no_sync`` keeps: autograd accumulates into the
    gathered parameters' gradients, in param_dtype (FSDP2 upcasts them only to a reduce_dtype that
    differs, torch/distributed/fsdp/_fully_shard/_fsdp_param.py ``to_accumulated_grad_if_needed``;
    accelerate's policy sets reduce_dtype = param_dtype, accelerate/utils/dataclasses.py
    ``set_mixed_precision``); the adapters of a LoRA-style plan in their own dtype."""
    per_param = fsdp.gathered_bytes if method is Method.FULL else state_layout.gradient_bytes
    if plan.fsdp_version == 2 and method is Method.FULL:
        return fsdp_versions.reduce_bytes(plan, per_param)
    return float(per_param)


def _note_gathered(
    acc: est_phases._Accumulator,
    label: str,
    fsdp: FsdpLayout,
    gathered: float,
    states: _FsdpStates,
    shard: int,
    *,
    whole: bool = False,
) -> None:
    """The gathered units and one unit's unsharded gradient, alive during forward and backward
    (``whole``: the model is the one unit, :func:`one_unit`)."""
    if shard == 1:
        acc.warnings.append("FSDP on 1 GPU shards nothing (CPU offload still moves state to host)")
    unit_gradient = states.unit_gradient
    # Gathered only while forward and backward run; resharded (freed) before the optimizer step.
    # Shown with the activations, the other part of memory that exists only then.
    acc.activations += gathered
    acc.last_layer_activations += gathered
    gathered_label = f"{label} gathered units (running + prefetched, {fsdp.gathered_bytes}-byte)"
    unit = "one unit"
    if whole:
        gathered_label = f"{label} gathered model (one FSDP unit, {fsdp.gathered_bytes}-byte)"
        unit = "the one unit, the whole model"
        if shard > 1:
            acc.warnings.append(
                "FSDP with no auto-wrap policy (--fsdp-wrap none: accelerate's NO_WRAP, its "
                "default when the config names none; Lightning's default): the whole model is "
                f"one unit, {gathered / GIB:.1f} GiB gathered from the first forward to the end "
                "of backward, with its whole unsharded gradient; --fsdp-wrap transformer "
                "gathers one block at a time"
            )
    acc.note(gathered_label, gathered, est_phases._BACKWARD_ONLY)
    acc.note(gathered_label, gathered, est_phases._BACKWARD_END_ONLY)
    acc.last_layer_activations += unit_gradient
    acc.note(
        f"{label} unsharded gradient of {unit} (before reduce-scatter)",
        unit_gradient,
        est_phases._BACKWARD_END_ONLY,
    )


def _note_unsynced(
    plan: Plan, acc: est_phases._Accumulator, label: str, unsynced_bytes: float
) -> None:
    """The unsharded gradients ``no_sync`` keeps between micro-batches, and the warning."""
    acc.warnings.append(
        f"FSDP with --grad-accum {plan.grad_accum}: the Trainer's no_sync keeps "
        f"{unsynced_bytes / GIB:.1f} GiB of unsharded gradients per GPU until the last "
        "micro-batch; --sync-each-batch keeps them sharded (a reduce-scatter per micro-batch)"
    )
    acc.unsynced_gradients += unsynced_bytes
    acc.note(
        f"{label} unsharded gradients (no_sync between micro-batches)",
        unsynced_bytes,
        frozenset({est_phases.PHASE_BACKWARD, est_phases.PHASE_BACKWARD_END}),
    )


def _note_sharded_states(
    plan: Plan,
    arch: Architecture,
    method: Method,
    acc: est_phases._Accumulator,
    label: str,
    states: _FsdpStates,
    shard: int,
    trainable: int,
    no_sync: bool,
) -> None:
    """The GPU's shards of the weights, gradients and optimizer states, and the step's
    temporaries (without CPU offload)."""
    tag = f"1/{shard} shard"
    acc.weights += states.params_bytes / shard
    acc.note(f"{label} weights ({tag})", states.params_bytes / shard)
    gradient_shard = states.gradient_bytes / shard
    if no_sync:
        # the shards appear as the last micro-batch's backward reduce-scatters the sums, each
        # sum freed as its shard appears: at the end of a backward the sums or the shards
        # (_Accumulator.backward_end_gradients, never fewer bytes than the shards), at the step
        # the shards
        acc.produced_gradients += gradient_shard
        acc.note(f"{label} gradients ({tag})", gradient_shard, est_phases._STEP_ONLY)
    elif plan.grad_accum > 1:
        acc.persistent_gradients += gradient_shard
        acc.note(f"{label} gradients ({tag})", gradient_shard)
    else:
        acc.produced_gradients += gradient_shard
        acc.note(f"{label} gradients ({tag})", gradient_shard, est_phases._PRODUCED)
    acc.optimizer += states.state_bytes / shard
    acc.note(f"{label} optimizer states ({tag})", states.state_bytes / shard)
    temporaries = est_states.optimizer_step_temporary_bytes(
        arch, method, trainable, states.layout, plan.optimizer, 1, shard, plan.optimizer_impl
    )
    acc.step_temporaries += temporaries
    acc.note(f"{label} optimizer step temporaries", temporaries, est_phases._STEP_ONLY)


def _adapters_share_units(
    plan: Plan, arch: Architecture, method: Method, savers: Savers, acc: est_phases._Accumulator
) -> bool:
    """Whether FSDP1 wraps the adapters in their transformer block's unit (a framework whose wrap
    policy is the blocks alone, with ``use_orig_params``: ``frameworks.toml``
    ``fsdp1_adapters_share_units``). The block's flat parameter then requires a gradient and takes
    it whole: "FSDP supports mixing frozen and non-frozen [parameters], but ... the gradient memory
    usage will be higher than expected (namely, equivalent to not freezing those parameters)"
    (``FullyShardedDataParallel`` docs, ``use_orig_params``). Under ``no_sync`` that gradient stays
    unsharded between micro-batches. Counted for 16-bit LoRA/DoRA bases (a quantized base's flat
    parameter is not modelled). Says so in a warning when it does."""
    shared = (
        (savers.fsdp1_adapters_share_units or one_unit(plan))
        and plan.fsdp_version == 1
        and method in (Method.LORA, Method.DORA)
        and arch.checkpoint_bits is None
    )
    if shared and one_unit(plan):
        acc.warnings.append(
            "FSDP1 with no auto-wrap policy: the adapters share the model's one flat parameter "
            "(use_orig_params), which takes a whole gradient, frozen weights included (PyTorch's "
            "FSDP docs, use_orig_params)"
        )
    elif shared:
        acc.warnings.append(
            "FSDP1 with the adapters inside their blocks' units (use_orig_params): each block's "
            "flat parameter takes a whole gradient, frozen weights included (PyTorch's FSDP "
            "docs, use_orig_params); PEFT's fsdp_auto_wrap_policy gives the adapters units of "
            "their own"
        )
    return shared


def keeps_unsharded_gradients(plan: Plan, savers: Savers, shard: int) -> bool:
    """Whether FSDP keeps whole unsharded gradients between the micro-batches of one step.

    The Hugging Face Trainer runs every micro-batch but the last under ``accelerator.no_sync``
    unless accelerate's ``GradientAccumulationPlugin(sync_each_batch=True)`` is set
    (transformers/trainer.py, the training loop's ``sync_context``; accelerate/accelerator.py
    ``Accelerator.accumulate``). Under ``no_sync`` FSDP skips the reduce-scatter and accumulates
    the unsharded gradients: "FSDP will accumulate the full model gradients (instead of gradient
    shards) until the eventual sync" (``FullyShardedDataParallel.no_sync`` docs); accelerate's
    gradient-synchronization guide measures Mixtral 8x7B on 8 A100s out of memory at accumulation
    2 under ``no_sync`` and at the accumulation-1 peak with ``sync_each_batch`` at 16. torchtune's
    distributed recipes never skip the sync (``frameworks.toml``). One rank has nothing to sync.
    """
    return plan.grad_accum > 1 and shard > 1 and not savers.sync_each_batch


# --------------------------------------------------------------------------------------------------
# Megatron-LM tensor and pipeline parallelism.
# --------------------------------------------------------------------------------------------------

#: Row-parallel linear layers (input split over TP, output all-reduced): their biases are
#: replicated. The others (QKV, the MLP's first projections) are column-parallel, bias split too.
ROW_PARALLEL_LINEARS = ("o_proj", "down_proj", "fc2")


def tensor_parallel_block_params(arch: Architecture, tp: int) -> float:
    """Parameters of one block on one tensor-parallel rank: the linear weights over ``tp``, the
    column-parallel biases over ``tp``, the row-parallel biases, norms and router replicated."""
    per_rank = 0.0
    for linear in arch.linears:
        weight = linear.in_features * linear.out_features * linear.copies
        bias = linear.out_features * linear.copies if linear.bias else 0
        if linear.name in ROW_PARALLEL_LINEARS:
            per_rank += weight / tp + bias
        else:
            per_rank += (weight + bias) / tp
    return per_rank + arch.norm_params_per_layer + arch.router_params_per_layer


def megatron_stage_params(arch: Architecture, tp: int, pp: int, stage: int) -> float:
    """Parameters on one GPU of pipeline ``stage`` (0-based): its ``L/pp`` blocks, split over TP; the
    first stage also the vocabulary-parallel embedding, the last the final norm and the output
    layer (a tied output layer is a copy of the embedding there, kept in sync by Megatron)."""
    params = (arch.layers // pp) * tensor_parallel_block_params(arch, tp)
    first, last = stage == 0, stage == pp - 1
    if first:
        params += arch.embedding_params / tp
    if last:
        params += arch.final_norm_params
        if arch.lm_head_params or not first:
            params += (arch.lm_head_params or arch.embedding_params) / tp
    return params


@dataclass(frozen=True)
class MegatronBytes:
    """Bytes per parameter of Megatron's model states (distributed optimizer docs' table)."""

    weight: int
    main_gradient: int
    """Megatron's contiguous main-gradient buffer: fp32 in bf16 training
    (``accumulate_allreduce_grads_in_fp32``, on with ``--bf16``), allocated once, alive always."""
    master: int
    """fp32 master copy (0 when the parameters are fp32)."""


def megatron_bytes(precision: Precision) -> MegatronBytes:
    """``bf16``/``mixed``: bf16 parameters, fp32 main gradients and master copy (18 bytes with
    Adam); ``fp32``/``amp``: fp32 parameters and gradients (16 bytes with Adam)."""
    if precision in (Precision.BF16, Precision.MIXED):
        return MegatronBytes(weight=2, main_gradient=4, master=4)
    return MegatronBytes(weight=4, main_gradient=4, master=0)


def megatron_layer_activation_bytes(
    arch: Architecture,
    batch: int,
    seq: int,
    element_bytes: int,
    tp: int,
    *,
    sequence_parallel: bool,
    attention: Attention,
    selective_recompute: bool,
    dropout: bool,
) -> float:
    """Bytes one Megatron layer keeps for backward on one TP rank (Korthikanti et al., Table 2).

    The paper's GPT layer, tensor by tensor, with ``e`` bytes per element (2 in 16-bit) and 1 byte
    per dropout-mask element; ``t = b s`` tokens:

    * outside the tensor-parallel regions (replicated under TP alone, split over ``tp`` with
      sequence parallelism): the inputs of the two LayerNorms, of the QKV projection and of the
      MLP (``4 e sbh`` = the paper's 8sbh) and the two dropout masks after attention and after the
      MLP (``2 sbh``): the paper's ``10 sbh``;
    * inside them (split over ``tp``): Q and K (``e t (q_dim + kv_dim)``, the paper's 4sbh), V
      (``e t kv_dim``, 2sbh), the output projection's input (``e t q_dim``, 2sbh) and the MLP: the
      first projection's output and the activation's output (GELU: ``2 e t i``, the paper's 16sbh
      at ``i = 4h``; SwiGLU: the fused gate and up output plus the product, ``3 e t i``): the
      paper's ``24 sbh``;
    * the attention scores without a fused kernel (``--attn eager``): the softmax output (``e``),
      with dropout its mask (1) and output (``e``) per score element: the paper's ``5 a s^2 b``.
      Flash attention (and selective recomputation, which recomputes the attention core) keeps no
      scores: a flash kernel keeps an fp32 log-sum-exp per row (``4 b a s``).

    So a GPT layer (``i = 4h``, MHA, dropout, unfused, ``e = 2``) gives the paper's
    ``sbh(10 + 24/t + 5as/(ht))`` under TP and ``sbh/t (34 + 5as/h)`` with sequence parallelism,
    ``34 sbh/t`` with selective recomputation. MoE (not in the paper): the MLP terms count the
    ``k`` routed experts.
    """
    tokens = batch * seq
    e = element_bytes
    sbh = tokens * arch.hidden
    mask = 1 if dropout else 0
    outside = 4 * e * sbh + 2 * mask * sbh
    inside = e * tokens * (arch.q_dim + arch.kv_dim) + e * tokens * arch.kv_dim
    inside += e * tokens * arch.q_dim
    mlp = (3 if arch.gated_mlp else 2) * e * tokens * arch.intermediate
    inside += mlp * (arch.routed_copies if arch.experts > 1 else 1)
    if not selective_recompute:
        score_elements = batch * arch.heads * seq * seq
        if attention is Attention.EAGER:
            inside += (e + (mask + e if dropout else 0)) * score_elements
        else:
            inside += 4 * batch * arch.heads * seq
    if sequence_parallel and tp > 1:
        return (outside + inside) / tp
    return outside + inside / tp


@dataclass(frozen=True)
class MegatronStage:
    """One GPU of one pipeline stage: its parameters and the bytes it holds."""

    stage: int
    layers: int
    params: float
    weights: float
    gradients: float
    optimizer: float
    activations: float
    """At the start of the last in-flight micro-batch's backward (1F1B steady state)."""
    one_layer: float
    """One layer of one micro-batch (the end-of-backward phase)."""
    micro_batches_in_flight: int
    host: float = 0.0
    """Host RAM of this GPU's offloaded optimizer shard (Megatron's optimizer CPU offload)."""

    @property
    def total(self) -> float:
        """Everything at the start of backward."""
        return self.weights + self.gradients + self.optimizer + self.activations


def megatron_stage(plan: Plan, arch: Architecture, gpus: int, stage: int) -> MegatronStage:
    """The bytes on one GPU of pipeline ``stage`` for ``plan`` on ``gpus`` GPUs.

    Data parallelism is ``gpus / (tp x pp x cp)``; the distributed optimizer (``--zero 1``) shards
    master copy and optimizer states over data x context ranks (``gpus / (tp x pp)``), the
    experts' over ``gpus / (tp x pp x ep)`` (:mod:`~hwdash.core.estimator.long_context`).
    Activations (1F1B, Korthikanti section 4.2.3): stage ``k`` holds ``min(pp - k, grad_accum)``
    micro-batches of its ``L/pp`` layers (:func:`megatron_layer_activation_bytes` on one CP rank's
    ``s/cp`` tokens; with full recomputation each layer's input, ``e sbh``, split over ``tp``
    with sequence parallelism, plus one layer being recomputed); the first stage also the
    embedding's dropout mask (``sbh``), the last the final norm's and output layer's inputs
    (``2 e sbh``) and the fp32 logits (``4 s b v / tp``) (section 4.3) with, in 16-bit, the logits
    or their gradient beside them (``e s b v / tp``); CP and EP buffers from
    :func:`_long_context_extras`."""
    tp, pp = plan.tp, plan.pp
    layout = LAYOUTS[plan.precision]
    e = layout.activation_bytes
    sizes = megatron_bytes(plan.precision)
    layers = arch.layers // pp
    experts = layers * long_context.expert_params_per_layer(arch) / tp
    params = megatron_stage_params(arch, tp, pp, stage) - experts * (1 - 1 / plan.ep)
    shard = _megatron_optimizer_shard(plan, gpus, params, experts / plan.ep)
    optimizer, host = _megatron_optimizer_bytes(plan, shard)
    dropout = plan.hidden_dropout > 0
    sequence_split = tp if plan.sequence_parallel and tp > 1 else 1
    seq = plan.seq // plan.cp
    one_layer = megatron_layer_activation_bytes(
        arch,
        plan.batch,
        seq,
        e,
        tp,
        sequence_parallel=plan.sequence_parallel,
        attention=plan.attention,
        selective_recompute=plan.selective_recompute,
        dropout=dropout,
    )
    sbh = plan.batch * seq * arch.hidden
    in_flight = max(1, min(pp - stage, plan.grad_accum))
    per_micro_batch = layers * (e * sbh / sequence_split if plan.grad_ckpt else one_layer)
    if stage == 0 and dropout:
        per_micro_batch += sbh / sequence_split
    saved, transient = _long_context_extras(plan, arch, layers, e, sequence_split)
    activations = in_flight * (per_micro_batch + saved) + transient
    activations += one_layer if plan.grad_ckpt else 0.0
    if stage == pp - 1:
        activations += _megatron_head(plan, arch, seq, e, sequence_split)
    return MegatronStage(
        stage=stage,
        layers=layers,
        params=params,
        weights=params * sizes.weight,
        gradients=params * sizes.main_gradient,
        optimizer=optimizer,
        activations=activations,
        one_layer=one_layer,
        micro_batches_in_flight=in_flight,
        host=host,
    )


def _megatron_head(plan: Plan, arch: Architecture, seq: int, e: int, sequence_split: int) -> float:
    """The last stage's head: the final norm's and output layer's inputs (``2 e sbh``, split with
    sequence parallelism) and the vocab-parallel cross entropy's logits (``s b v / tp`` elements).

    megatron/core/tensor_parallel/cross_entropy.py (``calculate_logits_max``: ``.float()``, then in
    place) keeps an fp32 copy (4 bytes each); in 16-bit the logits live beside it to the end of
    forward, and backward returns the fp32 softmax as their gradient, which autograd casts back to
    the logits' dtype beside it (``validate_outputs``, torch/csrc/autograd/engine.cpp): ``e`` bytes
    more. In fp32 ``.float()`` is the logits themselves."""
    logits = plan.batch * seq * arch.vocab / plan.tp
    head = 2 * e * plan.batch * seq * arch.hidden / sequence_split + 4 * logits
    return head + (e * logits if e < 4 else 0.0)


def _megatron_optimizer_shard(plan: Plan, gpus: int, params: float, local_experts: float) -> float:
    """The parameters whose master copy and optimizer states one GPU holds, of its ``params``: the
    distributed optimizer shards them over data x context ranks (``gpus / (tp x pp)``), the
    ``local_experts`` part over the experts' data-parallel group (``gpus / (tp x pp x ep)``,
    megatron/core/parallel_state.py)."""
    tp, pp = plan.tp, plan.pp
    dense_dp = max(1, gpus // (tp * pp)) if plan.zero >= 1 else 1
    shard = params / dense_dp
    if plan.ep > 1:
        expert_dp = max(1, gpus // (tp * pp * plan.ep)) if plan.zero >= 1 else 1
        shard += local_experts * (1 / expert_dp - 1 / dense_dp)
    return shard


#: Bytes per offloaded parameter that Megatron's hybrid optimizer keeps on the host besides the
#: optimizer states: the pinned fp32 copy it steps (the master weights) and the pinned fp32
#: gradient buffer it copies the gradient into (megatron/core/optimizer/cpu_offloading/
#: hybrid_optimizer.py, ``_get_sub_optimizer_param_groups`` and ``_set_sub_optimizer_grads``;
#: ``param_update_in_fp32=True`` from megatron/core/optimizer/__init__.py).
OFFLOAD_HOST_MASTER_BYTES = 4
OFFLOAD_HOST_GRADIENT_BYTES = 4


def _megatron_optimizer_bytes(plan: Plan, shard: float) -> tuple[float, float]:
    """(GPU bytes, host bytes) of the master copy and optimizer states of one GPU's ``shard``
    (:func:`_megatron_optimizer_shard`). Without offload all of it is on the GPU: fp32 master
    (bf16 training) and fp32 states. With Megatron's optimizer CPU offload, the
    ``optimizer_offload_fraction`` of the shard is on the host: fp32 copy, states and fp32
    gradient copy each (module docstring); the rest stays on the GPU. Counted as exactly the
    fraction: Megatron stops after the parameter shard that reaches it, a little more."""
    sizes = megatron_bytes(plan.precision)
    state = est_states.optimizer_state_bytes_per_param(plan.optimizer, LAYOUTS[Precision.FP32])
    k_bytes = sizes.master + state
    if not plan.megatron_offload:
        return shard * k_bytes, 0.0
    offloaded = shard * plan.optimizer_offload_fraction
    host_bytes = OFFLOAD_HOST_MASTER_BYTES + state + OFFLOAD_HOST_GRADIENT_BYTES
    return (shard - offloaded) * k_bytes, offloaded * host_bytes


def _long_context_extras(
    plan: Plan, arch: Architecture, layers: int, e: int, sequence_split: int
) -> tuple[float, float]:
    """(bytes per micro-batch kept for backward, bytes of one layer's transient buffers) that
    context and expert parallelism add on one rank (:mod:`~hwdash.core.estimator.long_context`):
    with ``--ep``, each MoE layer's received token copies (kept) and the send copy of the layer
    running; with ``--cp``, the ring's K/V and dK/dV blocks in flight. Both 0 without them."""
    transient = long_context.ring_buffers(plan, arch, e, plan.tp)
    if plan.ep <= 1:
        return 0.0, transient
    tokens = plan.batch * plan.seq / plan.cp
    copies = long_context.dispatched_token_bytes(arch, tokens, e, sequence_split)
    moe_layers = long_context.moe_layers(arch) * layers // arch.layers
    return moe_layers * copies, transient + copies


def add_megatron_training(
    plan: Plan, arch: Architecture, gpus: int, acc: est_phases._Accumulator, label: str
) -> int:
    """The heavier of the first and the last pipeline stage, into ``acc``; return the trainable
    parameters (the whole model: Megatron trains all of it)."""
    tp, pp, cp = plan.tp, plan.pp, plan.cp
    if gpus % (tp * pp * cp):
        acc.warnings.append(
            f"{gpus} GPUs is not a multiple of tp x pp x cp = {tp * pp * cp}: counted with "
            f"{max(1, gpus // (tp * pp * cp))}-way data parallelism"
        )
    candidates = [megatron_stage(plan, arch, gpus, 0)]
    if pp > 1:
        candidates.append(megatron_stage(plan, arch, gpus, pp - 1))
    stage = max(candidates, key=lambda candidate: candidate.total)
    dp = max(1, gpus // (tp * pp * cp))
    where = "first" if stage.stage == 0 else "last"
    mesh = f"tp {tp} x pp {pp}" + (f" x cp {cp}" if cp > 1 else "") + f" x dp {dp}"
    mesh += f", ep {plan.ep}" if plan.ep > 1 else ""
    acc.note(
        f"{label} on {mesh}: {where} pipeline stage ({stage.layers} layers, "
        f"{stage.micro_batches_in_flight} micro-batch(es) in flight, "
        f"{stage.params / 1e9:.2f}B params per GPU)",
        0,
    )
    acc.weights += stage.weights
    experts = f", experts 1/{tp * plan.ep}" if plan.ep > 1 else ""
    acc.note(f"{label} weights (stage {stage.stage}, 1/{tp} of each layer{experts})", stage.weights)
    acc.persistent_gradients += stage.gradients
    acc.note(f"{label} main gradients (fp32 buffer)", stage.gradients)
    _add_megatron_optimizer(plan, arch, gpus, acc, label, stage.optimizer)
    acc.activations += stage.activations
    acc.note(
        f"{label} activations (Korthikanti et al. 2022, {stage.micro_batches_in_flight} "
        "micro-batch(es))",
        stage.activations,
        est_phases._BACKWARD_ONLY,
    )
    acc.last_layer_activations += stage.one_layer
    acc.note(f"{label} one layer's backward", stage.one_layer, est_phases._BACKWARD_END_ONLY)
    if plan.precision is Precision.BF16:
        acc.warnings.append(
            "Megatron's bf16 training keeps fp32 main gradients, an fp32 master copy and fp32 "
            "optimizer states (6 + 12/d bytes per parameter with the distributed optimizer): "
            "counted as --precision mixed"
        )
    if pp > 1 and plan.grad_accum < pp:
        acc.warnings.append(
            f"--grad-accum {plan.grad_accum} gives the pipeline fewer micro-batches than its {pp} "
            "stages (a large bubble); Megatron runs global batch / (micro-batch x dp) of them"
        )
    if plan.zero == 0 and dp > 1:
        acc.warnings.append(
            "the optimizer states are replicated over data parallelism: Megatron's distributed "
            "optimizer (--use-distributed-optimizer, here --zero 1) shards them"
        )
    return math.floor(arch.total_params)


def _add_megatron_optimizer(
    plan: Plan,
    arch: Architecture,
    gpus: int,
    acc: est_phases._Accumulator,
    label: str,
    optimizer: float,
) -> None:
    """The master copy and optimizer states on the GPU (``optimizer`` bytes), and with Megatron's
    optimizer CPU offload the host's share (:func:`_add_megatron_offload_host`)."""
    acc.optimizer += optimizer
    dp = max(1, gpus // (plan.tp * plan.pp * plan.cp)) * plan.cp
    sharded = f"distributed over dp {dp}" if plan.zero >= 1 else "not distributed (--zero 1)"
    if plan.megatron_offload:
        fraction = plan.optimizer_offload_fraction
        sharded += f"; {fraction:g} of it on the host" if fraction < 1 else "; all on the host"
    acc.note(f"{label} master copy + optimizer states ({sharded})", optimizer)
    if plan.megatron_offload:
        _add_megatron_offload_host(plan, arch, gpus, acc, label)


def _add_megatron_offload_host(
    plan: Plan, arch: Architecture, gpus: int, acc: est_phases._Accumulator, label: str
) -> None:
    """The host RAM of Megatron's optimizer CPU offload on all ``gpus`` (one machine holds them
    all, as for ZeRO-Offload): every pipeline stage's per-GPU share
    (:func:`_megatron_optimizer_bytes`) times the ``gpus / pp`` GPUs that run it; the stages
    between the first and the last are alike."""
    pp = plan.pp
    per_stage = gpus / pp
    host = megatron_stage(plan, arch, gpus, 0).host
    if pp > 1:
        host += megatron_stage(plan, arch, gpus, pp - 1).host
    if pp > 2:
        host += (pp - 2) * megatron_stage(plan, arch, gpus, 1).host
    host *= per_stage
    acc.host += host
    acc.note(
        f"{label} offloaded fp32 copies, optimizer states and gradient copies: on the host",
        0,
    )
