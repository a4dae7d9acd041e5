"""Make it fit, the knobs: what the search may change in a plan, and in which order.

Each knob is a dimension a practitioner turns (gradient checkpointing, the micro-batch, the
optimizer, the method...), with a short list of settings ordered from the mildest to the most
drastic; :func:`knobs_for` lists those worth turning for one plan on one GPU count. The search and
the ranking are in :mod:`hwdash.core.planning.fit_options`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hwdash.core.estimator import architecture, resolve_lora_targets
from hwdash.core.estimator.fsdp_versions import state_dict_kind
from hwdash.core.estimator.parallelism import root_keeps_ends
from hwdash.core.estimator.savers import Savers, resolve_savers
from hwdash.core.estimator.selective_ac import OP, SelectiveAcError, check_op_policy
from hwdash.core.estimator.zero_buffers import zero_settings
from hwdash.core.plan import (
    LORA_STYLE_METHODS,
    Attention,
    FsdpMode,
    FsdpStateDict,
    FsdpWrap,
    Loss,
    Method,
    Offload,
    Optimizer,
    OptimizerImpl,
    Plan,
    Precision,
    Quant,
)
from hwdash.core.plan_unused import plain_data_parallel
from hwdash.core.specs import Framework, ModelSpec

SHORTEST_SEQUENCE = 256
"""The search never proposes a sequence shorter than this (a truncated experiment is no experiment)."""

SMALLEST_RANK = 4
"""Nor a LoRA rank below this."""

LONG_SEQUENCE = 32768
"""From this sequence length the search offers splitting it over GPUs (``--cp``, ``--sp-ulysses``):
Megatron's and torchtitan's long-context recipes turn context parallelism on from 32k tokens."""

EXCLUSIVE_KNOBS = (("zero", "fsdp"),)
"""Knobs never turned together (the plan refuses DeepSpeed ZeRO with PyTorch FSDP), in the order
:func:`knobs_for` lists them."""

ATTENTION_ONLY_TARGETS = ("q_proj", "v_proj")
"""LoRA on the query and value projections only: the original LoRA paper's choice (Hu et al. 2021,
arXiv:2106.09685, section 7.1)."""


@dataclass(frozen=True)
class Setting:
    """One setting of one knob: the plan fields it sets and how it reads."""

    updates: Mapping[str, Any]
    """Plan fields and their new values."""
    words: str
    """What the change means, e.g. ``gradient checkpointing on``."""
    slowdown_keys: tuple[str, ...] = ()
    """Catalog slowdown ids this setting brings in (``offload-optimizer``, ``qlora``...)."""


@dataclass(frozen=True)
class Knob:
    """A dimension the search turns: settings ordered from the mildest to the most drastic."""

    name: str
    keeps_experiment: bool
    settings: tuple[Setting, ...]


def _halvings(start: int, floor: int) -> list[int]:
    values = []
    value = start // 2
    while value >= floor:
        values.append(value)
        value //= 2
    return values


def trained_method(plan: Plan) -> Method:
    """The method of what is trained: the policy's under RL, else the plan's."""
    return plan.rl_method if plan.is_rl else plan.method


def knobs_for(
    plan: Plan, model: ModelSpec, gpu_count: int, framework: Framework | None = None
) -> list[Knob]:
    """The knobs worth turning for this plan on ``gpu_count`` GPUs (none that change nothing).
    ``framework``: the catalog's entry for ``plan.framework`` (None: the packaged one)."""
    savers = resolve_savers(plan, framework) if plan.is_training else None
    knobs = _checkpointing_knobs(plan, savers, model) if savers is not None else []
    knobs += _micro_batch_knobs(plan)
    knobs += _attention_knobs(plan)
    if savers is not None:
        knobs += _fused_optimizer_knobs(plan)
        knobs += _saver_knobs(plan, framework)
        accumulates = plan.grad_accum > 1 or any(k.name == "micro_batch" for k in knobs)
        knobs += _sharding_knobs(plan, gpu_count, savers, accumulates)
        knobs += _long_context_knobs(plan, model, gpu_count)
        knobs += _zero_buffer_knobs(plan, model)
        knobs += _fsdp_buffer_knobs(plan)
        knobs += _optimizer_knobs(plan)
        knobs += _precision_knobs(plan)
        knobs += _lora_knobs(plan, model)
        knobs += _method_knobs(plan)
    knobs += _quant_knobs(plan, model)
    knobs += _sequence_knobs(plan)
    return knobs


