"""Make it fit: the smallest changes to a plan that make it fit a chosen flavor.

The search turns the knobs a practitioner turns, each through a short list of settings ordered from
the mildest to the most drastic (:func:`knobs_for`), and tries every combination of up to
:data:`MAX_CHANGES` knobs. A combination is kept when the plain estimator says it fits and no milder
combination (a subset of its knobs, each no further along) fits too: every option is *minimal*.
Options are ranked: those that keep the experiment first, and among them less slowdown, then lower
cost, then fewer changes; among those that change it, fewer changes first (:func:`rank_options`).

"Keeps the experiment" means the same model, method, data, numerics and global batch: gradient
checkpointing, a smaller micro-batch with more accumulation, the attention kernel, a fused optimizer
step, a chunked or fused-linear loss, activation offloading, the optimizer step fused into backward,
DeepSpeed ZeRO or PyTorch FSDP and CPU offload, FSDP's reduce-scatter after every micro-batch. Everything else (method, LoRA rank and targets,
optimizer, precision, sequence length) changes what is trained.

Speed: the hours of each option are the flavor table's (:mod:`hwdash.core.planning.run_time`: FLOPs, where
recomputation is one more forward and LoRA skips the weight gradients, times the catalog's
``[[slowdown]]`` factors for CPU offload and 8-bit and 4-bit dequantisation, each with its source), so
re-running an option's command gives the same hours; its slowdown is its step time over the plan's.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from hwdash.core.catalog import Catalog
from hwdash.core.estimator import (
    architecture,
    estimate_memory,
    resolve_lora_targets,
)
from hwdash.core.estimator.savers import resolve_savers
from hwdash.core.plan import (
    LORA_STYLE_METHODS,
    Attention,
    FsdpMode,
    Loss,
    Method,
    Offload,
    Optimizer,
    OptimizerImpl,
    Plan,
    Precision,
    Quant,
)
from hwdash.core.planning.fit import evaluate_flavor, training_tokens
from hwdash.core.results import FitVerdict, FlavorFit, PlanReport
from hwdash.core.specs import Accelerator, Flavor, Framework, ModelSpec, Slowdown

MAX_CHANGES = 3
"""Knobs changed at once at most (a fourth is tried only when three find nothing)."""

SHORTEST_SEQUENCE = 256
"""The search never proposes a sequence shorter than this (a truncated experiment is no experiment)."""

SMALLEST_RANK = 4
"""Nor a LoRA rank below this."""

CLOSEST_SHOWN = 3
"""Options shown when nothing fits the target: the ones least over its memory."""

CLOSE_RATIO = 1.5
"""A flavor "comes close" when the plan needs at most this many times its usable memory."""

EXCLUSIVE_KNOBS = (("zero", "fsdp"),)
"""Knobs never turned together (the plan refuses DeepSpeed ZeRO with PyTorch FSDP), in the order
:func:`knobs_for` lists them."""

ATTENTION_ONLY_TARGETS = ("q_proj", "v_proj")
"""LoRA on the query and value projections only: the original LoRA paper's choice (Hu et al. 2021,
arXiv:2106.09685, section 7.1)."""


@dataclass(frozen=True)
class Change:
    """One plan field changed by an option."""

    field: str
    """A :class:`~hwdash.core.plan.Plan` field name."""
    old: Any
    """The value before (JSON-ready: enums as their values)."""
    new: Any
    """The value after."""

    def to_json(self) -> dict[str, Any]:
        """``{"field", "from", "to"}``."""
        return {"field": self.field, "from": self.old, "to": self.new}


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


@dataclass(frozen=True)
class FitOption:
    """A set of changes that makes the plan fit the target flavor."""

    plan: Plan
    """The changed plan (re-checking it with the plain estimator gives ``fit``)."""
    changes: tuple[Change, ...]
    """Plan fields that differ from the original."""
    words: tuple[str, ...]
    """Each knob's change in words."""
    keeps_experiment: bool
    """Same model, method, data, numerics and global batch."""
    fit: FlavorFit
    """The changed plan on the target flavor (fits, or only tight when nothing fits)."""
    slowdown: float | None
    """Step time relative to the original plan on this flavor (1.3: 30% slower), the catalog's
    factors of both in; None when the flavor's speed is unknown."""
    slowdown_sources: tuple[str, ...] = ()
    """Sources of the catalog factors the option brings in (those the plan has already cancel)."""
    severity: int = 0
    """How far along its knobs the option goes (0: as it is; each knob's first setting counts 1):
    among options with as many changes, the milder comes first (LoRA before QLoRA)."""

    def to_json(self, args: Sequence[str]) -> dict[str, Any]:
        """One entry of ``"fit": {"options": [...]}``; ``args`` reproduce the plan on the CLI."""
        return {
            "flavor": self.fit.flavor.id,
            "changes": [change.to_json() for change in self.changes],
            "words": list(self.words),
            "keeps_experiment": self.keeps_experiment,
            "args": list(args),
            "memory_total": self.fit.need_bytes,
            "verdict": self.fit.verdict.value,
            "headroom_bytes": self.fit.headroom_bytes,
            "hours": self.fit.hours,
            "cost": self.fit.cost,
            "slowdown": None if self.slowdown is None else round(self.slowdown, 4),
        }


