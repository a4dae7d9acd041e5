"""GPU memory per device for a plan: weights, gradients, optimizer states, activations, KV cache, overhead.

Pure and cheap (the TUI reruns it on every keystroke): no I/O, no globals that change, only arithmetic
over the model's architecture. Every formula names its source next to it; where a constant is a guess,
the comment says so.

Main sources:

* ZeRO: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
  arXiv:1910.02054, Figure 1 and section 5: model states of ``(2 + 2 + K) * Psi`` bytes with K = 12
  for mixed-precision Adam, sharded over ``Nd`` data-parallel GPUs stage by stage.
* ZeRO-Offload: Ren et al. 2021, arXiv:2101.06840, section 4: fp32 master weights and Adam states
  (and the gradients they are updated from) live in host memory; the GPU keeps the 16-bit parameters.
* Activations: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models", arXiv:2205.05198, section 4.1 (``s*b*h*(34 + 5*a*s/h)`` bytes per layer in 16-bit, and
  ``2*s*b*h`` per layer with full recomputation). We recount the same saved tensors for today's
  Hugging Face decoder layers (RMSNorm with an fp32 upcast, SwiGLU MLP, GQA, no dropout); see
  :func:`layer_activation_bytes`.
* QLoRA: Dettmers et al. 2023, arXiv:2305.14314, section 3 (NF4 and double quantization:
  0.127 bits per parameter of quantization constants).
* LLM.int8(): Dettmers et al. 2022, arXiv:2208.07339 (int8 weights with one scale per output row).
"""

from __future__ import annotations

import math

from hwdash.core.catalog import Accelerator, Framework, ModelSpec
from hwdash.core.estimator.activations import (
    DROPOUT_MASK_BYTES,
    LOSS_FP32_BYTES_PER_LOGIT,
    dora_weight_norm_transient_bytes,
    layer_activation_bytes,
    logits_bytes,
    lora_dropout_mask_elements,
    training_activation_bytes,
)
from hwdash.core.estimator.architecture import (
    ALL_LINEAR,
    MODULE_ALIASES,
    Architecture,
    LinearShape,
    architecture,
    lora_adapter_params,
    resolve_lora_targets,
)
from hwdash.core.estimator.inference import (
    _add_inference,
    inference_activation_bytes,
    kv_cache_bytes,
)
from hwdash.core.estimator.phases import (
    _BACKWARD_END_ONLY,
    _BACKWARD_ONLY,
    _PRODUCED,
    _STEP_ONLY,
    PHASE_BACKWARD,
    PHASE_BACKWARD_END,
    PHASE_INFERENCE,
    PHASE_OPTIMIZER_STEP,
    _Accumulator,
    _peak_phase,
)
from hwdash.core.estimator.rl import _add_rl
from hwdash.core.estimator.states import (
    ADAFACTOR_STATE_FRACTION,
    ADAFACTOR_STEP_BYTES_PER_ELEMENT,
    ADAM_8BIT_STATE_BYTES,
    ADAPTER_LAYOUT,
    GROUPED_4BIT_BYTES_PER_PARAM,
    INT8_BYTES_PER_PARAM,
    INT8_ROW_SCALE_BYTES,
    LAYOUTS,
    NF4_BYTES_PER_PARAM,
    NF4_CONSTANT_BYTES_PER_PARAM,
    QUANTIZED_METHODS,
    ZERO3_MAX_LIVE_PARAMETERS,
    Layout,
    ModelStates,
    _base_weight_bytes,
    checkpoint_weight_bytes,
    model_state_bytes,
    optimizer_state_bytes_per_param,
    optimizer_step_temporary_bytes,
)
from hwdash.core.estimator.training import _effective_layout, _train_one_model
from hwdash.core.plan import (
    LORA_STYLE_METHODS,
    Attention,
    Method,
    Offload,
    Plan,
    Precision,
)
from hwdash.core.results import MemoryBreakdown, MemoryEstimate
from hwdash.core.savers import (
    resolve_savers,
)
from hwdash.core.units import MIB