def _checkpointing_knobs(plan: Plan, savers: Savers, model: ModelSpec) -> list[Knob]:
    """Checkpointing, then checkpointing with the checkpoints offloaded to host RAM (Unsloth's
    offloaded checkpointing; torchtune's activation offloading on top of checkpointing). An FSDP
    plan training in full first gets torchtitan's selective op policy (its FSDP recipes' milder
    step: ``activation_checkpoint.mode = "selective"``), where the model's blocks are counted
    for it (:func:`hwdash.core.estimator.selective_ac.check_op_policy`)."""
    if plan.grad_ckpt:
        return []
    full = {"grad_ckpt": True, "selective_ac": None}
    settings = []
    if _offers_selective_op(plan, model):
        settings.append(
            Setting({"selective_ac": OP}, "selective activation checkpointing (torchtitan's op)")
        )
    settings.append(Setting(full, "gradient checkpointing"))
    if not savers.activation_offload:
        settings.append(
            Setting(
                {**full, "activation_offload": True},
                "gradient checkpointing + activation offloading to CPU",
                ("activation-offload",),
            )
        )
    return [Knob("grad_ckpt", True, tuple(settings))]


def _offers_selective_op(plan: Plan, model: ModelSpec) -> bool:
    """Whether the search offers ``--selective-ac op``: an FSDP plan training in full (the op
    policy is counted for full training) on a decoder whose blocks it is counted for."""
    if plan.selective_ac is not None or plan.fsdp is FsdpMode.NONE:
        return False
    if trained_method(plan) is not Method.FULL or plan.activation_offload or model.encoder_only:
        return False
    try:
        check_op_policy(architecture(model))
    except SelectiveAcError:
        return False
    return True


def _micro_batch_knobs(plan: Plan) -> list[Knob]:
    """Smaller micro-batches (the divisors of the batch, up to four); a training plan accumulates
    more so the global batch stays the same."""
    smaller = [b for b in range(plan.batch - 1, 0, -1) if plan.batch % b == 0]
    if not smaller:
        return []
    settings = []
    for micro in smaller[:4]:
        if plan.is_training:
            accum = plan.grad_accum * plan.batch // micro
            words = f"micro-batch {plan.batch}->{micro}, accumulation {plan.grad_accum}->{accum}"
            settings.append(Setting({"batch": micro, "grad_accum": accum}, words))
        else:
            settings.append(Setting({"batch": micro}, f"batch {plan.batch}->{micro}"))
    return [Knob("micro_batch", True, tuple(settings))]


def _attention_knobs(plan: Plan) -> list[Knob]:
    """SDPA attention for a plan on eager attention (no full score matrix kept)."""
    if plan.attention is not Attention.EAGER:
        return []
    setting = Setting({"attention": Attention.SDPA}, "sdpa attention (from eager)")
    return [Knob("attention", True, (setting,))]


def _fused_optimizer_knobs(plan: Plan) -> list[Knob]:
    """The fused AdamW step for a training plan on AdamW's other implementations."""
    if plan.optimizer is not Optimizer.ADAMW or plan.optimizer_impl is OptimizerImpl.FUSED:
        return []
    setting = Setting(
        {"optimizer_impl": OptimizerImpl.FUSED},
        f"fused AdamW (from {plan.optimizer_impl.value})",
    )
    return [Knob("optimizer_impl", True, (setting,))]


def _sharding_knobs(plan: Plan, gpu_count: int, savers: Savers, accumulates: bool) -> list[Knob]:
    """DDP's gradients as views of its buckets, DeepSpeed ZeRO, PyTorch FSDP (never both:
    :data:`EXCLUSIVE_KNOBS`), and FSDP's reduce-scatter every micro-batch where the plan (or the
    micro-batch knob) accumulates."""
    knobs: list[Knob] = []
    if plain_data_parallel(plan, gpu_count) and not savers.ddp_bucket_view:
        knobs.append(_ddp_bucket_view_knob())
    zero_settings = _zero_settings(plan, gpu_count)
    if zero_settings:
        knobs.append(Knob("zero", True, tuple(zero_settings)))
    fsdp_settings = _fsdp_settings(plan, gpu_count)
    if plan.fsdp is FsdpMode.SHARD_GRAD_OP and gpu_count > 1:
        # FULL_SHARD frees each unit after its forward and gathers it again in backward
        fsdp_settings = [Setting({"fsdp": FsdpMode.FULL}, "FSDP full shard, not shard-grad-op")]
    if fsdp_settings:
        knobs.append(Knob("fsdp", True, tuple(fsdp_settings)))
    sharded = plan.fsdp is not FsdpMode.NONE or bool(fsdp_settings)
    if not savers.sync_each_batch and sharded and accumulates and gpu_count > 1:
        knobs.append(_sync_each_batch_knob())
    return knobs


