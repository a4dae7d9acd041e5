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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from hwdash.core.catalog import Catalog
from hwdash.core.estimator import estimate_memory
from hwdash.core.estimator.software import Software
from hwdash.core.plan import LORA_STYLE_METHODS, Offload, Plan
from hwdash.core.planning.budget import dropped_note, split_over_budget
from hwdash.core.planning.fit import evaluate_flavor, training_tokens
from hwdash.core.planning.fit_knobs import (
    ATTENTION_ONLY_TARGETS,
    EXCLUSIVE_KNOBS,
    SHORTEST_SEQUENCE,
    SMALLEST_RANK,
    Knob,
    Setting,
    knobs_for,
    trained_method,
)
from hwdash.core.results import FitVerdict, FlavorFit, PlanReport
from hwdash.core.specs import Accelerator, Flavor, Framework, ModelSpec, Slowdown

__all__ = [
    "ATTENTION_ONLY_TARGETS",
    "CLOSEST_SHOWN",
    "CLOSE_RATIO",
    "EXCLUSIVE_KNOBS",
    "MAX_CHANGES",
    "SHORTEST_SEQUENCE",
    "SMALLEST_RANK",
    "Change",
    "FitOption",
    "FitSearch",
    "Knob",
    "Setting",
    "bigger_siblings",
    "closest_flavor",
    "find_fit_options",
    "knobs_for",
    "rank_options",
    "search_flavor",
]

MAX_CHANGES = 3
"""Knobs changed at once at most (a fourth is tried only when three find nothing)."""


CLOSEST_SHOWN = 3
"""Options shown when nothing fits the target: the ones least over its memory."""

CLOSE_RATIO = 1.5
"""A flavor "comes close" when the plan needs at most this many times its usable memory."""


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


def _value(value: Any) -> Any:
    return getattr(value, "value", value)


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
        method = updates.get("method", updates.get("rl_method", trained_method(plan)))
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


_Entry = tuple[_Candidate, FlavorFit, Plan]
"""A combination tried, its fit on the flavor, and the changed plan."""


@dataclass
class _Tried:
    """What one flavor's search found: the combinations that fit, those only tight, those over
    the memory (kept only to show the closest), and how many the estimator was asked about."""

    fitting: list[_Entry] = field(default_factory=list)
    tight: list[_Entry] = field(default_factory=list)
    over: list[tuple[int, int, _Candidate, Plan]] = field(default_factory=list)
    """(memory per GPU, changes, combination, changed plan)."""
    evaluated: int = 1

    def add(self, candidate: _Candidate, fit: FlavorFit, changed: Plan) -> None:
        """Keep a combination under the memory by its verdict (one that does not fit is dropped)."""
        if fit.verdict is FitVerdict.FITS:
            self.fitting.append((candidate, fit, changed))
        elif fit.verdict is FitVerdict.TIGHT:
            self.tight.append((candidate, fit, changed))

    def chosen(self) -> list[_Entry]:
        """Those that fit, then the tight ones where no option that fits is milder."""
        return self.fitting + [
            entry
            for entry in _minimal(self.tight)
            if not any(_dominates(found, entry[0]) for found, _fit, _plan in self.fitting)
        ]


def _flavor_evaluator(
    model: ModelSpec,
    flavor: Flavor,
    accelerator: Accelerator,
    flavor_fit: Callable[[Plan], FlavorFit] | None,
    framework: Framework | None,
    slowdowns: Mapping[str, Slowdown] | None,
    software: Software | None = None,
) -> Callable[[Plan], FlavorFit]:
    """A plan's fit on the flavor: ``flavor_fit`` when given, else :func:`evaluate_flavor`."""
    if flavor_fit is not None:
        return flavor_fit

    def evaluate(candidate_plan: Plan) -> FlavorFit:
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
            software=software,
        )[0]

    return evaluate


def _memory_need(
    model: ModelSpec,
    flavor: Flavor,
    accelerator: Accelerator,
    framework: Framework | None,
    cache: dict[tuple[Plan, int, str], int],
    software: Software | None = None,
) -> Callable[[Plan], int]:
    """A plan's bytes per GPU on the flavor that must stay on the GPU, through ``cache``."""

    def need_of(changed: Plan) -> int:
        key = (changed, flavor.gpu_count, accelerator.id)
        need = cache.get(key)
        if need is None:
            estimate = estimate_memory(
                changed,
                model,
                gpus=flavor.gpu_count,
                accelerator=accelerator,
                framework=framework,
                software=software,
            )
            # paged optimizer states may spill to host RAM (see evaluate_flavor)
            need = estimate.per_gpu.total - estimate.managed_bytes
            cache[key] = need
        return need

    return need_of


