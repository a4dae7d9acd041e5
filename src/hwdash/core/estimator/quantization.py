"""Weights of a quantized inference plan (``--quant``): bytes held and the dequantisation workspace.

Only the linear layers inside the transformer blocks are quantized. transformers replaces every
``nn.Linear`` of the model with a bitsandbytes or GPTQ/AWQ layer except the modules it keeps in full
precision: the output embedding (LM head) is kept out by ``get_keys_to_not_convert``
(``transformers/quantizers/base.py``, and ``modules_to_not_convert`` in the GPTQ and AWQ
quantizers), and embeddings and norms are not ``nn.Linear`` at all, so they stay in the load dtype
(16-bit). That is the split :attr:`Architecture.quantizable_params` / ``unquantized_params`` already
makes for QLoRA and quantized checkpoints.

A MoE's routed experts are not ``nn.Linear`` in transformers 5.24: each block keeps them as fused
3-D parameters of one ``...Experts`` module (``MixtralExperts.gate_up_proj`` / ``down_proj`` in
``modeling_mixtral.py``; likewise Qwen2/3-MoE, DeepSeek-V2/V3 and Llama 4), and
``replace_with_bnb_linear`` (``integrations/bitsandbytes.py``) swaps only ``nn.Linear`` and
``Conv1D`` modules, with no expert-specific path in the bitsandbytes quantizers
(``quantizers/quantizer_bnb_4bit.py`` / ``_8bit.py``). Applied to Mixtral-8x7B's config on the meta
device it makes ``Linear4bit`` of the attention's 1.34B parameters and leaves the 45.1B expert
parameters in ``MixtralExperts``. So the experts load, and stay, in the load dtype; they are
``unquantized_params`` (:attr:`Architecture.experts_fused`), and PEFT's
``prepare_model_for_kbit_training`` upcasts them to fp32 with the rest (below). A GPTQ or AWQ
checkpoint stores each expert's matrices apart (``experts.0.w1.qweight``): the AWQ and GPTQ
quantizers also swap ``nn.Linear`` only, and the model's weight converters
(``conversion_mapping.py``, ``.experts.*.w1.weight`` -> ``.experts.gate_up_proj``) match
``.weight`` names only, so the fused experts are missing keys, made in the load dtype.

Bytes per quantized weight:

* ``nf4``: 4 bits plus double-quantized constants, 0.127 bits per parameter (QLoRA, Dettmers et al.
  2023, arXiv:2305.14314, section 3 "Double Quantization"): the estimator's NF4 constants.
* ``int8``: LLM.int8() (Dettmers et al. 2022, arXiv:2208.07339, section 3.1, vector-wise
  quantization): one byte per weight and one fp32 absmax per output row (bitsandbytes' ``SCB``), the
  same count as an 8-bit checkpoint (:func:`hwdash.core.estimator.checkpoint_weight_bytes`).
* ``awq-4``: 4-bit weights, and per group of 128 input weights an fp16 scale and a 4-bit zero
  (Lin et al. 2024, arXiv:2306.00978; AutoAWQ's ``q_group_size=128``): the estimator's 4-bit
  checkpoint count.
* ``gptq-4``: as AWQ plus GPTQ's ``g_idx``, one int32 group index per input feature of every matrix
  (AutoGPTQ's ``QuantLinear`` registers it whether or not ``desc_act`` reorders the groups;
  Frantar et al. 2023, arXiv:2210.17323, section 4).

Quantize-on-load (the ``model load`` phase, :data:`~hwdash.core.estimator.phases.PHASE_MODEL_LOAD`),
read in transformers 5.24 and bitsandbytes (main, 0.50.2.dev0):

* ``core_model_loading.py`` (``convert_and_load_state_dict_in_model``) loads the checkpoint one
  tensor at a time: each is read from the safetensors file (mmap) and moved straight to its
  device in the load dtype (``_materialize_copy``: ``tensor[...]`` then ``.to(device, dtype)``;
  with a cast, ATen's ``native/cuda/Copy.cu`` converts on the CPU side of a CPU-to-GPU copy, so
  the GPU gets only the result). A weight
  bitsandbytes quantizes keeps the load dtype (``needs_quantization`` skips the cast), and with
  on-the-fly quantization the loader runs without its thread pool ("to avoid worker threads
  loading full-precision tensors to GPU faster than the main thread can quantize them"), so one
  16-bit weight is on the GPU at a time, in the device map's device (the GPU:
  ``quantizer_bnb_4bit.py``'s ``update_device_map`` defaults to the current CUDA device).
* 4-bit: ``Bnb4bitQuantize.convert`` (``integrations/bitsandbytes.py``) wraps that GPU tensor in
  ``bnb.nn.Params4bit`` and calls ``.to(value.device)``, whose ``_quantize``
  (``bitsandbytes/nn/modules.py``) runs ``quantize_4bit`` on the GPU: the 16-bit source, the packed
  output and an fp32 absmax per block of 64 are alive together, and with double quantization
  (``compress_statistics``) ``quantize_4bit`` (``bitsandbytes/functional.py``) makes a second
  fp32 copy, ``_absmax - offset``, while ``quantize_blockwise`` 8-bit-quantizes it. So the load
  holds, beyond the packed weights it keeps, the 16-bit source plus two fp32 absmax vectors.
* 8-bit: ``Bnb8bitQuantize.convert`` copies the GPU tensor to the CPU (``value.to("cpu")``) while
  keeping the GPU one (``value`` and the input dict still hold it), and ``Int8Params._quantize``
  copies the CPU one back as fp16 (``.to(device=device, dtype=torch.float16)``) before
  ``int8_vectorwise_quant`` (``bitsandbytes/backends/cuda/ops.py``: the int8 rows and fp32 row
  scales it returns are what the layer keeps; no outlier columns at threshold 0). So two 16-bit
  copies of the weight are alive beyond the int8 weight.
* A pre-quantized checkpoint (``Bnb4bitDeserialize``, GPTQ, AWQ) is not quantized on load.
* PEFT's ``prepare_model_for_kbit_training`` (``peft/utils/other.py``, PEFT 0.21) then casts every
  16-bit parameter that is not ``Params4bit`` to fp32, one at a time (``param.data =
  param.data.to(torch.float32)``): the unquantized parts (embeddings, LM head, norms, fused MoE
  experts) move from 2 to 4 bytes, and while the largest one (the embedding, the LM head or one
  block's fused ``gate_up_proj``) is cast its 16-bit original is alive too.
"""

