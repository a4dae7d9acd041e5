"""``--max seq`` on a plan that splits the sequence (``--cp``, ``--sp-ulysses``): the search steps
in the multiples the Plan takes (2 x cp for the load-balanced ring, sp for Ulysses) instead of
re-planning at --seq 1, which the Plan refuses (a traceback before)."""

from __future__ import annotations

import json

import pytest
from monitor_cli import run_plan

from hwdash.core.catalog import load_catalog
from hwdash.core.plan import Plan
from hwdash.core.planning.fit import evaluate_flavor
from hwdash.core.planning.max_fit import MaxField, find_max
from hwdash.core.results import FitVerdict

pytestmark = pytest.mark.usefixtures("quiet_machine")

# Megatron's distributed optimizer with CPU offload keeps the 8B model's states off an L40S
RING = (
    "--model llama-3.1-8b --method full --precision mixed --grad-ckpt --tp 2 --cp 4 --gpus 8"
    " --zero 1 --offload optimizer"
)


def test_max_seq_with_cp_steps_by_twice_cp(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        *RING.split(),
        "--flavor",
        "l40sx8",
        "--max",
        "seq",
        "--json",
    ]
    status, out, err = run_plan(capsys, *args)
    assert status == 0 and "Traceback" not in err
    found = json.loads(out)["max"]
    assert found["value"] % 8 == 0
    # re-planned at the answer it fits; one step (8 tokens) more does not
    catalog = load_catalog(include_user=False)
    plan = Plan.model_validate(
        {"model": "llama-3.1-8b", "method": "full", "precision": "mixed", "grad_ckpt": True}
        | {"tp": 2, "cp": 4, "gpus": 8, "zero": 1, "offload": "optimizer"}
    )
    answer = find_max(plan, catalog.models["llama-3.1-8b"], catalog, "l40sx8", MaxField.SEQ)
    assert answer.value == found["value"] and answer.step == 8

    def verdict(seq: int) -> FitVerdict:
        changed = plan.with_changes({"seq": seq})
        flavor = catalog.flavors["l40sx8"]
        return evaluate_flavor(
            changed, catalog.models["llama-3.1-8b"], flavor, catalog.accelerator_for(flavor), None
        )[0].verdict

    assert verdict(answer.value) is FitVerdict.FITS
    assert verdict(answer.value + 8) is not FitVerdict.FITS


def test_nothing_fits_says_the_smallest_step(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        *RING.split(),
        "--flavor",
        "a10g-largex4",
        "--max",
        "seq",
    ]
    status, out, err = run_plan(capsys, *args)
    assert status == 1 and "Traceback" not in err + out
    assert "longest --seq that fits a10g-largex4: none (even 8 does not fit" in out
