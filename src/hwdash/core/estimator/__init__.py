"""GPU memory per device for a plan: weights, gradients, optimizer states, activations, KV cache, overhead.

Pure and cheap (the TUI reruns it on every keystroke): no I/O, no globals that change, only arithmetic
over the model's architecture. Every formula names its source next to it; where a constant is a guess,
the comment says so. The package is split by concern, each module listing the sources it uses:

* :mod:`~hwdash.core.estimator.architecture`: the model's linear layers, embeddings and norms
  (:func:`architecture`), and which of them LoRA adapts;
* :mod:`~hwdash.core.estimator.states`: storage layouts, optimizer states and the step's
  temporaries, ZeRO sharding, frozen and quantized weights (ZeRO, arXiv:1910.02054; QLoRA,
  arXiv:2305.14314; LLM.int8(), arXiv:2208.07339);
* :mod:`~hwdash.core.estimator.activations`: what a training step keeps for backward, per layer
  and in all, the adapters' tensors, the logits and the loss (Korthikanti et al. 2022,
  arXiv:2205.05198, recounted for today's Hugging Face layers);
* :mod:`~hwdash.core.estimator.inference`: prefill activations and the KV cache;
* :mod:`~hwdash.core.estimator.training`: one trained model, step by step (ZeRO-Offload,
  arXiv:2101.06840; the memory savers of :mod:`hwdash.core.estimator.savers`);
* :mod:`~hwdash.core.estimator.rl`: RL plans (policy, value model, reference, reward, vLLM);
* :mod:`~hwdash.core.estimator.phases`: the phases whose peaks are compared;
* :mod:`~hwdash.core.estimator.estimate`: :func:`estimate_memory` and the overhead: allocated,
  reserved and the whole GPU;
* :mod:`~hwdash.core.estimator.software`: the CUDA context and kernels by compute capability and
  NCCL's buffer and channel tables (``catalog/software.toml``);
* :mod:`~hwdash.core.estimator.collectives`: NCCL communicators per process group (their own
  memory and buffers).

Sharding beyond ZeRO (PyTorch FSDP, Megatron TP/PP) lives in :mod:`hwdash.core.estimator.parallelism`,
quantized inference in :mod:`hwdash.core.estimator.quantization`, other block layouts in
:mod:`hwdash.core.estimator.block_activations`. Every name the module had before it became a package is
importable from here.

May import: the core's foundation (the plan model, the entry schemas, units, module names, data
files); never the models' readers, the catalog loader, planning or plans, which import it.
"""

from __future__ import annotations

from hwdash.core.estimator.activations import (
    _INPUT_SAVED_ONLY_FOR_WEIGHT_GRAD,
    _SHARED_INPUT_GROUPS,
    DROPOUT_MASK_BYTES,
    LOSS_FP32_BYTES_PER_LOGIT,
    _adapter_extras,
    _input_copies_kept,
    _merged_expert_gradient_bytes,
    _merged_expert_weight_bytes,
    _rms_norm_bytes,
    _score_bytes_per_element,
    dora_weight_norm_transient_bytes,
    layer_activation_bytes,
    logits_bytes,
    lora_dropout_mask_elements,
    training_activation_bytes,
)
from hwdash.core.estimator.architecture import (
    ALL_LINEAR,
    Architecture,
    LinearShape,
    architecture,
    lora_adapter_params,
    resolve_lora_targets,
    resolve_top_level,
    top_level_adapter_params,
    top_level_params,
)
from hwdash.core.estimator.estimate import (
    _compute_dtype,
    estimate_memory,
)
from hwdash.core.estimator.inference import (
    decompressed_kv_bytes_per_token,
    inference_activation_bytes,
    kv_cache_bytes,
    latent_kv_bytes_per_token,
)
from hwdash.core.estimator.phases import (
    _BACKWARD_END_ONLY,
    _BACKWARD_ONLY,
    _EVERY_PHASE,
    _PRODUCED,
    _STEP_ONLY,
    PHASE_BACKWARD,
    PHASE_BACKWARD_END,
    PHASE_INFERENCE,
    PHASE_OPTIMIZER_STEP,
    _Accumulator,
    _gradients_persist,
    _peak_phase,
)
from hwdash.core.estimator.rl import (
    _frozen_copy,
    _generation_engine,
    _rl_counts_reward_model,
)
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
    Layout,
    ModelStates,
    _base_weight_bytes,
    _largest_trained_tensor,
    checkpoint_weight_bytes,
    model_state_bytes,
    optimizer_state_bytes_per_param,
    optimizer_step_temporary_bytes,
)
from hwdash.core.estimator.training import (
    _effective_layout,
    _sharded_elsewhere,
    _train_one_model,
)

#: Every name the module had before it became a package: the public API, and the internal names
#: that :mod:`hwdash.core.estimator.parallelism`, :mod:`hwdash.core.estimator.quantization` and tests reach into.
__all__ = [
    "ADAFACTOR_STATE_FRACTION",
    "ADAFACTOR_STEP_BYTES_PER_ELEMENT",
    "ADAM_8BIT_STATE_BYTES",
    "ADAPTER_LAYOUT",
    "ALL_LINEAR",
    "DROPOUT_MASK_BYTES",
    "GROUPED_4BIT_BYTES_PER_PARAM",
    "INT8_BYTES_PER_PARAM",
    "INT8_ROW_SCALE_BYTES",
    "LAYOUTS",
    "LOSS_FP32_BYTES_PER_LOGIT",
    "NF4_BYTES_PER_PARAM",
    "NF4_CONSTANT_BYTES_PER_PARAM",
    "PHASE_BACKWARD",
    "PHASE_BACKWARD_END",
    "PHASE_INFERENCE",
    "PHASE_OPTIMIZER_STEP",
    "QUANTIZED_METHODS",
    "_BACKWARD_END_ONLY",
    "_BACKWARD_ONLY",
    "_EVERY_PHASE",
    "_INPUT_SAVED_ONLY_FOR_WEIGHT_GRAD",
    "_PRODUCED",
    "_SHARED_INPUT_GROUPS",
    "_STEP_ONLY",
    "Architecture",
    "Layout",
    "LinearShape",
    "ModelStates",
    "_Accumulator",
    "_adapter_extras",
    "_base_weight_bytes",
    "_compute_dtype",
    "_effective_layout",
    "_frozen_copy",
    "_generation_engine",
    "_gradients_persist",
    "_input_copies_kept",
    "_largest_trained_tensor",
    "_merged_expert_gradient_bytes",
    "_merged_expert_weight_bytes",
    "_peak_phase",
    "_rl_counts_reward_model",
    "_rms_norm_bytes",
    "_score_bytes_per_element",
    "_sharded_elsewhere",
    "_train_one_model",
    "architecture",
    "checkpoint_weight_bytes",
    "decompressed_kv_bytes_per_token",
    "dora_weight_norm_transient_bytes",
    "estimate_memory",
    "inference_activation_bytes",
    "kv_cache_bytes",
    "latent_kv_bytes_per_token",
    "layer_activation_bytes",
    "logits_bytes",
    "lora_adapter_params",
    "lora_dropout_mask_elements",
    "model_state_bytes",
    "optimizer_state_bytes_per_param",
    "optimizer_step_temporary_bytes",
    "resolve_lora_targets",
    "resolve_top_level",
    "top_level_adapter_params",
    "top_level_params",
    "training_activation_bytes",
]