from __future__ import annotations

import dataclasses
import math

from hwdash.core.estimator.architecture import Architecture
from hwdash.core.estimator.phases import _BACKWARD_ONLY, PHASE_MODEL_LOAD, _Accumulator
from hwdash.core.estimator.states import (
    NF4_BYTES_PER_PARAM,
    NF4_CONSTANT_BYTES_PER_PARAM,
    checkpoint_weight_bytes,
)
from hwdash.core.plan import Plan, Quant

#: Bytes of GPTQ's ``g_idx`` entry per input feature of a quantized matrix (int32; AutoGPTQ's
#: ``qlinear`` modules, ``register_buffer("g_idx", ..., dtype=torch.int32)``).
GPTQ_GROUP_INDEX_BYTES = 4

#: The bit width each ``--quant`` mode stores its block linears at.
QUANT_BITS = {Quant.NF4: 4, Quant.INT8: 8, Quant.GPTQ_4: 4, Quant.AWQ_4: 4}
#: The ``--quant`` modes transformers quantizes while loading (bitsandbytes); GPTQ and AWQ load a
#: checkpoint quantized beforehand.
QUANTIZED_ON_LOAD = (Quant.NF4, Quant.INT8)

#: Bytes per element of a checkpoint's weights as ``from_pretrained`` loads them (bf16 or fp16: the
#: checkpoint's own dtype under transformers 5's default ``dtype="auto"``, or ``torch_dtype``).
LOAD_DTYPE_BYTES = 2
#: Weights per fp32 absmax of bitsandbytes' 4-bit quantization: ``Params4bit``'s default
#: ``blocksize`` (64; ``bitsandbytes/nn/modules.py``), which transformers' ``Linear4bit`` keeps.
BNB_4BIT_BLOCKSIZE = 64
#: An absmax (fp32) of ``quantize_4bit`` (``bitsandbytes/backends/cuda/ops.py``).
ABSMAX_BYTES = 4
#: ``Int8Params._quantize`` copies the weight to the GPU as fp16 before quantizing it.
INT8_SOURCE_BYTES = 2


