"""NCCL communicators: device memory NCCL allocates outside PyTorch's caching allocator.

Each process group a plan creates gets an NCCL communicator, and each communicator connects its
ranks over channels. Every connection holds one buffer per protocol (LL, LL128, Simple) on one of
its two GPUs: ``p2pRecvSetup`` allocates them on the receiver, except Simple on the sender under
P2P read (NVIDIA/nccl ``src/transport/p2p.cc``), so per rank a ring channel costs one connection's
buffers, whichever way the link reads. The buffer sizes are NCCL's defaults (``src/init.cc``,
``computeBuffSizes``; ``NCCL_BUFFSIZE`` overrides Simple's: the plan's ``nccl_buffsize``) and the
channel counts depend on the link (``[[interconnect]]``); both are data in ``catalog/software.toml``.
NCCL ``cudaMalloc``\\ s these itself: NVML counts them, ``torch.cuda.memory_reserved`` never does.
Beside its connections' buffers each communicator holds memory of its own (``communicator_bytes``,
even with one rank), and the process loads NCCL's device code once with its first communicator
(``kernels_bytes``): both measured on an H100 (``[[nccl]]``'s notes say how).

The groups (:func:`comm_groups`):

* DDP, DeepSpeed ZeRO, RL and FSDP full shard: the data-parallel world group, a ring of every GPU;
  DeepSpeed ZeRO adds a second communicator over the same GPUs: its engine reduces and gathers on a
  clone of the world group (``_clone_world_group`` in ``deepspeed/utils/groups.py``, a
  ``dist.new_group`` of every rank), while the launcher's barriers use the default group;
* FSDP hybrid shard: the shard group (one node) and the replicate group (one GPU per node)
  (``torch.distributed.fsdp``'s ``HYBRID_SHARD`` builds both);
* Megatron-LM, FSDP hybrid shard and FSDP2 context parallelism: the default group as well, which
  their barriers use beside their own groups;
* Megatron-LM: the tensor-parallel group and the data-parallel group (rings), and the pipeline's
  point-to-point sends and receives to the previous and the next stage
  (``megatron/core/parallel_state.py``, ``initialize_model_parallel``); with ``--cp`` the
  context-parallel group (ring attention's K/V sends to the next rank and receives from the
  previous), with ``--ep`` the expert-parallel group (all-to-all: a connection to each of its
  other ranks) and the experts' data-parallel group;
* DeepSpeed-Ulysses: its sequence-parallel group (all-to-all); FSDP2 context parallelism: the
  context-parallel group of accelerate's device mesh;
* multi-GPU inference splits the weights over the GPUs: a tensor-parallel group of every GPU (vLLM
  and TGI; ``device_map="auto"`` runs layer by layer with no communicator and needs less).

On one GPU there is no DDP wrapper and no tensor or pipeline group, but DeepSpeed ZeRO and FSDP still
run their collectives, on communicators of one rank: the same groups with one rank each, which hold
no connection but their own memory (measured: 0.54-0.58 GiB beside the tensors under FSDP, 0.93-1.01
GiB under ZeRO, ``bench/data/whole_gpu_readings_e.toml``).

Left out: NVLink SHARP (NVLS) buffers on NVSwitch systems, trees across nodes (with
``NCCL_RUNTIME_CONNECT=1``, NCCL's default since 2.22, connections are made when an algorithm is
first used; one node runs rings), Megatron's smaller groups (embedding, position embedding) and
serving engines' second communicator (vLLM's own PyNccl beside torch's group).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hwdash.core.estimator import phases as est_phases
from hwdash.core.estimator.parallelism import fsdp_shard_size
from hwdash.core.plan import FsdpMode, Method, Plan
from hwdash.core.plan_unused import plain_data_parallel
from hwdash.core.software_specs import Interconnect, NcclBuffers


@dataclass(frozen=True)
class CommGroup:
    """One NCCL communicator a rank belongs to."""

    name: str
    ranks: int
    pattern: Literal["ring", "p2p", "alltoall"]
    """``ring``: collectives (all-reduce, all-gather, reduce-scatter); ``p2p``: pipeline sends and
    ring attention's K/V passing (to the previous and the next rank); ``alltoall``: Ulysses' and
    the MoE dispatcher's all-to-all, a send/receive pair with every other rank of the group."""


