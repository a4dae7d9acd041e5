"""The estimate: one plan, one model, the peak bytes per GPU and the phase it happens in.

:func:`estimate_memory` resolves the plan's layout, savers and compute dtype, warns about settings
that do not do what they say on this model or GPU, hands the plan to the concern that counts it
(:mod:`~hwdash.core.estimator.inference`, :mod:`~hwdash.core.estimator.rl` or
:mod:`~hwdash.core.estimator.training`), then takes the peak phase
(:mod:`~hwdash.core.estimator.phases`) and adds the overhead.

Sources:

* The overhead: PyTorch's CUDA memory-management notes
  (https://pytorch.org/docs/stable/notes/cuda.html#memory-management) and our H200 runs for the
  allocator's pool; ``catalog/software.toml`` (each row with its source) for the CUDA context and
  kernels, for NCCL's buffers (NVIDIA/nccl ``src/init.cc``, ``src/transport/p2p.cc``) and for
  its communicators (our H100).
* The phases and the gradients alive in each: the fake-tensor traces of
  ``bench/data/calibration.csv`` (``peak_phase``).
* The warnings name the kernel or library whose limit they state (FlashAttention 2, transformers'
  attention implementations, PEFT's ``lora.ParamWrapper`` for fused MoE expert weights, DeepSpeed
  ZeRO on one GPU).
"""

from __future__ import annotations

import dataclasses
import math

from hwdash.core.estimator import images
from hwdash.core.estimator.architecture import Architecture, architecture
from hwdash.core.estimator.collectives import CommGroup, nccl_bytes
from hwdash.core.estimator.inference import _add_inference
from hwdash.core.estimator.phases import (
    PHASE_BACKWARD,
    PHASE_BACKWARD_END,
    _Accumulator,
    _peak_breakdown,
    _peak_phase,
    _phase_details,
)
from hwdash.core.estimator.rl import _add_rl
from hwdash.core.estimator.savers import resolve_savers
from hwdash.core.estimator.software import PoolKind, Software, packaged_software
from hwdash.core.estimator.states import QUANTIZED_METHODS, Layout
from hwdash.core.estimator.training import _effective_layout, _train_one_model
from hwdash.core.plan import (
    LORA_STYLE_METHODS,
    Attention,
    FsdpMode,
    Method,
    Offload,
    Plan,
    Precision,
    Quant,
)
from hwdash.core.results import MemoryEstimate
from hwdash.core.specs import Accelerator, Framework, ModelSpec

# --------------------------------------------------------------------------------------------------
# The overhead: what the GPU holds beyond the tensors.
#
# * the caching allocator's pool (reserved minus allocated): a fraction of the tensors (catalog/
#   software.toml's ``[[allocator_pool]]``: one alone on a GPU, one in a parallel training group),
#   plus what a side stream's pool keeps cached beyond the tensors alive at the peak (FSDP1's
#   all-gather stream, ``_Accumulator.side_stream_pool``: :mod:`~hwdash.core.estimator.fsdp_versions`);
# * the software's own footprint, outside the allocator: the CUDA context and loaded kernels by
#   compute capability (``[[cuda_context]]`` in catalog/software.toml,
#   :mod:`~hwdash.core.estimator.software`);
# * NCCL's communicators (their own memory and buffers), outside the allocator too
#   (:mod:`~hwdash.core.estimator.collectives`).
#
# allocated (the tensors: ``torch.cuda.max_memory_allocated``) + the pool = reserved
# (``torch.cuda.max_memory_reserved``); reserved + footprint + NCCL (+ managed memory) = the whole
# GPU (what NVML shows), the breakdown's total and what the fit verdict compares.
# --------------------------------------------------------------------------------------------------


def distributed_pool(plan: Plan, dp: int) -> bool:
    """Whether a plan's allocator pool is a parallel process's: training on more than one GPU, or
    under DeepSpeed ZeRO or FSDP on any count, or on the Megatron-LM path. ZeRO and FSDP gather, free
    and reduce each layer's parameters and gradients in buffers on their own streams whatever the
    world size; on one H100 their runs reserved 20-85% beyond their peak allocation (median 31%),
    plain runs 0.5-29% (median 9%) (``bench/data/whole_gpu_readings_e.toml``,
    ``bench/data/device_h200/``)."""
    if plan.method is Method.INFERENCE:
        return False
    return dp > 1 or plan.zero > 0 or plan.fsdp is not FsdpMode.NONE or plan.megatron