def quantize_on_load_bytes(arch: Architecture, bits: int) -> int:
    """The transient of quantizing the largest block linear while ``from_pretrained`` loads it,
    beyond the quantized weight it keeps (see the module notes).

    * 4 bits: the 16-bit source on the GPU plus two fp32 absmax vectors, one per block of 64
      (``quantize_4bit``'s, and its ``_absmax - offset`` copy under double quantization);
    * 8 bits: the 16-bit source still on the GPU plus its fp16 copy ``Int8Params`` quantizes.
    """
    largest = arch.largest_quantized_linear
    weights = largest.in_features * largest.out_features
    if bits == 4:
        blocks = math.ceil(weights / BNB_4BIT_BLOCKSIZE)
        return LOAD_DTYPE_BYTES * weights + 2 * ABSMAX_BYTES * blocks
    return (LOAD_DTYPE_BYTES + INT8_SOURCE_BYTES) * weights


def kbit_upcast_bytes(arch: Architecture, frozen_bytes: int) -> int:
    """What PEFT's ``prepare_model_for_kbit_training`` adds above the loaded model while it casts
    the unquantized parameters to ``frozen_bytes`` (4: fp32): ``frozen_bytes - 2`` more bytes per
    unquantized parameter, plus the 16-bit original of the largest one (the embedding, the LM
    head or a fused expert tensor) alive while it is cast. 0 when they stay 16-bit
    (``--qlora-frozen-dtype bf16``)."""
    if frozen_bytes <= LOAD_DTYPE_BYTES:
        return 0
    largest = max(arch.embedding_params, arch.lm_head_params, arch.largest_fused_expert_params)
    return (frozen_bytes - LOAD_DTYPE_BYTES) * arch.unquantized_params + LOAD_DTYPE_BYTES * largest


def add_quantized_base_load(
    acc: _Accumulator, arch: Architecture, bits: int, linears: float, frozen_bytes: int, label: str
) -> None:
    """Record the model load of a base whose block linears are quantized to ``bits`` (``linears``:
    their bytes, constants included): the quantized model with its unquantized parts in the load
    dtype, and the larger transient of quantizing the largest linear (unless the checkpoint came
    quantized) and PEFT's fp32 upcast (``frozen_bytes`` 4)."""
    loaded = linears + LOAD_DTYPE_BYTES * arch.unquantized_params
    acc.add_phase_bytes(
        PHASE_MODEL_LOAD, "weights", loaded, f"{label} quantized base as loaded (16-bit rest)"
    )
    if arch.checkpoint_bits is None:
        acc.add_phase_transient(
            PHASE_MODEL_LOAD,
            "weights",
            quantize_on_load_bytes(arch, bits),
            f"{label} largest linear being quantized on load ({bits}-bit: 16-bit source and "
            "quantization scratch)",
        )
    upcast = kbit_upcast_bytes(arch, frozen_bytes)
    if upcast:
        acc.add_phase_transient(
            PHASE_MODEL_LOAD,
            "weights",
            upcast,
            f"{label} fp32 upcast of the unquantized parts (PEFT's "
            "prepare_model_for_kbit_training)",
        )


def quantized_linear_bytes(arch: Architecture, quant: Quant) -> float:
    """Bytes of the block linears (weights and biases) quantized as ``quant``, constants included.

    The int8 and the AWQ/GPTQ counts go through :func:`checkpoint_weight_bytes`, the code path that
    sizes a checkpoint whose ``config.json`` says it is quantized, so a ``--quant`` plan and a
    quantized checkpoint of the same model agree.
    """
    if quant is Quant.NONE:
        raise ValueError("quantized_linear_bytes needs a quantization mode")
    if quant is Quant.NF4:
        return arch.quantizable_params * (NF4_BYTES_PER_PARAM + NF4_CONSTANT_BYTES_PER_PARAM)
    as_checkpoint = dataclasses.replace(arch, checkpoint_bits=QUANT_BITS[quant])
    linears = checkpoint_weight_bytes(as_checkpoint, 2) - 2.0 * arch.unquantized_params
    if quant is Quant.GPTQ_4:
        linears += arch.linear_inputs * GPTQ_GROUP_INDEX_BYTES
    return linears


