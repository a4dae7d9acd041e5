"""A budget for the run (``--budget DOLLARS``): which flavors cost more, the band of a cost, the notes.

A flavor's estimated run cost (hours x $/hour, :func:`hwdash.core.planning.fit.evaluate_flavor`)
is compared with ``Plan.budget``: over it, the flavor keeps its memory verdict but is marked
(``over_budget``) and is never recommended; make-it-fit drops the options over it. Without a
data size (``--examples``/``--tokens``) no cost is known and the budget applies to nothing (one
warning says so). The bands a cost falls in are data: ``catalog/planning/budget_bands.toml``, the
seeds' guide's grouping of advice by budget (under $5, $5-20, $20-50, $50-200).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from hwdash.core.data_files import packaged_catalog_dir, read_catalog_toml
from hwdash.core.results import FitVerdict
from hwdash.core.units import format_money
from hwdash.errors import CatalogError

if TYPE_CHECKING:
    from hwdash.core.results import FlavorFit, PlanReport

BANDS_FILE = ("planning", "budget_bands.toml")
"""The bands' file under the packaged catalog folder."""

NEEDS_DATA_SIZE = (
    "--budget needs a data size (--examples or --tokens): without it no run cost is "
    "estimated, so the budget is not applied"
)


@dataclass(frozen=True)
class Band:
    """One budget band: costs below ``below`` dollars (None: every larger cost)."""

    label: str
    below: float | None


@lru_cache(maxsize=1)
def budget_bands() -> tuple[Band, ...]:
    """The bands of ``catalog/planning/budget_bands.toml``, cheapest first. Raises
    :class:`CatalogError` naming the file when a band is malformed or out of order."""
    path = packaged_catalog_dir().joinpath(*BANDS_FILE)
    bands: list[Band] = []
    for index, raw in enumerate(read_catalog_toml(path).get("band", [])):
        label, below = raw.get("label"), raw.get("below")
        if not isinstance(label, str) or not (below is None or isinstance(below, int | float)):
            raise CatalogError(path, f"band {index + 1}: needs a text label and a number below")
        bands.append(Band(label, None if below is None else float(below)))
    limits = [band.below for band in bands]
    if not bands or None in limits[:-1] or limits != sorted(limits, key=_order):
        raise CatalogError(path, "bands must rise, and only the last may have no upper limit")
    return tuple(bands)


def _order(below: float | None) -> float:
    return float("inf") if below is None else below


def band_of(cost: float | None) -> str | None:
    """The label of the band ``cost`` (dollars) falls in; None for an unknown cost."""
    if cost is None:
        return None
    bands = budget_bands()
    return next((b.label for b in bands if b.below is None or cost < b.below), bands[-1].label)


@dataclass(frozen=True)
class RunCost:
    """A flavor's run cost and how it stands against the budget."""

    cost: float | None
    """Dollars: hours x $/hour, None without either."""
    over_budget: bool | None
    """Costs more than the budget; None without a budget or a known cost."""
    notes: tuple[str, ...] = ()
    """``over budget ($X > $Y)`` when it is, for the flavor's note."""


def price_run(hours: float | None, price_per_hour: float | None, budget: float | None) -> RunCost:
    """The cost of ``hours`` at ``price_per_hour``, against ``budget`` dollars (None: no budget)."""
    if hours is None or price_per_hour is None:
        return RunCost(None, None)
    cost = hours * price_per_hour
    if budget is None:
        return RunCost(cost, None)
    if cost > budget:
        note = f"over budget ({format_money(cost)} > {format_money(budget)})"
        return RunCost(cost, True, (note,))
    return RunCost(cost, False)


def budget_warnings(
    budget: float | None, fits: Sequence[FlavorFit], recommended: str | None
) -> list[str]:
    """The report's warnings about the budget: it needs a data size (once), or no flavor that
    fits in memory is within it."""
    if budget is None or not fits:
        return []
    priced = [fit for fit in fits if fit.flavor.price_per_hour is not None]
    if priced and all(fit.cost is None for fit in priced):
        return [NEEDS_DATA_SIZE]
    over = [fit for fit in fits if fit.over_budget and fit.verdict is FitVerdict.FITS]
    if recommended is None and over:
        cheapest = min(over, key=lambda fit: fit.cost or 0.0)
        return [
            f"no flavor that fits is within the budget of {format_money(budget)}: the cheapest "
            f"that fits, {cheapest.flavor.id}, costs {format_money(cheapest.cost)}"
        ]
    return []


def budget_json(report: PlanReport, flavors: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The top-level ``budget`` of ``--json`` (None without ``--budget``); adds ``over_budget``
    (true, false, or null when the cost is unknown) to each of ``flavors``, the flavors' JSON."""
    budget = report.plan.budget
    if budget is None:
        return None
    for entry, fit in zip(flavors, report.flavors, strict=True):
        entry["over_budget"] = fit.over_budget
    recommended = next((f for f in report.flavors if f.flavor.id == report.recommended), None)
    return {
        "dollars": budget,
        "band_of_recommended": band_of(recommended.cost) if recommended else None,
        "over_budget_count": sum(1 for fit in report.flavors if fit.over_budget),
    }


def split_over_budget(options: Iterable[Any]) -> tuple[list[Any], int]:
    """Make-it-fit's options within the budget, and how many were dropped for costing more
    (each option's ``fit.over_budget``; an unknown cost is kept)."""
    options = list(options)
    kept = [option for option in options if option.fit.over_budget is not True]
    return kept, len(options) - len(kept)


def dropped_note(dropped: int, budget: float | None) -> tuple[str, ...]:
    """Make-it-fit's note on the options it dropped for the budget (none dropped: no note)."""
    if not dropped or budget is None:
        return ()
    options = "option" if dropped == 1 else "options"
    return (f"{dropped} {options} over the budget of {format_money(budget)} dropped",)