def pool_kind(plan: Plan, dp: int) -> PoolKind:
    """Which ``[[allocator_pool]]`` fraction a plan takes (:meth:`Software.pool_fraction`):

    * ``single_gpu``: no collectives (one GPU without ZeRO or FSDP, or inference);
    * ``megatron``: training on the Megatron-LM path. Its DDP keeps every gradient in one
      contiguous buffer allocated up front and reduces bucket views of it in place
      (megatron/core/distributed/param_and_grad_buffer.py), and its distributed optimizer gathers
      parameters into that layout too, so few transient buffers of odd sizes reach the cache;
    * ``param_offload``: ZeRO-3 ``offload_param`` or FSDP CPU offload. Each layer's parameters
      reach the GPU through new buffers at every gather (copied host to device on the gather's
      stream), and the cache keeps more of those blocks: beyond hwdash's allocated tensors, its own
      H100 runs reserved 25-134% (median 45%) with parameter offload, 5-28% (median 21%) without
      (``bench/data/allocator_pool_fit.txt``, rows h100-*: sets E, F and H3);
    * ``distributed``: any other training process under a parallel group, ZeRO or FSDP
      (:func:`distributed_pool`)."""
    if not distributed_pool(plan, dp):
        return "single_gpu"
    if plan.megatron:
        return "megatron"
    if plan.offload is Offload.PARAMS or (plan.fsdp is not FsdpMode.NONE and plan.fsdp_offload):
        return "param_offload"
    return "distributed"


def _pool(software: Software, kind: PoolKind, allocated: int) -> tuple[str, int]:
    """The caching allocator's pool beside ``allocated`` bytes of tensors, and its line: the
    kind's base (where it has one) plus its fraction of the tensors."""
    fraction = software.pool_fraction(kind)
    base = software.pool_base(kind)
    pool = base + round(fraction * allocated)
    if not base:
        return f"allocator pool ({fraction:.0%} of the tensors)", pool
    return f"allocator pool ({base / 2**30:.2f} GiB + {fraction:.0%} of the tensors)", pool


def estimate_memory(
    plan: Plan,
    model: ModelSpec,
    *,
    gpus: int | None = None,
    accelerator: Accelerator | None = None,
    framework: Framework | None = None,
    software: Software | None = None,
) -> MemoryEstimate:
    """Peak bytes per GPU for ``plan`` on ``gpus`` data-parallel GPUs (default ``plan.gpus``).

    ``accelerator`` (None: hardware-neutral) sets the compute dtype, a vLLM share, the CUDA context
    row, NCCL's channels; ``framework``, ``software``: the catalog's entries (None: the packaged).

    The peak is the largest of the step's phases (:func:`~hwdash.core.estimator.phases._peak_phase`),
    and the breakdown shows the components as they are at that phase (``MemoryEstimate.peak_phase``):

    * start of backward: weights + optimizer states + the saved activations and the loss's fp32
      tensors + the gradients that persist across backward
      (:func:`~hwdash.core.estimator.phases._gradients_persist`);
    * end of backward: the gradients backward produced and the first layer's activations;
    * optimizer step: weights + optimizer states + every gradient + the step's temporaries
      (:func:`~hwdash.core.estimator.states.optimizer_step_temporary_bytes`), no activations;
    * model load (outside the step): the weights as ``from_pretrained`` loads them and its largest
      transient (quantize-on-load, PEFT's fp32 upcast; :mod:`~hwdash.core.estimator.quantization`);
    * checkpoint save (between steps): weights + optimizer states + what a save gathers.

    Gradients fill in as backward frees the activations layer by layer, so between the two ends the
    sum of activations and gradients moves from one to the other; the traces show no peak in
    between (``bench/data/calibration.csv``, ``peak_phase``).
    """
    dp = plan.gpus if gpus is None else max(1, gpus)
    arch = architecture(model)
    acc = _Accumulator()
    savers = resolve_savers(plan, framework)
    compute_dtype = _compute_dtype(plan, accelerator, acc)
    layout = _effective_layout(plan, acc)
    plan = _plan_the_model_runs(plan, model, layout, acc)
    _warn_about_settings(plan, model, dp, accelerator, layout, acc)
    _warn_about_moe(plan, model, arch, savers.qlora_frozen_bytes, acc)
    trainable = 0
    if model.encoder_only:
        # imported here: encoder_training imports the training module this one imports
        from hwdash.core.estimator import encoder, encoder_training

        encoder.check_encoder_plan(plan, model)
        acc.warnings.extend(encoder.encoder_warnings(plan, model))
        if plan.method is Method.INFERENCE:
            encoder_training.encoder_inference(plan, model, arch, layout, dp, acc)
        else:
            trainable = encoder_training.train_encoder(plan, model, arch, layout, dp, acc, savers)
    elif plan.method is Method.INFERENCE:
        _add_inference(plan, arch, layout, dp, acc)
    elif plan.is_rl:
        trainable = _add_rl(plan, arch, layout, dp, acc, accelerator, savers)
    else:
        trainable = _train_one_model(
            plan, arch, plan.method, layout, dp, acc, "model", with_logits=True, savers=savers
        )
    return _memory_estimate(plan, arch, acc, dp, trainable, compute_dtype, accelerator, software)


