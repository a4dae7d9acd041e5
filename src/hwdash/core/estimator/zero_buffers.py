"""DeepSpeed ZeRO's runtime buffers, from the plan's DeepSpeed settings (or DeepSpeed's defaults).

What DeepSpeed allocates beside the model states the ZeRO paper counts
(:mod:`hwdash.core.estimator.states`): the gradient reduce buckets, ZeRO-3's gathered ("live")
parameters and the small parameters it never partitions, the fp32 gradients of one optimizer
sub-group, and ZeRO-Offload's staging buffers. Sources (DeepSpeed, deepspeedai/DeepSpeed at master,
August 2026):

* Defaults: ``deepspeed/runtime/zero/config.py`` (``DeepSpeedZeroConfig``): ``reduce_bucket_size``
  5e8, ``allgather_bucket_size`` 5e8, ``contiguous_gradients`` True, ``overlap_comm`` None, which
  its validator turns into ``stage == 3``, ``stage3_prefetch_bucket_size`` 5e7,
  ``stage3_max_live_parameters`` 1e9, ``stage3_max_reuse_distance`` 1e9,
  ``stage3_param_persistence_threshold`` 1e5, ``sub_group_size`` 1e9.
* The Hugging Face Trainer's ``"auto"``: ``transformers/integrations/deepspeed.py``
  (``HfTrainerDeepSpeedConfig.trainer_config_finalize``): ``reduce_bucket_size`` = hidden^2,
  ``stage3_prefetch_bucket_size`` = int(0.9 hidden^2), ``stage3_param_persistence_threshold`` =
  10 hidden.
* Stages 1-2, ``deepspeed/runtime/zero/stage_1_and_2.py``: ``setup_buckets`` allocates, at the
  start of each backward, one reduce bucket of ``reduce_bucket_size`` elements in the optimizer's
  parameter dtype (``self.dtype``: the 16-bit module under bf16/fp16) when
  ``contiguous_gradients`` is on, and a second one with ``overlap_comm`` ("double buffers");
  ``_release_ipg_buffers`` frees them once backward's reduction is done, before the step. Without
  ``contiguous_gradients`` no buffer is allocated: the gradients waiting for their bucket stay
  where autograd made them (at most one bucket's worth, two with ``overlap_comm``). With CPU
  offload, ``temp_grad_buffer_for_gpu_offload`` holds the largest parameter's gradient on the GPU,
  and its pinned twin ``temp_grad_buffer_for_cpu_offload`` on the host; the fp32 gradient
  partition (``single_partition_of_fp32_groups[i].grad``) is fp32 and pinned on the host.
  ``allgather_bucket_size``: ``deepspeed/runtime/utils.py`` ``all_gather_dp_groups`` hands the
  gather to ``all_gather_into_tensor_dp_groups`` whenever torch has ``all_gather_into_tensor``
  (every torch DeepSpeed supports today), which gathers into the 16-bit flat groups in place: no
  bucket is allocated.
* Stage 3, ``deepspeed/runtime/zero/stage3.py``: one reduce bucket of ``reduce_bucket_size``
  elements per gradient dtype, allocated once at init (alive always); without offload,
  ``_prepare_fp32_grad_for_sub_group`` makes the fp32 gradient of one sub-group at a time
  (``_create_fp16_sub_groups``: parameters added to a sub-group until it holds
  ``sub_group_size`` elements); with CPU offload the step runs on the host and the sub-group
  buffers live there (``subgroup_gradient_buffer``, pinned), next to the 16-bit gradient
  partition (``grad_partitions_flat_buffer`` in ``gradient_accumulation_dtype``, the model's
  dtype unless ``data_types.grad_accum_dtype`` says otherwise, ``engine.py`` ``get_data_types``).
* Stage 3's gathered parameters, ``deepspeed/runtime/zero/partitioned_param_coordinator.py``:
  a module's own parameters are gathered before it runs (``fetch_sub_module``); prefetching
  gathers up to ``min(stage3_max_live_parameters - available, stage3_prefetch_bucket_size)``
  elements more; ``__params_to_release`` keeps a module's parameters gathered when the trace uses
  them again within ``stage3_max_reuse_distance`` elements. From forward to backward a module is
  used again after the modules behind it run forward and backward (twice their parameters), so the
  last ``max_reuse_distance / 2`` elements of the model stay gathered into backward.
  ``parameter_offload.py`` ``mark_persistent_parameters``: parameters of at most
  ``stage3_param_persistence_threshold`` elements are never partitioned (every GPU keeps them).
"""

