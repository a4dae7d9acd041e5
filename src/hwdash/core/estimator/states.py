"""Model states on one GPU: storage layouts, optimizer states, ZeRO sharding, frozen and quantized weights.

What one trained or frozen model keeps for its whole life, as the ZeRO paper names it: weights,
gradients and optimizer states (with the fp32 master copy), and the temporaries of the optimizer
step; sharded stage by stage under DeepSpeed ZeRO, offloaded to the host under ZeRO-Offload, and
quantized where the method or the checkpoint says so.

Sources:

* ZeRO: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
  arXiv:1910.02054, Figure 1 and section 5: model states of ``(2 + 2 + K) * Psi`` bytes with K = 12
  for mixed-precision Adam, sharded over ``Nd`` data-parallel GPUs stage by stage.
* ZeRO-Offload: Ren et al. 2021, arXiv:2101.06840, section 4 (used by the training assembly).
* DeepSpeed's config docs, https://www.deepspeed.ai/docs/config-json/ (ZeRO-3 live parameters).
* AdamW: Loshchilov & Hutter 2019, arXiv:1711.05101; 8-bit Adam: Dettmers et al. 2021,
  arXiv:2110.02861; Adafactor: Shazeer & Stern 2018, arXiv:1804.04235; PyTorch's
  ``torch/optim/adamw.py`` and transformers' ``optimization.py`` for the step's temporaries.
* PEFT's adapter dtype (``autocast_adapter_dtype``, PEFT 0.12+) and ``prepare_model_for_kbit_training``.
* QLoRA: Dettmers et al. 2023, arXiv:2305.14314, section 3 (NF4 and double quantization:
  0.127 bits per parameter of quantization constants).
* LLM.int8(): Dettmers et al. 2022, arXiv:2208.07339 (int8 weights with one scale per output row).
* GPTQ: Frantar et al. 2023, arXiv:2210.17323, section 4; AWQ: Lin et al. 2024, arXiv:2306.00978.
"""

from __future__ import annotations

from dataclasses import dataclass

from hwdash.core.estimator.architecture import Architecture
from hwdash.core.plan import Method, Optimizer, OptimizerImpl, Precision

# --------------------------------------------------------------------------------------------------
# Storage layouts.
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """Bytes per parameter of each model-state part, and of activations, for a storage layout."""

    weight_bytes: int
    gradient_bytes: int
    master_bytes: int
    """fp32 master copy kept by the optimizer (0 when the weights themselves are fp32)."""
    state_bytes: int
    """Bytes of one optimizer state value (e.g. Adam's momentum)."""
    activation_bytes: int
    """Bytes per activation element (2 under autocast or bf16, 4 in plain fp32)."""


#: The layouts of :class:`Precision`, exactly as its docstrings state.
LAYOUTS: dict[Precision, Layout] = {
    Precision.FP32: Layout(
        weight_bytes=4, gradient_bytes=4, master_bytes=0, state_bytes=4, activation_bytes=4
    ),
    Precision.AMP: Layout(
        weight_bytes=4, gradient_bytes=4, master_bytes=0, state_bytes=4, activation_bytes=2
    ),
    Precision.BF16: Layout(
        weight_bytes=2, gradient_bytes=2, master_bytes=0, state_bytes=2, activation_bytes=2
    ),
    Precision.MIXED: Layout(
        weight_bytes=2, gradient_bytes=2, master_bytes=4, state_bytes=4, activation_bytes=2
    ),
}

#: LoRA adapters are created in fp32 by PEFT even on a 16-bit base (``autocast_adapter_dtype=True``,
#: the default since PEFT 0.12): 4 bytes weight and gradient, fp32 Adam states, no master copy.
ADAPTER_LAYOUT = LAYOUTS[Precision.FP32]


# --------------------------------------------------------------------------------------------------
# Optimizer states and the optimizer step.
# --------------------------------------------------------------------------------------------------