def _long_context_knobs(plan: Plan, model: ModelSpec, gpu_count: int) -> list[Knob]:
    """A long sequence split over GPUs: context parallelism (ring attention) on Megatron and FSDP2
    plans, DeepSpeed-Ulysses elsewhere (heads divisible by it); expert parallelism for a MoE model
    on Megatron. Each split keeps the experiment (the same tokens, the same model)."""
    knobs: list[Knob] = []
    if plan.is_rl or not plan.is_training or gpu_count < 2 or plan.sequence_shards > 1:
        return knobs
    free = gpu_count // (plan.tp * plan.pp)
    sizes = [size for size in (2, 4, 8, 16) if size <= free and free % size == 0]
    if plan.seq >= LONG_SEQUENCE and sizes:
        ring = plan.megatron or (plan.fsdp is not FsdpMode.NONE and plan.fsdp_version == 2)
        if ring:
            settings = tuple(
                Setting({"cp": n, "gpus": gpu_count}, f"context parallel over {n} GPUs (ring)")
                for n in sizes
                if plan.seq % (2 * n) == 0
            )
            name = "cp"
        elif plan.zero:
            settings = tuple(
                Setting({"sp_ulysses": n, "gpus": gpu_count}, f"Ulysses sequence parallel over {n}")
                for n in sizes
                if plan.seq % n == 0 and model.heads % n == 0 and model.kv_heads % n == 0
            )
            name = "sp_ulysses"
        else:
            settings, name = (), ""
        if settings:
            knobs.append(Knob(name, True, settings))
    if plan.megatron and model.experts > 1 and plan.ep == 1:
        experts = tuple(
            Setting({"ep": n, "gpus": gpu_count}, f"experts split over {n} GPUs")
            for n in sizes
            if model.experts % n == 0
        )
        if experts:
            knobs.append(Knob("ep", True, experts))
    return knobs


def _optimizer_knobs(plan: Plan) -> list[Knob]:
    """Lighter optimizers than AdamW (they change the experiment).

    Paged 8-bit AdamW holds as many GPU bytes as 8-bit AdamW (NVML counts managed memory); it goes
    further only because the driver may page its states out to host RAM, which the flavor verdict
    calls tight (hwdash.core.planning.fit.evaluate_flavor): so it comes after 8-bit.
    """
    if plan.optimizer is not Optimizer.ADAMW:
        return []
    settings = (
        Setting({"optimizer": Optimizer.ADAMW_8BIT}, "8-bit AdamW"),
        Setting(
            {"optimizer": Optimizer.ADAMW_8BIT_PAGED},
            "paged 8-bit AdamW (states may spill to host RAM)",
        ),
        Setting({"optimizer": Optimizer.ADAFACTOR}, "Adafactor"),
    )
    return [Knob("optimizer", False, settings)]


def _precision_knobs(plan: Plan) -> list[Knob]:
    """bf16 weights and optimizer states for a plan in fp32 or mixed precision."""
    if plan.precision not in (Precision.FP32, Precision.AMP, Precision.MIXED):
        return []
    setting = Setting(
        {"precision": Precision.BF16},
        f"bf16 weights and states (from {plan.precision.value})",
    )
    return [Knob("precision", False, (setting,))]


