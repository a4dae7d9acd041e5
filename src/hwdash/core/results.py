"""Results of an estimate: memory per GPU, fit per flavor, and the report that ties them together.

Plain frozen dataclasses with integer bytes; :meth:`PlanReport.to_json` gives the ``--json`` shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hwdash.core.plan import Plan
from hwdash.core.specs import Accelerator, Flavor, Framework, ModelSpec, Slowdown

MEMORY_COMPONENTS = ("weights", "gradients", "optimizer", "activations", "kv_cache", "overhead")


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on one GPU, by component."""

    weights: int = 0
    """Model weights (every model of an RL plan; quantized where the method quantizes)."""
    gradients: int = 0
    """Gradients of the trainable parameters alive at the peak."""
    optimizer: int = 0
    """Optimizer states, plus the fp32 master copy where the layout keeps one."""
    activations: int = 0
    """Activations saved for backward, the logits and the loss, and the largest transient."""
    kv_cache: int = 0
    """KV cache (inference, RL generation) including a colocated vLLM engine's reservation."""
    overhead: int = 0
    """Everything but the tensors: the allocator's pool (reserved - allocated), the CUDA context
    and kernels, and NCCL's communicator buffers."""

    @property
    def total(self) -> int:
        """Sum of every component."""
        return (
            self.weights
            + self.gradients
            + self.optimizer
            + self.activations
            + self.kv_cache
            + self.overhead
        )

    def as_dict(self) -> dict[str, int]:
        """Components and total as integer bytes (the ``memory`` object of ``--json``)."""
        out = {name: int(getattr(self, name)) for name in MEMORY_COMPONENTS}
        out["total"] = self.total
        return out


@dataclass(frozen=True)
class MemoryEstimate:
    """What one plan needs on each GPU at a given GPU count."""

    per_gpu: MemoryBreakdown
    """Peak bytes per GPU."""
    gpus: int
    """The data-parallel GPU count this estimate assumes."""
    host_bytes: int = 0
    """Host RAM that CPU offload needs (the whole machine, not per GPU)."""
    managed_bytes: int = 0
    """Paged optimizer states in CUDA managed memory, included in ``per_gpu.optimizer``: NVML
    counts them while they sit on the GPU, ``torch.cuda`` memory statistics never do, and the driver
    pages them to host RAM when the GPU runs short (slower, not out of memory)."""
    total_params: int = 0
    """Parameters of the model (all experts)."""
    trainable_params: int = 0
    """Parameters that receive gradients (adapters only for LoRA-style methods)."""
    compute_dtype: str = "bf16"
    """The half-precision dtype the matmuls run in (``fp16`` on a GPU without bf16)."""
    peak_phase: str = "start of backward"
    """When the peak happens: ``start of backward`` (saved activations and the loss alive),
    ``end of backward`` (every gradient plus the first layer's activations), ``optimizer step``
    (gradients, states and the step's temporaries), ``prefill`` (inference), or outside the step
    ``model load`` (``from_pretrained``: quantize-on-load, PEFT's fp32 upcast) and ``checkpoint
    save`` (between steps); every name: ``hwdash.core.estimator.phases.PEAK_PHASES``."""
    details: tuple[tuple[str, int], ...] = ()
    """Named sub-parts alive at the peak phase, for display, e.g. ``("reference model weights", n)``."""
    warnings: tuple[str, ...] = ()
    """Things the user should know about this estimate."""
    allocated_bytes: int = 0
    """The caching allocator's peak: the tensors alive at the peak, what
    ``torch.cuda.max_memory_allocated`` reports (managed memory left out)."""
    reserved_bytes: int = 0
    """``allocated_bytes`` plus the allocator's cached and fragmented blocks: what
    ``torch.cuda.max_memory_reserved`` reports."""

    @property
    def whole_gpu_bytes(self) -> int:
        """What NVML shows for the process: reserved + the CUDA context and kernels + NCCL's
        buffers + managed memory. The breakdown's total, and what the fit verdict compares."""
        return self.per_gpu.total

    def memory_json(self) -> dict[str, int]:
        """The ``memory`` object of ``--json``: the components, ``total`` (the whole GPU) and the
        three totals ``allocated``, ``reserved`` and ``whole_gpu``."""
        out = self.per_gpu.as_dict()
        out["allocated"] = self.allocated_bytes
        out["reserved"] = self.reserved_bytes
        out["whole_gpu"] = self.whole_gpu_bytes
        return out


class FitVerdict(str, Enum):
    """Whether a plan fits one flavor."""

    FITS = "fits"
    TIGHT = "tight"
    NO = "no"


#: Headroom under which a fit is only ``tight``: 10% of usable memory.
TIGHT_HEADROOM_FRACTION = 0.10