#: bitsandbytes 8-bit Adam keeps both states in 8 bits (1 byte each per parameter); its block-wise
#: quantization constants (one fp32 per 2048 values) are small enough to ignore. Dettmers et al. 2021,
#: "8-bit Optimizers via Block-wise Quantization", arXiv:2110.02861.
ADAM_8BIT_STATE_BYTES = 2

#: bitsandbytes' 32-bit Adam (``PagedAdamW32bit``, the Trainer's ``paged_adamw_32bit``) keeps both
#: states in fp32 whatever the parameters' dtype: ``Optimizer2State.init_state`` allocates them as
#: ``torch.float32`` when ``optim_bits`` is 32 (bitsandbytes/optim/optimizer.py).
ADAM_32BIT_STATE_BYTES = 8

#: Adafactor (Shazeer & Stern 2018, arXiv:1804.04235) keeps a factored second moment: a row and a
#: column vector per matrix ((rows + cols) values instead of rows * cols) and no first moment in the
#: default Hugging Face configuration (beta1=None). For matrices 1000+ wide that is under 0.2% of a
#: full state; vectors (norms, biases) keep full states. We approximate the whole thing as 1% of one
#: full state per parameter: a deliberate, documented overestimate, small either way.
ADAFACTOR_STATE_FRACTION = 0.01


def optimizer_state_bytes_per_param(optimizer: Optimizer, layout: Layout) -> float:
    """Optimizer state bytes per trainable parameter, excluding the master copy.

    * adamw: two states (momentum, variance) in the layout's state dtype (Loshchilov & Hutter 2019).
    * adamw-8bit: both states in 8 bits (bitsandbytes; arXiv:2110.02861).
    * adamw-32bit-paged: both states in fp32 (bitsandbytes' ``PagedAdamW32bit``).
    * sgd: none. We model plain SGD as Hugging Face's ``optim="sgd"`` creates it (torch's default
      ``momentum=0``, which keeps no state); SGD with momentum would add one state.
    * adafactor: a factored second moment, see :data:`ADAFACTOR_STATE_FRACTION`.
    """
    if optimizer is Optimizer.ADAMW:
        return 2 * layout.state_bytes
    if optimizer in (Optimizer.ADAMW_8BIT, Optimizer.ADAMW_8BIT_PAGED):
        return ADAM_8BIT_STATE_BYTES
    if optimizer is Optimizer.ADAMW_32BIT_PAGED:
        return ADAM_32BIT_STATE_BYTES
    if optimizer is Optimizer.SGD:
        return 0
    return ADAFACTOR_STATE_FRACTION * layout.state_bytes


#: Bytes per element of the largest parameter that Hugging Face's ``Adafactor.step`` holds at once:
#: it upcasts the gradient and the parameter to fp32 and builds the update from them, one parameter
#: at a time (``transformers/optimization.py``). Fitted, and exact, on the three ``adafactor-single``
#: rows of ``bench/data/calibration.csv`` (qwen2.5-0.5b, llama-3.2-1b, qwen2.5-7b, full bf16): the
#: optimizer phase holds 16.0 bytes per element of the embedding matrix above weights + gradients.
ADAFACTOR_STEP_BYTES_PER_ELEMENT = 16


def _largest_trained_tensor(arch: Architecture, method: Method, trainable: int) -> int:
    """Elements of the largest trained tensor: the embedding, LM head or largest block matrix for
    full training; for LoRA-style methods the largest adapter matrix (r x in for lora_A, out x r
    for lora_B), bounded here by one layer's adapters."""
    if method is Method.FULL:
        return max(
            arch.embedding_params,
            arch.lm_head_params,
            max(linear.in_features * linear.out_features for linear in arch.linears),
        )
    return trainable // max(1, arch.layers)