def _lora_knobs(plan: Plan, model: ModelSpec) -> list[Knob]:
    """A smaller LoRA rank (halvings, down to :data:`SMALLEST_RANK`), then adapters on the query
    and value projections only."""
    if trained_method(plan) not in LORA_STYLE_METHODS:
        return []
    knobs: list[Knob] = []
    ranks = [r for r in _halvings(plan.lora_r, SMALLEST_RANK)][:3]
    if ranks:
        settings = tuple(Setting({"lora_r": r}, f"LoRA rank {plan.lora_r}->{r}") for r in ranks)
        knobs.append(Knob("lora_r", False, settings))
    targets = _attention_only_targets(plan, model)
    if targets is not None:
        setting = Setting({"lora_targets": targets}, f"LoRA on {','.join(targets)} only")
        knobs.append(Knob("lora_targets", False, (setting,)))
    return knobs


def _method_knobs(plan: Plan) -> list[Knob]:
    """Cheaper methods for the same model (:func:`_method_ladder`); the quantized ones bring in
    the catalog's factor of their name."""
    method = trained_method(plan)
    ladder = _method_ladder(method)
    if not ladder:
        return []
    method_field = "rl_method" if plan.is_rl else "method"
    settings = tuple(
        Setting(
            {method_field: step},
            f"{'policy ' if plan.is_rl else ''}{method.value}->{step.value}",
            (step.value,) if step in (Method.QLORA, Method.LORA_8BIT) else (),
        )
        for step in ladder
    )
    return [Knob("method", False, settings)]


def _quant_knobs(plan: Plan, model: ModelSpec) -> list[Knob]:
    """Quantized weights for inference on a 16-bit checkpoint.

    16-bit -> int8 -> 4-bit: quantized weights change what is measured (the outputs), so the knob
    does not keep the experiment. int8 brings in the catalog's LLM.int8() factor; NF4 has none
    (bitsandbytes 0.40.0's release notes measure its batch-1 kernels faster than 16-bit matmuls:
    2.2x on Turing to 4.0x on Hopper).
    """
    if (
        plan.method is not Method.INFERENCE
        or plan.quant is not Quant.NONE
        or model.checkpoint_bits is not None
    ):
        return []
    settings = (
        Setting({"quant": Quant.INT8}, "int8 weights (LLM.int8())", ("int8-inference",)),
        Setting({"quant": Quant.NF4}, "4-bit NF4 weights (bitsandbytes)"),
    )
    return [Knob("quant", False, settings)]


def _sequence_knobs(plan: Plan) -> list[Knob]:
    """A shorter sequence (two halvings at most, down to :data:`SHORTEST_SEQUENCE`)."""
    shorter = _halvings(plan.seq, SHORTEST_SEQUENCE)[:2]
    if not shorter:
        return []
    settings = tuple(Setting({"seq": s}, f"sequence {plan.seq}->{s}") for s in shorter)
    return [Knob("seq", False, settings)]


def _zero_settings(plan: Plan, gpu_count: int) -> list[Setting]:
    """ZeRO stages that shard over ``gpu_count`` GPUs, then CPU offload (slowest last); for a
    Megatron plan, :func:`_megatron_optimizer_settings`."""
    if plan.megatron:
        return _megatron_optimizer_settings(plan, gpu_count)
    settings: list[Setting] = []
    # Sharding over the flavor's GPUs: the plan's own breakdown (``--gpus``) follows, so the
    # option's command line shows the sharded memory.
    gpus = {"gpus": gpu_count} if gpu_count > 1 else {}
    if gpu_count > 1:
        for stage in (1, 2, 3):
            if stage > plan.zero and plan.offload is Offload.NONE:
                settings.append(Setting({"zero": stage, **gpus}, f"ZeRO-{stage}"))
    if plan.offload is Offload.NONE:
        stage = max(plan.zero, 2)
        settings.append(
            Setting(
                {"zero": stage, "offload": Offload.OPTIMIZER, **gpus},
                f"ZeRO-{stage} + optimizer offload to CPU",
                ("offload-optimizer",),
            )
        )
    if plan.offload is not Offload.PARAMS:
        settings.append(
            Setting(
                {"zero": 3, "offload": Offload.PARAMS, **gpus},
                "ZeRO-3 + parameter offload to CPU",
                ("offload-params",),
            )
        )
    return settings


#: The shares of its optimizer shard a Megatron plan may move to the host, mildest first: half
#: (the GPU keeps stepping the rest; ``--optimizer-offload-fraction``), then all of it.
MEGATRON_OFFLOAD_FRACTIONS = (0.5, 1.0)