from __future__ import annotations

from dataclasses import dataclass

from hwdash.core.estimator import phases as est_phases
from hwdash.core.estimator.architecture import Architecture
from hwdash.core.plan import Offload, Plan

#: DeepSpeed's defaults, deepspeed/runtime/zero/config.py (``DeepSpeedZeroConfig``), in elements.
REDUCE_BUCKET_DEFAULT = 500_000_000
ALLGATHER_BUCKET_DEFAULT = 500_000_000
PREFETCH_BUCKET_DEFAULT = 50_000_000
MAX_LIVE_PARAMETERS_DEFAULT = 1_000_000_000
MAX_REUSE_DISTANCE_DEFAULT = 1_000_000_000
PERSISTENCE_THRESHOLD_DEFAULT = 100_000
SUB_GROUP_SIZE_DEFAULT = 1_000_000_000

#: The Hugging Face Trainer's "auto" prefetch bucket: int(0.9 * hidden^2)
#: (transformers/integrations/deepspeed.py, ``trainer_config_finalize``).
AUTO_PREFETCH_FRACTION = 0.9
#: The Trainer's "auto" persistence threshold: 10 * hidden (same function).
AUTO_PERSISTENCE_PER_HIDDEN = 10

#: DeepSpeed's fp32 master gradients (the optimizer's partition dtype).
FP32_BYTES = 4


@dataclass(frozen=True)
class ZeroSettings:
    """A plan's DeepSpeed settings, each resolved to the number DeepSpeed runs with."""

    reduce_bucket: int
    allgather_bucket: int
    overlap_comm: bool
    contiguous_gradients: bool
    prefetch_bucket: int
    max_live_parameters: int
    max_reuse_distance: int
    persistence_threshold: int
    sub_group_size: int


def zero_settings(plan: Plan, hidden: int) -> ZeroSettings:
    """The plan's DeepSpeed settings: None is DeepSpeed's default, ``auto`` the Trainer's value
    for a model of width ``hidden``."""

    def pick(value: int | str | None, default: int, auto: int) -> int:
        if value is None:
            return default
        return auto if value == "auto" else int(value)

    overlap = plan.ds_overlap_comm
    return ZeroSettings(
        reduce_bucket=pick(plan.ds_reduce_bucket, REDUCE_BUCKET_DEFAULT, hidden * hidden),
        allgather_bucket=pick(plan.ds_allgather_bucket, ALLGATHER_BUCKET_DEFAULT, 0),
        overlap_comm=plan.zero == 3 if overlap is None else overlap,
        contiguous_gradients=plan.ds_contiguous_gradients is not False,
        prefetch_bucket=pick(
            plan.ds_prefetch_bucket,
            PREFETCH_BUCKET_DEFAULT,
            int(AUTO_PREFETCH_FRACTION * hidden * hidden),
        ),
        max_live_parameters=pick(plan.ds_max_live_params, MAX_LIVE_PARAMETERS_DEFAULT, 0),
        max_reuse_distance=pick(plan.ds_max_reuse_distance, MAX_REUSE_DISTANCE_DEFAULT, 0),
        persistence_threshold=pick(
            plan.ds_persistence_threshold,
            PERSISTENCE_THRESHOLD_DEFAULT,
            AUTO_PERSISTENCE_PER_HIDDEN * hidden,
        ),
        sub_group_size=pick(plan.ds_sub_group_size, SUB_GROUP_SIZE_DEFAULT, 0),
    )


def _elements(count: float) -> str:
    """``5e8``, ``1.2e7``: an element count as DeepSpeed's configs write them."""
    if count == 0:
        return "0"
    text = f"{count:.1e}".replace("e+0", "e").replace("e+", "e").replace(".0e", "e")
    return text


# --------------------------------------------------------------------------------------------------
# The reduce bucket (every stage) and ZeRO-Offload's gradient staging (stages 1-2).
# --------------------------------------------------------------------------------------------------


def reduce_bucket_buffers(settings: ZeroSettings, zero: int) -> int:
    """How many reduce buckets DeepSpeed keeps: two at stages 1-2 with ``overlap_comm``
    (``setup_buckets``' double buffers), one at stage 3 (``stage3.py`` allocates one per dtype)."""
    return 2 if zero in (1, 2) and settings.overlap_comm else 1