@dataclass(frozen=True)
class FitSearch:
    """What ``--fit TARGET`` found."""

    target: str
    """The flavor id, ``any``, ``local`` or ``local-free``."""
    fits_already: bool
    """The plan fits (with headroom) as it is: no change needed."""
    options: tuple[FitOption, ...] = ()
    """Ranked options (empty when nothing tried fits)."""
    evaluated: int = 0
    """Combinations the estimator was asked about (for the benchmark)."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    """Things to know about the search (nothing to try, only tight options...)."""
    closest: tuple[FitOption, ...] = ()
    """When nothing tried fits one target: the options that come closest on it, least over first
    (their verdict is ``no``); empty otherwise."""


# -- the knobs ------------------------------------------------------------------------------------


def _value(value: Any) -> Any:
    return getattr(value, "value", value)


def _halvings(start: int, floor: int) -> list[int]:
    values = []
    value = start // 2
    while value >= floor:
        values.append(value)
        value //= 2
    return values


def _trained_method(plan: Plan) -> Method:
    return plan.rl_method if plan.is_rl else plan.method


def knobs_for(
    plan: Plan, model: ModelSpec, gpu_count: int, framework: Framework | None = None
) -> list[Knob]:
    """The knobs worth turning for this plan on ``gpu_count`` GPUs (none that change nothing).
    ``framework``: the catalog's entry for ``plan.framework`` (None: the packaged one)."""
    knobs: list[Knob] = []
    training = plan.is_training
    method = _trained_method(plan)
    method_field = "rl_method" if plan.is_rl else "method"
    savers = resolve_savers(plan, framework) if training else None
    if training and not plan.grad_ckpt:
        # Checkpointing, then checkpointing with the checkpoints offloaded to host RAM (Unsloth's
        # offloaded checkpointing; torchtune's activation offloading on top of checkpointing).
        settings = [Setting({"grad_ckpt": True}, "gradient checkpointing")]
        if savers is not None and not savers.activation_offload:
            settings.append(
                Setting(
                    {"grad_ckpt": True, "activation_offload": True},
                    "gradient checkpointing + activation offloading to CPU",
                    ("activation-offload",),
                )
            )
        knobs.append(Knob("grad_ckpt", True, tuple(settings)))
    smaller = [b for b in range(plan.batch - 1, 0, -1) if plan.batch % b == 0]
    if smaller:
        settings = []
        for micro in smaller[:4]:
            if training:
                accum = plan.grad_accum * plan.batch // micro
                words = (
                    f"micro-batch {plan.batch}->{micro}, accumulation {plan.grad_accum}->{accum}"
                )
                settings.append(Setting({"batch": micro, "grad_accum": accum}, words))
            else:
                settings.append(Setting({"batch": micro}, f"batch {plan.batch}->{micro}"))
        knobs.append(Knob("micro_batch", True, tuple(settings)))
    if plan.attention is Attention.EAGER:
        knobs.append(
            Knob(
                "attention",
                True,
                (Setting({"attention": Attention.SDPA}, "sdpa attention (from eager)"),),
            )
        )
    if (
        training
        and plan.optimizer is Optimizer.ADAMW
        and plan.optimizer_impl is not OptimizerImpl.FUSED
    ):
        knobs.append(
            Knob(
                "optimizer_impl",
                True,
                (
                    Setting(
                        {"optimizer_impl": OptimizerImpl.FUSED},
                        f"fused AdamW (from {plan.optimizer_impl.value})",
                    ),
                ),
            )
        )
    if training:
        knobs += _saver_knobs(plan, framework)
        zero_settings = _zero_settings(plan, gpu_count)
        if zero_settings:
            knobs.append(Knob("zero", True, tuple(zero_settings)))
        fsdp_settings = _fsdp_settings(plan, gpu_count)
        if fsdp_settings:
            knobs.append(Knob("fsdp", True, tuple(fsdp_settings)))
        sharded = plan.fsdp is not FsdpMode.NONE or bool(fsdp_settings)
        accumulates = plan.grad_accum > 1 or any(k.name == "micro_batch" for k in knobs)
        if (
            savers is not None
            and not savers.sync_each_batch
            and sharded
            and accumulates
            and gpu_count > 1
        ):
            knobs.append(_sync_each_batch_knob())
    if training and plan.optimizer is Optimizer.ADAMW:
        # Paged 8-bit AdamW holds as many GPU bytes as 8-bit AdamW (NVML counts managed memory);
        # it goes further only because the driver may page its states out to host RAM, which the
        # flavor verdict calls tight (hwdash.core.planning.fit.evaluate_flavor): so it comes after 8-bit.
        knobs.append(
            Knob(
                "optimizer",
                False,
                (
                    Setting({"optimizer": Optimizer.ADAMW_8BIT}, "8-bit AdamW"),
                    Setting(
                        {"optimizer": Optimizer.ADAMW_8BIT_PAGED},
                        "paged 8-bit AdamW (states may spill to host RAM)",
                    ),
                    Setting({"optimizer": Optimizer.ADAFACTOR}, "Adafactor"),
                ),
            )
        )
    if training and plan.precision in (Precision.FP32, Precision.AMP, Precision.MIXED):
        knobs.append(
            Knob(
                "precision",
                False,
                (
                    Setting(
                        {"precision": Precision.BF16},
                        f"bf16 weights and states (from {plan.precision.value})",
                    ),
                ),
            )
        )
    if training and method in LORA_STYLE_METHODS:
        ranks = [r for r in _halvings(plan.lora_r, SMALLEST_RANK)][:3]
        if ranks:
            knobs.append(
                Knob(
                    "lora_r",
                    False,
                    tuple(Setting({"lora_r": r}, f"LoRA rank {plan.lora_r}->{r}") for r in ranks),
                )
            )
        targets = _attention_only_targets(plan, model)
        if targets is not None:
            knobs.append(
                Knob(
                    "lora_targets",
                    False,
                    (
                        Setting(
                            {"lora_targets": targets},
                            f"LoRA on {','.join(targets)} only",
                        ),
                    ),
                )
            )
    if training:
        ladder = _method_ladder(method)
        if ladder:
            knobs.append(
                Knob(
                    "method",
                    False,
                    tuple(
                        Setting(
                            {method_field: step},
                            f"{'policy ' if plan.is_rl else ''}{method.value}->{step.value}",
                            (step.value,) if step in (Method.QLORA, Method.LORA_8BIT) else (),
                        )
                        for step in ladder
                    ),
                )
            )
    if (
        plan.method is Method.INFERENCE
        and plan.quant is Quant.NONE
        and model.checkpoint_bits is None
    ):
        # 16-bit -> int8 -> 4-bit: quantized weights change what is measured (the outputs), so the
        # knob does not keep the experiment. int8 brings in the catalog's LLM.int8() factor; NF4
        # has none (bitsandbytes 0.40.0's release notes measure its batch-1 kernels faster than
        # 16-bit matmuls: 2.2x on Turing to 4.0x on Hopper).
        knobs.append(
            Knob(
                "quant",
                False,
                (
                    Setting(
                        {"quant": Quant.INT8}, "int8 weights (LLM.int8())", ("int8-inference",)
                    ),
                    Setting({"quant": Quant.NF4}, "4-bit NF4 weights (bitsandbytes)"),
                ),
            )
        )
    shorter = _halvings(plan.seq, SHORTEST_SEQUENCE)[:2]
    if shorter:
        knobs.append(
            Knob(
                "seq",
                False,
                tuple(Setting({"seq": s}, f"sequence {plan.seq}->{s}") for s in shorter),
            )
        )
    return knobs


