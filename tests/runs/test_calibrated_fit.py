"""``--calibrated`` rescales each flavor's need by the ledger's measured allocator factor and
recomputes the memory verdict; a flavor refused for a reason that is not memory stays refused."""

from __future__ import annotations

from hwdash.core.catalog import load_catalog
from hwdash.core.plan import Method, Plan
from hwdash.core.planning.fit import evaluate_flavor
from hwdash.core.results import FitVerdict, FlavorFit
from hwdash.runs.calibration import scaled_fit


def _fit(plan: Plan, flavor_id: str) -> FlavorFit:
    catalog = load_catalog()
    flavor = catalog.flavors[flavor_id]
    accelerator = catalog.accelerator_for(flavor)
    model = catalog.models[plan.model]
    fit, _estimate = evaluate_flavor(plan, model, flavor, accelerator, None)
    return fit


def test_a_refusal_that_is_not_memory_survives_a_smaller_measured_factor() -> None:
    # tp 4 on a 1-GPU flavor: refused whatever the memory; the small model fits by memory
    plan = Plan(model="qwen2.5-0.5b", method=Method.FULL, gpus=4, tp=4, framework="megatron")
    fit = _fit(plan, "a100-large")
    assert fit.verdict is FitVerdict.NO
    assert fit.refusals and "multiple of" in fit.refusals[0]
    scaled = scaled_fit(fit, 0.5)
    assert scaled.verdict is FitVerdict.NO
    assert "multiple of" in scaled.reason


def test_a_memory_refusal_turns_into_a_fit_when_the_measured_factor_says_so() -> None:
    plan = Plan(model="llama-3.1-8b", method=Method.FULL, batch=1, seq=512)
    fit = _fit(plan, "a100-large")
    assert fit.verdict is FitVerdict.NO and not fit.refusals
    assert fit.reason.startswith("needs ")
    factor = 0.5 * fit.usable_bytes / fit.need_bytes
    scaled = scaled_fit(fit, factor)
    assert scaled.verdict is FitVerdict.FITS
    assert scaled.need_bytes < fit.need_bytes
    assert not scaled.reason.startswith("needs ")
