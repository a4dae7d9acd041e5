# ruff: noqa: SIM905 - flag lists read best as one string each
"""One time model: the catalog's slowdowns are in every hours figure a user sees (issue 22).

The plan's own flavor rows (JSON and table), make-it-fit's options and the ``hf jobs`` timeout all
read :func:`hwdash.core.planning.run_time.estimate_run_time`; a QLoRA plan's hours are the unslowed LoRA
hours (the same FLOPs: 4N + 2N per token) times the catalog's ``qlora`` factor everywhere.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from monitor_cli import run_plan

from hwdash.core.catalog import Catalog, load_catalog
from hwdash.core.models.config import resolve_model
from hwdash.core.plan import Method, Offload, Plan, Precision
from hwdash.core.planning.run_time import estimate_run_time
from hwdash.core.plans.exports import job_timeout_minutes
from hwdash.core.units import format_hours

pytestmark = pytest.mark.usefixtures("quiet_machine")


SEVEN_B = "--model qwen2.5-7b --grad-ckpt --examples 20000".split()


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(include_user=False)


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    status, out, err = run_plan(capsys, *args, "--json")
    assert status == 0, err
    return json.loads(out)  # type: ignore[no-any-return]


def row(document: dict[str, Any], flavor_id: str) -> dict[str, Any]:
    return next(entry for entry in document["flavors"] if entry["id"] == flavor_id)


def test_the_time_model_multiplies_the_catalog_factors_and_names_them(catalog: Catalog) -> None:
    model = resolve_model("qwen2.5-7b", catalog)
    accelerator = catalog.accelerators[catalog.flavors["a10g-large"].accelerator or ""]
    lora = Plan(model="qwen2.5-7b", method=Method.LORA, grad_ckpt=True)
    plain = estimate_run_time(lora, model, accelerator, 1, 10**8, slowdowns=catalog.slowdowns)
    assert plain.slowdowns == () and plain.factor == 1.0
    qlora = estimate_run_time(
        lora.with_changes({"method": Method.QLORA}),
        model,
        accelerator,
        1,
        10**8,
        slowdowns=catalog.slowdowns,
    )
    factor = catalog.slowdowns["qlora"].factor
    assert [entry.id for entry in qlora.slowdowns] == ["qlora"]
    assert plain.hours is not None and qlora.hours is not None
    assert qlora.hours == pytest.approx(plain.hours * factor, rel=1e-12)
    assert plain.tokens_per_second is not None and qlora.tokens_per_second is not None
    assert qlora.tokens_per_second == pytest.approx(plain.tokens_per_second / factor, rel=1e-12)
    # ZeRO-3 parameter offload: the catalog's offload-params factor (it offloads the optimizer too)
    full = Plan(model="qwen2.5-7b", method=Method.FULL, precision=Precision.MIXED, zero=3)
    on_gpu = estimate_run_time(full, model, accelerator, 4, 10**8, slowdowns=catalog.slowdowns)
    offloaded = estimate_run_time(
        full.with_changes({"offload": Offload.PARAMS}),
        model,
        accelerator,
        4,
        10**8,
        slowdowns=catalog.slowdowns,
    )
    assert [entry.id for entry in offloaded.slowdowns] == ["offload-params"]
    assert on_gpu.hours is not None and offloaded.hours is not None
    assert offloaded.hours == pytest.approx(
        on_gpu.hours * catalog.slowdowns["offload-params"].factor, rel=1e-12
    )


def test_a_qlora_plans_json_and_table_hours_carry_the_qlora_factor(
    capsys: pytest.CaptureFixture[str], catalog: Catalog
) -> None:
    factor = catalog.slowdowns["qlora"].factor
    lora = row(plan_json(capsys, *SEVEN_B, "--method", "lora"), "a10g-large")
    qlora = row(plan_json(capsys, *SEVEN_B, "--method", "qlora"), "a10g-large")
    assert lora["slowdowns"] == []
    assert qlora["slowdowns"] == [{"id": "qlora", "factor": factor}]
    assert qlora["hours"] == pytest.approx(lora["hours"] * factor, rel=1e-12)
    assert qlora["cost"] == pytest.approx(lora["cost"] * factor, rel=1e-12)
    assert qlora["tokens_per_second"] == pytest.approx(lora["tokens_per_second"] / factor)
    # the printed flavor table shows the same hours, and says which factor is in them
    status, out, _ = run_plan(capsys, *SEVEN_B, "--method", "qlora", "--flavor", "a10g-large")
    assert status == 0
    table_row = next(line for line in out.splitlines() if "a10g-large" in line)
    assert format_hours(qlora["hours"]) in table_row
    assert format_hours(lora["hours"]) not in table_row
    assert f"qlora x{factor:g}" in out


def test_a_fit_option_has_the_hours_its_command_reruns_to(
    capsys: pytest.CaptureFixture[str], catalog: Catalog
) -> None:
    document = plan_json(
        capsys,
        *"--model qwen2.5-7b --method lora --examples 20000 --flavor t4-small".split(),
        "--fit",
        "t4-small",
    )
    base = row(document, "t4-small")
    options = document["fit"]["options"]
    assert any(
        option["args"][option["args"].index("--method") + 1] == "qlora" for option in options
    )
    for option in options:
        again = row(plan_json(capsys, *option["args"]), "t4-small")
        assert option["hours"] == pytest.approx(again["hours"], rel=1e-12), option["words"]
        assert option["cost"] == pytest.approx(again["cost"], rel=1e-12)
        method = option["args"][option["args"].index("--method") + 1]
        if method == "qlora":
            # the same option as 16-bit LoRA, times the catalog's qlora factor
            args = list(option["args"])
            args[args.index("--method") + 1] = "lora"
            unslowed = row(plan_json(capsys, *args), "t4-small")["hours"]
            factor = catalog.slowdowns["qlora"].factor
            assert option["hours"] == pytest.approx(unslowed * factor, rel=1e-12)
        if "--seq" not in option["args"]:  # the same tokens: the step-time ratio is the hours'
            assert option["slowdown"] == pytest.approx(option["hours"] / base["hours"], abs=1e-4)


def test_the_hf_jobs_timeout_covers_the_slowed_run(
    capsys: pytest.CaptureFixture[str], catalog: Catalog
) -> None:
    lora = row(plan_json(capsys, *SEVEN_B, "--method", "lora"), "a10g-large")["hours"]
    slowed = lora * catalog.slowdowns["qlora"].factor
    status, out, err = run_plan(
        capsys, *SEVEN_B, "--method", "qlora", "--flavor", "a10g-large", "--export", "hf-jobs"
    )
    assert status == 0, err
    timeout = out.strip().splitlines()[-1].split("--timeout ")[1].split()[0]
    minutes = int(timeout[:-1]) * (60 if timeout.endswith("h") else 1)
    assert minutes == job_timeout_minutes(slowed)
    assert minutes >= slowed * 60
    assert f"# estimated {slowed:.2f} h" in out and "qlora x1.66" in out


def test_a_user_catalogs_factor_is_the_one_applied(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "slowdowns.toml").write_text(
        '[[slowdown]]\nid = "qlora"\nfactor = 2.0\ncompared_with = "16-bit LoRA"\n'
        'source = "measured on our own runs"\n',
        encoding="utf-8",
    )
    lora = row(plan_json(capsys, *SEVEN_B, "--method", "lora"), "a10g-large")
    qlora = row(
        plan_json(capsys, *SEVEN_B, "--method", "qlora", "--catalog", str(folder)), "a10g-large"
    )
    assert qlora["slowdowns"] == [{"id": "qlora", "factor": 2.0}]
    assert qlora["hours"] == pytest.approx(2.0 * lora["hours"], rel=1e-12)