def _zero_settings(plan: Plan, gpu_count: int) -> list[Setting]:
    """ZeRO stages that shard over ``gpu_count`` GPUs, then CPU offload (slowest last)."""
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
    knobs: list[Knob] = []
    losses = {
        Loss.STANDARD: (Loss.CHUNKED, Loss.FUSED_LINEAR),
        Loss.LEGACY: (Loss.CHUNKED, Loss.FUSED_LINEAR),
        Loss.CHUNKED: (Loss.FUSED_LINEAR,),
    }.get(savers.loss, ())
    if losses:
        knobs.append(
            Knob(
                "loss",
                True,
                tuple(
                    Setting(
                        {"loss": loss}, f"{loss.value} cross-entropy (from {savers.loss.value})"
                    )
                    for loss in losses
                ),
            )
        )
    if plan.grad_ckpt and not savers.activation_offload:
        knobs.append(
            Knob(
                "activation_offload",
                True,
                (
                    Setting(
                        {"activation_offload": True},
                        "activation offloading to CPU",
                        ("activation-offload",),
                    ),
                ),
            )
        )
    if (
        not savers.optimizer_in_backward
        and _trained_method(plan) is Method.FULL
        and not plan.is_rl
        and plan.grad_accum == 1
        and plan.zero == 0
        and plan.tp == 1
        and plan.pp == 1
    ):
        knobs.append(
            Knob(
                "optimizer_in_backward",
                True,
                (Setting({"optimizer_in_backward": True}, "optimizer step fused into backward"),),
            )
        )
    return knobs


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