def reduce_bucket_bytes(
    settings: ZeroSettings, zero: int, trainable: int, gradient_bytes: int
) -> float:
    """Bytes of the reduce buckets: ``reduce_bucket_size`` elements of the gradients' dtype per
    buffer, allocated in full with ``contiguous_gradients``; without it, the gradients waiting for
    a bucket, at most one bucket (and never more than every trainable parameter) per buffer."""
    per_buffer = float(settings.reduce_bucket)
    if not settings.contiguous_gradients:
        per_buffer = float(min(settings.reduce_bucket, trainable))
    return per_buffer * gradient_bytes * reduce_bucket_buffers(settings, zero)


def add_reduce_buckets(
    plan: Plan,
    arch: Architecture,
    trainable: int,
    largest_trained: int,
    gradient_bytes: int,
    acc: est_phases._Accumulator,
) -> None:
    """The reduce buckets (stage 1-2: alive during backward only; stage 3: always), the stage 1-2
    all-gather bucket (none: gathered in place) and ZeRO-Offload's gradient staging buffers."""
    if plan.zero == 0:
        return
    settings = zero_settings(plan, arch.hidden)
    buckets = reduce_bucket_bytes(settings, plan.zero, trainable, gradient_bytes)
    count = reduce_bucket_buffers(settings, plan.zero)
    how = "buffer" if settings.contiguous_gradients else "gradients waiting, at most"
    how = how if count == 1 or not settings.contiguous_gradients else "buffers"
    label = (
        f"ZeRO reduce bucket ({_elements(settings.reduce_bucket)} elements x {count} {how}, "
        f"{gradient_bytes}-byte)"
    )
    if plan.zero == 3:
        acc.persistent_gradients += buckets
        acc.note(label, buckets)
    else:
        # freed by _release_ipg_buffers at the end of backward's reduction, before the step
        acc.unsynced_gradients += buckets
        acc.note(label, buckets, est_phases._BACKWARD_ONLY | est_phases._BACKWARD_END_ONLY)
        acc.note(
            f"ZeRO all-gather bucket ({_elements(settings.allgather_bucket)} elements: gathered in "
            "place, none allocated)",
            0,
        )
        if plan.offload is not Offload.NONE:
            staging = float(largest_trained * gradient_bytes)
            acc.persistent_gradients += staging
            acc.host += staging
            acc.note(
                "ZeRO-Offload gradient staging (largest parameter, GPU and pinned host)", staging
            )


def offload_host_gradient_bytes(zero: int, weight_bytes: int) -> int:
    """Bytes per trained parameter of the gradients ZeRO-Offload keeps on the host: the fp32
    gradient partition (stages 1-2 ``single_partition_of_fp32_groups[i].grad``; stage 3's
    ``subgroup_gradient_buffer``), plus at stage 3 the 16-bit ``grad_partitions_flat_buffer``."""
    return FP32_BYTES + (weight_bytes if zero == 3 else 0)


# --------------------------------------------------------------------------------------------------
# ZeRO-3: persistent and gathered parameters, the step's sub-group.
# --------------------------------------------------------------------------------------------------


def persistent_params(arch: Architecture, threshold: int) -> int:
    """Parameters ZeRO-3 never partitions: every tensor of at most ``threshold`` elements (norm
    weights and biases are ``hidden`` wide, a bias ``out_features``, the router ``experts x
    hidden``; a weight matrix only on a toy model)."""
    per_layer = 0
    for linear in arch.linears:
        weight = linear.in_features * linear.out_features * linear.copies
        if weight <= threshold:
            per_layer += weight
        if linear.bias and linear.out_features * linear.copies <= threshold:
            per_layer += linear.out_features * linear.copies
    if arch.hidden <= threshold:
        per_layer += arch.norm_params_per_layer
    if 0 < arch.router_params_per_layer <= threshold:
        per_layer += arch.router_params_per_layer
    persistent = per_layer * arch.layers
    if arch.hidden <= threshold:
        persistent += arch.final_norm_params
    return min(arch.total_params, persistent)


def largest_module_params(arch: Architecture) -> int:
    """The largest module ZeRO-3 gathers at once: its hooks fetch one module's own parameters
    (a linear layer, a fused expert weight, the embedding or the LM head)."""
    largest_linear = max(
        (linear.in_features * linear.out_features * linear.copies for linear in arch.linears),
        default=0,
    )
    return max(largest_linear, arch.embedding_params, arch.lm_head_params)