def _plan_the_model_runs(plan: Plan, model: ModelSpec, layout: Layout, acc: _Accumulator) -> Plan:
    """The plan with the attention the model has and, for a vision-language model with
    ``--images``, the image tokens added to the language model's sequence; the vision tower's
    activations are added to ``acc`` here (:mod:`hwdash.core.estimator.images`)."""
    plan = _attention_the_model_has(plan, model, acc)
    plan, image_tokens = images.with_image_tokens(plan, model)
    images.add_vision_activations(plan, model, image_tokens, layout.activation_bytes, acc)
    return plan


def _compute_dtype(plan: Plan, accelerator: Accelerator | None, acc: _Accumulator) -> str:
    """The dtype the matmuls run in: fp32, or bf16 unless the GPU has none (then fp16, warned)."""
    if plan.precision is Precision.FP32:
        return "fp32"
    if accelerator is not None and accelerator.kind == "gpu" and not accelerator.bf16:
        acc.warnings.append(
            f"{accelerator.name} has no bf16: the plan runs in fp16 (same bytes); "
            + (
                "pure 16-bit weights and optimizer states in fp16 are numerically risky: prefer "
                "--precision mixed or amp"
                if plan.precision is Precision.BF16
                else "use loss scaling (fp16=True)"
            )
        )
        return "fp16"
    return "bf16"


def _attention_the_model_has(plan: Plan, model: ModelSpec, acc: _Accumulator) -> Plan:
    """The plan with eager attention where transformers offers no other for ``model``."""
    if model.eager_attention_only and plan.attention is not Attention.EAGER:
        acc.warnings.append(
            f"{model.name}: transformers has no {plan.attention.value} attention for this "
            "architecture (its position bias is added to the scores): counted as eager, with "
            "the s^2 scores kept"
        )
        return plan.model_copy(update={"attention": Attention.EAGER})
    if model.position_encoding == "alibi" and plan.attention is Attention.FLASH:
        # FalconFlashAttention2.forward (modeling_falcon.py) raises "`alibi` is not supported
        # when `use_flash_attn` is True": the run would need sdpa, which keeps no s^2 scores either
        acc.warnings.append(
            f"{model.name}: transformers' flash-attention path refuses ALiBi position biases: "
            "counted as sdpa (--attn sdpa), which the run must use"
        )
        return plan.model_copy(update={"attention": Attention.SDPA})
    if model.attn_logit_softcap is not None and plan.attention is Attention.SDPA:
        # transformers has no SDPA path for soft-capped attention scores: Gemma 2's model class
        # says ``_supports_sdpa = False  # sdpa does not support softcapping``
        # (transformers/models/gemma2/modeling_gemma2.py; vaultgemma and t5gemma alike), so a run
        # that asks for none (the Trainer's default) gets eager, and flash-attn 2 (which caps
        # inside the kernel) is the only kernel without the s^2 scores. Traced: gemma-2-2b LoRA
        # bf16 at b1/s2048 was -24% against the SDPA count.
        acc.warnings.append(
            f"{model.name}: transformers has no sdpa attention for soft-capped attention scores: "
            "counted as eager, with the s^2 scores kept (--attn flash keeps none)"
        )
        return plan.model_copy(update={"attention": Attention.EAGER})
    return plan