# -- the search -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Candidate:
    levels: tuple[tuple[int, int], ...]
    """(knob index, setting index) pairs, knob indices ascending."""


def _dominates(small: _Candidate, large: _Candidate) -> bool:
    """Whether ``small`` turns a subset of ``large``'s knobs, each no further."""
    theirs = dict(large.levels)
    return all(knob in theirs and level <= theirs[knob] for knob, level in small.levels)


def _apply(plan: Plan, knobs: Sequence[Knob], candidate: _Candidate) -> Plan | None:
    updates: dict[str, Any] = {}
    for knob, level in candidate.levels:
        updates.update(knobs[knob].settings[level].updates)
    if "lora_r" in updates or "lora_targets" in updates:
        method = updates.get("method", updates.get("rl_method", _trained_method(plan)))
        if method not in LORA_STYLE_METHODS:
            return None  # a rank for a plan that no longer has adapters changes nothing
    try:
        changed = plan.with_changes(updates)
    except ValidationError:
        return None
    if changed.optimizer_in_backward and (changed.zero or changed.offload is not Offload.NONE):
        return None  # DeepSpeed steps the optimizer itself
    return changed


def _changes(original: Plan, changed: Plan) -> tuple[Change, ...]:
    out = []
    for name in Plan.model_fields:
        old, new = getattr(original, name), getattr(changed, name)
        if old != new:
            out.append(
                Change(
                    name,
                    list(old) if isinstance(old, tuple) else _value(old),
                    list(new) if isinstance(new, tuple) else _value(new),
                )
            )
    return tuple(out)


def _time_of(fit: FlavorFit) -> float | None:
    """Seconds per token on the flavor (the inverse throughput, the catalog's slowdowns in), or None."""
    if fit.tokens_per_second:
        return 1.0 / fit.tokens_per_second
    return None


def _relative_step_time(fit: FlavorFit, base: FlavorFit) -> float | None:
    """Seconds per token of ``fit`` over those of ``base`` (the plan as given), or None."""
    option_time, base_time = _time_of(fit), _time_of(base)
    if option_time is None or base_time is None:
        return None
    return option_time / base_time