def optimizer_step_temporary_bytes(
    arch: Architecture,
    method: Method,
    trainable: int,
    layout: Layout,
    optimizer: Optimizer,
    zero: int,
    data_parallel: int,
    implementation: OptimizerImpl = OptimizerImpl.FOREACH,
) -> float:
    """Temporaries the optimizer step allocates on top of the states (freed when it returns).

    * adamw, ``foreach`` (``torch.optim.AdamW()``'s default on CUDA, the Trainer's
      ``adamw_torch``): ``_foreach_sqrt`` of the second moments builds one state-sized tensor for
      every parameter at once (``torch/optim/adamw.py``, ``_multi_tensor_adam``). Traced: the
      optimizer phase holds exactly weights + gradients + 1.5 x states on every ``adamw-foreach``
      row of ``bench/data/calibration.csv``.
    * adamw, ``fused`` (the Trainer's default ``adamw_torch_fused`` on torch >= 2.8, see
      ``default_optim`` in transformers' ``training_args.py``): none; traced on the
      ``adamw-fused`` rows (weights + gradients + states).
    * adamw, ``for-loop``: sqrt(v) of one parameter at a time, the largest.
    * adamw-8bit and adamw-32bit-paged (bitsandbytes, one kernel per parameter) and plain SGD
      (in-place adds): none.
    * adafactor: :data:`ADAFACTOR_STEP_BYTES_PER_ELEMENT` times the largest trained tensor.

    Sharded like the states under ZeRO (each rank steps its own partition).
    """
    shard = max(1, data_parallel) if zero >= 1 else 1
    largest_tensor = _largest_trained_tensor(arch, method, trainable)
    if optimizer is Optimizer.ADAMW:
        if implementation is OptimizerImpl.FOREACH:
            return trainable * layout.state_bytes / shard
        if implementation is OptimizerImpl.FOR_LOOP:
            return largest_tensor * layout.state_bytes / shard
        return 0.0
    if optimizer is Optimizer.ADAFACTOR:
        return ADAFACTOR_STEP_BYTES_PER_ELEMENT * largest_tensor / shard
    return 0.0


# --------------------------------------------------------------------------------------------------
# Model states under ZeRO.
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelStates:
    """Model-state bytes on one GPU (ZeRO paper's "model states")."""

    weights: float
    gradients: float
    optimizer: float
    """Optimizer states plus the master copy."""

    @property
    def total(self) -> float:
        """All three together."""
        return self.weights + self.gradients + self.optimizer


def model_state_bytes(
    params: int,
    trainable: int,
    layout: Layout,
    optimizer: Optimizer,
    zero: int,
    data_parallel: int,
) -> ModelStates:
    """Weights, gradients and optimizer states per GPU under ZeRO stage ``zero`` over ``data_parallel``.

    ZeRO paper, Figure 1: with Psi parameters and K bytes of optimizer state per parameter,
    stage 0 keeps ``(2 + 2 + K) Psi`` on every GPU; stage 1 (P_os) shards the K part over Nd;
    stage 2 (P_os+g) also the gradients; stage 3 (P_os+g+p) also the parameters. K here is the
    master copy plus the optimizer states of :func:`optimizer_state_bytes_per_param` (12 for
    mixed-precision Adam). ``params`` includes frozen parameters (weights only); ``trainable`` are
    the ones with gradients and optimizer states.
    """
    k_bytes = layout.master_bytes + optimizer_state_bytes_per_param(optimizer, layout)
    weights = float(params * layout.weight_bytes)
    gradients = float(trainable * layout.gradient_bytes)
    states = trainable * k_bytes
    dp = max(1, data_parallel)
    if zero >= 1:
        states /= dp
    if zero >= 2:
        gradients /= dp
    if zero >= 3:
        weights /= dp
    return ModelStates(weights=weights, gradients=gradients, optimizer=states)


# --------------------------------------------------------------------------------------------------
# Quantized and checkpoint weights.
# --------------------------------------------------------------------------------------------------