def quantized_weight_bytes(arch: Architecture, quant: Quant, unquantized_bytes: int) -> float:
    """Every weight of an inference plan under ``quant``: the quantized block linears plus the rest
    (embeddings, LM head, norms, routers) at ``unquantized_bytes`` per parameter (the load dtype)."""
    return quantized_linear_bytes(arch, quant) + unquantized_bytes * arch.unquantized_params


def dequantization_workspace_bytes(
    arch: Architecture, quant: Quant, tokens: int, element_bytes: int
) -> int:
    """The transient a quantized matmul allocates during the prefill, for the largest block linear.

    * nf4: bitsandbytes' ``MatMul4Bit.forward`` (``bitsandbytes/autograd/_functions.py``) calls
      ``dequantize_4bit`` on the whole weight and runs an ordinary ``linear`` on it, so one layer's
      weight exists in 16 bits at a time. (A single token per sequence takes the fused
      ``gemv_4bit`` kernel instead, without it; the prefill does not.)
    * int8: ``MatMul8bitLt`` quantizes the input rows to int8 (one byte per input element) and
      ``int8_linear_matmul`` returns an int32 result (4 bytes per output element) that
      ``int8_mm_dequant`` turns into the 16-bit output (``bitsandbytes/backends/cuda/ops.py``).
      The outlier columns above ``llm_int8_threshold`` (6.0) go through a 16-bit matmul on a
      handful of columns (arXiv:2208.07339, section 3.2): too few to count.
    * awq-4: AutoAWQ's ``WQLinear_GEMM`` (``awq/modules/linear/gemm.py``) dequantizes the whole
      weight to fp16 and calls ``torch.matmul`` once a call has 1024 tokens or more
      (``FP16_MATMUL_HEURISTIC_CONDITION``; vLLM's ``awq.py`` does the same from 256 tokens), so a
      prefill holds one 16-bit weight, as nf4.
    * gptq-4: counted the same way (a fused kernel with no such copy would need less): the
      larger figure, on the safe side.
    """
    largest = arch.largest_quantized_linear
    if quant is Quant.INT8:
        return tokens * largest.in_features + 4 * tokens * largest.out_features
    return element_bytes * largest.in_features * largest.out_features


def quantized_inference(
    plan: Plan, arch: Architecture, weight_bytes: int, gpus: int, acc: _Accumulator, weights: float
) -> float:
    """The per-GPU weights of an inference plan with ``--quant`` (``weights``: what the estimator
    counted without it), recording the dequantisation workspace and the warnings on ``acc``."""
    if arch.checkpoint_bits is not None:
        acc.warnings.append(
            f"--quant {plan.quant.value} is ignored: the checkpoint is already quantized to "
            f"{arch.checkpoint_bits} bits (its config.json's quantization_config)"
        )
        acc.add_phase_bytes(PHASE_MODEL_LOAD, "weights", weights, "weights as loaded")
        return weights
    # The parts left unquantized stay in the dtype the model loads in (``torch_dtype``).
    quantized = quantized_weight_bytes(arch, plan.quant, weight_bytes) / gpus
    acc.add_phase_bytes(PHASE_MODEL_LOAD, "weights", quantized, "weights as loaded")
    if plan.quant in QUANTIZED_ON_LOAD:
        # one whole linear is quantized on one GPU (a device map places whole modules)
        bits = QUANT_BITS[plan.quant]
        acc.add_phase_transient(
            PHASE_MODEL_LOAD,
            "weights",
            quantize_on_load_bytes(arch, bits),
            f"largest linear being quantized on load ({plan.quant.value}: 16-bit source and "
            "quantization scratch)",
        )
    workspace = dequantization_workspace_bytes(
        arch, plan.quant, plan.batch * plan.seq, min(weight_bytes, 2)
    )
    acc.activations += workspace
    acc.note(f"{plan.quant.value} dequantisation workspace (one layer)", workspace, _BACKWARD_ONLY)
    return quantized