def _new_slowdown_sources(fit: FlavorFit, base: FlavorFit) -> tuple[str, ...]:
    """The catalog factors in ``fit``'s time that ``base``'s lacks, each with its source."""
    return tuple(
        f"{entry.id}: x{entry.factor:g} ({entry.source})"
        for entry in fit.slowdowns
        if entry not in base.slowdowns
    )


def search_flavor(
    plan: Plan,
    model: ModelSpec,
    flavor: Flavor,
    accelerator: Accelerator,
    *,
    slowdowns: Mapping[str, Slowdown] | None = None,
    max_changes: int = MAX_CHANGES,
    flavor_fit: Callable[[Plan], FlavorFit] | None = None,
    keeps_only: bool = False,
    memory_cache: dict[tuple[Plan, int, str], int] | None = None,
    skip_knobs: frozenset[str] = frozenset(),
    framework: Framework | None = None,
    near_misses: list[FitOption] | None = None,
) -> tuple[bool, list[FitOption], int]:
    """(fits already, minimal options, combinations evaluated) for one flavor.

    ``flavor_fit`` evaluates a plan on the flavor (default: :func:`hwdash.core.planning.fit.evaluate_flavor`);
    it is a parameter so a caller can swap in a flavor built from live GPUs. ``keeps_only`` turns
    only the knobs that keep the experiment. ``memory_cache`` shares per-GPU needs between flavors
    with the same accelerator and GPU count. ``framework``: the catalog's entry for
    ``plan.framework`` (None: the packaged one); no knob changes the framework. ``slowdowns``: the
    catalog's step-time factors (None: the packaged ones). ``near_misses``: when given and nothing
    fits (nor is tight), it receives the :data:`CLOSEST_SHOWN` options that come closest, least
    memory over first.
    """

    def evaluate(candidate_plan: Plan) -> FlavorFit:
        if flavor_fit is not None:
            return flavor_fit(candidate_plan)
        # The candidate's own tokens: a shorter sequence truncates the examples (as re-running
        # the option's command counts them).
        return evaluate_flavor(
            candidate_plan,
            model,
            flavor,
            accelerator,
            training_tokens(candidate_plan),
            framework=framework,
            slowdowns=slowdowns,
        )[0]

    base = evaluate(plan)
    if base.verdict is FitVerdict.FITS:
        return True, [], 1
    usable = accelerator.usable_bytes
    knobs = knobs_for(plan, model, flavor.gpu_count, framework)
    knobs = [knob for knob in knobs if knob.name not in skip_knobs]
    if keeps_only:
        knobs = [knob for knob in knobs if knob.keeps_experiment]
    cache = {} if memory_cache is None else memory_cache
    evaluated = 1
    fitting: list[tuple[_Candidate, FlavorFit, Plan]] = []
    tight: list[tuple[_Candidate, FlavorFit, Plan]] = []
    over: list[tuple[int, int, _Candidate, Plan]] = []  # (memory per GPU, changes, ...)
    names = [knob.name for knob in knobs]
    exclusive = {
        (names.index(a), names.index(b)) for a, b in EXCLUSIVE_KNOBS if a in names and b in names
    }
    for size in range(1, max_changes + 1):
        for chosen in itertools.combinations(range(len(knobs)), size):
            if any(pair in exclusive for pair in itertools.combinations(chosen, 2)):
                continue  # two ways to do one thing (ZeRO or FSDP): never both
            for levels in itertools.product(*(range(len(knobs[k].settings)) for k in chosen)):
                candidate = _Candidate(tuple(zip(chosen, levels, strict=True)))
                if any(_dominates(found, candidate) for found, _fit, _plan in fitting):
                    continue
                changed = _apply(plan, knobs, candidate)
                if changed is None:
                    continue
                evaluated += 1
                # Memory first (cheap); the full flavor evaluation only for what may fit.
                key = (changed, flavor.gpu_count, accelerator.id)
                need = cache.get(key)
                if need is None:
                    estimate = estimate_memory(
                        changed,
                        model,
                        gpus=flavor.gpu_count,
                        accelerator=accelerator,
                        framework=framework,
                    )
                    # paged optimizer states may spill to host RAM (see evaluate_flavor)
                    need = estimate.per_gpu.total - estimate.managed_bytes
                    cache[key] = need
                if need > usable:
                    if near_misses is not None:
                        over.append((need, len(candidate.levels), candidate, changed))
                    continue
                fit = evaluate(changed)
                if fit.verdict is FitVerdict.FITS:
                    fitting.append((candidate, fit, changed))
                elif fit.verdict is FitVerdict.TIGHT:
                    tight.append((candidate, fit, changed))
        if fitting and size >= 1 and not _worth_going_on(fitting, knobs, base):
            break
    # Tight options come after the ones that fit, and only where no option that fits is milder.
    chosen_set = fitting + [
        entry
        for entry in _minimal(tight)
        if not any(_dominates(found, entry[0]) for found, _fit, _plan in fitting)
    ]
    options = [
        _option(plan, knobs, candidate, fit, changed, base)
        for candidate, fit, changed in chosen_set
    ]
    if near_misses is not None and not options:
        # Nothing fits: the combinations least over the memory, fewer changes first among equals.
        over.sort(key=lambda entry: (entry[0], entry[1]))
        for _need, _count, candidate, changed in over[:CLOSEST_SHOWN]:
            near_misses.append(_option(plan, knobs, candidate, evaluate(changed), changed, base))
    return False, options, evaluated


