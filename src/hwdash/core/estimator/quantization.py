"""Weights of a quantized inference plan (``--quant``): bytes held and the dequantisation workspace.

Only the linear layers inside the transformer blocks are quantized. transformers replaces every
``nn.Linear`` of the model with a bitsandbytes or GPTQ/AWQ layer except the modules it keeps in full
precision: the output embedding (LM head) is kept out by ``get_keys_to_not_convert``
(``transformers/integrations/bitsandbytes.py``, and ``modules_to_not_convert`` in the GPTQ and AWQ
quantizers), and embeddings and norms are not ``nn.Linear`` at all, so they stay in the load dtype
(16-bit). That is the split :attr:`Architecture.quantizable_params` / ``unquantized_params`` already
makes for QLoRA and quantized checkpoints.

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
"""

from __future__ import annotations

import dataclasses

from hwdash.core.estimator.architecture import Architecture
from hwdash.core.estimator.phases import _BACKWARD_ONLY, _Accumulator
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
    largest = arch.largest_linear
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
        return weights
    # The parts left unquantized stay in the dtype the model loads in (``torch_dtype``).
    quantized = quantized_weight_bytes(arch, plan.quant, weight_bytes) / gpus
    workspace = dequantization_workspace_bytes(
        arch, plan.quant, plan.batch * plan.seq, min(weight_bytes, 2)
    )
    acc.activations += workspace
    acc.note(f"{plan.quant.value} dequantisation workspace (one layer)", workspace, _BACKWARD_ONLY)
    return quantized
