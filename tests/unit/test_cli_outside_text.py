"""Catalog, model and plan names from outside are printed as typed by the command line, never read
as rich markup: `[/x]` does not crash it, `[bold]` is not swallowed, a trailing backslash is kept.

The overlay in tests/data/catalog_hostile holds an accelerator, a flavor and a model with such names.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hwdash.cli import main

HOSTILE = Path(__file__).resolve().parent.parent / "data" / "catalog_hostile"
ACCELERATOR_ID = "evil[/x]gpu"
ACCELERATOR_NAME = "Evil [bold]GPU[/bold] [/x] \\\\"
FLAVOR_ID = "evil[/x]box[bold]\\\\"
MODEL_ID = "evil[/x]model"
MODEL_NAME = "Evil [bold]Model[/bold] [/x] \\\\"
PLAN_NAME = "[/x] [bold]run[/bold] \\\\"


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No user catalog, no GPUs, plans under tmp_path, and room for every table column."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("HWDASH_CATALOG", raising=False)
    monkeypatch.delenv("HWDASH_FAKE_NVML", raising=False)
    monkeypatch.setenv("COLUMNS", "220")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    status = main(list(argv))
    out, err = capsys.readouterr()
    assert status == 0, err
    assert "Traceback" not in err
    return out


@pytest.mark.parametrize(
    ("kind", "literals"),
    [
        ("flavors", (FLAVOR_ID, f"1x {ACCELERATOR_ID}")),
        ("accelerators", (ACCELERATOR_ID, ACCELERATOR_NAME)),
        ("models", (MODEL_ID,)),
    ],
)
def test_catalog_list_prints_hostile_ids_and_names_as_typed(
    capsys: pytest.CaptureFixture[str], kind: str, literals: tuple[str, ...]
) -> None:
    out = run(capsys, "catalog", "list", "--kind", kind, "--catalog", str(HOSTILE))
    for literal in literals:
        assert literal in out


def test_plan_prints_the_model_and_flavor_names_as_typed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = run(capsys, "plan", "--model", MODEL_ID, "--catalog", str(HOSTILE))
    lines = out.splitlines()
    assert lines[0].startswith(f"{MODEL_NAME}: lora, bf16")
    (row,) = [line for line in lines if FLAVOR_ID in line and "│" in line]
    assert f"{FLAVOR_ID} (cheapest" in row  # the cheapest flavor of all: $0.01/h
    assert f"recommended: {FLAVOR_ID} (cheapest that fits)" in lines


def test_plan_fit_and_check_name_a_hostile_flavor_as_typed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    big = ("--model", MODEL_ID, "--batch", "64", "--seq", "8192", "--catalog", str(HOSTILE))
    out = run(capsys, "plan", *big, "--fit", FLAVOR_ID)
    assert f"to fit {FLAVOR_ID}:" in out
    assert main(["plan", *big, "--flavor", FLAVOR_ID, "--check"]) == 1
    assert capsys.readouterr().out.startswith(f"does not fit {FLAVOR_ID}: ")


def test_a_plan_saved_under_a_hostile_name_is_listed_by_compare_as_typed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = run(capsys, "plan", "--model", MODEL_ID, "--catalog", str(HOSTILE), "--save", PLAN_NAME)
    assert f"saved plan '{PLAN_NAME}'" in out
    listing = run(capsys, "compare", "--list", "--catalog", str(HOSTILE))
    (row,) = listing.splitlines()[1:]
    assert row.startswith(PLAN_NAME)
    assert MODEL_NAME in row and FLAVOR_ID in row