@dataclass(frozen=True)
class FlavorFit:
    """The plan evaluated on one flavor at that flavor's GPU count."""

    flavor: Flavor
    accelerator: Accelerator | None
    verdict: FitVerdict
    need_bytes: int
    """Peak bytes per GPU at this flavor's GPU count: the whole GPU, what NVML will show."""
    usable_bytes: int
    """Usable memory per GPU (what NVML reports)."""
    reason: str = ""
    """Why it does not fit, or a caveat (CPU-only, TPU, unified memory)."""
    hours: float | None = None
    """Estimated wall-clock hours (training) or None when the data size is unknown; the
    ``slowdowns`` are in (:func:`hwdash.core.planning.run_time.estimate_run_time`)."""
    cost: float | None = None
    """Dollars for those hours, None without a price or hours."""
    over_budget: bool | None = None
    """The cost is over the plan's ``--budget`` (:mod:`hwdash.core.planning.budget`); None without
    a budget or a known cost."""
    tokens_per_second: float | None = None
    """Training throughput (tokens/s) or, for inference, decode tokens/s per sequence, slowdowns in."""
    outside_allocator_bytes: int = 0
    """The part of ``need_bytes`` outside PyTorch's caching allocator (the CUDA context and kernels,
    NCCL's buffers, managed memory): what a measured allocator factor leaves as it is."""
    slowdowns: tuple[Slowdown, ...] = ()
    """The catalog's step-time factors in ``hours`` and ``tokens_per_second`` (QLoRA's
    dequantisation, CPU offload...), each with its source."""
    refusals: tuple[str, ...] = ()
    """Why the plan cannot run on the flavor whatever its memory (GPU count against tp x pp, the
    hardware kind, host RAM for offload): the verdict is ``no`` while any is here, however the
    need is rescaled (``--calibrated``)."""
    caveats: tuple[str, ...] = ()
    """The rest of ``reason`` after the memory reason and the refusals (TPU, unified memory,
    the run cost's notes)."""
    managed_bytes: int = 0
    """Paged optimizer states (CUDA managed memory) in ``need_bytes``: they spill to host RAM."""

    @property
    def headroom_bytes(self) -> int:
        """Usable minus needed bytes per GPU (negative when it does not fit)."""
        return self.usable_bytes - self.need_bytes

    def to_json(self) -> dict[str, Any]:
        """One entry of the ``flavors`` list of ``--json``."""
        return {
            "id": self.flavor.id,
            "fit": self.verdict.value,
            "headroom_bytes": self.headroom_bytes,
            "need_bytes": self.need_bytes,
            "usable_bytes": self.usable_bytes,
            "gpu_count": self.flavor.gpu_count,
            "price_per_hour": self.flavor.price_per_hour,
            "hours": self.hours,
            "cost": self.cost,
            "tokens_per_second": self.tokens_per_second,
            "slowdowns": [{"id": entry.id, "factor": entry.factor} for entry in self.slowdowns],
            "reason": self.reason,
        }


@dataclass(frozen=True)
class PlanReport:
    """Everything ``hwdash plan`` shows: the plan, the model, memory, fits and the recommendation."""

    plan: Plan
    model: ModelSpec
    estimate: MemoryEstimate
    flavors: tuple[FlavorFit, ...]
    recommended: str | None = None
    """Cheapest flavor that fits (by total cost when the data size is known, else by $/hour)."""
    fastest: str | None = None
    """Fastest flavor that fits."""
    tokens: int | None = None
    """Training tokens the time estimate uses."""
    warnings: tuple[str, ...] = field(default_factory=tuple)
    framework: Framework | None = field(default=None, compare=False)
    """The catalog's entry for ``plan.framework`` the estimate used (None: the packaged one). Left
    out of equality and the hash (a catalog entry holds a dict): the estimate it led to is in."""

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` object of ``hwdash plan``."""
        plan = self.plan.model_dump(mode="json")
        plan["model_id"] = self.model.id
        plan["model_name"] = self.model.name
        plan["total_params"] = self.estimate.total_params
        plan["trainable_params"] = self.estimate.trainable_params
        plan["tokens"] = self.tokens
        plan["compute_dtype"] = self.estimate.compute_dtype
        plan["peak_phase"] = self.estimate.peak_phase
        return {
            "plan": plan,
            "memory": self.estimate.memory_json(),
            "host_memory": self.estimate.host_bytes,
            "managed_memory": self.estimate.managed_bytes,
            "flavors": [fit.to_json() for fit in self.flavors],
            "recommended": self.recommended,
            "fastest": self.fastest,
            "warnings": list(self.warnings),
        }