def _megatron_optimizer_settings(plan: Plan, gpu_count: int) -> list[Setting]:
    """Megatron's distributed optimizer (``--zero 1``; stages 2-3 it does not run), then its
    optimizer CPU offload (megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py) of half,
    then all of each GPU's shard, with the plan's other GPUs on the flavor's count."""
    if plan.offload is not Offload.NONE and plan.optimizer_offload_fraction >= 1:
        return []
    gpus = {"gpus": gpu_count} if gpu_count > 1 else {}
    settings: list[Setting] = []
    if plan.zero == 0 and gpu_count > plan.tp * plan.pp * plan.cp:
        settings.append(Setting({"zero": 1, **gpus}, "Megatron distributed optimizer (ZeRO-1)"))
    for fraction in MEGATRON_OFFLOAD_FRACTIONS:
        if plan.offload is not Offload.NONE and fraction <= plan.optimizer_offload_fraction:
            continue
        share = "all" if fraction == 1 else f"{fraction:g}"
        settings.append(
            Setting(
                {
                    "zero": 1,
                    "offload": Offload.OPTIMIZER,
                    "optimizer_offload_fraction": fraction,
                    **gpus,
                },
                f"Megatron optimizer CPU offload ({share} of the optimizer shard)",
                ("megatron-offload-optimizer",),
            )
        )
    return settings


def _saver_knobs(plan: Plan, framework: Framework | None = None) -> list[Knob]:
    """The training stacks' memory savers that keep the experiment (:mod:`hwdash.core.estimator.savers`),
    each offered only where the plan (or its ``--framework``'s defaults) has it off.

    * loss: chunked, then fused-linear cross-entropy: the same loss, computed without the full
      fp32 logits (torchtune's ``CEWithChunkedOutputLoss``; Liger's fused linear cross-entropy);
    * activation offloading: the checkpoints go to host RAM. Only with gradient checkpointing
      (here when the plan has it; else the grad_ckpt knob's second setting): torchtune's
      memory_optimizations tutorial advises against it otherwise, as every saved tensor would
      cross PCIe;
    * optimizer in backward: full fine-tuning only (torchtune's ``optimizer_in_bwd`` exists in its
      full fine-tuning recipes), with no accumulation (the plan refuses it) and not under ZeRO
      (DeepSpeed runs its own optimizer step).
    """
    savers = resolve_savers(plan, framework)
    return [
        *_loss_knobs(savers),
        *_activation_offload_knobs(plan, savers),
        *_optimizer_in_backward_knobs(plan, savers),
    ]


def _loss_knobs(savers: Savers) -> list[Knob]:
    """Chunked, then fused-linear cross-entropy, from the loss the plan computes now."""
    losses = {
        Loss.STANDARD: (Loss.CHUNKED, Loss.FUSED_LINEAR),
        Loss.LEGACY: (Loss.CHUNKED, Loss.FUSED_LINEAR),
        Loss.CHUNKED: (Loss.FUSED_LINEAR,),
    }.get(savers.loss, ())
    if not losses:
        return []
    settings = tuple(
        Setting({"loss": loss}, f"{loss.value} cross-entropy (from {savers.loss.value})")
        for loss in losses
    )
    return [Knob("loss", True, settings)]


def _activation_offload_knobs(plan: Plan, savers: Savers) -> list[Knob]:
    """Activation offloading to host RAM, for a plan that checkpoints already."""
    if not plan.grad_ckpt or savers.activation_offload:
        return []
    setting = Setting(
        {"activation_offload": True}, "activation offloading to CPU", ("activation-offload",)
    )
    return [Knob("activation_offload", True, (setting,))]


def _optimizer_in_backward_knobs(plan: Plan, savers: Savers) -> list[Knob]:
    """The optimizer step fused into backward: full fine-tuning, no accumulation, no ZeRO, no
    tensor or pipeline parallelism."""
    if (
        savers.optimizer_in_backward
        or trained_method(plan) is not Method.FULL
        or plan.is_rl
        or plan.grad_accum != 1
        or plan.zero != 0
        or plan.tp != 1
        or plan.pp != 1
    ):
        return []
    setting = Setting({"optimizer_in_backward": True}, "optimizer step fused into backward")
    return [Knob("optimizer_in_backward", True, (setting,))]