def _combinations(knobs: Sequence[Knob], size: int) -> Iterator[_Candidate]:
    """Every way to turn ``size`` of ``knobs``, each to any of its settings, in order (never two
    :data:`EXCLUSIVE_KNOBS` together)."""
    names = [knob.name for knob in knobs]
    exclusive = {
        (names.index(a), names.index(b)) for a, b in EXCLUSIVE_KNOBS if a in names and b in names
    }
    for chosen in itertools.combinations(range(len(knobs)), size):
        if any(pair in exclusive for pair in itertools.combinations(chosen, 2)):
            continue  # two ways to do one thing (ZeRO or FSDP): never both
        for levels in itertools.product(*(range(len(knobs[k].settings)) for k in chosen)):
            yield _Candidate(tuple(zip(chosen, levels, strict=True)))


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
    software: Software | None = None,
) -> tuple[bool, list[FitOption], int]:
    """(fits already, minimal options, combinations evaluated) for one flavor.

    ``flavor_fit`` evaluates a plan on the flavor (default: :func:`hwdash.core.planning.fit.evaluate_flavor`);
    it is a parameter so a caller can swap in a flavor built from live GPUs. ``keeps_only`` turns
    only the knobs that keep the experiment. ``memory_cache`` shares per-GPU needs between flavors
    with the same accelerator and GPU count. ``framework``: the catalog's entry for
    ``plan.framework`` (None: the packaged one); no knob changes the framework. ``slowdowns``: the
    catalog's step-time factors, ``software`` its software footprint (None: the packaged ones).
    ``near_misses``: when given and nothing fits (nor is tight), it receives the
    :data:`CLOSEST_SHOWN` options that come closest, least memory over first.
    """
    evaluate = _flavor_evaluator(
        model, flavor, accelerator, flavor_fit, framework, slowdowns, software
    )
    base = evaluate(plan)
    if base.verdict is FitVerdict.FITS:
        return True, [], 1
    knobs = [
        knob
        for knob in knobs_for(plan, model, flavor.gpu_count, framework)
        if knob.name not in skip_knobs and (knob.keeps_experiment or not keeps_only)
    ]
    cache = {} if memory_cache is None else memory_cache
    need_of = _memory_need(model, flavor, accelerator, framework, cache, software)
    tried = _try_combinations(
        plan,
        knobs,
        base,
        evaluate,
        need_of,
        accelerator.usable_bytes,
        max_changes,
        keep_over=near_misses is not None,
    )
    options = [
        _option(plan, knobs, candidate, fit, changed, base)
        for candidate, fit, changed in tried.chosen()
    ]
    if near_misses is not None and not options:
        # Nothing fits: the combinations least over the memory, fewer changes first among equals.
        tried.over.sort(key=lambda entry: (entry[0], entry[1]))
        for _need, _count, candidate, changed in tried.over[:CLOSEST_SHOWN]:
            near_misses.append(_option(plan, knobs, candidate, evaluate(changed), changed, base))
    return False, options, tried.evaluated


def _try_combinations(
    plan: Plan,
    knobs: Sequence[Knob],
    base: FlavorFit,
    evaluate: Callable[[Plan], FlavorFit],
    need_of: Callable[[Plan], int],
    usable: int,
    max_changes: int,
    *,
    keep_over: bool,
) -> _Tried:
    """Every combination of up to ``max_changes`` knobs, fewer first, skipping those a found option
    dominates; stops after a size where :func:`_worth_going_on` says so."""
    tried = _Tried()
    for size in range(1, max_changes + 1):
        for candidate in _combinations(knobs, size):
            if any(_dominates(found, candidate) for found, _fit, _plan in tried.fitting):
                continue
            changed = _apply(plan, knobs, candidate)
            if changed is None:
                continue
            tried.evaluated += 1
            # Memory first (cheap); the full flavor evaluation only for what may fit.
            need = need_of(changed)
            if need > usable:
                if keep_over:
                    tried.over.append((need, len(candidate.levels), candidate, changed))
                continue
            tried.add(candidate, evaluate(changed), changed)
        if tried.fitting and not _worth_going_on(tried.fitting, knobs, base):
            break
    return tried


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
    searchable = [(f, a) for f in flavors if (a := _searchable(catalog, f)) is not None]
    cache: dict[tuple[Plan, int, str], int] = {}
    framework = catalog.framework_for(plan)
    software = catalog.software
    found = _search_passes(
        plan, model, searchable, across, limit, slowdowns, cache, framework, software
    )
    if found.fits_already and not across:
        found.options = []
    elif not across and searchable:
        # More GPUs of the same kind: the same flavor family with more of them (ZeRO shards the
        # states over them), as it is or with the knobs that keep the experiment.
        target_flavor, target_accelerator = searchable[0]
        for bigger in bigger_siblings(catalog, target_flavor):
            options, count = _on_more_gpus(
                plan,
                model,
                target_flavor,
                bigger,
                target_accelerator,
                slowdowns,
                cache,
                framework,
                software,
            )
            found.evaluated += count
            found.options.extend(options)
    within, dropped = split_over_budget(found.options)  # --budget: options costing more go
    ranked = rank_options(within, cost_first=across)[:limit]
    fits_already = found.fits_already
    # the target's own closest options (never another flavor's), when none fits it
    closest = tuple(found.near_misses) if not ranked and not fits_already and not across else ()
    return FitSearch(
        target=target,
        fits_already=fits_already,
        options=tuple(ranked),
        evaluated=found.evaluated,
        notes=_search_notes(bool(searchable), ranked, fits_already)
        + dropped_note(dropped, plan.budget),
        closest=closest,
    )