def _warn_about_settings(
    plan: Plan,
    model: ModelSpec,
    dp: int,
    accelerator: Accelerator | None,
    layout: Layout,
    acc: _Accumulator,
) -> None:
    """Warn where a setting does not do what it says on this model, GPU count or GPU."""
    if model.decoder_layers:
        acc.warnings.append(
            "encoder-decoder: the encoder reads --seq tokens and the decoder is counted at --seq "
            "tokens too (its activations, and for inference its self- and cross-attention KV cache)"
        )
    if plan.seq > model.max_context:
        acc.warnings.append(
            f"--seq {plan.seq} is longer than {model.name}'s context ({model.max_context} tokens)"
        )
    if plan.zero and dp == 1:
        acc.warnings.append(
            f"ZeRO stage {plan.zero} shards over data-parallel GPUs: with 1 GPU it saves nothing"
            + (
                " (offload still moves state to host RAM)"
                if plan.offload is not Offload.NONE
                else ""
            )
        )
    if (
        plan.attention is Attention.FLASH
        and accelerator is not None
        and accelerator.kind == "gpu"
        and not accelerator.bf16
    ):
        acc.warnings.append(
            f"FlashAttention 2 needs an Ampere or newer GPU, not {accelerator.name}: use --attn sdpa "
            "(its memory-efficient kernel also keeps no s^2 scores, so the memory is the same)"
        )
    if plan.attention is Attention.FLASH and layout.activation_bytes == 4:
        acc.warnings.append(
            "flash attention needs fp16/bf16 inputs; with --precision fp32 it falls back to SDPA"
        )


def _warn_about_moe(
    plan: Plan, model: ModelSpec, arch: Architecture, frozen_bytes: int, acc: _Accumulator
) -> None:
    """The MoE warnings: LoRA on the experts, and quantization leaving them 16-bit."""
    _warn_about_moe_adapters(plan, model, acc)
    _warn_about_quantized_moe(plan, arch, frozen_bytes, acc)


def _warn_about_quantized_moe(
    plan: Plan, arch: Architecture, frozen_bytes: int, acc: _Accumulator
) -> None:
    """Say that a quantized MoE keeps its fused routed experts unquantized (see
    :attr:`Architecture.experts_fused` and :mod:`hwdash.core.estimator.quantization`)."""
    if arch.experts <= 1 or not arch.experts_fused:
        return
    trained_method = plan.rl_method if plan.is_rl else plan.method
    on_load = plan.quant in (Quant.NF4, Quant.INT8) or (
        trained_method in QUANTIZED_METHODS and arch.checkpoint_bits is None
    )
    if on_load:
        acc.warnings.append(
            "bitsandbytes quantizes nn.Linear only: this MoE's routed experts (fused 3D weights "
            "in transformers 5) stay in 16 bits and are counted so"
            + (
                ", upcast to fp32 with the rest by prepare_model_for_kbit_training unless "
                "--qlora-frozen-dtype bf16"
                if trained_method in QUANTIZED_METHODS and frozen_bytes == 4
                else ""
            )
        )
    elif arch.checkpoint_bits is not None and (
        trained_method in LORA_STYLE_METHODS or plan.method is Method.INFERENCE
    ):
        acc.warnings.append(
            "transformers 5 keeps this MoE's routed experts as fused 3D weights, which its "
            "GPTQ, AWQ and bitsandbytes layers do not replace: the quantized checkpoint's experts "
            "are counted in 16 bits"
        )