def _ddp_bucket_view_knob() -> Knob:
    """Plain data parallelism: ``DistributedDataParallel(gradient_as_bucket_view=True)`` makes the
    gradients views of DDP's buckets and drops their copy, one gradient set (PyTorch's
    ``torch/nn/parallel/distributed.py`` docs). It keeps the experiment (the same all-reduce
    into the same buckets) and the speed: the docs name no cost, so no catalog factor is applied.
    One argument in the training code: no export writes it."""
    setting = Setting(
        {"ddp_bucket_view": True}, "DDP gradients as views of its buckets (gradient_as_bucket_view)"
    )
    return Knob("ddp_bucket_view", True, (setting,))


def _sync_each_batch_knob() -> Knob:
    """FSDP with accumulation: a reduce-scatter after every micro-batch instead of the Trainer's
    ``no_sync``, which keeps the whole unsharded gradient (:mod:`hwdash.core.estimator.parallelism`,
    ``keeps_unsharded_gradients``). Offered where FSDP is on or offered, on more than one GPU,
    and the plan accumulates or the micro-batch knob would make it. It keeps the experiment (the
    same sums, reduced earlier). It costs one reduce-scatter per micro-batch instead of per step;
    accelerate's guide warns of a slowdown but measures none for FSDP (docs
    concept_guides/gradient_synchronization.md), so no catalog factor is applied."""
    return Knob(
        "sync_each_batch",
        True,
        (
            Setting(
                {"sync_each_batch": True},
                "FSDP gradients reduce-scattered every micro-batch (sync_each_batch)",
            ),
        ),
    )


def _fsdp_settings(plan: Plan, gpu_count: int) -> list[Setting]:
    """PyTorch FSDP full shard over the flavor's GPUs, then with CPU offload: an alternative to
    ZeRO (the plan takes one or the other), for a fine-tuning plan not sharded yet."""
    if (
        gpu_count < 2
        or plan.is_rl
        or plan.fsdp is not FsdpMode.NONE
        or plan.zero
        or plan.offload is not Offload.NONE
        or plan.tp > 1
        or plan.pp > 1
    ):
        return []
    return [
        Setting(
            {"fsdp": FsdpMode.FULL, "gpus": gpu_count}, f"FSDP full shard over {gpu_count} GPUs"
        ),
        Setting(
            {"fsdp": FsdpMode.FULL, "fsdp_offload": True, "gpus": gpu_count},
            f"FSDP full shard over {gpu_count} GPUs + CPU offload",
            ("offload-params",),
        ),
    ]


def _method_ladder(method: Method) -> list[Method]:
    """Cheaper ways to train the same model: full -> LoRA -> 8-bit LoRA -> QLoRA (DoRA -> LoRA)."""
    ladders = {
        Method.FULL: [Method.LORA, Method.LORA_8BIT, Method.QLORA],
        Method.DORA: [Method.LORA, Method.LORA_8BIT, Method.QLORA],
        Method.LORA: [Method.LORA_8BIT, Method.QLORA],
        Method.LORA_8BIT: [Method.QLORA],
    }
    return ladders.get(method, [])


def _attention_only_targets(plan: Plan, model: ModelSpec) -> tuple[str, ...] | None:
    """The query and value projections by the model's own module names (T5's ``q`` and ``v``);
    None where the family fuses them with the key (GPT-2's ``c_attn``: no such choice)."""
    arch = architecture(model)
    names = tuple(
        linear.path.rsplit(".", 1)[-1]
        for linear in arch.linears
        if linear.name in ATTENTION_ONLY_TARGETS
    )
    if len(names) != len(ATTENTION_ONLY_TARGETS) or tuple(plan.lora_targets) == names:
        return None
    try:
        chosen = resolve_lora_targets(arch, names)
        current = resolve_lora_targets(arch, plan.lora_targets)
    except ValueError:
        return None
    if len(chosen) >= len(current):
        return None
    return names


#: DeepSpeed's advice when ZeRO-3 runs out of memory: lower ``stage3_max_live_parameters`` and
#: ``stage3_max_reuse_distance`` (DeepSpeed's config docs, "Parameter offloading" / ZeRO-3
#: section, https://www.deepspeed.ai/docs/config-json/); the search offers a tenth of the plan's.
ZERO3_LIVE_FRACTION = 10


