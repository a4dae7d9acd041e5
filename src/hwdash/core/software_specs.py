"""The software's own footprint as catalog data (``catalog/software.toml``): the CUDA context by
compute capability, NCCL's channels by link, NCCL's buffers and communicators, and the caching
allocator's pool (issue 29).

Kept beside :mod:`hwdash.core.specs`, whose strict base and patterns they share.
"""

from __future__ import annotations

import re

from pydantic import Field, model_validator

from hwdash.core.specs import COMPUTE_CAPABILITY_PATTERN, ID_PATTERN, _FieldProblem, _Strict


class CudaContext(_Strict):
    """Device memory a CUDA process holds outside PyTorch's caching allocator (``[[cuda_context]]``).

    The CUDA context, the kernels loaded into it (lazily since CUDA 11.7, by default since CUDA
    12.2 and PyTorch 1.13) and the cuBLAS/cuDNN handles' own state: what NVML shows for a process
    beyond ``torch.cuda.max_memory_reserved``. cuBLAS workspaces that PyTorch allocates through its
    caching allocator are inside "reserved", not here.
    """

    id: str = Field(pattern=ID_PATTERN)
    """Row id."""
    compute_capabilities: tuple[str, ...] = Field(default=(), strict=False)  # TOML gives a list
    """The compute capabilities this row is for (``["9.0"]``); empty for the default row only."""
    default: bool = False
    """The row for a hardware-neutral estimate and for a GPU whose compute capability has no row."""
    bytes: int = Field(gt=0, le=64 * 2**30)
    """Bytes per process on one GPU."""
    measured_on: str = Field(min_length=1)
    """The GPU (short name) and compute capability the reading is from, shown in the plan."""
    software: str = ""
    """Driver, CUDA and PyTorch versions of the reading, where known."""
    source: str = Field(min_length=1)
    """Where the number comes from (a measurement, a public thread), with its conditions."""
    notes: str = ""

    @model_validator(mode="after")
    def _capabilities(self) -> CudaContext:
        for capability in self.compute_capabilities:
            if not isinstance(capability, str) or not re.match(
                COMPUTE_CAPABILITY_PATTERN, capability
            ):
                raise _FieldProblem(
                    "compute_capabilities", f"{capability!r} is not a compute capability like '9.0'"
                )
        if not self.default and not self.compute_capabilities:
            raise _FieldProblem(
                "compute_capabilities", "a row that is not the default needs compute capabilities"
            )
        return self


class Interconnect(_Strict):
    """NCCL's channel counts on one kind of GPU-to-GPU link (``[[interconnect]]``)."""

    id: str = Field(pattern=ID_PATTERN)
    """``nvlink``, ``pcie``: what an accelerator's ``interconnect`` names."""
    default: bool = False
    """The interconnect of a hardware-neutral estimate and of an accelerator that names none."""
    coll_channels: int = Field(ge=1, le=64)
    """Channels of a collective communicator (``NCCL INFO N coll channels``; MAXCHANNELS is 64)."""
    p2p_channels_per_peer: int = Field(ge=1, le=64)
    """Channels per peer of point-to-point sends and receives (pipeline stages)."""
    source: str = Field(min_length=1)
    """The NCCL logs or source the counts come from."""
    notes: str = ""


class NcclBuffers(_Strict):
    """NCCL's per-connection buffer of each protocol (``[[nccl]]``), from its source's defaults."""

    id: str = Field(pattern=ID_PATTERN)
    ll_bytes: int = Field(ge=0, le=2**34)
    """LL protocol buffer (``NCCL_LL_BUFFSIZE``'s default)."""
    ll128_bytes: int = Field(ge=0, le=2**34)
    """LL128 protocol buffer (``NCCL_LL128_BUFFSIZE``'s default)."""
    simple_bytes: int = Field(ge=0, le=2**34)
    """Simple protocol buffer (``NCCL_BUFFSIZE``'s default, 4 MiB); ``--nccl-buffsize`` overrides it."""
    communicator_bytes: int = Field(default=0, ge=0, le=2**34)
    """Each communicator's own device memory beside its connections' buffers."""
    kernels_bytes: int = Field(default=0, ge=0, le=2**34)
    """NCCL's device code, loaded once per process with its first communicator."""
    source: str = Field(min_length=1)
    """The NCCL source files and version the defaults are read from."""
    notes: str = ""
    """Where ``communicator_bytes`` and ``kernels_bytes`` come from, and anything else."""


class AllocatorPool(_Strict):
    """PyTorch's caching-allocator pool, reserved minus allocated, as a fraction of the tensors it
    holds (``[[allocator_pool]]``, one entry): one fraction for a process that runs no collectives,
    one for a distributed training process (data parallel, sharded, tensor or pipeline parallel,
    and ZeRO or FSDP at any GPU count) and, optionally, one for such a process whose parameters
    live on the host and one for Megatron-LM's (``estimate.pool_kind``; without them, the
    distributed one)."""

    id: str = Field(pattern=ID_PATTERN)
    single_gpu: float = Field(ge=0, le=4)
    """Reserved / allocated - 1 of a process that runs no collectives (one GPU, or inference)."""
    single_gpu_source: str = Field(min_length=1)
    distributed: float = Field(ge=0, le=4)
    """Reserved / allocated - 1 of a training process in a data-, tensor- or pipeline-parallel
    group (DDP, ZeRO, FSDP; Megatron-LM where ``megatron`` is unset), or under ZeRO or FSDP on one
    GPU (``estimate.distributed_pool``)."""
    distributed_source: str = Field(min_length=1)
    param_offload: float | None = Field(default=None, ge=0, le=4)
    """Reserved / allocated - 1 of a distributed training process whose parameters are offloaded
    to the host (ZeRO-3 ``offload_param``, FSDP CPU offload): each layer's parameters come back
    through new device buffers at every gather. None: the ``distributed`` fraction."""
    param_offload_source: str = ""
    megatron: float | None = Field(default=None, ge=0, le=4)
    """Reserved / allocated - 1 of a training process on the Megatron-LM path (its contiguous
    gradient buffer). None: the ``distributed`` fraction."""
    megatron_source: str = ""
    distributed_base_bytes: int = Field(default=0, ge=0)
    """Bytes the pool holds whatever the tensors, beside its ``distributed`` fraction (0: none)."""
    param_offload_base_bytes: int = Field(default=0, ge=0)
    """The same for ``param_offload``: the gathered parameters' blocks that come back at every
    gather are sized by the layers, not by the tensors alive at the peak."""
    megatron_base_bytes: int = Field(default=0, ge=0)
    """The same for ``megatron``."""
    notes: str = ""

    @model_validator(mode="after")
    def _fractions_cited(self) -> AllocatorPool:
        for name in ("param_offload", "megatron"):
            if getattr(self, name) is not None and not getattr(self, f"{name}_source"):
                raise _FieldProblem(f"{name}_source", f"{name} needs its source")
        return self