def _warn_about_moe_adapters(plan: Plan, model: ModelSpec, acc: _Accumulator) -> None:
    """Warn how LoRA on MoE experts is counted (transformers 5's fused expert weights)."""
    trained_method = plan.rl_method if plan.is_rl else plan.method
    if model.experts > 1 and trained_method in LORA_STYLE_METHODS and not model.peft_fused_experts:
        # qwen2_moe: PEFT 0.21 has no fused-expert mapping for it (transformers_weight_conversion.py)
        acc.warnings.append(
            "PEFT cannot adapt this model's routed experts (fused 3D weights it has no mapping "
            "for): LoRA reaches the attention and the shared expert, the experts stay frozen"
        )
        return
    if model.experts > 1 and trained_method in LORA_STYLE_METHODS:
        acc.warnings.append(
            "LoRA on MoE experts is counted as transformers 5 runs it: experts stored as fused 3D "
            "weights, which PEFT merges with their adapters layer by layer and keeps for backward "
            "(a 16-bit copy of every adapted expert weight per layer); transformers 4.x adapts "
            "each expert's linears and needs less"
        )
        if plan.lora_dropout > 0:
            acc.warnings.append(
                "PEFT adapts fused MoE expert weights with lora.ParamWrapper, which refuses LoRA "
                "dropout: use --lora-dropout 0 (no masks are counted for the experts)"
            )


def _memory_estimate(
    plan: Plan,
    arch: Architecture,
    acc: _Accumulator,
    dp: int,
    trainable: int,
    compute_dtype: str,
    accelerator: Accelerator | None,
    software: Software | None,
) -> MemoryEstimate:
    """The estimate at the peak phase: its components, the overhead, the parts alive then."""
    software = packaged_software() if software is None else software
    if acc.managed:
        acc.warnings.append(
            f"paged optimizer states ({acc.managed / 2**30:.1f} GiB) live in CUDA managed memory: "
            "counted on the GPU as NVML sees them; torch.cuda statistics leave them out, and the "
            "driver pages them to host RAM (slower) when the GPU runs short"
        )
    phase = _peak_phase(plan, acc)
    tensors = _peak_breakdown(acc, phase, 0)
    # managed memory is the driver's, not the caching allocator's: neither allocated nor pooled
    # (paged optimizer states, in the optimizer component wherever the phase holds them)
    managed = min(math.ceil(acc.managed), tensors.optimizer)
    allocated = tensors.total - managed
    pool_label, pool = _pool(software, pool_kind(plan, dp), allocated)
    side_live = acc.side_stream_live if phase in (PHASE_BACKWARD, PHASE_BACKWARD_END) else 0.0
    side_cached = round(max(0.0, acc.side_stream_pool - side_live))
    context, context_label = software.context_for(accelerator)
    link = software.interconnect_for(accelerator)
    nccl = 0
    groups: tuple[CommGroup, ...] = ()
    if accelerator is None or accelerator.vendor == "nvidia":
        # NCCL is CUDA's: TPUs and Apple GPUs communicate otherwise (not counted)
        nccl, groups = nccl_bytes(plan, dp, link, software.nccl)
    details = _phase_details(acc, phase)
    details.append((pool_label, pool))
    if side_cached:
        details.append(("FSDP1 side streams' cached blocks (reserved, not allocated)", side_cached))
    pool += side_cached
    details.append((context_label, context.bytes))
    if nccl:
        details.append(
            (f"NCCL ({len(groups)} communicator{'s' if len(groups) > 1 else ''} and buffers)", nccl)
        )
    return MemoryEstimate(
        per_gpu=dataclasses.replace(tensors, overhead=pool + context.bytes + nccl),
        gpus=dp,
        host_bytes=math.ceil(acc.host),
        managed_bytes=math.ceil(acc.managed),
        total_params=arch.total_params,
        trainable_params=trainable,
        compute_dtype=compute_dtype,
        peak_phase=phase,
        details=tuple(details),
        warnings=tuple(acc.warnings),
        allocated_bytes=allocated,
        reserved_bytes=allocated + pool,
    )
