"""Context, Ulysses sequence and expert parallelism: what they change on one GPU of a training plan.

Sources, each formula below cites one:

* Ring attention: Liu et al. 2023, "Ring Attention with Blockwise Transformers for Near-Infinite
  Context", arXiv:2310.01889, section 3: each of ``cp`` hosts keeps its ``s/cp`` block of the
  sequence (every activation of the layer, its Q, K and V) and passes K/V blocks around the ring,
  receiving the next block while it computes on the current one: one more K/V block in flight.
  Megatron-LM's context-parallel docs (docs/source/api-guide/context_parallel.rst): activations
  split along the sequence over CP ranks that share the weights; the load-balanced split gives each
  rank two chunks (``megatron/training/arguments.py`` asserts seq-length a multiple of ``2 cp``);
  the distributed optimizer and the gradient all-reduce run over the data-parallel x CP group.
  Backward passes dK/dV along the ring as well: a second block in flight.
* DeepSpeed-Ulysses: Jacobs et al. 2023, "DeepSpeed Ulysses", arXiv:2309.14509, section 3:
  the sequence is split over ``sp`` ranks; before attention an all-to-all turns the local Q, K, V
  (``s/sp`` tokens, all heads) into the whole sequence for ``heads/sp`` heads, and one after it
  turns the output back. With a fused attention kernel every saved tensor has ``s/sp`` tokens'
  worth of elements; the all-to-all keeps a send and a receive copy of Q, K, V for one layer.
* Expert parallelism: Lepikhin et al. 2020, "GShard", arXiv:2006.16668, section 2.2, and Fedus et
  al. 2021, "Switch Transformers", arXiv:2101.03961, section 2.2: the experts of every MoE layer
  are split over ``ep`` ranks, the dense parts replicated; tokens go to their experts' rank by an
  all-to-all (dispatch) and come back by another (combine). Balanced routing gives each rank the
  same ``t k`` token copies it sends. Megatron-LM's ``MoEAlltoAllTokenDispatcher``
  (megatron/core/transformer/moe/token_dispatcher.py): the permuted tokens it sends and the tokens
  it receives (``t k h`` elements each), the received ones kept as the experts' input for backward.
  Megatron's expert groups (megatron/core/parallel_state.py): experts split over ``tp x ep``
  (expert tensor parallelism defaults to ``tp``), their data-parallel group ``gpus/(tp ep pp)``.
"""

from __future__ import annotations

from hwdash.core.estimator import phases as est_phases
from hwdash.core.estimator.architecture import Architecture
from hwdash.core.plan import Plan


def expert_params_per_layer(arch: Architecture) -> float:
    """The routed experts' parameters of one block (the linears with one copy per expert);
    0 for a dense model."""
    if arch.experts <= 1:
        return 0.0
    total = 0.0
    for linear in arch.linears:
        if linear.copies > 1:
            total += linear.in_features * linear.out_features * linear.copies
            total += linear.out_features * linear.copies if linear.bias else 0
    return total


def ring_kv_block_bytes(
    arch: Architecture, batch: int, seq: int, cp: int, element_bytes: int, tp: int
) -> float:
    """One K/V block in flight on the ring (Liu et al. section 3): K and V of ``s/cp`` tokens,
    their heads split over ``tp`` (``2 e b (s/cp) kv_dim / tp``)."""
    return 2 * element_bytes * batch * (seq / cp) * arch.kv_dim / tp


def ring_buffers(plan: Plan, arch: Architecture, element_bytes: int, tp: int = 1) -> float:
    """The ring's transient buffers during one layer's backward: the next K/V block and the dK/dV
    block passed on (two blocks); 0 without ``--cp``."""
    if plan.cp <= 1:
        return 0.0
    return 2 * ring_kv_block_bytes(arch, plan.batch, plan.seq, plan.cp, element_bytes, tp)


def ulysses_buffers(plan: Plan, arch: Architecture, element_bytes: int) -> float:
    """The all-to-all's copies of Q, K and V for one layer (Jacobs et al. section 3): the
    ``s/sp`` tokens' Q, K, V it sends and the same count it receives; 0 without Ulysses."""
    if plan.sp_ulysses <= 1:
        return 0.0
    tokens = plan.batch * plan.seq / plan.sp_ulysses
    return 2 * element_bytes * tokens * (arch.q_dim + 2 * arch.kv_dim)


def dispatched_token_bytes(
    arch: Architecture, tokens: float, element_bytes: int, sequence_split: int
) -> float:
    """One MoE layer's received token copies (``e t k h``; Megatron's all-to-all dispatcher), the
    tokens split over the TP group with sequence parallelism (``sequence_split``)."""
    return element_bytes * tokens * arch.experts_per_token * arch.hidden / sequence_split


def moe_layers(arch: Architecture) -> int:
    """The blocks with routed experts (DeepSeek's first dense layers have none)."""
    return arch.layers - arch.dense_layers if arch.experts > 1 else 0


def add_sequence_buffers(
    plan: Plan, arch: Architecture, element_bytes: int, acc: est_phases._Accumulator, label: str
) -> None:
    """Into ``acc``, the buffers of one layer's attention under FSDP2 context parallelism (the
    ring's K/V and dK/dV blocks) or DeepSpeed-Ulysses (the all-to-all's Q/K/V copies), alive in
    backward; the activations themselves were counted for ``s/N`` tokens."""
    if plan.cp > 1:
        extra = ring_buffers(plan, arch, element_bytes)
        words = f"ring attention K/V blocks in flight (cp {plan.cp}, Liu et al. 2023)"
    else:
        extra = ulysses_buffers(plan, arch, element_bytes)
        words = f"Ulysses all-to-all Q/K/V copies (sp {plan.sp_ulysses}, Jacobs et al. 2023)"
    acc.activations += extra
    acc.note(
        f"{label} activations of seq {plan.seq // plan.sequence_shards} per GPU; {words}",
        extra,
        est_phases._BACKWARD_ONLY,
    )
