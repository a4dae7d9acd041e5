"""Make it fit (``--fit TARGET``) for a serving plan (``--method inference --engine vllm|sglang``).

A serving plan fits a flavor when the engine starts there: its KV pool holds one ``--max-model-len``
request (:func:`~hwdash.core.planning.serving_plan.serving_on_flavors`; vLLM refuses to start
otherwise, ``vllm/v1/core/kv_cache_utils.py`` ``check_enough_kv_cache_memory``). The search turns
the engine's own knobs, each through settings from the mildest to the most drastic:

* ``--gpu-memory-utilization`` up to :data:`UTILIZATION_CAP` (the engine's budget is that share of
  the GPU, ``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``);
* fewer ``--max-num-seqs`` (the sampler's dummy run over that many rows of logits is in the
  profile, ``vllm/v1/worker/gpu_model_runner.py`` ``_dummy_sampler_run``);
* ``--kv-dtype fp8`` (one byte per cached element, ``vllm/config/cache.py`` ``cache_dtype``);
* more tensor-parallel GPUs of the target's kind, sizes that divide the attention heads
  (``vllm/config/model.py`` ``verify_with_parallel_config``), on the target or a sibling flavor with
  more of the same GPU (:func:`~hwdash.core.planning.fit_options.bigger_siblings`);
* a quantized load (``--quant int8``, then ``--quant awq-4``);
* a lower ``--max-model-len``: the longest that starts with the other changes of the option
  (:func:`~hwdash.core.planning.serving_max.serving_max`, ``--max seq``).

Every combination of up to :data:`MAX_CHANGES` knobs is re-planned as ``hwdash plan`` does it
(:func:`~hwdash.core.planning.fit.evaluate_plan`, then the engine's verdicts); one is kept when the
engine starts and no milder combination (a subset of its knobs, each no further) starts too.
Options are ranked smallest change first: fewer knobs, then milder settings, then $/h.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from hwdash.core.catalog import Catalog
from hwdash.core.estimator.serving import ServingMemory
from hwdash.core.plan import KvDtype, Plan, Quant
from hwdash.core.planning.fit import evaluate_plan
from hwdash.core.planning.fit_options import (
    FitOption,
    FitSearch,
    _changes,
    _dominates,
    bigger_siblings,
    find_fit_options,
)
from hwdash.core.planning.fit_options import _Candidate as Candidate
from hwdash.core.planning.max_fit import MaxField
from hwdash.core.planning.serving_max import serving_max
from hwdash.core.planning.serving_plan import (
    outside_budget_bytes,
    serving_on_flavors,
    serving_settings,
)
from hwdash.core.results import FitVerdict, FlavorFit
from hwdash.core.specs import Flavor, ModelSpec

MAX_CHANGES = 3
"""Knobs changed at once at most."""

UTILIZATION_CAP = 0.95
"""The highest ``--gpu-memory-utilization`` offered. What the engine holds outside its budget
(the CUDA-graph pool captured after the KV cache is sized, the CUDA context, uncounted TP buffers:
:func:`~hwdash.core.planning.serving_plan.outside_budget_bytes`) and any other process on the GPU
must fit in the rest (0.95 leaves 1.1 GiB of an L4's 22.5 GiB, about twice the CUDA-graph pool
of catalog/engines.toml, 512 MiB): a stated policy, not a measured limit."""

#: A knob's name for a max-model-len change computed after the others (the longest that starts).
LENGTH_KNOB = "max_model_len"

KNOB_ORDER = ("gpu_memory_utilization", "max_num_seqs", "tp", "kv_dtype", "quant", LENGTH_KNOB)
"""The knobs from the mildest change to what is served to the largest: the engine's share and its
sampler rows change nothing served; more GPUs cost more; fp8 keys and values, then quantized
weights, change the numerics; a shorter ``--max-model-len`` refuses requests."""


@dataclass(frozen=True)
class ServingSetting:
    """One setting of one serving knob."""

    updates: dict[str, Any]
    words: str
    slowdown_id: str | None = None
    """A catalog ``[[slowdown]]`` id the setting brings in (``int8-inference``)."""


@dataclass(frozen=True)
class ServingKnob:
    name: str
    keeps_experiment: bool
    settings: tuple[ServingSetting, ...]


@dataclass(frozen=True)
class _Started:
    """A plan re-planned on one flavor: its fit there and the engine's memory (None: no GPU)."""

    plan: Plan
    fit: FlavorFit
    memory: ServingMemory | None


