"""``--max FIELD``: the largest setting of one field (the fewest GPUs, for ``gpus``) that fits a flavor.

"Fits" is the sense of ``--check``: the verdict :attr:`~hwdash.core.results.FitVerdict.FITS` (at
least 10% of the usable memory left, no refusal), so ``--check`` at the answer exits 0. A tight fit
counts as not fitting: it may OOM.

* ``seq``: the longest sequence, up to the model's context (``max_position_embeddings``) and the
  Plan field's bound.
* ``batch``: the largest micro-batch per GPU, up to the Plan field's bound.
* ``concurrency``: inference only. Until serving plans exist it is the largest batch of sequences of
  ``--seq`` tokens that one ``generate`` call holds (weights, KV cache, activations), the same
  search as ``batch``; training plans are refused.
* ``gpus``: the *fewest* GPUs of the flavor's accelerator that fit (more GPUs never need more per
  GPU: the estimator's property test), counted in steps of ``tp x pp``. A plan that fits one GPU
  answers 1; one that needs more than the flavor has answers that count all the same (the text says
  the flavor has fewer). The host RAM per GPU is the flavor's.

The estimate never needs less memory for a longer sequence or a larger batch (a property test
checks it), so each answer is a binary search: about 20 estimates, under a millisecond each.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from hwdash.core.catalog import Catalog
from hwdash.core.plan import Plan
from hwdash.core.planning.fit import evaluate_flavor, training_tokens
from hwdash.core.results import TIGHT_HEADROOM_FRACTION, FitVerdict, FlavorFit
from hwdash.core.specs import Flavor, ModelSpec
from hwdash.errors import UsageError


class MaxField(str, Enum):
    """What ``--max`` searches."""

    SEQ = "seq"
    BATCH = "batch"
    CONCURRENCY = "concurrency"
    GPUS = "gpus"


MAX_FIELDS: tuple[str, ...] = tuple(field.value for field in MaxField)


def _field_bound(name: str) -> int:
    """The Plan field's upper bound (``le``), read from the model so the two never drift."""
    for meta in Plan.model_fields[name].metadata:
        bound = getattr(meta, "le", None)
        if bound is not None:
            return int(bound)
    raise AssertionError(f"Plan.{name} has no upper bound")  # pragma: no cover


@dataclass(frozen=True)
class MaxFit:
    """The answer of ``--max FIELD`` on one flavor."""

    field: MaxField
    target: str
    """The flavor id searched."""
    value: int | None
    """The answer; None when even the smallest setting does not fit."""
    fit: FlavorFit
    """The plan on the flavor at the answer (at the smallest setting when there is none)."""
    step: int = 1
    """How far apart two settings are (``tp x pp`` for ``gpus``, else 1)."""
    bound: int | None = None
    """The largest setting searched (None for ``gpus``, whose answer is the fewest)."""
    bounded_by: str | None = None
    """Why the search stopped at ``bound`` when the answer is the bound: ``the model's context
    (32768)``, ``the --batch bound (65536)``."""
    plan_seq: int = 0
    """The plan's ``--seq`` (``concurrency`` counts sequences of that length)."""
    accelerator_name: str = ""
    """The flavor's accelerator (``gpus`` counts GPUs of it)."""
    flavor_gpus: int = 0
    """The flavor's own GPU count."""
    words: str | None = None
    """What the answer counts, in the sentence (None: the field's own words; a serving plan's
    ``seq`` is its longest ``--max-model-len``)."""

    @property
    def headroom_bytes(self) -> int | None:
        """Usable minus needed memory per GPU at the answer (None without one)."""
        return None if self.value is None else self.fit.headroom_bytes

    def to_json(self) -> dict[str, Any]:
        """The ``max`` object of ``hwdash plan --json``: ``field``, ``value``, ``headroom_bytes``;
        then the target and, when the answer is the search's bound, what bounds it."""
        return {
            "field": self.field.value,
            "value": self.value,
            "headroom_bytes": self.headroom_bytes,
            "target": self.target,
            "bounded_by": self.bounded_by if self.value is not None else None,
        }

    def sentence(self) -> str:
        """The answer in one line."""
        from hwdash.core.units import GIB

        what = {
            MaxField.SEQ: "longest --seq",
            MaxField.BATCH: "largest --batch",
            MaxField.CONCURRENCY: f"most sequences of {self.plan_seq} tokens at once",
            MaxField.GPUS: f"fewest GPUs ({self.accelerator_name})",
        }[self.field]
        what = self.words or what
        # "the longest --seq ... fits", "the most sequences ... fit"
        verb = "fit" if self.field in (MaxField.GPUS, MaxField.CONCURRENCY) else "fits"
        if self.value is None:
            if self.field is MaxField.GPUS:
                return (
                    f"{what} that fit {self.target}: none (more GPUs do not bring this plan "
                    f"under the memory; at {self.fit.flavor.gpu_count} GPUs: {_why_not(self.fit)})"
                )
            why = _why_not(self.fit)
            return f"{what} that {verb} {self.target}: none (even {self.step} does not fit: {why})"
        free = f"{self.fit.headroom_bytes / GIB:.1f} GiB free per GPU"
        if self.field is MaxField.GPUS:
            fewer = self.value - self.step
            tail = f"; {fewer} {'does' if fewer == 1 else 'do'} not" if fewer > 0 else ""
            flavor_count = self.flavor_gpus
            has = f"; the flavor has {flavor_count}" if flavor_count != self.value else ""
            return f"{what} that fit {self.target}: {self.value} ({free}{tail}{has})"
        if self.bounded_by is not None:
            tail = f"; capped by {self.bounded_by}"
        else:
            tail = f"; {self.value + self.step} does not fit"
        return f"{what} that {verb} {self.target}: {self.value} ({free}{tail})"