def comm_groups(plan: Plan, gpus: int) -> tuple[CommGroup, ...]:
    """The communicators one rank of ``plan`` on ``gpus`` GPUs joins."""
    if gpus <= 1:
        return _one_gpu_groups(plan)
    groups: list[CommGroup] = []
    # hybrid shard within one node is full shard (the exports write it so): no group of its own
    hybrid = (
        plan.fsdp is FsdpMode.HYBRID and fsdp_shard_size(gpus, plan.fsdp, plan.gpus_per_node) < gpus
    )
    if plan.megatron or hybrid or plan.cp > 1:
        # their groups are new_groups beside the default one, whose communicator the launcher's and
        # the framework's barriers create: Megatron's _compile_dependencies calls
        # torch.distributed.barrier() (megatron/training/initialize.py), accelerate's
        # wait_for_everyone() does (the Trainer waits at dataset preparation and saves)
        groups.append(CommGroup("default (barriers)", gpus, "ring"))
    if plan.megatron:
        if plan.tp > 1:
            groups.append(CommGroup("tensor-parallel", plan.tp, "ring"))
        if plan.pp > 1:
            groups.append(CommGroup("pipeline-parallel", plan.pp, "p2p"))
        if plan.cp > 1:
            groups.append(CommGroup("context-parallel", plan.cp, "p2p"))
        data = gpus // (plan.tp * plan.pp)  # Megatron's data x context group
        if data > 1:
            groups.append(CommGroup("data-parallel", data, "ring"))
        groups.extend(_expert_groups(plan, gpus))
    elif plan.sp_ulysses > 1 or plan.cp > 1:
        groups.extend(_sequence_groups(plan, gpus))
    elif plan.fsdp is FsdpMode.HYBRID:
        shard = fsdp_shard_size(gpus, plan.fsdp, plan.gpus_per_node)
        if shard > 1:
            groups.append(CommGroup("FSDP shard", shard, "ring"))
        if gpus // shard > 1:
            groups.append(CommGroup("FSDP replicate", gpus // shard, "ring"))
    elif plan.fsdp in (FsdpMode.FULL, FsdpMode.SHARD_GRAD_OP):
        groups.append(CommGroup("FSDP shard", gpus, "ring"))
    elif plan.method is Method.INFERENCE:
        groups.append(CommGroup("tensor-parallel", gpus, "ring"))
    else:
        groups.append(CommGroup("data-parallel", gpus, "ring"))
        if plan.zero:
            groups.append(CommGroup("DeepSpeed world clone", gpus, "ring"))
    return tuple(groups)


def _one_gpu_groups(plan: Plan) -> tuple[CommGroup, ...]:
    """ZeRO, FSDP and Megatron training on one GPU: their groups, of one rank (a plain run has
    none). Megatron-LM initialises NCCL on one GPU too, and its ``_compile_dependencies`` barrier
    (megatron/training/initialize.py) creates the default group's communicator."""
    if plan.method is Method.INFERENCE:
        return ()
    if plan.megatron:
        return (CommGroup("default (barriers)", 1, "ring"),)
    if plan.fsdp is not FsdpMode.NONE:
        return (CommGroup("FSDP shard", 1, "ring"),)
    if plan.zero:
        return (
            CommGroup("data-parallel", 1, "ring"),
            CommGroup("DeepSpeed world clone", 1, "ring"),
        )
    return ()


def _expert_groups(plan: Plan, gpus: int) -> list[CommGroup]:
    """Megatron's expert-parallel group (all-to-all dispatch and combine) and the experts'
    data-parallel group, ``gpus / (tp x ep x pp)`` (megatron/core/parallel_state.py)."""
    if plan.ep <= 1:
        return []
    groups = [CommGroup("expert-parallel", plan.ep, "alltoall")]
    expert_data = gpus // (plan.tp * plan.ep * plan.pp)
    if expert_data > 1:
        groups.append(CommGroup("expert data-parallel", expert_data, "ring"))
    return groups


def _sequence_groups(plan: Plan, gpus: int) -> list[CommGroup]:
    """FSDP2 context parallelism (accelerate's device mesh: a CP ring beside the FSDP shard
    group) or DeepSpeed-Ulysses (the sequence-parallel all-to-all group beside ZeRO's world
    groups, deepspeed/sequence/layer.py)."""
    if plan.cp > 1:
        shard = fsdp_shard_size(gpus, plan.fsdp, plan.gpus_per_node)
        return [
            CommGroup("FSDP shard", shard, "ring"),
            CommGroup("context-parallel", plan.cp, "ring"),
        ]
    groups = [
        CommGroup("data-parallel", gpus, "ring"),
        CommGroup("Ulysses sequence-parallel", plan.sp_ulysses, "alltoall"),
    ]
    if plan.zero:
        groups.append(CommGroup("DeepSpeed world clone", gpus, "ring"))
    return groups


def connection_bytes(nccl: NcclBuffers, buffsize: int | None) -> int:
    """One connection's buffers: LL + LL128 + Simple (``buffsize``: ``NCCL_BUFFSIZE``)."""
    simple = nccl.simple_bytes if buffsize is None else buffsize
    return nccl.ll_bytes + nccl.ll128_bytes + simple


def group_bytes(
    group: CommGroup, link: Interconnect, nccl: NcclBuffers, buffsize: int | None
) -> int:
    """Bytes one rank holds for ``group``: the communicator's own memory and its buffers."""
    return nccl.communicator_bytes + group_buffer_bytes(group, link, nccl, buffsize)


def group_buffer_bytes(
    group: CommGroup, link: Interconnect, nccl: NcclBuffers, buffsize: int | None
) -> int:
    """The connections' buffers one rank holds for ``group``: channels x connections x one
    connection's buffers.

    A ring channel gives each rank one connection's buffers (from its previous rank; the one to its
    next rank lives there). A pipeline stage receives from the previous stage (forward) and the
    next one (backward): two peers in the middle of the pipeline, one at an end when there are two
    stages, each over ``p2p_channels_per_peer`` channels. One rank connects to nobody.
    """
    if group.ranks <= 1:
        return 0
    per_connection = connection_bytes(nccl, buffsize)
    if group.pattern == "ring":
        return link.coll_channels * per_connection
    peers = group.ranks - 1 if group.pattern == "alltoall" else min(2, group.ranks - 1)
    return link.p2p_channels_per_peer * peers * per_connection


def nccl_bytes(
    plan: Plan, gpus: int, link: Interconnect, nccl: NcclBuffers
) -> tuple[int, tuple[CommGroup, ...]]:
    """Every communicator's bytes on one rank and NCCL's device code, and the groups counted."""
    groups = comm_groups(plan, gpus)
    total = sum(group_bytes(group, link, nccl, plan.nccl_buffsize) for group in groups)
    return total + (nccl.kernels_bytes if groups else 0), groups


def ddp_bucket_bytes(
    plan: Plan, dp: int, trainable: int, gradient_bytes: int, bucket_view: bool = False
) -> float:
    """PyTorch DDP's gradient buckets: a second copy of every trained parameter's gradient.

    ``torch/nn/parallel/distributed.py``: the ``Reducer`` groups the trained parameters into
    buckets of ``bucket_cap_mb`` (``_DEFAULT_BUCKET_CAP_MB = 25``; the first one
    ``_DEFAULT_FIRST_BUCKET_BYTES``) and allocates each bucket as one flat tensor at construction;
    the autograd hook copies each gradient into its bucket, which is all-reduced in place. The
    buckets together span every trained parameter whatever the cap, in the gradient's dtype, and
    live as long as the DDP module. ``gradient_as_bucket_view=True`` (``bucket_view``,
    ``--ddp-bucket-view``) makes the gradients views of the buckets instead ("the saved memory
    size will be equal to the total gradients size", the same file's docs), as does a script
    that all-reduces its gradients itself without DDP: no copy. accelerate's
    ``DistributedDataParallelKwargs`` defaults it to ``False`` (``accelerate/utils/dataclasses.py``)
    and the Trainer does not set it. Plain data parallelism only: DeepSpeed, FSDP and Megatron
    reduce through their own buffers (counted elsewhere); one GPU has no DDP wrapper."""
    if bucket_view or not plain_data_parallel(plan, dp):
        return 0.0
    return float(trainable * gradient_bytes)


def add_ddp_buckets(
    plan: Plan,
    dp: int,
    trainable: int,
    gradient_bytes: int,
    acc: est_phases._Accumulator,
    bucket_view: bool = False,
) -> None:
    """Add :func:`ddp_bucket_bytes` as gradients alive in every phase, and its line."""
    buckets = ddp_bucket_bytes(plan, dp, trainable, gradient_bytes, bucket_view)
    if not buckets:
        return
    acc.persistent_gradients += buckets
    acc.note(f"DDP gradient buckets (a copy of the gradients, {gradient_bytes}-byte)", buckets)