def replan(plan: Plan, model: ModelSpec, catalog: Catalog, flavor: Flavor) -> _Started:
    """``plan`` on ``flavor`` as ``hwdash plan --flavor FLAVOR`` reports it: the engine's verdict
    and need (:func:`~hwdash.core.planning.serving_plan.serving_on_flavors`)."""
    on = plan.model_copy(update={"flavors": (flavor.id,)})
    report = evaluate_plan(on, catalog, model)
    settings = serving_settings(on, model)
    if settings is not None:
        report, memories = serving_on_flavors(report, settings, catalog)
    else:  # (never: the caller searches serving plans only)
        memories = {}
    return _Started(plan, report.flavors[0], memories.get(flavor.id))


def _utilization_knob(memory: ServingMemory) -> ServingKnob | None:
    """A higher ``--gpu-memory-utilization``: halfway to the cap, then the cap."""
    fraction = memory.fraction
    if fraction >= UTILIZATION_CAP:
        return None
    outside = outside_budget_bytes(memory) / 2**30
    why = (
        f"not above {UTILIZATION_CAP:g}: the rest holds what the engine keeps outside its budget "
        f"({outside:.2f} GiB: CUDA graphs, context, TP buffers) and other processes"
    )
    values = sorted({round((fraction + UTILIZATION_CAP) / 2, 2), UTILIZATION_CAP})
    settings = tuple(
        ServingSetting(
            {"gpu_memory_utilization": value},
            f"--gpu-memory-utilization {value:g} (was {fraction:g}); {why}",
        )
        for value in values
        if value > fraction
    )
    return ServingKnob("gpu_memory_utilization", True, settings)


