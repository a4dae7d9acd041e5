"""PyTorch FSDP's choices a plan makes (``--fsdp``, ``--fsdp-state-dict``, ``--fsdp-wrap``), imported
from :mod:`hwdash.core.plan` as before; kept here so that the plan module stays under the size
limit."""

from __future__ import annotations

from enum import Enum


class FsdpMode(str, Enum):
    """PyTorch FSDP sharding (``--fsdp``), distinct from DeepSpeed ZeRO (``--zero``).

    Zhao et al. 2023, "PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel",
    arXiv:2304.11277, section 3.2 (full and hybrid sharding). FSDP keeps the model states in the
    plan's dtype: no fp32 master copy unless the layout asks for one (see :mod:`hwdash.core.estimator.parallelism`).
    """

    NONE = "none"
    FULL = "full"
    """Parameters, gradients and optimizer states sharded over every GPU (``FULL_SHARD``,
    ``fully_shard``)."""
    HYBRID = "hybrid"
    """Sharded within a node of ``gpus_per_node`` GPUs, replicated across nodes (``HYBRID_SHARD``)."""
    SHARD_GRAD_OP = "shard-grad-op"
    """Sharded over every GPU like ``full``, but each unit stays gathered from its forward to its
    backward (``ShardingStrategy.SHARD_GRAD_OP``, ZeRO-2's trade: PyTorch's FSDP docs, "does not
    reshard them after the forward"; FSDP2 ``fully_shard(reshard_after_forward=False)``, which
    accelerate's FSDP2 config writes as ``fsdp_reshard_after_forward: false``): at the start of
    backward the whole model is gathered, and backward all-gathers nothing."""


#: accelerate's ``fsdp_sharding_strategy`` (``torch.distributed.fsdp.ShardingStrategy``'s names) for
#: each ``--fsdp`` mode, as the exports write it.
SHARDING_STRATEGIES = {
    FsdpMode.FULL: "FULL_SHARD",
    FsdpMode.HYBRID: "HYBRID_SHARD",
    FsdpMode.SHARD_GRAD_OP: "SHARD_GRAD_OP",
}


class FsdpStateDict(str, Enum):
    """How FSDP saves a checkpoint (``--fsdp-state-dict``; accelerate's ``fsdp_state_dict_type``)."""

    FULL = "full"
    """``FULL_STATE_DICT``: every unit gathered in turn and copied to rank 0's host RAM (accelerate's
    ``FullStateDictConfig(offload_to_cpu=True, rank0_only=True)``)."""
    SHARDED = "sharded"
    """``SHARDED_STATE_DICT``: each rank writes its own shards, nothing gathered."""


class FsdpWrap(str, Enum):
    """How FSDP splits the model into units (``--fsdp-wrap``; accelerate's ``fsdp_auto_wrap_policy``,
    the Trainer's ``fsdp_config.auto_wrap_policy``)."""

    TRANSFORMER = "transformer"
    """Each decoder block its own unit, the embedding, output layer and final norm left in the root
    unit, which stays gathered from the first forward to the end of backward
    (``TRANSFORMER_BASED_WRAP``: the Trainer's default; FSDP1's ``_post_forward_reshard`` never
    frees the root; accelerate's FSDP2 before 1.14 wraps the blocks, then ``fully_shard(model)``,
    accelerate/utils/fsdp_utils.py ``fsdp2_prepare_model`` at v1.13.0). FSDP1's default."""
    TRANSFORMER_ENDS = "transformer-ends"
    """Each decoder block, the embedding and the output layer their own units, gathered one at a
    time (torchtitan's ``apply_fsdp``; torchtune's ``custom_sharded_layers``; accelerate 1.14 and
    later carve the embedding and ``[final norm, output layer]`` out of the root, huggingface/
    accelerate PR 4015). FSDP2's default."""
    NONE = "none"
    """No auto-wrap policy (``NO_WRAP``: accelerate's default when its config says none, Lightning's
    ``FSDPStrategy`` default): the whole model is the root unit, gathered from the first forward to
    the end of backward."""


def keeps_ends_in_root(wrap: FsdpWrap | None, version: int) -> bool:
    """Whether the embedding, output layer and final norm sit in FSDP's root unit, gathered from
    the first forward to the end of backward (``--fsdp-wrap transformer``); unset, FSDP1 keeps them
    there and FSDP2 gives them their own units (``transformer-ends``, :class:`FsdpWrap`)."""
    if wrap is None:
        wrap = FsdpWrap.TRANSFORMER if version == 1 else FsdpWrap.TRANSFORMER_ENDS
    return wrap is FsdpWrap.TRANSFORMER
