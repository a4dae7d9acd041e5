"""One trained model: its model states, gradients, optimizer step and activations, step by step.

:func:`_train_one_model` adds one trained model (the plan's model, an RL policy or value model) to
the accumulator: the weights (full, or a frozen base with adapters), the optimizer states and the
gradients in the phases they are alive in, the optimizer step's temporaries, then the activations
and the logits. Plans sharded by PyTorch FSDP or Megatron TP/PP go to :mod:`hwdash.core.estimator.parallelism`;
the memory savers come from :mod:`hwdash.core.estimator.savers`.

Sources:

* ZeRO: Rajbhandari et al. 2020, arXiv:1910.02054, section 3.1 (the fp32 master copy) and 5
  (sharding); DeepSpeed's config docs, https://www.deepspeed.ai/docs/config-json/ ("bf16"/"fp16":
  the module cast to 16 bits under ZeRO) and ``stage_1_and_2.py`` (fp32 gradient partitions,
  ``single_partition_of_fp32_groups``).
* ZeRO-Offload: Ren et al. 2021, arXiv:2101.06840, section 4: fp32 master weights and Adam states
  (and the gradients they are updated from) live in host memory; the GPU keeps the 16-bit parameters.
* PEFT (fp32 adapters; ``prepare_model_for_kbit_training``) and bitsandbytes (one weight
  dequantized at a time); torchtune (bf16 adapters, ``optimizer_in_bwd``) and PyTorch's tutorial
  "How to save memory by fusing the optimizer step into the backward pass".
* The phases each part is alive in, and the recomputation rules, are traced on
  ``bench/data/calibration.csv`` (see the comments in place).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hwdash.core.estimator import collectives, long_context, parallelism, zero_buffers
from hwdash.core.estimator.activations import (
    DROPOUT_MASK_BYTES,
    _merged_expert_gradient_bytes,
    dora_weight_norm_transient_bytes,
    eager_backward_transient_bytes,
    layer_activation_bytes,
    training_activation_bytes,
)
from hwdash.core.estimator.architecture import (
    ALL_LINEAR,
    EMBEDDING,
    LM_HEAD,
    Architecture,
    LinearShape,
    lora_adapter_params,
    resolve_lora_targets,
    resolve_top_level,
    top_level_adapter_params,
    top_level_params,
)
from hwdash.core.estimator.phases import (
    _BACKWARD_END_ONLY,
    _BACKWARD_ONLY,
    _PRODUCED,
    _STEP_ONLY,
    _STEP_PHASES,
    PHASE_MODEL_LOAD,
    _Accumulator,
    _gradients_persist,
)
from hwdash.core.estimator.quantization import add_quantized_base_load
from hwdash.core.estimator.savers import (
    Savers,
    is_paged,
    logits_and_loss_bytes,
    offloaded_activations,
    resolve_savers,
)
from hwdash.core.estimator.selective_ac import recomputes_last_block
from hwdash.core.estimator.states import (
    ADAPTER_LAYOUT,
    LAYOUTS,
    QUANTIZED_METHODS,
    Layout,
    ModelStates,
    _base_weight_bytes,
    _largest_trained_tensor,
    model_state_bytes,
    optimizer_state_bytes_per_param,
    optimizer_step_temporary_bytes,
)
from hwdash.core.plan import FsdpMode, Method, Offload, OptimizerImpl, Plan, Precision, StoreDtype


def _sharded_elsewhere(plan: Plan) -> bool:
    """Whether PyTorch FSDP or Megatron TP/PP shard the plan (:mod:`hwdash.core.estimator.parallelism`)."""
    return plan.fsdp is not FsdpMode.NONE or plan.megatron


def _effective_layout(plan: Plan, acc: _Accumulator) -> Layout:
    """The layout, adjusted where DeepSpeed overrides it.

    With ZeRO and bf16/fp16 enabled, DeepSpeed casts the whole module to 16 bits and its ZeRO
    optimizer keeps an fp32 master copy and fp32 states of what trains (DeepSpeed config docs,
    "bf16"/"fp16" sections; ZeRO paper section 3.1). So ``amp`` (fp32 weights under autocast)
    becomes ``mixed``, and so does ``bf16`` for full training; a LoRA-style ``bf16`` plan is
    unchanged (its base is already 16-bit, its adapters get the master copy either way).
    """
    layout = LAYOUTS[plan.precision]
    if _sharded_elsewhere(plan):
        return (
            layout  # FSDP and Megatron keep their own layouts (hwdash.core.estimator.parallelism)
        )
    if plan.zero == 0 or plan.precision in (Precision.FP32, Precision.MIXED):
        return layout
    trained = plan.rl_method if plan.is_rl else plan.method
    if plan.precision is Precision.BF16 and trained is not Method.FULL:
        return layout
    acc.warnings.append(
        "DeepSpeed ZeRO casts the model to 16 bits and keeps an fp32 master copy and fp32 "
        "optimizer states: counted as --precision mixed"
    )
    return LAYOUTS[Precision.MIXED]


@dataclass(frozen=True)
class _Trained:
    """What the model-state step of :func:`_train_one_model` hands to the steps after it."""

    trainable: int
    """Parameters with gradients and optimizer states (the adapters, for LoRA-style methods)."""
    states: ModelStates
    """Their weights, gradients and optimizer states on one GPU (before offload)."""
    state_layout: Layout
    """The layout the trained parameters are stored in (the adapters' own, for LoRA-style)."""
    targets: tuple[LinearShape, ...] = ()
    """The adapted linear layers (none for full training)."""
    adapted_top: tuple[str, ...] = ()
    """The embedding and/or LM head LoRA adapts (``resolve_top_level``)."""
    saved_top: tuple[str, ...] = ()
    """The embedding and/or LM head trained in full (PEFT's ``modules_to_save``)."""
    copy_params: int = 0
    """Parameters of those trained copies (part of ``trainable``)."""
    copy_layout: Layout | None = None
    """The layout the copies train in (the base's dtype, not the adapters')."""


def _train_sequence_shard(
    plan: Plan,
    arch: Architecture,
    method: Method,
    layout: Layout,
    dp: int,
    acc: _Accumulator,
    label: str,
    with_logits: bool,
    savers: Savers,
) -> int:
    """FSDP2 context parallelism or DeepSpeed-Ulysses: one rank trains on its ``s/N`` tokens
    (:mod:`~hwdash.core.estimator.long_context`), plus the attention's buffers."""
    local = plan.model_copy(
        update={"seq": plan.seq // plan.sequence_shards, "cp": 1, "sp_ulysses": 1}
    )
    trainable = _train_one_model(
        local, arch, method, layout, dp, acc, label, with_logits=with_logits, savers=savers
    )
    long_context.add_sequence_buffers(plan, arch, layout.activation_bytes, acc, label)
    return trainable


def _train_one_model(
    plan: Plan,
    arch: Architecture,
    method: Method,
    layout: Layout,
    dp: int,
    acc: _Accumulator,
    label: str,
    *,
    with_logits: bool,
    savers: Savers | None = None,
) -> int:
    """Add the model states and activations of one trained model; return its trainable params.

    ``savers`` (:mod:`hwdash.core.estimator.savers`) switches the loss path, compile, activation offloading,
    the optimizer step in backward, paged states and the adapters' and QLoRA extras' dtypes."""
    if savers is None:
        savers = resolve_savers(plan)
    if plan.sequence_shards > 1 and not plan.megatron:
        return _train_sequence_shard(
            plan, arch, method, layout, dp, acc, label, with_logits, savers
        )
    if _sharded_elsewhere(plan):
        if plan.fsdp is not FsdpMode.NONE:
            return parallelism.add_fsdp_training(
                plan,
                arch,
                method,
                dp,
                acc,
                label,
                with_logits=with_logits,
                train_one=_train_one_model,
                savers=savers,
            )
        return parallelism.add_megatron_training(plan, arch, dp, acc, label)
    if method is Method.FULL:
        trained = _add_full_weights(plan, arch, layout, dp, acc, label)
    else:
        trained = _add_adapted_weights(plan, arch, method, layout, dp, acc, label, savers)
    gradients, step_temporaries = _add_optimizer_states(
        plan, arch, method, trained, dp, acc, label, savers
    )
    _add_gradients(plan, arch, method, trained, gradients, dp, acc, label, savers)
    _add_reduce_buffers(plan, arch, method, trained, dp, acc, savers)
    acc.step_temporaries += step_temporaries
    acc.note(f"{label} optimizer step temporaries", step_temporaries, _STEP_ONLY)
    _add_activations(plan, arch, method, layout, trained, acc, label, with_logits, savers)
    return trained.trainable


def _add_reduce_buffers(
    plan: Plan,
    arch: Architecture,
    method: Method,
    trained: _Trained,
    dp: int,
    acc: _Accumulator,
    savers: Savers,
) -> None:
    """The buffers the gradients are reduced through, in the trained parameters' 16-bit dtype:
    DeepSpeed's reduce buckets and offload staging, or PyTorch DDP's buckets."""
    largest = _largest_trained_tensor(arch, method, trained.trainable)
    gradient_bytes = trained.state_layout.gradient_bytes
    zero_buffers.add_reduce_buckets(plan, arch, trained.trainable, largest, gradient_bytes, acc)
    bucket_view = savers.ddp_bucket_view
    collectives.add_ddp_buckets(plan, dp, trained.trainable, gradient_bytes, acc, bucket_view)


def _add_full_weights(
    plan: Plan, arch: Architecture, layout: Layout, dp: int, acc: _Accumulator, label: str
) -> _Trained:
    """Full training: every parameter trains in ``layout``; ZeRO-3 shards or offloads the weights."""
    trainable = arch.total_params
    states = model_state_bytes(arch.total_params, trainable, layout, plan.optimizer, plan.zero, dp)
    weights_full = float(arch.total_params * layout.weight_bytes)
    gpu_weights, host_weights = zero_buffers.add_zero3_weights(
        plan, arch, weights_full, dp, acc, label
    )
    acc.weights += gpu_weights
    acc.host += host_weights
    acc.note(f"{label} weights", gpu_weights)
    acc.add_phase_bytes(PHASE_MODEL_LOAD, "weights", gpu_weights, f"{label} weights as loaded")
    return _Trained(trainable, states, layout)


def _add_adapted_weights(
    plan: Plan,
    arch: Architecture,
    method: Method,
    layout: Layout,
    dp: int,
    acc: _Accumulator,
    label: str,
    savers: Savers,
) -> _Trained:
    """LoRA-style training: the frozen base (quantized for QLoRA and 8-bit LoRA) and the adapters,
    plus the transients of a quantized base's dequantized weight and of DoRA's weight norm."""
    zero = plan.zero
    targets = resolve_lora_targets(arch, plan.lora_targets)
    dora = method is Method.DORA
    router = ALL_LINEAR in plan.lora_targets  # PEFT maps all-linear onto a MoE's router too
    trainable = lora_adapter_params(arch, targets, plan.lora_r, dora=dora, router=router)
    adapted_top = resolve_top_level(arch, plan.lora_targets, strict=False)
    trainable += top_level_adapter_params(arch, adapted_top, plan.lora_r)
    base_bytes, _ = _base_weight_bytes(arch, method, layout, savers.qlora_frozen_bytes)
    gpu_base, host_base = zero_buffers.add_zero3_weights(plan, arch, base_bytes, dp, acc, label)
    state_layout = _adapter_state_layout(zero, savers)
    states = model_state_bytes(trainable, trainable, state_layout, plan.optimizer, zero, dp)
    acc.weights += gpu_base + states.weights
    acc.host += host_base
    acc.note(f"{label} frozen base ({method.value})", gpu_base)
    acc.note(f"{label} adapters", states.weights)
    _add_base_load(plan, arch, method, base_bytes, gpu_base, acc, label, savers)
    saved_top = resolve_top_level(arch, plan.lora_modules_to_save)
    copy_params = sum(top_level_params(arch, part) for part in saved_top)
    copy_layout = None
    if copy_params:
        copy_layout = _copy_layout(plan, method, layout, savers)
        states = _add_trained_copies(plan, copy_params, copy_layout, states, dp, acc, label)
        trainable += copy_params
    _add_adapter_transients(arch, method, targets, state_layout, layout, acc, label)
    return _Trained(
        trainable,
        states,
        state_layout,
        targets,
        adapted_top=adapted_top,
        saved_top=saved_top,
        copy_params=copy_params,
        copy_layout=copy_layout,
    )


def _add_base_load(
    plan: Plan,
    arch: Architecture,
    method: Method,
    base_bytes: float,
    gpu_base: float,
    acc: _Accumulator,
    label: str,
    savers: Savers,
) -> None:
    """Record the frozen base's model load: as loaded (the adapters come later, from PEFT's
    ``get_peft_model``), and for a quantized base what quantizing and upcasting it hold
    (:func:`~hwdash.core.estimator.quantization.add_quantized_base_load`). Under ZeRO-3 the base
    is loaded into its shards (DeepSpeed's ``zero.Init``): counted as sharded, no transient."""
    bits = arch.checkpoint_bits
    if method is Method.QLORA:
        bits = 4
    elif method is Method.LORA_8BIT:
        bits = 8
    if bits is None or plan.zero >= 3:
        acc.add_phase_bytes(PHASE_MODEL_LOAD, "weights", gpu_base, f"{label} base as loaded")
        return
    frozen_bytes = savers.qlora_frozen_bytes
    linears = base_bytes - frozen_bytes * arch.unquantized_params
    add_quantized_base_load(acc, arch, bits, linears, frozen_bytes, label)


def _adapter_state_layout(zero: int, savers: Savers) -> Layout:
    """The adapters' states: as DeepSpeed or PEFT keep them, or torchtune's bf16 adapters."""
    # DeepSpeed casts the whole module to bf16 and keeps an fp32 master copy of what trains;
    # without DeepSpeed PEFT keeps fp32 adapters. Both come to 16 bytes per adapter parameter
    # with Adam.
    state_layout = LAYOUTS[Precision.MIXED] if zero > 0 else ADAPTER_LAYOUT
    if zero == 0 and savers.adapter_dtype is StoreDtype.BF16:
        # torchtune builds the adapters in the model's bf16 (--adapter-dtype bf16)
        state_layout = LAYOUTS[Precision.BF16]
    return state_layout


def _add_trained_copies(
    plan: Plan,
    copy_params: int,
    copy_layout: Layout,
    states: ModelStates,
    dp: int,
    acc: _Accumulator,
    label: str,
) -> ModelStates:
    """Add the weights of the modules trained in full beside the adapters; return ``states``
    with the copies' weights, gradients and optimizer states added."""
    # PEFT's ModulesToSaveWrapper keeps the frozen original and trains a deep copy in the
    # base's dtype (peft/utils/other.py): the copy's weights, gradients and optimizer states.
    # A quantized base's embedding and head are upcast by prepare_model_for_kbit_training
    # (savers.qlora_frozen_bytes); DeepSpeed keeps an fp32 master copy of what trains.
    copies = model_state_bytes(copy_params, copy_params, copy_layout, plan.optimizer, plan.zero, dp)
    acc.weights += copies.weights
    acc.note(f"{label} trained copies ({', '.join(plan.lora_modules_to_save)})", copies.weights)
    return ModelStates(
        weights=states.weights + copies.weights,
        gradients=states.gradients + copies.gradients,
        optimizer=states.optimizer + copies.optimizer,
    )


def _add_adapter_transients(
    arch: Architecture,
    method: Method,
    targets: tuple[LinearShape, ...],
    state_layout: Layout,
    layout: Layout,
    acc: _Accumulator,
    label: str,
) -> None:
    """A quantized base's dequantized weight and DoRA's weight norm, alive in backward only."""
    if method in QUANTIZED_METHODS:
        # bitsandbytes dequantizes one weight at a time to 16 bits for the matmul (fused MoE
        # experts are not quantized: Architecture.experts_fused).
        largest = arch.largest_quantized_linear
        dequantized = 2 * largest.in_features * largest.out_features
        acc.activations += dequantized
        acc.note(f"{label} dequantized weight (transient)", dequantized, _BACKWARD_ONLY)
    if method is Method.DORA:
        transient = dora_weight_norm_transient_bytes(
            targets, state_layout.weight_bytes, layout.activation_bytes
        )
        acc.activations += transient
        acc.note(f"{label} DoRA weight-norm transient", transient, _BACKWARD_ONLY)


def _copy_layout(plan: Plan, method: Method, layout: Layout, savers: Savers) -> Layout:
    """The layout a ``modules_to_save`` copy trains in: the dtype its original is loaded in (fp32
    or bf16 weights, gradients and Adam states alike, as torch.optim keeps states in the
    parameter's dtype), or DeepSpeed's mixed layout under ZeRO."""
    if plan.zero > 0:
        return LAYOUTS[Precision.MIXED]
    weight_bytes = savers.qlora_frozen_bytes if method in QUANTIZED_METHODS else layout.weight_bytes
    return LAYOUTS[Precision.FP32] if weight_bytes == 4 else LAYOUTS[Precision.BF16]


def _top_level_activation_bytes(
    plan: Plan, arch: Architecture, trained: _Trained, element_bytes: int, casts: bool
) -> int:
    """What LoRA on the embedding or LM head, and a trained LM-head copy, keep for backward.

    * a trained LM head (``modules_to_save``) keeps its input, the final norm's output (a frozen
      one keeps nothing: its input gradient needs only the weight);
    * LoRA on the LM head, as on a block linear (PEFT's ``lora.Linear``): its input's 16-bit cast
      (autocast, after PEFT's cast to the fp32 adapter), the dropout mask when ``p > 0``, lora_A's
      output, and autocast's 16-bit copies of A and B;
    * LoRA on the embedding (PEFT's ``lora.Embedding``: no dropout): the r-wide lookup of
      ``lora_embedding_A`` cast to 16 bits for the matmul with B, and B's 16-bit copy, and the fp32
      gradient of B (hidden x r) while backward reaches it;
    * an embedding that trains (adapted or a trained copy) makes the first block's input need a
      gradient: its first norm then keeps what every other block's does (an RMSNorm its fp32
      input and reciprocal RMS; a native LayerNorm its input and two fp32 statistics per row);
      with a frozen embedding it keeps nothing.

    Traced (``hwdash plan --trace``, b1/s512 unless said, dropout 0, bf16): qwen2.5-0.5b with
    ``modules_to_save`` embed_tokens and lm_head -0.05%, lm_head alone -0.01%, all block linears
    plus embed_tokens and lm_head as LoRA targets -0.08%; llama-3.2-1b q_proj, v_proj and
    lm_head (b2/s1024) 0.00%, and with embed_tokens at r16 and r64 the first norm's
    4 t h + 4 t bytes and B's 4 h r bytes were what remained.
    """
    e, tokens, r = element_bytes, plan.batch * plan.seq, plan.lora_r
    kept = 0
    if LM_HEAD in trained.saved_top:
        kept += e * tokens * arch.hidden
    if LM_HEAD in trained.adapted_top:
        kept += e * tokens * arch.hidden + e * tokens * r
        if plan.lora_dropout > 0:
            kept += DROPOUT_MASK_BYTES * tokens * arch.hidden
        if casts:
            kept += e * r * (arch.hidden + arch.vocab)
    if EMBEDDING in trained.adapted_top:
        kept += e * tokens * r + (e * r * arch.hidden if casts else 0) + 4 * arch.hidden * r
    if EMBEDDING in trained.adapted_top or EMBEDDING in trained.saved_top:
        if arch.norm_saves_input:
            kept += e * tokens * arch.hidden + 8 * tokens
        else:
            kept += 4 * tokens * arch.hidden + 4 * tokens
    return kept


def _add_optimizer_states(
    plan: Plan,
    arch: Architecture,
    method: Method,
    trained: _Trained,
    dp: int,
    acc: _Accumulator,
    label: str,
    savers: Savers,
) -> tuple[float, float]:
    """Add the optimizer states (to the host under ZeRO-Offload, to managed memory when paged);
    return the gradients on the GPU and the optimizer step's temporaries, as offload and the
    optimizer step in backward leave them."""
    offload = plan.offload
    trainable, state_layout = trained.trainable, trained.state_layout
    gradients, optimizer = trained.states.gradients, trained.states.optimizer
    step_temporaries = _step_temporaries(plan, arch, method, trained, dp)
    if offload is not Offload.NONE:
        # ZeRO-Offload: master copy and optimizer states (and the gradients they step from) live on
        # the host; all shards of one machine add up to the full size there. From stage 2 the GPU
        # keeps no gradient partition either: each reduced bucket is copied straight to the host
        # (stage_1_and_2.py: cpu_offload sets self.device to 'cpu' for the fp32 partition's .grad
        # and async_inplace_copy_grad_to_fp32_buffer_from_gpu fills it; stage3.py: the 16-bit
        # grad_partitions_flat_buffer is made on self.device, the CPU under offload_optimizer).
        # On the GPU: the reduce buckets and the largest parameter's staging buffer
        # (zero_buffers.add_reduce_buckets). Stage 1 reduces only at the accumulation boundary,
        # so its 16-bit gradients stay on the GPU through backward.
        if plan.zero >= 2:
            gradients = 0.0
        k_bytes = state_layout.master_bytes + optimizer_state_bytes_per_param(
            plan.optimizer, state_layout
        )
        # the gradients DeepSpeed keeps on the host are fp32 (zero_buffers, stage_1_and_2.py
        # and stage3.py), pinned with offload_optimizer.pin_memory
        host_gradients = zero_buffers.offload_host_gradient_bytes(
            plan.zero, state_layout.weight_bytes
        )
        acc.host += trainable * (k_bytes + host_gradients)
        optimizer = 0.0
        step_temporaries = 0.0
    if savers.optimizer_in_backward:
        gradients, step_temporaries = _optimizer_in_backward(
            plan, arch, method, trained, dp, gradients, step_temporaries
        )
    acc.optimizer += optimizer
    if is_paged(plan.optimizer):
        acc.managed += optimizer
        acc.note(f"{label} optimizer states (paged: CUDA managed memory)", optimizer)
    else:
        acc.note(f"{label} optimizer states", optimizer)
    return gradients, step_temporaries


def _step_temporaries(
    plan: Plan, arch: Architecture, method: Method, trained: _Trained, dp: int
) -> float:
    """The optimizer step's temporaries: the trained parameters', then the trained copies' (PEFT's
    modules_to_save) in their own dtype."""
    step_temporaries = optimizer_step_temporary_bytes(
        arch,
        method,
        trained.trainable - trained.copy_params,
        trained.state_layout,
        plan.optimizer,
        plan.zero,
        dp,
        plan.optimizer_impl,
    )
    if plan.zero == 3 and plan.optimizer_impl is OptimizerImpl.FOREACH:
        # ZeRO-3 steps one sub-group at a time: _optimizer_step hands the torch optimizer one
        # sub-group's fp32 partition per call (deepspeed/runtime/zero/stage3.py, step), so
        # foreach's state-sized temporary is one sub-group's, as its fp32 gradients are
        trainable = trained.trainable - trained.copy_params
        partition = trainable / max(1, dp)
        largest = _largest_trained_tensor(arch, method, trainable) / max(1, dp)
        group = zero_buffers.zero3_sub_group_fp32_gradients(plan, arch, partition, largest)
        step_temporaries = min(step_temporaries, group * trained.state_layout.state_bytes)
    if trained.copy_layout is not None:
        # the trained copies step in their own dtype, each a vocab x hidden matrix (as full
        # training's embedding: Method.FULL's largest tensor)
        step_temporaries += optimizer_step_temporary_bytes(
            arch,
            Method.FULL,
            trained.copy_params,
            trained.copy_layout,
            plan.optimizer,
            plan.zero,
            dp,
            plan.optimizer_impl,
        )
    return step_temporaries


def _optimizer_in_backward(
    plan: Plan,
    arch: Architecture,
    method: Method,
    trained: _Trained,
    dp: int,
    gradients: float,
    step_temporaries: float,
) -> tuple[float, float]:
    """The gradients and step temporaries with the optimizer step fused into backward."""
    # torchtune's optimizer_in_bwd: a hook steps each parameter and frees its gradient as soon
    # as backward produces it (torchtune's memory utilities, utils/memory.py and later
    # training/memory.py: create_optim_in_bwd_wrapper and
    # register_optim_in_bwd_hooks, one optimizer per parameter stepped from a post-accumulate-
    # grad hook; PyTorch tutorial "How to save memory by fusing the optimizer step into the
    # backward pass"): at most
    # one parameter's gradient and its step's temporaries exist at a time.
    trainable, state_layout = trained.trainable, trained.state_layout
    one_tensor = _largest_trained_tensor(arch, method, trainable)
    gradients = min(gradients, float(one_tensor * state_layout.gradient_bytes))
    if plan.offload is Offload.NONE:
        step_temporaries = optimizer_step_temporary_bytes(
            arch,
            method,
            trainable,
            state_layout,
            plan.optimizer,
            plan.zero,
            dp,
            OptimizerImpl.FOR_LOOP,
        )
    return gradients, step_temporaries


def _add_gradients(
    plan: Plan,
    arch: Architecture,
    method: Method,
    trained: _Trained,
    gradients: float,
    dp: int,
    acc: _Accumulator,
    label: str,
    savers: Savers,
) -> None:
    """Add the gradients, alive across backward or produced by it (:func:`_gradients_persist`),
    and the fp32 copies a master copy's step reads."""
    if _gradients_persist(plan):
        acc.persistent_gradients += gradients
        if plan.zero == 0 and not plan.is_rl:
            # gradient accumulation's sums: the Trainer frees them (zero_grad) before it saves
            acc.save_freed_gradients += gradients
            acc.note(f"{label} gradients", gradients, _STEP_PHASES)
        else:
            acc.note(f"{label} gradients", gradients)
    else:
        acc.produced_gradients += gradients
        acc.note(f"{label} gradients", gradients, _PRODUCED)
    if trained.state_layout.master_bytes and plan.offload is Offload.NONE:
        # The step reads fp32 gradients: DeepSpeed upcasts the 16-bit gradients into fp32
        # partitions for its fp32 master copy (stage_1_and_2.py, single_partition_of_fp32_groups),
        # as does our trace's emulation (bench/calibration/tracing.py, ``to_masters``), which frees
        # each 16-bit gradient as it is copied: traced qwen2.5-7b mixed, optimizer phase.
        trainable = trained.trainable
        shard = dp if plan.zero >= 1 else 1
        fp32_gradients = trainable * 4 / shard
        if savers.optimizer_in_backward:
            fp32_gradients = min(
                fp32_gradients, 4.0 * _largest_trained_tensor(arch, method, trainable)
            )
        elif plan.zero == 3:
            # ZeRO-3 upcasts one sub-group at a time (zero_buffers, stage3.py)
            largest = _largest_trained_tensor(arch, method, trainable) / shard
            fp32_gradients = 4.0 * zero_buffers.zero3_sub_group_fp32_gradients(
                plan, arch, trainable / shard, largest
            )
        extra = fp32_gradients - (0.0 if _gradients_persist(plan) else gradients)
        acc.master_gradients += extra
        acc.note(f"{label} fp32 gradients for the master copy", extra, _STEP_ONLY)


def _layer_settings(
    plan: Plan, method: Method, layout: Layout, trained: _Trained, savers: Savers
) -> dict[str, Any]:
    """The keyword arguments of :func:`layer_activation_bytes` and
    :func:`training_activation_bytes` for this model: weights, adapters, compile."""
    targets = trained.targets
    return {
        "weight_bytes": layout.weight_bytes,
        "lora_targets": targets,
        "lora_rank": plan.lora_r if targets else 0,
        "dora": method is Method.DORA,
        "lora_dropout": bool(targets) and plan.lora_dropout > 0,
        "compiled": savers.compile,
        "tiled_mlp": bool(plan.tiled_mlp),
        "liger": bool(plan.liger) and not plan.megatron,
        "adapter_casts": (
            False
            if targets and trained.state_layout.weight_bytes == layout.activation_bytes == 2
            else None
        ),
    }


def _logits_and_loss(
    plan: Plan,
    arch: Architecture,
    method: Method,
    layout: Layout,
    trained: _Trained,
    savers: Savers,
) -> int:
    """The logits and the loss at their peak, as the loss path (``savers``) computes them; full
    training also holds the LM head's gradient while the fused losses run."""
    return logits_and_loss_bytes(
        savers,
        plan.batch,
        plan.seq,
        arch.vocab,
        arch.hidden,
        layout.activation_bytes,
        arch.final_logit_softcap,
        head_gradient_bytes=(
            arch.vocab * arch.hidden * trained.state_layout.gradient_bytes
            if method is Method.FULL
            else 0
        ),
    )


#: ``--tiled-mlp`` on a mixture of experts (activations.tiled_mlp_bytes counts dense MLPs).
_TILED_EXPERTS = (
    "--tiled-mlp is counted for dense MLPs (DeepSpeed's TiledMLP wraps a model's MLP module): this "
    "model's expert layers are planned untiled"
)


#: ``--liger`` on a model none of whose norms or MLPs Liger's kernels replace.
_LIGER_NONE = (
    "--liger counts Liger's RMSNorm and gated-activation kernels: this model has LayerNorms and "
    "an ungated MLP, so it is planned without them"
)


def _kernel_warnings(plan: Plan, arch: Architecture) -> list[str]:
    """What ``--tiled-mlp`` and ``--liger`` leave out for this model."""
    warnings = []
    if plan.tiled_mlp and arch.experts > 1:
        warnings.append(_TILED_EXPERTS)
    if plan.liger and not plan.megatron and not arch.gated_mlp and arch.norm_saves_input:
        warnings.append(_LIGER_NONE)
    return warnings


def _add_activations(
    plan: Plan,
    arch: Architecture,
    method: Method,
    layout: Layout,
    trained: _Trained,
    acc: _Accumulator,
    label: str,
    with_logits: bool,
    savers: Savers,
) -> None:
    """Add the activations at the start of backward (saved, or checkpointed with one layer
    recomputed), the logits and loss, and the first layer's backward at the end of backward."""
    element_bytes = layout.activation_bytes
    settings = _layer_settings(plan, method, layout, trained, savers)
    if label == "model":
        acc.warnings.extend(_kernel_warnings(plan, arch))
    activations = training_activation_bytes(
        arch,
        plan.batch,
        plan.seq,
        element_bytes,
        plan.attention,
        plan.grad_ckpt,
        selective_ac=plan.selective_ac,
        **settings,
    )
    activations += _top_level_activation_bytes(
        plan,
        arch,
        trained,
        element_bytes,
        bool(settings["adapter_casts"] is not False) and element_bytes != 4,
    )
    logits = _logits_and_loss(plan, arch, method, layout, trained, savers) if with_logits else 0
    one_layer, transient = _add_first_layer_backward(
        plan, arch, layout, trained, acc, label, settings
    )
    if plan.grad_ckpt or plan.selective_ac is not None:
        # full or torchtitan's selective checkpointing (selective_ac.py): one block recomputed
        # on top of the rest where backward recomputes one before freeing any
        again = recomputes_last_block(plan.selective_ac, arch.layers)
        recomputed = (one_layer, transient) if again else (0, 0)
        kept = _kept_head_gradient(savers, arch, method, layout) if with_logits and again else 0
        _add_checkpointed(arch, activations, recomputed, logits, acc, label, savers, kept)
        return
    if savers.activation_offload:
        on_gpu, on_host = offloaded_activations(arch.layers, activations / arch.layers)
        acc.host += on_host
        activations = round(on_gpu)
    acc.activations += activations + logits
    acc.note(f"{label} activations", activations, _BACKWARD_ONLY)
    if with_logits:
        acc.note(f"{label} logits and loss", logits, _BACKWARD_ONLY)


def _add_first_layer_backward(
    plan: Plan,
    arch: Architecture,
    layout: Layout,
    trained: _Trained,
    acc: _Accumulator,
    label: str,
    settings: dict[str, Any],
) -> tuple[int, int]:
    """The end of backward: the first layer's activations (recomputed, with checkpointing) while
    every other gradient exists. Traced: mixtral-8x7b LoRA with checkpointing peaks there
    (bench/data/calibration.csv, gradients 97% complete at the backward peak). Its backward holds
    eager attention's score-sized gradients on top, as a recomputed layer's does
    (:func:`eager_backward_transient_bytes`). Returns one layer's saved tensors and that transient.

    The first layer has its own attention kind: a sliding or chunked one keeps SDPA's mask past
    its span (activations._masked_sdpa)."""
    block, e = arch.leading_block, layout.activation_bytes
    one_layer = layer_activation_bytes(block, plan.batch, plan.seq, e, plan.attention, **settings)
    transient = eager_backward_transient_bytes(block, plan.batch, plan.seq, e, plan.attention)
    last_layer = one_layer + transient
    last_layer += _merged_expert_gradient_bytes(trained.targets, layout.weight_bytes)
    acc.last_layer_activations += last_layer
    acc.note(f"{label} first layer's backward", last_layer, _BACKWARD_END_ONLY)
    return one_layer, transient


def _kept_head_gradient(savers: Savers, arch: Architecture, method: Method, layout: Layout) -> int:
    """The output layer's unsharded gradient where FSDP's root unit holds it to the end of backward
    (``--fsdp-wrap transformer``, ``Savers.fsdp_root_keeps_head``): created as
    backward starts (in the forward by a fused linear cross-entropy, Liger's ``grad_weight``), it is
    reduce-scattered only in the root's post-backward, after the last block's recomputation
    (``_fully_shard/_fsdp_state.py``: the root's post-backward runs in the final callback). The
    tied embedding's gradient waits likewise. Full training only; in the gathered dtype."""
    if not savers.fsdp_root_keeps_head or method is not Method.FULL:
        return 0
    return (arch.lm_head_params or arch.embedding_params) * layout.weight_bytes


def _add_checkpointed(
    arch: Architecture,
    activations: int,
    recomputed_layer: tuple[int, int],
    logits: int,
    acc: _Accumulator,
    label: str,
    savers: Savers,
    kept_head: int = 0,
) -> None:
    """Start of backward with gradient checkpointing: the checkpoints plus the larger of the
    logits and loss and the recomputed layer (``activations`` counts the checkpoints and one
    layer, :func:`training_activation_bytes`; ``recomputed_layer``: that layer's saved tensors
    and what its backward holds on top, :func:`eager_backward_transient_bytes`).

    With recomputation the loss's fp32 tensors and the recomputed layer are not alive at the same
    time: backward starts with the loss and the LM head (freed once the hidden state's gradient
    exists), and only then recomputes the last block. Traced: every checkpointed row of
    bench/data/calibration.csv peaks at the start of backward (end of forward + 8 fp32 bytes per
    logit), without the recomputed layer on top. ``kept_head``: the output layer's gradient alive
    beside the recomputed layer (:func:`_kept_head_gradient`).
    """
    saved, transient = recomputed_layer
    checkpoints = activations - saved
    recomputed = saved + transient + kept_head
    if savers.activation_offload:
        # the checkpoints go to host RAM, all but the layers in flight (savers.py)
        on_gpu, on_host = offloaded_activations(arch.layers, checkpoints / arch.layers)
        acc.host += on_host
        checkpoints = round(on_gpu)
    acc.activations += checkpoints + max(recomputed, logits)
    acc.note(f"{label} activations (checkpoints)", checkpoints, _BACKWARD_ONLY)
    if logits >= recomputed:
        acc.note(f"{label} logits and loss", logits, _BACKWARD_ONLY)
        return
    acc.note(f"{label} recomputed layer", recomputed - kept_head, _BACKWARD_ONLY)
    if kept_head:
        head = f"{label} output layer's gradient (kept for the FSDP root unit's reduce-scatter)"
        acc.note(head, kept_head, _BACKWARD_ONLY)