def _worth_going_on(
    fitting: list[tuple[_Candidate, FlavorFit, Plan]], knobs: Sequence[Knob], base: FlavorFit
) -> bool:
    """Go on to larger combinations while no option keeps the experiment at the plan's own speed:
    options that keep it are ranked by slowdown before their count of changes
    (:func:`rank_options`), so two savers at x1.0 must be found beside one offload at x3."""
    for candidate, fit, _plan in fitting:
        if all(knobs[knob].keeps_experiment for knob, _level in candidate.levels):
            slowdown = _relative_step_time(fit, base)
            if slowdown is None or round(slowdown, 3) <= 1.0:
                return False
    return True


def _minimal(
    found: list[tuple[_Candidate, FlavorFit, Plan]],
) -> list[tuple[_Candidate, FlavorFit, Plan]]:
    return [
        entry
        for entry in found
        if not any(other[0] != entry[0] and _dominates(other[0], entry[0]) for other in found)
    ]


def _option(
    plan: Plan,
    knobs: Sequence[Knob],
    candidate: _Candidate,
    fit: FlavorFit,
    changed: Plan,
    base: FlavorFit,
) -> FitOption:
    words = tuple(knobs[knob].settings[level].words for knob, level in candidate.levels)
    keeps = all(knobs[knob].keeps_experiment for knob, _level in candidate.levels)
    return FitOption(
        plan=changed,
        changes=_changes(plan, changed),
        words=words,
        keeps_experiment=keeps,
        fit=fit,
        slowdown=_relative_step_time(fit, base),
        slowdown_sources=_new_slowdown_sources(fit, base),
        severity=sum(level + 1 for _knob, level in candidate.levels),
    )


def rank_options(options: Iterable[FitOption], *, cost_first: bool = False) -> list[FitOption]:
    """Options that fit before tight ones; then those that keep the experiment. Among those that
    keep it, what the run pays comes first: less slowdown, then lower cost, then fewer and milder
    changes (ZeRO-3 with parameter offload at x4.5 is no better for being one change); among
    those that change it, fewer and milder changes first (the smaller departure from the
    experiment), then slowdown and cost. ``cost_first`` (``--fit any``: the cheapest options
    overall) puts cost first within each group."""

    def key(option: FitOption) -> tuple[Any, ...]:
        # rounded as shown (x1.50): float noise in the step times must not outrank a change
        slowdown = round(option.slowdown, 3) if option.slowdown is not None else float("inf")
        cost = option.fit.cost if option.fit.cost is not None else float("inf")
        price = option.fit.flavor.price_per_hour
        hourly = price if price is not None else float("inf")
        keeps = 0 if option.keeps_experiment else 1
        tight = 1 if option.fit.verdict is FitVerdict.TIGHT else 0
        changes = (len(option.words), option.severity)
        if cost_first:
            if option.keeps_experiment:
                return (tight, keeps, cost, hourly, slowdown, changes, option.fit.flavor.id)
            return (tight, keeps, cost, hourly, changes, slowdown, option.fit.flavor.id)
        if option.keeps_experiment:
            return (tight, keeps, slowdown, cost, changes, option.fit.flavor.id)
        return (tight, keeps, changes, slowdown, cost, option.fit.flavor.id)

    return sorted(options, key=key)