def _zero_buffer_knobs(plan: Plan, model: ModelSpec) -> list[Knob]:
    """DeepSpeed's buffers, smaller (:mod:`hwdash.core.estimator.zero_buffers`), for a plan on
    ZeRO: the reduce bucket at the Hugging Face Trainer's ``auto`` (hidden^2) where that is
    smaller, else a quarter; at stage 3 also fewer live parameters, a shorter reuse distance and a
    prefetch no larger than the Trainer's ``auto``. The same training, more and smaller
    collectives (no catalog factor)."""
    if plan.zero == 0 or not plan.is_training:
        return []
    hidden = model.hidden_size
    current = zero_settings(plan, hidden)
    bucket = (
        hidden * hidden if hidden * hidden < current.reduce_bucket else current.reduce_bucket // 4
    )
    settings: list[Setting] = []
    if 0 < bucket < current.reduce_bucket:
        settings.append(
            Setting(
                {"ds_reduce_bucket": bucket},
                f"ZeRO reduce bucket {current.reduce_bucket:.2g}->{bucket:.2g} elements",
            )
        )
    if plan.zero == 3:
        live = current.max_live_parameters // ZERO3_LIVE_FRACTION
        reuse = current.max_reuse_distance // ZERO3_LIVE_FRACTION
        prefetch = min(current.prefetch_bucket, int(0.9 * hidden * hidden))
        updates: dict[str, Any] = {
            "ds_max_live_params": live,
            "ds_max_reuse_distance": reuse,
            "ds_prefetch_bucket": prefetch,
        }
        if settings:
            updates.update(settings[-1].updates)
        settings.append(
            Setting(
                updates,
                f"ZeRO-3 live parameters {current.max_live_parameters:.2g}->{live:.2g}, reuse "
                f"distance {current.max_reuse_distance:.2g}->{reuse:.2g}, prefetch "
                f"{prefetch:.2g}" + (" and the smaller reduce bucket" if len(updates) > 3 else ""),
            )
        )
    return [Knob("zero_buffers", True, tuple(settings))] if settings else []


def _fsdp_buffer_knobs(plan: Plan) -> list[Knob]:
    """FSDP's own extras turned off (:mod:`hwdash.core.estimator.fsdp_versions`): FSDP1's
    ``limit_all_gathers`` back on, the reduce-scatter in the gathered dtype instead of fp32, and a
    sharded state dict instead of FULL_STATE_DICT (whose gather at save is the checkpoint-save
    phase's transient, :func:`~hwdash.core.estimator.fsdp_versions.state_dict_kind`), and each
    decoder block its own unit where the whole model was one (``--fsdp-wrap none``)."""
    if plan.fsdp is FsdpMode.NONE:
        return []
    knobs: list[Knob] = []
    if plan.fsdp_wrap is FsdpWrap.NONE:
        setting = Setting(
            {"fsdp_wrap": FsdpWrap.TRANSFORMER},
            "FSDP wraps each decoder block (one block gathered at a time)",
        )
        knobs.append(Knob("fsdp_wrap", True, (setting,)))
    elif plan.fsdp_version != 1 and root_keeps_ends(plan):
        setting = Setting(
            {"fsdp_wrap": FsdpWrap.TRANSFORMER_ENDS},
            "FSDP wraps the embedding and output layer too (torchtitan-style; accelerate 1.14+)",
        )
        knobs.append(Knob("fsdp_wrap", True, (setting,)))
    if plan.fsdp_version == 1 and plan.fsdp_limit_all_gathers is False:
        setting = Setting({"fsdp_limit_all_gathers": True}, "FSDP1 limit_all_gathers on")
        knobs.append(Knob("fsdp_limit_all_gathers", True, (setting,)))
    if plan.fsdp_reduce_fp32:
        setting = Setting({"fsdp_reduce_fp32": False}, "FSDP reduce-scatter in bf16 (from fp32)")
        knobs.append(Knob("fsdp_reduce_fp32", False, (setting,)))
    if state_dict_kind(plan) is FsdpStateDict.FULL:
        setting = Setting(
            {"fsdp_state_dict": FsdpStateDict.SHARDED},
            "FSDP sharded state dict (no gather at save)",
        )
        knobs.append(Knob("fsdp_state_dict", True, (setting,)))
    return knobs
