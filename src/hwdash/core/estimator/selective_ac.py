"""Selective activation checkpointing outside Megatron (``--selective-ac op|N|K/N``): torchtitan's
two policies and fms-fsdp's ratio.

torchtitan (``torchtitan/distributed/activation_checkpoint.py``, ``_apply_ac_to_transformer_block``
under ``activation_checkpoint.mode = "selective"``) wraps each transformer block one of two ways:

* ``selective_ac_option = "op"`` (``_apply_op_sac``): torch's
  ``torch.utils.checkpoint.create_selective_checkpoint_contexts`` with a policy that marks
  ``MUST_SAVE`` the outputs of the ops in its save list (``aten.mm``, the SDPA flash / efficient /
  cuDNN kernels, ``_c10d_functional.reduce_scatter_tensor``, ``abs`` and ``max`` for float8
  scaling) and recomputes every other op; of the ``aten.mm`` calls it saves only the odd ones,
  counting them per block's forward (1st, 3rd, 5th..., "every second mm" recomputed);
* ``selective_ac_option = "N"`` (``_apply_layer_sac``): full checkpointing
  (``checkpoint_wrapper``) on every N-th block (a global counter ``% N == 0``, so blocks N, 2N...,
  counted from 1) and nothing on the others;

and IBM's fms-fsdp (``fms_fsdp/policies/ac_handler.py``, ``apply_fsdp_checkpointing``, copied by
IDRIS's Jean Zay fine-tuning benchmark as ``--sac 3/4``) checkpoints a fraction ``p = K/N`` of the
blocks, evenly spaced: counting blocks from 1, block ``i`` is checkpointed when ``i p`` reaches the
next half-integer cut-off (0.5, 1.5, 2.5...), so ``round(layers x p)`` of them (1/2: the 1st, 3rd...;
3/4: three of every four). ``K/N`` with ``K = 1`` is not torchtitan's ``N`` (which checkpoints the
last block of each group, this the middle one): both are counted as written.

What each block then keeps for backward, by hand (the checks are hand computations in
``tests/unit/test_selective_ac.py``; hwdash's tracer builds a Hugging Face model with
``gradient_checkpointing_enable`` and cannot apply this policy, so
``bench/selective_ac_policy_check.py`` runs such a policy through torch on tiny Llama and Qwen2
blocks on CPU: the matmuls it saves are the ones counted here):

* op: the block's input (the non-reentrant checkpoint holds its arguments, as full checkpointing
  does; Korthikanti et al. 2022, arXiv:2205.05198, ``2 s b h`` in 16-bit) plus each saved op's
  output. A linear without bias on the ``b x s x in`` activation runs as ``aten.mm`` (torch's
  ``aten/src/ATen/native/Linear.cpp``: ``matmul`` folds the batch into rows); a linear with bias
  runs as ``aten.addmm`` (``_flatten_nd_linear``), which is neither in the save list nor counted.
  The block's linears in forward order (transformers' ``modeling_llama.py``: q, k, v, o; then
  ``down_proj(act(gate_proj(x)) * up_proj(x))``: gate, up, down) give the mm sequence. SDPA in
  16-bit (a fused kernel) keeps its output (``e t q_dim``) and the fp32 log-sum-exp per head and
  row (``4 b heads s``); eager attention (``bmm``) and the flash-attn package's own op are
  recomputed. In backward one block is recomputed in full on top, as with full checkpointing.
* N: every N-th block keeps its input only, the others everything
  (:func:`~hwdash.core.estimator.activations.layer_activation_bytes`); a block is recomputed in
  backward on top of the rest only when the last block is a checkpointed one (``layers % N == 0``):
  otherwise the blocks after a checkpointed one have freed at least a block's activations by the
  time it is recomputed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hwdash.core.plan import Attention
from hwdash.errors import UsageError

if TYPE_CHECKING:  # the estimator imports this module
    from hwdash.core.estimator.layout import Architecture

#: torchtitan's op policy, the value of ``--selective-ac`` that selects it.
OP = "op"
#: Bytes per element of the log-sum-exp the fused SDPA kernels return (fp32, one per head and
#: query row: ``aten/src/ATen/native/transformers/attention.cpp``).
SDPA_LSE_BYTES = 4


class SelectiveAcError(UsageError, ValueError):
    """A model the op policy is not counted for (a UsageError for the command line; a ValueError
    for the make-it-fit search, which skips it)."""


def checkpointed_flags(value: str, layers: int) -> list[bool]:
    """Which of ``layers`` blocks (in order) a layer policy checkpoints in full: ``N``, blocks N,
    2N... (torchtitan); ``K/N``, block ``i`` (from 1) when ``i K / N`` reaches the next half-integer
    cut-off (fms-fsdp; exact in integers: ``2 i K >= (2 m + 1) N`` for the m-th cut-off)."""
    if "/" not in value:
        n = int(value)
        return [index % n == 0 for index in range(1, layers + 1)]
    k, n = (int(part) for part in value.split("/"))
    flags = []
    cut = 0  # the cut-off is cut + 1/2
    for index in range(1, layers + 1):
        reached = 2 * index * k >= (2 * cut + 1) * n
        cut += reached
        flags.append(reached)
    return flags


def checkpointed_blocks(value: str, layers: int) -> int:
    """How many blocks the layer policy checkpoints in full (:func:`checkpointed_flags`)."""
    return sum(checkpointed_flags(value, layers))


def recomputes_last_block(value: str | None, layers: int) -> bool:
    """Whether backward recomputes a block on top of everything kept: full checkpointing
    (``value`` None, ``--grad-ckpt``) and the op policy always; a layer policy when the last
    block is a checkpointed one."""
    if value is None or value == OP:
        return True
    return checkpointed_flags(value, layers)[-1]


def check_op_policy(arch: Architecture) -> None:
    """Refuse the models whose blocks the op policy is not counted for: the count follows a dense
    Llama-style block (attention projections, then the MLP's)."""
    if arch.experts > 1 or arch.dense_layers:
        why = "a mixture of experts (its grouped expert matmuls are not aten.mm)"
    elif arch.kv_lora_rank:
        why = "multi-head latent attention"
    elif arch.cross_attention_layers:
        why = "an encoder-decoder"
    else:
        return
    raise SelectiveAcError(
        f"--selective-ac op is counted for dense decoder blocks, not {why}: use --selective-ac N "
        "(every N-th block checkpointed) or --grad-ckpt",
        flag="--selective-ac",
    )


def op_saved_tensors(
    arch: Architecture, batch: int, seq: int, element_bytes: int, attention: Attention
) -> list[tuple[str, int]]:
    """The op policy's saved outputs in one block, each ``(what, bytes)``, in forward order (see
    the module docstring): the odd ``aten.mm`` calls among the bias-free linears, then SDPA's
    output and log-sum-exp."""
    tokens = batch * seq
    saved: list[tuple[str, int]] = []
    mm_count = 0
    for linear in arch.linears:
        if linear.bias:
            continue  # aten.addmm: not saved, not counted
        mm_count += 1
        if mm_count % 2:
            saved.append((linear.name, element_bytes * tokens * linear.out_features))
    if attention is Attention.SDPA and element_bytes == 2:
        saved.append(("sdpa output", element_bytes * tokens * arch.q_dim))
        saved.append(("sdpa log-sum-exp", SDPA_LSE_BYTES * batch * arch.heads * seq))
    return saved


def op_saved_bytes(
    arch: Architecture, batch: int, seq: int, element_bytes: int, attention: Attention
) -> int:
    """What the op policy saves in one block besides its input."""
    return sum(size for _, size in op_saved_tensors(arch, batch, seq, element_bytes, attention))


def kept_bytes(
    value: str,
    arch: Architecture,
    kinds: list[tuple[int, int]],
    block_input: int,
    saved: int,
) -> int:
    """Every block's kept activations at the start of backward (the recomputed block excluded).

    ``kinds``: ``(count, one block's activations)`` per block kind; ``block_input``: one block's
    input; ``saved``: the op policy's per-block outputs (:func:`op_saved_bytes`). The layer policy
    leaves ``layers - layers // N`` blocks whole; with several block kinds it counts the largest
    ones among them (on the safe side: which kinds fall on the checkpointed indices is not known
    here); exact for a uniform stack.
    """
    if value == OP:
        return arch.layers * (block_input + saved)
    checkpointed = checkpointed_blocks(value, arch.layers)
    whole = arch.layers - checkpointed
    ones = sorted((one for count, one in kinds for _ in range(count)), reverse=True)
    return sum(ones[:whole]) + checkpointed * block_input


def activation_bytes(
    value: str,
    arch: Architecture,
    kinds: list[tuple[int, int]],
    shape: tuple[int, int, int, int],
    attention: Attention,
) -> int:
    """All blocks' activations at the start of backward under ``--selective-ac value``, one
    recomputed block included where backward recomputes one on top (:func:`kept_bytes`,
    :func:`recomputes_last_block`). ``shape``: batch, sequence, activation and checkpoint bytes
    per element (the block input is stored in the latter: fp32 under ``amp``)."""
    batch, seq, element_bytes, input_bytes = shape
    saved = 0
    if value == OP:
        check_op_policy(arch)
        saved = op_saved_bytes(arch, batch, seq, element_bytes, attention)
    block_input = input_bytes * batch * seq * arch.hidden
    kept = kept_bytes(value, arch, kinds, block_input, saved)
    recomputed = max(one for _, one in kinds) if recomputes_last_block(value, arch.layers) else 0
    return kept + recomputed


def recompute_flops_per_token(value: str | None, arch: Architecture, matmul_params: int) -> float:
    """FLOPs per token that ``--selective-ac`` recomputes in backward (0 without it).

    ``matmul_params``: the parameters one token's forward multiplies (``--grad-ckpt`` adds a
    whole forward, ``2 x`` that: Korthikanti et al. 2022, arXiv:2205.05198, section 5). The layer
    policy recomputes the forward of ``layers // N`` of the blocks (that share of it); the op policy
    the matmuls it does not save, ``2 x in x out`` each per token: the even-numbered ``aten.mm``
    calls and every biased projection (``aten.addmm``, not on its list), in every block. The
    recomputed elementwise ops and the attention core (SDPA saved; eager recomputed) are left out.
    """
    if value is None:
        return 0.0
    if value != OP:
        return 2.0 * matmul_params * checkpointed_blocks(value, arch.layers) / arch.layers
    recomputed = 0
    mm_count = 0
    for linear in arch.linears:
        if not linear.bias:
            mm_count += 1
            if mm_count % 2:
                continue  # saved
        recomputed += linear.copies * linear.in_features * linear.out_features
    return 2.0 * arch.layers * recomputed