def _searchable(catalog: Catalog, flavor: Flavor) -> Accelerator | None:
    """The flavor's accelerator when the usual CUDA stack (or Apple MPS) runs there."""
    accelerator = catalog.accelerator_for(flavor)
    if accelerator is None or accelerator.kind not in ("gpu", "unified") or flavor.gpu_count == 0:
        return None
    return accelerator


def find_fit_options(
    plan: Plan,
    model: ModelSpec,
    catalog: Catalog,
    target: str,
    flavors: Sequence[Flavor],
    *,
    slowdowns: Mapping[str, Slowdown] | None = None,
    limit: int = 5,
) -> FitSearch:
    """Ranked options that make ``plan`` fit ``flavors``: one flavor (a flavor id, ``local``), or
    every flavor (``any``: the plan as it is on a flavor where it fits is an option too, with no
    changes, and options are ranked by cost). See the module docstring."""
    across = len(flavors) > 1
    if slowdowns is None:
        slowdowns = catalog.slowdowns  # the catalog's [[slowdown]] factors
    all_options: list[FitOption] = []
    fits_already = False
    evaluated = 0
    tokens = training_tokens(plan)
    searchable = [(f, a) for f in flavors if (a := _searchable(catalog, f)) is not None]
    cache: dict[tuple[Plan, int, str], int] = {}
    framework = catalog.framework_for(plan)
    # Passes: across many flavors, the knobs that keep the experiment first (an option that
    # changes the experiment never ranks above one that keeps it, so when those fill the list the
    # rest need not be searched); then every knob; a fourth knob only when three found nothing.
    passes = [(MAX_CHANGES, True)] if across else []
    passes += [(MAX_CHANGES, False), (MAX_CHANGES + 1, False)]
    near_misses: list[FitOption] = []
    for max_changes, keeps_only in passes:
        all_options = []
        near_misses = []
        for flavor, accelerator in searchable:
            already, options, count = search_flavor(
                plan,
                model,
                flavor,
                accelerator,
                slowdowns=slowdowns,
                max_changes=max_changes,
                keeps_only=keeps_only,
                memory_cache=cache,
                framework=framework,
                near_misses=None if across else near_misses,
            )
            evaluated += count
            fits_already = fits_already or already
            if already and across:
                fit = evaluate_flavor(
                    plan,
                    model,
                    flavor,
                    accelerator,
                    tokens,
                    framework=framework,
                    slowdowns=slowdowns,
                )[0]
                all_options.append(FitOption(plan, (), ("as it is",), True, fit, 1.0))
            all_options.extend(options)
        enough = sum(
            1 for o in all_options if o.fit.verdict is FitVerdict.FITS and o.keeps_experiment
        )
        if keeps_only and enough < limit:
            continue  # not enough that keep the experiment: search every knob
        if all_options or fits_already:
            break
    if fits_already and not across:
        all_options = []
    elif not across and searchable:
        # More GPUs of the same kind: the same flavor family with more of them (ZeRO shards the
        # states over them), as it is or with the knobs that keep the experiment.
        target_flavor, target_accelerator = searchable[0]
        for bigger in bigger_siblings(catalog, target_flavor):
            found, count = _on_more_gpus(
                plan, model, target_flavor, bigger, target_accelerator, slowdowns, cache, framework
            )
            evaluated += count
            all_options.extend(found)
    ranked = rank_options(all_options, cost_first=across)[:limit]
    notes: list[str] = []
    if not searchable:
        notes.append("no GPU flavor to fit: the target has no CUDA GPU")
    elif not ranked and not fits_already:
        notes.append(
            "nothing tried fits: no combination of the memory savers, cheaper methods and a "
            "shorter sequence brings the plan under this hardware's memory"
        )
    elif ranked and all(option.fit.verdict is FitVerdict.TIGHT for option in ranked):
        notes.append("only tight options (under 10% headroom): a memory spike may still OOM")
    # the target's own closest options (never another flavor's), when none fits it
    closest = tuple(near_misses) if not ranked and not fits_already and not across else ()
    return FitSearch(
        target=target,
        fits_already=fits_already,
        options=tuple(ranked),
        evaluated=evaluated,
        notes=tuple(notes),
        closest=closest,
    )