# --------------------------------------------------------------------------------------------------
# Constants. The guesses are marked as such. The two overhead constants (CUDA context, allocator) are
# not calibrated: the fake-tensor traces behind bench/data/calibration.csv allocate no CUDA context and
# no cached blocks, so the accuracy figures (bench/estimator_errors.py, docs/accuracy.md) compare the
# total without the overhead component. They stay guesses until a real GPU measures
# ``torch.cuda.memory_reserved`` against the estimate.
# --------------------------------------------------------------------------------------------------

#: CUDA context plus cuBLAS/cuDNN workspaces and loaded kernels, per GPU. A guess: PyTorch forum
#: threads and the CUDA "lazy loading" notes put the context at roughly 300-500 MiB depending on GPU,
#: driver and CUDA version (https://pytorch.org/docs/stable/notes/cuda.html#memory-management,
#: https://docs.nvidia.com/cuda/cuda-c-programming-guide/#lazy-loading). We take the high end.
CUDA_CONTEXT_BYTES = 500 * MIB

#: Allocator fragmentation and cached-but-unused blocks, as a fraction of everything else. A guess
#: (PyTorch's caching allocator rounds and caches blocks; ``memory_reserved`` typically exceeds
#: ``memory_allocated`` by a few to ~10 percent in training loops); not calibrated (see above).
ALLOCATOR_FRAGMENTATION = 0.08


# --------------------------------------------------------------------------------------------------
# The estimate.
# --------------------------------------------------------------------------------------------------


def _compute_dtype(plan: Plan, accelerator: Accelerator | None, acc: _Accumulator) -> str:
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


def estimate_memory(
    plan: Plan,
    model: ModelSpec,
    *,
    gpus: int | None = None,
    accelerator: Accelerator | None = None,
    framework: Framework | None = None,
) -> MemoryEstimate:
    """Peak bytes per GPU for ``plan`` on ``gpus`` data-parallel GPUs (default ``plan.gpus``).

    ``accelerator`` decides the compute dtype (fp16 on a GPU without bf16) and the size of a vLLM
    engine's share for RL plans; without it the estimate is hardware-neutral.

    The peak is the larger of two phases (:func:`_peak_phase`), and the breakdown shows the
    components as they are at that phase (``MemoryEstimate.peak_phase``):

    * start of backward: weights + optimizer states + the saved activations and the loss's fp32
      tensors + the gradients that persist across backward (:func:`_gradients_persist`);
    * optimizer step: weights + optimizer states + every gradient + the step's temporaries
      (:func:`optimizer_step_temporary_bytes`), no activations.

    Gradients fill in as backward frees the activations layer by layer, so between the two ends the
    sum of activations and gradients moves from one to the other; the traces show no peak in
    between (``bench/data/calibration.csv``, ``peak_phase``).
    """
    dp = plan.gpus if gpus is None else max(1, gpus)
    arch = architecture(model)
    acc = _Accumulator()
    # ``framework``: the catalog's entry for plan.framework (a user catalog may override it); None
    # reads the packaged frameworks.toml
    savers = resolve_savers(plan, framework)
    compute_dtype = _compute_dtype(plan, accelerator, acc)
    layout = _effective_layout(plan, acc)
    if model.eager_attention_only and plan.attention is not Attention.EAGER:
        acc.warnings.append(
            f"{model.name}: transformers has no {plan.attention.value} attention for this "
            "architecture (its position bias is added to the scores): counted as eager, with "
            "the s^2 scores kept"
        )
        plan = plan.model_copy(update={"attention": Attention.EAGER})
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

    trained_method = plan.rl_method if plan.is_rl else plan.method
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
    trainable = 0
    if plan.method is Method.INFERENCE:
        _add_inference(plan, arch, layout, dp, acc)
    elif plan.is_rl:
        trainable = _add_rl(plan, arch, layout, dp, acc, accelerator, savers)
    else:
        trainable = _train_one_model(
            plan, arch, plan.method, layout, dp, acc, "model", with_logits=True, savers=savers
        )

    if acc.managed:
        acc.warnings.append(
            f"paged optimizer states ({acc.managed / 2**30:.1f} GiB) live in CUDA managed memory: "
            "counted on the GPU as NVML sees them; torch.cuda statistics leave them out, and the "
            "driver pages them to host RAM (slower) when the GPU runs short"
        )
    phase = _peak_phase(plan, acc)
    rest = acc.phase_total(phase)
    overhead = CUDA_CONTEXT_BYTES + ALLOCATOR_FRAGMENTATION * rest
    details = [(label, value) for label, value, phases in acc.details if phase in phases]
    details.append(("CUDA context (guess)", CUDA_CONTEXT_BYTES))
    details.append(("allocator fragmentation (guess)", round(ALLOCATOR_FRAGMENTATION * rest)))
    at_step = phase == PHASE_OPTIMIZER_STEP
    at_end = phase == PHASE_BACKWARD_END
    peak_gradients = acc.persistent_gradients
    if at_step or at_end:
        peak_gradients += acc.produced_gradients
    if at_step:
        peak_gradients += acc.master_gradients
    peak_activations = acc.activations
    if at_step:
        peak_activations = 0.0
    elif at_end:
        peak_activations = acc.last_layer_activations
    breakdown = MemoryBreakdown(
        weights=math.ceil(acc.weights),
        gradients=math.ceil(peak_gradients),
        optimizer=math.ceil(acc.optimizer + (acc.step_temporaries if at_step else 0.0)),
        activations=math.ceil(peak_activations),
        kv_cache=math.ceil(acc.kv_cache),
        overhead=math.ceil(overhead),
    )
    return MemoryEstimate(
        per_gpu=breakdown,
        gpus=dp,
        host_bytes=math.ceil(acc.host),
        managed_bytes=math.ceil(acc.managed),
        total_params=arch.total_params,
        trainable_params=trainable,
        compute_dtype=compute_dtype,
        peak_phase=phase,
        details=tuple(details),
        warnings=tuple(acc.warnings),
    )


