"""Activation bytes of block layouts beyond the Llama one: native LayerNorm (with the parallel
attention + MLP block of GPT-NeoX and Falcon) and the cross-attention of an encoder-decoder (T5).

Used by :func:`hwdash.core.estimator.layer_activation_bytes` and
:func:`~hwdash.core.estimator.training_activation_bytes`; the families come from
:mod:`hwdash.core.models.families`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the estimator imports this module
    from hwdash.core.estimator.architecture import Architecture

#: Bytes per row that ``torch.nn.functional.layer_norm`` keeps for backward besides its input: the
#: fp32 mean and reciprocal standard deviation (``native_layer_norm`` returns both, in fp32 for
#: 16-bit inputs, and autograd saves them with the input; ``aten/src/ATen/native/layer_norm.cpp``).
LAYER_NORM_STATS_BYTES = 8


def layer_norm_bytes(arch: Architecture, tokens: int, residual_bytes: int) -> int:
    """What one block's native LayerNorms keep: their input and the per-row statistics.

    ``native_layer_norm`` saves its input tensor itself (no upcast copy, unlike Llama's RMSNorm),
    plus :data:`LAYER_NORM_STATS_BYTES` per row, whether or not its weight trains (the input
    gradient needs them). In a sequential block (GPT-2, BLOOM, GPT-BigCode) each norm reads its own
    residual tensor; in a parallel block (GPT-NeoX's ``use_parallel_residual``, Falcon's
    ``parallel_attn``) every norm reads the same block input, so it is kept once: Black et al.
    2022 (arXiv:2204.06745, section 2.1) compute ``x + attn(ln1(x)) + mlp(ln2(x))``.
    ``residual_bytes``: the residual stream's dtype (fp32 under ``amp``, where autocast also runs
    layer_norm in fp32).
    """
    norms = arch.norms_per_layer
    inputs = 1 if arch.parallel_block else norms
    return norms * LAYER_NORM_STATS_BYTES * tokens + inputs * residual_bytes * tokens * arch.hidden


def cross_attention_bytes(arch: Architecture, batch: int, seq: int, element_bytes: int) -> int:
    """What one decoder block's cross-attention keeps for backward (T5's ``EncDecAttention``).

    Counted tensor by tensor as :func:`~hwdash.core.estimator.layer_activation_bytes` counts a
    self-attention, for full training, with the encoder and the decoder both ``seq`` long:

    * its norm (T5's LayerNorm: an fp32 variance over an fp32 copy, 4 t h + 4 t, and the normalised
      output kept by the q projection, e t h);
    * Q (e t q_dim), K and V over the encoder output (e t kv_dim each), and the output kept by the o
      projection (e t q_dim);
    * the scores: T5 has no SDPA path (position bias added to the scores), so the fp32 softmax
      output and the 16-bit probabilities (4 + e bytes per score, as eager attention).

    The encoder output itself, which every cross k and v projection keeps, is one tensor for all
    blocks: :func:`encoder_output_bytes`.
    """
    tokens = batch * seq
    e = element_bytes
    norm = 4 * tokens * arch.hidden + 4 * tokens + e * tokens * arch.hidden
    projections = e * tokens * (2 * arch.q_dim + 2 * arch.kv_dim)
    scores = (4 + e) * batch * arch.heads * seq * seq
    return norm + projections + scores


def encoder_output_bytes(arch: Architecture, batch: int, seq: int, element_bytes: int) -> int:
    """The encoder's output, kept for the whole decoder pass (0 for a decoder-only model)."""
    if not arch.cross_attention_layers:
        return 0
    return element_bytes * batch * seq * arch.hidden


def cross_attention_total_bytes(
    arch: Architecture, batch: int, seq: int, element_bytes: int
) -> int:
    """Every decoder block's cross-attention plus the encoder output they share (training)."""
    if not arch.cross_attention_layers:
        return 0
    per_block = cross_attention_bytes(arch, batch, seq, element_bytes)
    shared = encoder_output_bytes(arch, batch, seq, element_bytes)
    return arch.cross_attention_layers * per_block + shared