def _why_not(fit: FlavorFit) -> str:
    """Why a setting does not fit, in words: the flavor's reason, or the tight headroom."""
    from hwdash.core.units import GIB

    if fit.verdict is FitVerdict.TIGHT:
        return (
            f"tight, {fit.need_bytes / GIB:.1f} GiB per GPU of {fit.usable_bytes / GIB:.1f} GiB, "
            f"under {TIGHT_HEADROOM_FRACTION:.0%} headroom"
        )
    return fit.reason or fit.verdict.value


def _plan_field(field: MaxField) -> str:
    """The Plan field a ``--max`` field moves."""
    return "batch" if field is MaxField.CONCURRENCY else field.value


def check_max_request(plan: Plan, field: MaxField) -> None:
    """Refuse what ``--max FIELD`` cannot answer for this plan (a UsageError naming ``--max``)."""
    if field is MaxField.CONCURRENCY and plan.is_training:
        raise UsageError(
            "--max concurrency counts the sequences an inference run holds at once: it needs "
            "--method inference (for training, --max batch is the largest micro-batch)",
            flag="--max",
        )


def with_gpu_count(flavor: Flavor, gpus: int) -> Flavor:
    """``flavor`` with ``gpus`` GPUs of its accelerator, its host RAM and price per GPU kept."""
    per_gpu = gpus / flavor.gpu_count if flavor.gpu_count else 1.0
    ram = None if flavor.ram_gb is None else flavor.ram_gb * per_gpu
    price = None if flavor.price_per_hour is None else flavor.price_per_hour * per_gpu
    return flavor.model_copy(update={"gpu_count": gpus, "ram_gb": ram, "price_per_hour": price})


def find_max(
    plan: Plan,
    model: ModelSpec,
    catalog: Catalog,
    flavor_id: str,
    field: MaxField,
    *,
    adjust: Callable[[FlavorFit], FlavorFit] | None = None,
) -> MaxFit:
    """The largest value of ``field`` (the fewest GPUs, for ``gpus``) with which ``plan`` fits the
    flavor ``flavor_id`` of ``catalog``; see the module's docstring for each field. ``adjust``:
    applied to every fit before its verdict is read (``--calibrated`` scales the need by what
    this box measured, as the flavor table does)."""
    check_max_request(plan, field)
    search = _Search(plan, model, catalog, flavor_id, field, adjust)
    if field is MaxField.GPUS:
        return _fewest_gpus(search)
    return _largest(search)