#: NF4 storage: 4 bits per weight (QLoRA paper, section 3).
NF4_BYTES_PER_PARAM = 0.5
#: Double-quantized NF4 constants: 8-bit absmax per 64 weights plus one fp32 constant per 256 blocks,
#: 8/64 + 32/(64*256) = 0.127 bits per parameter (QLoRA paper, section 3 "Double Quantization").
NF4_CONSTANT_BYTES_PER_PARAM = 0.127 / 8
#: LLM.int8(): one byte per weight; the per-row fp32 scale is counted per matrix (arXiv:2208.07339).
INT8_BYTES_PER_PARAM = 1
INT8_ROW_SCALE_BYTES = 4
#: GPTQ/AWQ 4-bit checkpoints: 4-bit weights plus, per group of 128 weights, an fp16 scale and a
#: 4-bit zero point (AutoGPTQ's and AutoAWQ's default group size is 128; Frantar et al. 2023,
#: arXiv:2210.17323, section 4; Lin et al. 2024, arXiv:2306.00978).
GROUPED_4BIT_BYTES_PER_PARAM = 0.5 + (2 + 0.5) / 128


QUANTIZED_METHODS = (Method.QLORA, Method.LORA_8BIT)


def checkpoint_weight_bytes(arch: Architecture, weight_bytes: int) -> float:
    """Weights as loaded for inference: 16-bit (or the layout's) unless the checkpoint is
    quantized, when its block linears take 4 bits plus group scales (GPTQ/AWQ/NF4 alike, within
    a few percent) or 8 bits plus a per-row scale (LLM.int8()); the rest stays 16-bit."""
    if arch.checkpoint_bits is None:
        return float(arch.total_params * weight_bytes)
    if arch.checkpoint_bits == 4:
        quantized = arch.quantizable_params * GROUPED_4BIT_BYTES_PER_PARAM
    else:
        rows = arch.linear_rows
        quantized = arch.quantizable_params * INT8_BYTES_PER_PARAM + rows * INT8_ROW_SCALE_BYTES
    return quantized + 2.0 * arch.unquantized_params


def _base_weight_bytes(
    arch: Architecture, method: Method, layout: Layout, frozen_bytes: int = 4
) -> tuple[float, float]:
    """Bytes of the frozen base for a LoRA-style method, and the bytes per parameter ZeRO-3 gathers.

    * lora/dora: the layout's weight dtype (bf16 for ``bf16``/``mixed``; fp32 for ``fp32``/``amp``,
      since ``amp`` means the model is loaded in fp32 and autocast does the matmuls).
    * qlora: NF4 plus double-quantized constants for every linear layer inside the blocks; the rest
      (embeddings, LM head, norms) is upcast to fp32 by PEFT's ``prepare_model_for_kbit_training``,
      which casts every non-quantized 16-bit parameter to fp32; ``frozen_bytes`` 2 keeps them
      16-bit as torchtune, torchao and Unsloth do (``Plan.qlora_frozen_dtype``).
    * lora-8bit: LLM.int8() weights with a per-row fp32 scale; the rest upcast to fp32 as above.
    """
    if method in (Method.LORA, Method.DORA) and arch.checkpoint_bits is not None:
        # LoRA on a quantized checkpoint trains over its quantized weights: QLoRA or 8-bit LoRA.
        method = Method.QLORA if arch.checkpoint_bits == 4 else Method.LORA_8BIT
    if method is Method.QLORA:
        quantized = arch.quantizable_params * (NF4_BYTES_PER_PARAM + NF4_CONSTANT_BYTES_PER_PARAM)
        total = quantized + frozen_bytes * arch.unquantized_params
        return total, total / arch.total_params
    if method is Method.LORA_8BIT:
        rows = arch.linear_rows
        quantized = arch.quantizable_params * INT8_BYTES_PER_PARAM + rows * INT8_ROW_SCALE_BYTES
        total = quantized + frozen_bytes * arch.unquantized_params
        return total, total / arch.total_params
    return float(arch.total_params * layout.weight_bytes), float(layout.weight_bytes)