def _max_num_seqs_knob(memory: ServingMemory) -> ServingKnob | None:
    """Fewer ``--max-num-seqs``: the sampler's profile rows halved, four times at most."""
    current = memory.settings.max_num_seqs or memory.engine.max_num_seqs
    values = [current // 2**step for step in range(1, 5) if current // 2**step >= 1]
    if not values:
        return None
    settings = tuple(
        ServingSetting(
            {"max_num_seqs": value},
            f"--max-num-seqs {value} (was {current}): at most {value} requests at once "
            "(less throughput under load)",
        )
        for value in values
    )
    return ServingKnob("max_num_seqs", True, settings)


def _kv_dtype_knob(plan: Plan) -> ServingKnob | None:
    """``--kv-dtype fp8``: half the KV bytes per token of a 16-bit cache."""
    if plan.kv_dtype is not KvDtype.AUTO:
        return None
    words = "--kv-dtype fp8: half the KV bytes; quality caveat: 8-bit keys/values (uncalibrated)"
    return ServingKnob("kv_dtype", False, (ServingSetting({"kv_dtype": KvDtype.FP8}, words),))


def _quant_knob(plan: Plan, model: ModelSpec, catalog: Catalog) -> ServingKnob | None:
    """A quantized load: int8 (bitsandbytes), then a 4-bit AWQ checkpoint; none for a model whose
    checkpoint is quantized already or a plan with ``--quant``."""
    if plan.quant is not Quant.NONE or model.checkpoint_bits is not None:
        return None
    int8 = catalog.slowdowns.get("int8-inference")
    int8_cost = (
        f"x{int8.factor:g} slower (catalog: int8-inference)"
        if int8 is not None
        else "slower: no catalog factor"
    )
    return ServingKnob(
        "quant",
        False,
        (
            ServingSetting(
                {"quant": Quant.INT8},
                f"--quant int8 (bitsandbytes): half the weight bytes; {int8_cost}",
                "int8-inference",
            ),
            ServingSetting(
                {"quant": Quant.AWQ_4},
                "--quant awq-4 (or gptq-4): needs a 4-bit checkpoint of the model; quality: "
                "some accuracy loss; no slowdown factor in the catalog",
            ),
        ),
    )


def _tp_knob(plan: Plan, model: ModelSpec, catalog: Catalog, flavor: Flavor) -> ServingKnob | None:
    """More tensor-parallel GPUs of the target's kind: each size above the plan's that divides the
    attention heads, on the target or the smallest sibling flavor with that many GPUs."""
    hosts = [flavor, *bigger_siblings(catalog, flavor)]
    largest = max(host.gpu_count for host in hosts)
    settings = []
    for tp in range(plan.gpus + 1, largest + 1):
        if model.heads % tp:
            continue
        host = next(host for host in hosts if host.gpu_count >= tp)
        settings.append(
            ServingSetting(
                {"gpus": tp, "flavors": (host.id,)},
                f"TP {tp} (--gpus {tp}) on {host.id}: {_price(host)}"
                + ("" if host.id == flavor.id else f" (was {_price(flavor)})"),
            )
        )
    return ServingKnob("tp", True, tuple(settings)) if settings else None


def _price(flavor: Flavor) -> str:
    price = flavor.price_per_hour
    return f"{flavor.gpu_count} GPUs" + ("" if price is None else f", ${price:g}/h")


def _length_knob() -> ServingKnob:
    """A lower ``--max-model-len``: its value found per combination (:func:`_with_length`)."""
    return ServingKnob(LENGTH_KNOB, False, (ServingSetting({}, ""),))


def serving_knobs(
    plan: Plan, model: ModelSpec, catalog: Catalog, flavor: Flavor, memory: ServingMemory
) -> list[ServingKnob]:
    """The knobs for ``plan`` on ``flavor`` (``memory``: the engine's there as it is), in
    :data:`KNOB_ORDER`."""
    knobs = [
        _utilization_knob(memory),
        _max_num_seqs_knob(memory),
        _tp_knob(plan, model, catalog, flavor),
        _kv_dtype_knob(plan),
        _quant_knob(plan, model, catalog),
        _length_knob(),
    ]
    return [knob for knob in knobs if knob is not None and knob.settings]


def _combinations(knobs: Sequence[ServingKnob], size: int) -> Iterator[Candidate]:
    for chosen in itertools.combinations(range(len(knobs)), size):
        for levels in itertools.product(*(range(len(knobs[k].settings)) for k in chosen)):
            yield Candidate(tuple(zip(chosen, levels, strict=True)))


def _with_length(
    started: _Started, model: ModelSpec, catalog: Catalog, current: int
) -> tuple[_Started, str] | None:
    """``started``'s plan with the longest ``--max-model-len`` that starts on its flavor (``--max
    seq``), and the change in words; None when none starts or it is no shorter than ``current``."""
    memory = started.memory
    if memory is None:
        return None
    report = evaluate_plan(started.plan, catalog, model)
    flavor = started.fit.flavor.id
    report, _memories = serving_on_flavors(report, memory.settings, catalog)
    longest = serving_max(report, memory.settings, flavor, MaxField.SEQ, catalog, memory).value
    if longest is None or longest >= current:
        return None
    shorter = started.plan.with_changes({"max_model_len": longest})
    words = (
        f"--max-model-len {longest} (was {current}): the longest that starts; longer "
        "requests are refused"
    )
    return replan(shorter, model, catalog, started.fit.flavor), words


@dataclass
class _Found:
    options: list[tuple[Candidate, _Started, tuple[str, ...]]]
    evaluated: int = 0


def _try(
    plan: Plan,
    model: ModelSpec,
    catalog: Catalog,
    flavor: Flavor,
    knobs: Sequence[ServingKnob],
    current: int,
) -> _Found:
    """Every combination of up to :data:`MAX_CHANGES` knobs, fewer first, skipping those a found
    option dominates: the minimal ones whose engine starts."""
    found = _Found([])
    for size in range(1, MAX_CHANGES + 1):
        for candidate in _combinations(knobs, size):
            if any(_dominates(done, candidate) for done, _s, _w in found.options):
                continue
            outcome = _evaluate(plan, model, catalog, flavor, knobs, candidate, current)
            found.evaluated += 1
            if outcome is not None and outcome[0].fit.verdict is FitVerdict.FITS:
                found.options.append((candidate, *outcome))
    return found


def _evaluate(
    plan: Plan,
    model: ModelSpec,
    catalog: Catalog,
    flavor: Flavor,
    knobs: Sequence[ServingKnob],
    candidate: Candidate,
    current: int,
) -> tuple[_Started, tuple[str, ...]] | None:
    """The candidate's plan re-planned on its flavor (the target, or the TP knob's), and its
    changes in words; the length knob last, at the longest that starts with the others."""
    updates: dict[str, Any] = {}
    words: list[str] = []
    length = False
    for knob, level in candidate.levels:
        if knobs[knob].name == LENGTH_KNOB:
            length = True
            continue
        setting = knobs[knob].settings[level]
        updates.update(setting.updates)
        words.append(setting.words)
    changed = plan.with_changes(updates) if updates else plan
    host = _host(catalog, flavor, changed)
    started = replan(changed, model, catalog, host)
    if length:
        shorter = _with_length(started, model, catalog, current)
        if shorter is None:
            return None
        started = shorter[0]
        words.append(shorter[1])
    return started, tuple(words)


def _host(catalog: Catalog, flavor: Flavor, changed: Plan) -> Flavor:
    """The flavor the changed plan runs on: the TP knob's sibling, else the target."""
    if changed.flavors and changed.flavors[0] in catalog.flavors:
        wanted = catalog.flavors[changed.flavors[0]]
        if wanted.accelerator == flavor.accelerator:
            return wanted
    return flavor


def _slowdown(catalog: Catalog, knobs: Sequence[ServingKnob], candidate: Candidate) -> float | None:
    """The catalog's factor of what the option brings in (int8), else None (not estimated)."""
    factor = None
    for knob, level in candidate.levels:
        ident = knobs[knob].settings[level].slowdown_id
        entry = catalog.slowdowns.get(ident) if ident else None
        if entry is not None:
            factor = (factor or 1.0) * entry.factor
    return factor


def _options_on(
    plan: Plan, model: ModelSpec, catalog: Catalog, flavor: Flavor
) -> tuple[bool, list[FitOption], int]:
    """(the engine starts as it is, the minimal options, combinations tried) on ``flavor``."""
    base = replan(plan, model, catalog, flavor)
    if base.memory is None:
        return False, [], 1
    if base.fit.verdict is FitVerdict.FITS:
        return True, [], 1
    knobs = serving_knobs(plan, model, catalog, flavor, base.memory)
    current = base.memory.settings.max_model_len
    found = _try(plan, model, catalog, flavor, knobs, current)
    options = []
    for candidate, started, words in found.options:
        levels = candidate.levels
        options.append(
            FitOption(
                plan=started.plan,
                changes=_changes(plan, started.plan),
                words=words,
                keeps_experiment=all(knobs[knob].keeps_experiment for knob, _ in levels),
                fit=started.fit,
                slowdown=_slowdown(catalog, knobs, candidate),
                severity=_severity(knobs, levels),
            )
        )
    return False, options, found.evaluated + 1


def _severity(knobs: Sequence[ServingKnob], levels: tuple[tuple[int, int], ...]) -> int:
    """How far the option goes: each knob's place in :data:`KNOB_ORDER` (tens), then how far
    along its settings (the first counts 1), summed over its knobs."""
    return sum(10 * KNOB_ORDER.index(knobs[knob].name) + level + 1 for knob, level in levels)


def rank_serving_options(options: Sequence[FitOption]) -> list[FitOption]:
    """Smallest change first: fewer knobs; then those that serve the same thing (the same
    weights, KV numerics and longest request) before those that change it; then the cheaper
    flavor (the same GPU before more of them); then the milder knobs (:func:`_severity`)."""

    def key(option: FitOption) -> tuple[Any, ...]:
        price = option.fit.flavor.price_per_hour
        return (
            len(option.words),
            0 if option.keeps_experiment else 1,
            float("inf") if price is None else price,
            option.severity,
            option.fit.flavor.id,
        )

    return sorted(options, key=key)


def find_serving_fit_options(
    plan: Plan,
    model: ModelSpec,
    catalog: Catalog,
    target: str,
    flavors: Sequence[Flavor],
    *,
    limit: int = 5,
) -> FitSearch:
    """``--fit TARGET`` for a serving plan (module docstring): the same
    :class:`~hwdash.core.planning.fit_options.FitSearch` as a training plan's."""
    gpu_flavors = [
        flavor
        for flavor in flavors
        if flavor.gpu_count > 0
        and (accelerator := catalog.accelerator_for(flavor)) is not None
        and accelerator.kind == "gpu"
    ]
    if not gpu_flavors:
        note = "no GPU flavor to fit: a serving engine needs a CUDA GPU"
        return FitSearch(target=target, fits_already=False, notes=(note,))
    across = len(gpu_flavors) > 1
    fits_already, options, evaluated = False, [], 0
    for flavor in gpu_flavors:
        already, found, count = _options_on(plan, model, catalog, flavor)
        evaluated += count
        fits_already = fits_already or already
        if already and across:
            started = replan(plan, model, catalog, flavor)
            options.append(FitOption(plan, (), ("as it is",), True, started.fit, None))
        options.extend(found)
    if fits_already and not across:
        return FitSearch(target=target, fits_already=True, evaluated=evaluated)
    # the same plan on the same flavor, reached from two targets (--fit any): once
    unique = {(option.plan, option.fit.flavor.id): option for option in reversed(options)}
    ranked = rank_serving_options(list(unique.values()))[:limit]
    notes: tuple[str, ...] = ()
    if not ranked:
        notes = (
            "nothing tried starts the engine: no combination of a higher "
            "--gpu-memory-utilization, fewer --max-num-seqs, --kv-dtype fp8, more TP GPUs, "
            "a quantized load and a shorter --max-model-len gives the KV pool one request",
        )
    return FitSearch(
        target=target,
        fits_already=fits_already,
        options=tuple(ranked),
        evaluated=evaluated,
        notes=notes,
    )


def fit_options_for(
    plan: Plan,
    model: ModelSpec,
    catalog: Catalog,
    target: str,
    flavors: Sequence[Flavor],
) -> FitSearch:
    """``--fit TARGET`` for any plan, as ``hwdash plan`` and the planner's fit view ask it: a
    serving plan's engine knobs (:func:`find_serving_fit_options`), else the training and
    ``generate`` knobs (:func:`~hwdash.core.planning.fit_options.find_fit_options`)."""
    if plan.is_serving:
        return find_serving_fit_options(plan, model, catalog, target, flavors)
    return find_fit_options(plan, model, catalog, target, flavors)
