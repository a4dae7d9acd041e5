"""``--budget DOLLARS`` (issue 30): flavors over it are marked and never recommended, the bands of
the seeds' guide, the warning without a data size, make-it-fit's dropped options, CLI text and JSON."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hwdash.cli import main
from hwdash.core.catalog import Catalog, load_catalog
from hwdash.core.plan import Plan
from hwdash.core.plan_fields import BY_NAME, form_fields
from hwdash.core.planning.budget import (
    NEEDS_DATA_SIZE,
    band_of,
    budget_bands,
    price_run,
)
from hwdash.core.planning.fit import evaluate_plan, recommend
from hwdash.core.results import FitVerdict

pytestmark = pytest.mark.usefixtures("isolated_home")

# qwen2.5-7b full fine-tuning on 20k examples: the cheapest flavors that fit cost about $7 (h200)
FULL = ("--model", "qwen2.5-7b", "--method", "full", "--examples", "20000")


@pytest.fixture(autouse=True)
def no_real_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWDASH_FAKE_NVML", "no-driver")


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def _plan(**fields: object) -> Plan:
    return Plan(model="qwen2.5-7b", method="full", examples=20_000, **fields)  # type: ignore[arg-type]


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:  # type: ignore[type-arg]
    status = main(["plan", *argv, "--json"])
    out = capsys.readouterr().out
    assert status == 0, out
    document: dict = json.loads(out)  # type: ignore[type-arg]
    return document


# -- the bands ------------------------------------------------------------------------------------


def test_bands_are_the_seeds_guide_and_a_band_above_it() -> None:
    assert [band.label for band in budget_bands()] == ["<$5", "$5-20", "$20-50", "$50-200", ">$200"]
    assert [band.below for band in budget_bands()] == [5.0, 20.0, 50.0, 200.0, None]


@pytest.mark.parametrize(
    ("cost", "band"),
    [
        (0.01, "<$5"),
        (4.99, "<$5"),
        (5.0, "$5-20"),  # a band's upper limit belongs to the next band
        (19.99, "$5-20"),
        (20.0, "$20-50"),
        (199.0, "$50-200"),
        (200.0, ">$200"),
        (1e6, ">$200"),
        (None, None),
    ],
)
def test_band_of_a_cost(cost: float | None, band: str | None) -> None:
    assert band_of(cost) == band


# -- the rules ------------------------------------------------------------------------------------


def test_price_run_against_the_budget() -> None:
    over = price_run(2.0, 3.0, 5.0)
    assert (over.cost, over.over_budget) == (6.0, True)
    assert over.notes == ("over budget ($6.00 > $5.00)",)
    assert price_run(2.0, 2.5, 5.0).over_budget is False  # exactly the budget is within it
    assert price_run(2.0, 3.0, None).over_budget is None  # no budget
    assert price_run(None, 3.0, 5.0) == price_run(None, None, None)  # no cost: nothing known
    assert price_run(None, 3.0, 5.0).over_budget is None


@pytest.mark.parametrize("budget", [0, -3])
def test_the_plan_refuses_a_budget_that_is_not_positive(budget: float) -> None:
    with pytest.raises(ValueError, match="budget"):
        _plan(budget=budget)


def test_over_budget_flavors_keep_their_verdict_and_get_a_note(catalog: Catalog) -> None:
    plain = evaluate_plan(_plan(), catalog)
    budgeted = evaluate_plan(_plan(budget=10.0), catalog)
    by_id = {fit.flavor.id: fit for fit in plain.flavors}
    over = [fit for fit in budgeted.flavors if fit.over_budget]
    assert over, "some flavor costs more than $10"
    for fit in budgeted.flavors:
        before = by_id[fit.flavor.id]
        assert fit.verdict is before.verdict  # the memory verdict stays
        if fit.cost is None:
            assert fit.over_budget is None
        else:
            assert fit.over_budget is (fit.cost > 10.0)
        if fit.over_budget:
            assert f"over budget (${fit.cost:,.2f} > $10.00)" in fit.reason
        else:
            assert "over budget" not in fit.reason
    assert all(fit.over_budget is None for fit in plain.flavors)


def test_recommendation_is_the_cheapest_that_fits_within_the_budget(catalog: Catalog) -> None:
    report = evaluate_plan(_plan(budget=100.0), catalog)
    assert report.recommended is not None
    fits = list(report.flavors)
    # the recommended flavor over the budget: the next cheapest that fits is recommended instead
    marked = [
        dataclasses.replace(fit, over_budget=True) if fit.flavor.id == report.recommended else fit
        for fit in fits
    ]
    cheapest, fastest = recommend(marked)
    assert cheapest is not None and report.recommended not in (cheapest, fastest)
    assert cheapest in {fit.flavor.id for fit in fits if fit.verdict is FitVerdict.FITS}
    # nothing that fits is within the budget: none, and a warning names the cheapest that fits
    poor = evaluate_plan(_plan(budget=1.0), catalog)
    assert (poor.recommended, poor.fastest) == (None, None)
    assert any(
        w.startswith("no flavor that fits is within the budget of $1.00") for w in poor.warnings
    )
    assert not any(w.startswith("only tight fits") for w in poor.warnings)


def test_without_a_data_size_the_budget_warns_once_and_changes_nothing(catalog: Catalog) -> None:
    plain = evaluate_plan(Plan(model="qwen2.5-7b", method="lora"), catalog)
    budgeted = evaluate_plan(Plan(model="qwen2.5-7b", method="lora", budget=1.0), catalog)
    assert budgeted.warnings.count(NEEDS_DATA_SIZE) == 1
    assert budgeted.recommended == plain.recommended
    assert [f.flavor.id for f in budgeted.flavors] == [f.flavor.id for f in plain.flavors]
    assert all(fit.over_budget is None for fit in budgeted.flavors)


# -- the command line -----------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "-3", "abc"])
def test_bad_budget_names_the_flag(capsys: pytest.CaptureFixture[str], value: str) -> None:
    try:
        status = main(["plan", "--model", "7B", f"--budget={value}"])
    except SystemExit as exc:  # argparse's refusal of a value that is not a number
        status = exc.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert status == 2
    assert err.startswith("hwdash plan: error: --budget: "), err
    assert "Traceback" not in err


def test_json_budget_and_over_budget(capsys: pytest.CaptureFixture[str]) -> None:
    document = _json(capsys, *FULL, "--budget", "10")
    flavors = document["flavors"]
    over = [f for f in flavors if f["over_budget"]]
    assert over and all(f["cost"] > 10 for f in over)
    assert all(
        f["over_budget"] is False for f in flavors if f["cost"] is not None and f["cost"] <= 10
    )
    assert all(f["over_budget"] is None for f in flavors if f["cost"] is None)
    recommended = next(f for f in flavors if f["id"] == document["recommended"])
    assert document["budget"] == {
        "dollars": 10.0,
        "band_of_recommended": band_of(recommended["cost"]),
        "over_budget_count": len(over),
    }
    assert document["budget"]["band_of_recommended"] == "$5-20"
    assert document["plan"]["budget"] == 10.0
    # without --budget the document is as it was: no budget anywhere
    plain = _json(capsys, *FULL)
    assert "budget" not in plain and "budget" not in plain["plan"]
    assert all("over_budget" not in f for f in plain["flavors"])


def test_text_shows_the_band_and_the_note(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *FULL, "--budget", "10"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "flavor" in line and "cost" in line)
    assert " band " in header
    assert "$5-20" in out and "over budget (" in out and "> $10.00)" in out
    assert "(cheapest that fits within the $10.00 budget)" in out
    assert main(["plan", *FULL]) == 0
    assert " band " not in capsys.readouterr().out


def test_fit_drops_options_over_the_budget(capsys: pytest.CaptureFixture[str]) -> None:
    plain = _json(capsys, *FULL, "--fit", "any")["fit"]
    assert any(o["cost"] is not None and o["cost"] > 7.5 for o in plain["options"])
    document = _json(capsys, *FULL, "--fit", "any", "--budget", "7.5")
    options = document["fit"]["options"]
    assert options and all(o["cost"] is None or o["cost"] <= 7.5 for o in options)
    notes = document["fit"]["notes"]
    dropped = [n for n in notes if "over the budget of $7.50 dropped" in n]
    assert len(dropped) == 1 and int(dropped[0].split()[0]) > 0


def test_the_planner_form_has_a_budget_row() -> None:
    assert BY_NAME["budget"].flag == "--budget"
    assert "budget" in [field.name for field, _ in form_fields()]