@dataclass
class _Passes:
    """What the passes over the flavors found: the last pass's options and near misses."""

    options: list[FitOption] = field(default_factory=list)
    near_misses: list[FitOption] = field(default_factory=list)
    fits_already: bool = False
    evaluated: int = 0


def _search_passes(
    plan: Plan,
    model: ModelSpec,
    searchable: Sequence[tuple[Flavor, Accelerator]],
    across: bool,
    limit: int,
    slowdowns: Mapping[str, Slowdown],
    cache: dict[tuple[Plan, int, str], int],
    framework: Framework | None,
    software: Software | None = None,
) -> _Passes:
    """Search every flavor, in passes: across many flavors, the knobs that keep the experiment
    first (an option that changes the experiment never ranks above one that keeps it, so when
    those fill the list the rest need not be searched); then every knob; a fourth knob only when
    three found nothing."""
    tokens = training_tokens(plan)
    passes = [(MAX_CHANGES, True)] if across else []
    passes += [(MAX_CHANGES, False), (MAX_CHANGES + 1, False)]
    found = _Passes()
    for max_changes, keeps_only in passes:
        found.options = []
        found.near_misses = []
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
                near_misses=None if across else found.near_misses,
                software=software,
            )
            found.evaluated += count
            found.fits_already = found.fits_already or already
            if already and across:
                fit = evaluate_flavor(
                    plan,
                    model,
                    flavor,
                    accelerator,
                    tokens,
                    framework=framework,
                    slowdowns=slowdowns,
                    software=software,
                )[0]
                found.options.append(FitOption(plan, (), ("as it is",), True, fit, 1.0))
            found.options.extend(options)
        enough = sum(
            1 for o in found.options if o.fit.verdict is FitVerdict.FITS and o.keeps_experiment
        )
        if keeps_only and enough < limit:
            continue  # not enough that keep the experiment: search every knob
        if found.options or found.fits_already:
            break
    return found


def _search_notes(
    searchable: bool, ranked: Sequence[FitOption], fits_already: bool
) -> tuple[str, ...]:
    """What to know about the search: no GPU to fit, nothing fits, or only tight options."""
    if not searchable:
        return ("no GPU flavor to fit: the target has no CUDA GPU",)
    if not ranked and not fits_already:
        return (
            "nothing tried fits: no combination of the memory savers, cheaper methods and a "
            "shorter sequence brings the plan under this hardware's memory",
        )
    if ranked and all(option.fit.verdict is FitVerdict.TIGHT for option in ranked):
        return ("only tight options (under 10% headroom): a memory spike may still OOM",)
    return ()


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


def _moved_to_more_gpus(plan: Plan, flavor: Flavor, bigger: Flavor) -> tuple[Plan, bool, str]:
    """(the plan on ``bigger``, whether it keeps the global batch, the move in words): the
    data-parallel copies multiply the global batch, so the accumulation is divided by the same
    factor where it can be (the experiment is kept)."""
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
    return moved, keeps, words


def _on_more_gpus(
    plan: Plan,
    model: ModelSpec,
    flavor: Flavor,
    bigger: Flavor,
    accelerator: Accelerator,
    slowdowns: Mapping[str, Slowdown],
    cache: dict[tuple[Plan, int, str], int],
    framework: Framework | None = None,
    software: Software | None = None,
) -> tuple[list[FitOption], int]:
    """Options on ``bigger`` (:func:`_moved_to_more_gpus`), as it is or with at most two knobs
    that keep the experiment; their slowdown is over the plan's step time on ``flavor``."""
    moved, keeps, words = _moved_to_more_gpus(plan, flavor, bigger)
    tokens = training_tokens(plan)
    given: dict[str, Any] = {"framework": framework, "slowdowns": slowdowns, "software": software}
    base_fit = evaluate_flavor(plan, model, flavor, accelerator, tokens, **given)[0]
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
        software=software,
    )
    if fits_as_is:
        fit = evaluate_flavor(moved, model, bigger, accelerator, tokens, **given)[0]
        options = [FitOption(moved, (), (), True, fit, None)]
    found: list[FitOption] = []
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