@dataclass(frozen=True)
class Zero3Gathered:
    """Parameters (elements) ZeRO-3 holds gathered on a GPU."""

    kept: float
    """Kept gathered from forward into backward (``stage3_max_reuse_distance``)."""
    running: float
    """The module running now."""
    prefetched: float
    """Gathered ahead (``stage3_prefetch_bucket_size``, up to ``stage3_max_live_parameters``)."""
    persistent: float
    """Never partitioned (``stage3_param_persistence_threshold``)."""

    @property
    def start_of_backward(self) -> float:
        return self.kept + self.running + self.prefetched

    @property
    def end_of_backward(self) -> float:
        return self.running + self.prefetched


def zero3_gathered(plan: Plan, arch: Architecture) -> Zero3Gathered:
    """The parameters ZeRO-3 keeps gathered at the start and the end of backward (see the module
    docstring): the last ``max_reuse_distance / 2`` elements kept from forward, the running module,
    and a prefetch of ``min(prefetch_bucket, max_live - gathered)``, all within the partitioned
    parameters; at the end of backward nothing is reused within the step, so only the running
    module and the prefetch."""
    settings = zero_settings(plan, arch.hidden)
    persistent = persistent_params(arch, settings.persistence_threshold)
    partitioned = float(max(0, arch.total_params - persistent))
    running = min(partitioned, float(largest_module_params(arch)))
    kept = min(partitioned - running, settings.max_reuse_distance / 2)
    room = max(0.0, settings.max_live_parameters - kept - running)
    prefetched = min(partitioned - running - kept, float(settings.prefetch_bucket), room)
    return Zero3Gathered(
        kept=kept, running=running, prefetched=max(0.0, prefetched), persistent=float(persistent)
    )


def add_zero3_weights(
    plan: Plan,
    arch: Architecture,
    total_bytes: float,
    dp: int,
    acc: est_phases._Accumulator,
    label: str,
) -> tuple[float, float]:
    """Weights of one model (``total_bytes`` over ``arch.total_params``) under ``plan``'s ZeRO:
    return the bytes on the GPU in every phase and on the host. Below stage 3 every weight is on
    the GPU. At stage 3 the GPU keeps its partition and the persistent parameters always, and the
    gathered parameters during forward and backward (added here, with the activations, as FSDP's
    gathered units are); with parameter offload the partitions live on the host. On one GPU the
    partition is the whole model and a gather still allocates its own full-size buffer
    (``partition_parameters.py``'s all-gather allocates ``partition size x world size`` whatever
    the world size), so the gathered parameters are counted there too: ZeRO-3 on one GPU costs
    more than no ZeRO, and more GPUs never need more per GPU."""
    offloaded = plan.offload is Offload.PARAMS
    if plan.zero < 3:
        return total_bytes, 0.0
    per_param = total_bytes / max(1, arch.total_params)
    gathered = zero3_gathered(plan, arch)
    persistent = gathered.persistent * per_param
    partition = (total_bytes - persistent) / max(1, dp)
    start = gathered.start_of_backward * per_param
    end = gathered.end_of_backward * per_param
    acc.activations += start
    acc.last_layer_activations += end
    settings = zero_settings(plan, arch.hidden)
    acc.note(
        f"{label} ZeRO-3 live parameters: kept for reuse (max reuse distance "
        f"{_elements(settings.max_reuse_distance)} / 2)",
        gathered.kept * per_param,
        est_phases._BACKWARD_ONLY,
    )
    acc.note(
        f"{label} ZeRO-3 live parameters: running module",
        gathered.running * per_param,
        est_phases._BACKWARD_ONLY | est_phases._BACKWARD_END_ONLY,
    )
    acc.note(
        f"{label} ZeRO-3 prefetch bucket ({_elements(settings.prefetch_bucket)} elements, max "
        f"live {_elements(settings.max_live_parameters)})",
        gathered.prefetched * per_param,
        est_phases._BACKWARD_ONLY | est_phases._BACKWARD_END_ONLY,
    )
    acc.note(
        f"{label} ZeRO-3 persistent parameters (tensors <= "
        f"{_elements(settings.persistence_threshold)} elements, not partitioned)",
        persistent,
    )
    if offloaded:
        return persistent, total_bytes
    return partition + persistent, 0.0


def zero3_sub_group_fp32_gradients(
    plan: Plan, arch: Architecture, partition_params: float, largest_partition: float
) -> float:
    """Elements of the fp32 gradients ZeRO-3 holds on the GPU at the step without offload: one
    sub-group's (``sub_group_size``, overrun by up to one parameter's partition), at most the
    whole partition."""
    settings = zero_settings(plan, arch.hidden)
    return min(partition_params, settings.sub_group_size + largest_partition)
