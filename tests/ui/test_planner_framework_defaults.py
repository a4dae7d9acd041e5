"""The planner form and ``hwdash plan`` resolve a framework's defaults the same way (issue 22).

For every framework in the catalog and every method, the form (driven with Pilot: the framework and
the method chosen in their drop-downs) must show the plan and the estimate that
``hwdash plan --framework F --method M --json`` prints. One app runs all the combinations.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Checkbox, Select

from hwdash.cli import main
from hwdash.core.catalog import Catalog, load_catalog
from hwdash.core.plan import Framework, Method, Optimizer, Plan, Precision
from hwdash.core.plans.store import PlanStore
from hwdash.ui.planner_pane import PlannerPane

MODEL = "llama-3.2-1b"
METHODS = ("inference", "full", "lora", "qlora", "lora-8bit", "dora", "ppo", "grpo")


class PlannerApp(App[None]):
    def __init__(self, catalog: Catalog, store: PlanStore) -> None:
        super().__init__()
        self.catalog = catalog
        self.store = store

    def compose(self) -> ComposeResult:
        yield PlannerPane(self.catalog, self.store, initial=Plan(model=MODEL))


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PlanStore:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("HWDASH_CATALOG", raising=False)
    monkeypatch.delenv("HWDASH_FAKE_NVML", raising=False)
    monkeypatch.setenv("COLUMNS", "160")
    return PlanStore()


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> dict | None:  # type: ignore[type-arg]
    status = main(["plan", "--model", MODEL, *argv, "--json"])
    out = capsys.readouterr().out
    if status != 0:
        return None
    document: dict = json.loads(out)  # type: ignore[type-arg]
    return document


def _plan_fields(document: dict) -> dict:  # type: ignore[type-arg]
    """The plan's fields as ``--json`` writes them (a field at a default the JSON leaves out, such
    as ``budget`` unset or ``cp`` at 1, is absent from both sides)."""
    return {name: document["plan"][name] for name in Plan.model_fields if name in document["plan"]}


async def test_form_and_command_line_resolve_every_framework_alike(
    isolated: PlanStore, capsys: pytest.CaptureFixture[str]
) -> None:
    catalog = load_catalog(include_user=False)
    assert set(catalog.frameworks) == {member.value for member in Framework}
    # The command line first: while the app runs, Textual captures what is printed.
    combos = [(framework, method) for framework in sorted(catalog.frameworks) for method in METHODS]
    printed = {
        combo: _cli(capsys, "--framework", combo[0], "--method", combo[1]) for combo in combos
    }
    app = PlannerApp(catalog, isolated)
    compared = 0
    async with app.run_test(size=(120, 60)) as pilot:
        pane = app.query_one(PlannerPane)
        await pilot.pause()
        for (framework, method), expected in printed.items():
            app.query_one("#plan-framework", Select).value = Framework(framework)
            app.query_one("#plan-method", Select).value = Method(method)
            await pilot.pause()
            combo = f"--framework {framework} --method {method}"
            if expected is None:  # the command line refuses it: so must the form
                assert pane.errors, combo
                continue
            assert pane.errors == {}, combo
            assert pane.report is not None
            shown = json.loads(pane.report.plan.model_dump_json())
            assert shown == _plan_fields(expected), combo
            assert pane.report.estimate.per_gpu.total == expected["memory"]["total"], combo
            assert pane.report.estimate.host_bytes == expected["host_memory"], combo
            compared += 1
    assert compared >= len(catalog.frameworks) * (len(METHODS) - 1)


async def test_a_choice_made_in_the_form_survives_a_change_of_framework(
    isolated: PlanStore,
) -> None:
    catalog = load_catalog(include_user=False)
    app = PlannerApp(catalog, isolated)
    async with app.run_test(size=(120, 60)) as pilot:
        pane = app.query_one(PlannerPane)
        await pilot.pause()
        app.query_one("#plan-framework", Select).value = Framework.UNSLOTH
        await pilot.pause()
        assert pane.report is not None
        # the form shows what the framework chose (Unsloth: checkpointing on, 8-bit AdamW)
        assert app.query_one("#plan-grad-ckpt", Checkbox).value is True
        assert app.query_one("#plan-optimizer", Select).value is Optimizer.ADAMW_8BIT
        # the user turns checkpointing off: that wins over every framework from now on
        await pilot.click("#plan-grad-ckpt")
        await pilot.pause()
        assert pane.report.plan.grad_ckpt is False
        app.query_one("#plan-framework", Select).value = Framework.TORCHTUNE
        await pilot.pause()
        assert pane.report.plan.grad_ckpt is False
        assert pane.report.plan.optimizer is Optimizer.ADAMW  # torchtune's LoRA optimizer
        assert pane.report.plan.precision is Precision.BF16
        app.query_one("#plan-framework", Select).value = Framework.UNSLOTH
        await pilot.pause()
        assert pane.report.plan.optimizer is Optimizer.ADAMW_8BIT
        assert pane.report.plan.grad_ckpt is False
        # back to Hugging Face: the optimizer the user never touched returns to its default
        app.query_one("#plan-framework", Select).value = Framework.HF
        await pilot.pause()
        assert pane.report.plan.optimizer is Optimizer.ADAMW
        assert app.query_one("#plan-optimizer", Select).value is Optimizer.ADAMW
        assert pane.report.plan.grad_ckpt is False