def bigger_siblings(catalog: Catalog, flavor: Flavor) -> list[Flavor]:
    """Flavors of the same provider with the same accelerator and a whole multiple of its GPUs."""
    return sorted(
        (
            other
            for other in catalog.flavors.values()
            if other.accelerator == flavor.accelerator
            and other.provider == flavor.provider
            and flavor.gpu_count > 0
            and other.gpu_count > flavor.gpu_count
            and other.gpu_count % flavor.gpu_count == 0
        ),
        key=lambda other: (other.gpu_count, other.id),
    )


def _on_more_gpus(
    plan: Plan,
    model: ModelSpec,
    flavor: Flavor,
    bigger: Flavor,
    accelerator: Accelerator,
    slowdowns: Mapping[str, Slowdown],
    cache: dict[tuple[Plan, int, str], int],
    framework: Framework | None = None,
) -> tuple[list[FitOption], int]:
    """Options on ``bigger``: the data-parallel copies multiply the global batch, so the
    accumulation is divided by the same factor where it can be (the experiment is kept)."""
    ratio = bigger.gpu_count // flavor.gpu_count
    keeps = plan.grad_accum % ratio == 0
    moved = plan.model_copy(
        update={
            "flavors": (bigger.id,),
            # the plan's own breakdown follows the GPUs (ZeRO and FSDP shard over them)
            "gpus": plan.gpus * ratio,
            "grad_accum": plan.grad_accum // ratio if keeps else plan.grad_accum,
        }
    )
    words = f"{bigger.gpu_count} GPUs: {flavor.id} -> {bigger.id}"
    if keeps and plan.grad_accum > 1:
        words += f", accumulation {plan.grad_accum}->{moved.grad_accum}"
    elif not keeps:
        words += f" (global batch x{ratio})"
    tokens = training_tokens(plan)
    base_fit = evaluate_flavor(
        plan, model, flavor, accelerator, tokens, framework=framework, slowdowns=slowdowns
    )[0]
    fits_as_is, options, count = search_flavor(
        moved,
        model,
        bigger,
        accelerator,
        slowdowns=slowdowns,
        max_changes=MAX_CHANGES - 1,
        keeps_only=True,
        memory_cache=cache,
        skip_knobs=frozenset({"micro_batch"}),  # the accumulation already moved with the GPUs
        framework=framework,
    )
    found: list[FitOption] = []
    if fits_as_is:
        fit = evaluate_flavor(
            moved, model, bigger, accelerator, tokens, framework=framework, slowdowns=slowdowns
        )[0]
        options = [FitOption(moved, (), (), True, fit, None)]
    for option in options:
        slowdown = _relative_step_time(option.fit, base_fit)
        if slowdown is None:
            slowdown = option.slowdown
        found.append(
            FitOption(
                plan=option.plan,
                changes=_changes(plan, option.plan),
                words=(words, *option.words),
                keeps_experiment=keeps and option.keeps_experiment,
                fit=option.fit,
                slowdown=slowdown,
                slowdown_sources=_new_slowdown_sources(option.fit, base_fit),
                severity=option.severity + 1,
            )
        )
    return found, count


def closest_flavor(report: PlanReport) -> FlavorFit | None:
    """The cheapest GPU flavor that comes close (needs at most 1.5x its memory), else the closest."""
    gpu_fits = [
        fit
        for fit in report.flavors
        if fit.accelerator is not None
        and fit.accelerator.kind in ("gpu", "unified")
        and fit.usable_bytes > 0
    ]
    if not gpu_fits:
        return None
    close = [fit for fit in gpu_fits if fit.need_bytes <= CLOSE_RATIO * fit.usable_bytes]
    if close:

        def price(fit: FlavorFit) -> tuple[float, float]:
            hourly = fit.flavor.price_per_hour
            return (float("inf") if hourly is None else hourly, fit.need_bytes / fit.usable_bytes)

        return min(close, key=price)
    return min(gpu_fits, key=lambda fit: fit.need_bytes / fit.usable_bytes)