@dataclass
class _Search:
    """One ``--max`` search: the plan re-planned at a value of its field on the target flavor."""

    plan: Plan
    model: ModelSpec
    catalog: Catalog
    flavor_id: str
    field: MaxField
    adjust: Callable[[FlavorFit], FlavorFit] | None

    def __post_init__(self) -> None:
        self.flavor = self.catalog.flavors[self.flavor_id]
        self.accelerator = self.catalog.accelerator_for(self.flavor)
        self.framework = self.catalog.framework_for(self.plan)

    def evaluate(self, value: int, *, timed: bool = False) -> FlavorFit:
        if self.field is MaxField.GPUS:
            changed, on = self.plan, with_gpu_count(self.flavor, value)
        else:
            changed, on = self.plan.with_changes({_plan_field(self.field): value}), self.flavor
        tokens = training_tokens(changed) if timed else None
        fit = evaluate_flavor(
            changed,
            self.model,
            on,
            self.accelerator,
            tokens,
            framework=self.framework,
            slowdowns=self.catalog.slowdowns,
            software=self.catalog.software,
        )[0]
        return fit if self.adjust is None else self.adjust(fit)

    def fits(self, value: int) -> bool:
        return self.evaluate(value).verdict is FitVerdict.FITS

    def answer(
        self,
        value: int | None,
        fit: FlavorFit,
        *,
        step: int = 1,
        bound: int | None = None,
        bounded_by: str | None = None,
    ) -> MaxFit:
        return MaxFit(
            self.field,
            self.flavor_id,
            value,
            fit,
            step=step,
            bound=bound,
            bounded_by=bounded_by,
            plan_seq=self.plan.seq,
            accelerator_name=self.accelerator.name if self.accelerator is not None else "CPU",
            flavor_gpus=self.flavor.gpu_count,
        )


def last_holding(low: int, high: int, holds: Callable[[int], bool]) -> int:
    """The largest ``k`` in ``[low, high)`` for which ``holds(k)``, by bisection, given that
    ``holds(low)`` is true, ``holds(high)`` false, and ``holds`` true up to some ``k`` and false
    after it (a setting that fits, then ones that do not)."""
    while high - low > 1:
        middle = (low + high) // 2
        if holds(middle):
            low = middle
        else:
            high = middle
    return low


def _fewest_gpus(search: _Search) -> MaxFit:
    """The fewest GPUs (in steps of tp x pp x cp (or sp), and of tp x ep x pp) of the flavor's
    kind that fit."""
    plan = search.plan
    step = math.lcm(plan.tp * plan.pp * plan.sequence_shards, plan.tp * plan.ep * plan.pp)
    top = _field_bound("gpus") // step
    if search.accelerator is None or search.flavor.gpu_count == 0 or not search.fits(top * step):
        return search.answer(None, search.evaluate(top * step), step=step)
    # the fewest: fits(k * step) holds from some k on; 0 GPUs never fit
    value = (last_holding(0, top, lambda k: not search.fits(k * step)) + 1) * step
    return search.answer(value, search.evaluate(value, timed=True), step=step)


def _seq_step(plan: Plan) -> int:
    """The step of ``--seq``: a multiple of 2 x cp (load-balanced ring attention,
    ``megatron/training/arguments.py``) and of sp (Ulysses), as :class:`Plan` refuses otherwise."""
    return math.lcm(2 * plan.cp if plan.cp > 1 else 1, plan.sp_ulysses)


def _largest(search: _Search) -> MaxFit:
    """The largest seq, batch or concurrency that fits, up to the field's bound (and the model's
    context for seq); seq in steps of :func:`_seq_step`."""
    name = _plan_field(search.field)
    bound = _field_bound(name)
    bounded_by = f"the --{name} bound ({bound})"
    context = search.model.max_context
    if search.field is MaxField.SEQ and context < bound:
        bound, bounded_by = context, f"the model's context ({context})"
    step = _seq_step(search.plan) if search.field is MaxField.SEQ else 1
    top = bound // step
    if not search.fits(step):
        return search.answer(None, search.evaluate(step), step=step, bound=bound)
    if search.fits(top * step):
        fit = search.evaluate(top * step, timed=True)
        return search.answer(top * step, fit, step=step, bound=bound, bounded_by=bounded_by)
    value = last_holding(1, top, lambda k: search.fits(k * step)) * step
    return search.answer(value, search.evaluate(value, timed=True), step=step, bound=bound)
