"""``hwdash plan``'s line on what this box measured for similar plans, and ``--calibrated``
(the rules: :mod:`hwdash.runs.calibration`)."""

from __future__ import annotations

import sys
from typing import Any

from hwdash.core.plan import Plan
from hwdash.runs.calibration import Calibration, apply_peak_factor, calibration, newest_records


def measured_for(plan: Plan, model: Any) -> Calibration | None:
    """The similar runs in the ledger (None without a ledger, or without similar runs). A ledger
    that cannot be read is said on stderr once; the plan goes on without it."""
    try:
        records = newest_records()
    except (OSError, ValueError) as exc:
        print(f"hwdash: the runs ledger was not read: {exc}", file=sys.stderr)
        return None
    if records is None:
        return None
    return calibration(records, model.id, plan.method.value)


def calibrated_plan(plan: Plan, measured: Calibration | None) -> Plan:
    """The plan with the measured MFU for its hours (a given ``--mfu`` wins)."""
    if measured is None or measured.mfu is None or plan.mfu is not None:
        return plan
    return plan.model_copy(update={"mfu": max(0.001, min(1.0, measured.mfu))})


def calibrated_report(report: Any, measured: Calibration | None) -> Any:
    """The report with each flavor's need times the measured peak factor."""
    return apply_peak_factor(report, None if measured is None else measured.peak_factor)