#: The public names callers import from ``hwdash.core.estimator`` (the module before it became a
#: package), plus the internal ones :mod:`hwdash.core.parallelism` and
#: :mod:`hwdash.core.quantization` reach into.
__all__ = [
    "ADAFACTOR_STATE_FRACTION",
    "ADAFACTOR_STEP_BYTES_PER_ELEMENT",
    "ADAM_8BIT_STATE_BYTES",
    "ADAPTER_LAYOUT",
    "ALLOCATOR_FRAGMENTATION",
    "ALL_LINEAR",
    "CUDA_CONTEXT_BYTES",
    "DROPOUT_MASK_BYTES",
    "GROUPED_4BIT_BYTES_PER_PARAM",
    "INT8_BYTES_PER_PARAM",
    "INT8_ROW_SCALE_BYTES",
    "LAYOUTS",
    "LOSS_FP32_BYTES_PER_LOGIT",
    "MODULE_ALIASES",
    "NF4_BYTES_PER_PARAM",
    "NF4_CONSTANT_BYTES_PER_PARAM",
    "PHASE_BACKWARD",
    "PHASE_BACKWARD_END",
    "PHASE_INFERENCE",
    "PHASE_OPTIMIZER_STEP",
    "QUANTIZED_METHODS",
    "ZERO3_MAX_LIVE_PARAMETERS",
    "_BACKWARD_END_ONLY",
    "_BACKWARD_ONLY",
    "_PRODUCED",
    "_STEP_ONLY",
    "Architecture",
    "Layout",
    "LinearShape",
    "ModelStates",
    "_Accumulator",
    "_base_weight_bytes",
    "_train_one_model",
    "architecture",
    "checkpoint_weight_bytes",
    "dora_weight_norm_transient_bytes",
    "estimate_memory",
    "inference_activation_bytes",
    "kv_cache_bytes",
    "layer_activation_bytes",
    "logits_bytes",
    "lora_adapter_params",
    "lora_dropout_mask_elements",
    "model_state_bytes",
    "optimizer_state_bytes_per_param",
    "optimizer_step_temporary_bytes",
    "resolve_lora_targets",
    "training_activation_bytes",
]
