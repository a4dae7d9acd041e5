"""What this box measured for plans like this one, and the plan recomputed with it (``--calibrated``).

**Similar** (the rule ``hwdash plan`` uses): a ledger record of the same model (its catalog id, or
the config it was read from, as the plan names it) and the same method (``lora``, ``full``...),
whose run ended normally or was stopped (``exit`` ``normal`` or ``killed``): a run that ran out of
memory or failed measured a truncated peak and speed. Batch, sequence and the rest may differ: the
measured **peak factor** is a ratio to each run's own plan, so it carries over; the measured **MFU**
is a property of the model, the method and the software on this box.

Each is the median over the similar runs that measured it (one odd run moves a median little). With
``--calibrated``, the plan's hours take the measured MFU (unless ``--mfu`` is given) and each
flavor's need is its reserved memory times the peak factor, what lies outside PyTorch's allocator
(the CUDA context and kernels, NCCL's communicators) left as it is; the verdict
(fits/tight/no) follows from that need.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hwdash.core.planning.fit import _sort_key, recommend, rescaled_fit
from hwdash.core.results import FlavorFit, PlanReport

SIMILAR_EXITS = ("normal", "killed")
LEDGER_RECORDS = 5000
"""The newest ledger records read for the comparison (a long ledger is not read whole)."""


@dataclass(frozen=True)
class Calibration:
    """The similar runs' measurements for one model and method."""

    model: str
    method: str
    runs: int
    """Similar runs in the ledger."""
    peak_factor: float | None
    """Median of measured / planned peak (1.04: the runs needed 4% more than planned)."""
    peak_runs: int
    mfu: float | None
    """Median measured MFU, 0..1."""
    mfu_runs: int

    def sentence(self) -> str:
        """``3 runs of llama-3.1-8b lora here: measured peak +4% over the estimate, MFU 38%``."""
        parts = []
        if self.peak_factor is not None:
            change = self.peak_factor - 1
            side = "over" if change >= 0 else "under"
            parts.append(f"measured peak {change:+.0%} {side} the estimate")
        if self.mfu is not None:
            parts.append(f"MFU {self.mfu:.0%}")
        what = ", ".join(parts) if parts else "no peak or MFU measured"
        runs = "1 run" if self.runs == 1 else f"{self.runs} runs"
        return f"{runs} of {self.model} {self.method} here: {what}"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if number == number and abs(number) != float("inf") else None


def is_similar(record: Mapping[str, Any], model: str, method: str) -> bool:
    """The rule in the module's docstring."""
    return (
        record.get("model") == model
        and record.get("method") == method
        and record.get("exit") in SIMILAR_EXITS
    )


def calibration(
    records: Iterable[Mapping[str, Any]], model: str, method: str
) -> Calibration | None:
    """The similar runs' medians; None when there is none."""
    similar = [r for r in records if is_similar(r, model, method)]
    if not similar:
        return None
    factors = []
    for record in similar:
        measured = _number(record.get("measured_peak_bytes"))
        planned = _number(record.get("planned_peak_bytes"))
        if measured and planned and planned > 0:
            factors.append(measured / planned)
    mfus = [m for m in (_number(r.get("mfu")) for r in similar) if m is not None and 0 < m <= 1]
    return Calibration(
        model=model,
        method=method,
        runs=len(similar),
        peak_factor=statistics.median(factors) if factors else None,
        peak_runs=len(factors),
        mfu=statistics.median(mfus) if mfus else None,
        mfu_runs=len(mfus),
    )


def scaled_need(need: int, factor: float, outside: int = 0) -> int:
    """A need with the measured factor applied to all but what lies ``outside`` the allocator."""
    fixed = min(need, outside)
    return fixed + round((need - fixed) * factor)


def scaled_fit(fit: FlavorFit, factor: float) -> FlavorFit:
    """One flavor's fit with its need scaled by ``factor`` and its verdict recomputed."""
    return rescaled_fit(fit, scaled_need(fit.need_bytes, factor, fit.outside_allocator_bytes))


def apply_peak_factor(report: PlanReport, factor: float | None) -> PlanReport:
    """The report with each flavor's need scaled by ``factor`` and its verdict recomputed."""
    if factor is None:
        return report
    fits = [scaled_fit(fit, factor) for fit in report.flavors]
    fits.sort(key=_sort_key)
    recommended, fastest = recommend(fits)
    return dataclasses.replace(
        report, flavors=tuple(fits), recommended=recommended, fastest=fastest
    )


def newest_records(path: Path | None = None) -> list[dict[str, Any]] | None:
    """The ledger's newest :data:`LEDGER_RECORDS` records; None when there is no ledger. Raises
    ``OSError`` or ``ValueError`` (:class:`hwdash.runs.ledger.LedgerError`) when it cannot be read."""
    from hwdash.runs import ledger

    path = ledger.ledger_path() if path is None else path
    if not path.exists():
        return None
    return ledger.read(path, last=LEDGER_RECORDS).records
