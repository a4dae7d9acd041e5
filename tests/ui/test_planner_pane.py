"""Pilot tests of the planner pane on the real catalog: type into the form, watch the estimate follow."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Footer, Input, OptionList, Select, Static
from textual.widgets._footer import FooterKey

from hwdash.core.catalog import Catalog, load_catalog
from hwdash.core.plan import Framework, FsdpMode, Loss, Method, Offload, OptimizerImpl, Plan, Quant
from hwdash.core.planning.fit import evaluate_plan
from hwdash.core.plans.store import PlanStore
from hwdash.core.results import FitVerdict, PlanReport
from hwdash.ui.planner_pane import PlannerPane
from hwdash.ui.widgets.planner_breakdown import MemoryBreakdownView
from hwdash.ui.widgets.planner_dialogs import NameDialog
from hwdash.ui.widgets.planner_flavors import FlavorTable
from hwdash.ui.widgets.planner_trace import STALE_HINT, TraceView


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(include_user=False)


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PlanStore:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    return PlanStore()


class PlannerApp(App[None]):
    """The pane alone, recording what it posts."""

    def __init__(self, catalog: Catalog, store: PlanStore, initial: Plan | None = None) -> None:
        super().__init__()
        self.catalog = catalog
        self.store = store
        self.initial = initial
        self.changes: list[PlanReport | None] = []

    def compose(self) -> ComposeResult:
        yield PlannerPane(self.catalog, self.store, initial=self.initial)

    def on_planner_pane_plan_changed(self, message: PlannerPane.PlanChanged) -> None:
        self.changes.append(message.report)


BASE = Plan(model="qwen2.5-7b", method=Method.LORA, batch=1, seq=2048, examples=10_000)


async def replace_text(pilot, selector: str, text: str) -> None:  # type: ignore[no-untyped-def]
    """Click an input, delete what it holds and type ``text`` key by key."""
    await pilot.click(selector)
    await pilot.press("end", "ctrl+u", *list(text))
    await pilot.pause()


async def test_first_frame_shows_the_estimate_of_the_initial_plan(
    catalog: Catalog, store: PlanStore
) -> None:
    app = PlannerApp(catalog, store, BASE)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        expected = evaluate_plan(BASE, catalog)
        assert pane.report is not None
        assert pane.report.estimate == expected.estimate
        assert app.changes and app.changes[-1] is pane.report
        assert app.query_one(MemoryBreakdownView).estimate == expected.estimate
        table = app.query_one(FlavorTable)
        assert table.row_count == len(expected.flavors)
        headline = str(app.query_one("#plan-headline", Static).render())
        assert expected.model.name in headline
        assert expected.recommended is not None and expected.recommended in headline


async def test_model_search_lists_matches_and_enter_picks_one(
    catalog: Catalog, store: PlanStore
) -> None:
    app = PlannerApp(catalog, store, BASE)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await replace_text(pilot, "#plan-model", "llama-3.1")
        matches = app.query_one("#plan-model-matches", OptionList)
        assert matches.has_class("-open")
        ids = [matches.get_option_at_index(i).id for i in range(matches.option_count)]
        assert set(ids) == {m for m in catalog.models if m.startswith("llama-3.1")}
        # "llama-3.1" alone is not a model: the field says so and the estimate stays.
        pane = app.query_one(PlannerPane)
        assert "model" in pane.errors
        await pilot.press("enter")
        await pilot.pause()
        assert not matches.has_class("-open")
        assert app.query_one("#plan-model", Input).value == ids[0]
        assert pane.errors == {}
        assert pane.report is not None and pane.report.model.id == ids[0]


async def test_changing_batch_seq_and_method_recomputes(catalog: Catalog, store: PlanStore) -> None:
    app = PlannerApp(catalog, store, BASE)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        assert pane.report is not None
        before = pane.report.estimate.per_gpu
        await replace_text(pilot, "#plan-batch", "8")
        await replace_text(pilot, "#plan-seq", "4096")
        assert pane.report.plan.batch == 8
        assert pane.report.plan.seq == 4096
        after = pane.report.estimate.per_gpu
        assert after.activations > before.activations
        expected = evaluate_plan(BASE.model_copy(update={"batch": 8, "seq": 4096}), catalog)
        assert app.query_one(MemoryBreakdownView).estimate == expected.estimate
        # Pick "full" from the method drop-down with the keyboard.
        await pilot.click("#plan-method")
        await pilot.pause()
        await pilot.press("f", "u", "l", "l", "enter")
        await pilot.pause()
        assert pane.report.plan.method is Method.FULL
        full = pane.report.estimate.per_gpu
        # every parameter trains: Adam states for all of them (alive in every phase; gradients are
        # not, at a start-of-backward peak)
        assert full.optimizer > after.optimizer
        table = app.query_one(FlavorTable)
        shown = {fit.flavor.id: fit.verdict for fit in table.shown}
        expected_full = evaluate_plan(pane.report.plan, catalog)
        assert shown == {fit.flavor.id: fit.verdict for fit in expected_full.flavors}


async def test_invalid_batch_is_marked_and_the_last_estimate_stays(
    catalog: Catalog, store: PlanStore
) -> None:
    app = PlannerApp(catalog, store, BASE)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        good = pane.report
        await replace_text(pilot, "#plan-batch", "0")
        row = app.query_one("#plan-row-batch")
        assert row.has_class("-invalid")
        assert app.query_one("#plan-batch", Input).has_class("-invalid")
        assert "at least 1" in str(app.query_one("#plan-error-batch", Static).render())
        assert pane.report is good
        assert pane.has_class("-stale")
        assert app.changes[-1] is None
        # The form was not cleared.
        assert app.query_one("#plan-model", Input).value == "qwen2.5-7b"
        assert good is not None
        assert app.query_one(FlavorTable).row_count == len(good.flavors)
        # An empty field is marked too, and fixing it brings a fresh estimate back.
        await replace_text(pilot, "#plan-batch", "")
        assert "required" in str(app.query_one("#plan-error-batch", Static).render())
        await replace_text(pilot, "#plan-batch", "2")
        assert not row.has_class("-invalid")
        assert not pane.has_class("-stale")
        assert pane.report is not good
        assert pane.report is not None and pane.report.plan.batch == 2
        assert app.changes[-1] is pane.report


async def test_plan_level_and_model_errors_land_on_their_field(
    catalog: Catalog, store: PlanStore
) -> None:
    app = PlannerApp(catalog, store, BASE)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        offload: Select[Offload] = app.query_one("#plan-offload", Select)
        offload.value = Offload.OPTIMIZER  # with ZeRO stage 0: not allowed
        await pilot.pause()
        assert app.query_one("#plan-row-offload").has_class("-invalid")
        assert "ZeRO" in str(app.query_one("#plan-error-offload", Static).render())
        app.query_one("#plan-zero", Select).value = 2
        await pilot.pause()
        assert pane.errors == {}
        assert pane.report is not None and pane.report.estimate.host_bytes > 0
        await replace_text(pilot, "#plan-lora-r", "4096")  # wider than Qwen2.5-7B's k/v projections
        assert app.query_one("#plan-row-lora-r").has_class("-invalid")
        assert "wider than" in str(app.query_one("#plan-error-lora-r", Static).render())
        await replace_text(pilot, "#plan-lora-r", "16")
        assert pane.errors == {}
        await replace_text(pilot, "#plan-model", "no-such-model")
        assert app.query_one("#plan-row-model").has_class("-invalid")
        assert "no-such-model" in str(app.query_one("#plan-error-model", Static).render())


async def test_s_saves_the_plan_under_a_name_from_a_dialog(
    catalog: Catalog, store: PlanStore, tmp_path: Path
) -> None:
    app = PlannerApp(catalog, store, BASE)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await pilot.pause()
        app.query_one(FlavorTable).focus()
        await pilot.press("s")
        await pilot.pause()
        assert isinstance(app.screen, NameDialog)
        assert app.screen.query_one("#name-input", Input).value == "Qwen2.5-7B lora"
        await pilot.press("enter")
        await pilot.pause()
        assert not isinstance(app.screen, NameDialog)
        saved = PlanStore(tmp_path / "xdg" / "hwdash" / "plans.json").list()
        assert [s.name for s in saved] == ["Qwen2.5-7B lora"]
        assert saved[0].plan == BASE
        assert saved[0].summary is not None
        pane = app.query_one(PlannerPane)
        assert pane.report is not None
        assert saved[0].summary.per_gpu_total == pane.report.estimate.per_gpu.total
        assert any("Saved plan 'Qwen2.5-7B lora'" in n.message for n in app._notifications)
        # Same name again: the dialog warns, and the plan is saved with a suffix.
        await pilot.press("s")
        await pilot.pause()
        hint = str(app.screen.query_one("#name-hint", Static).render())
        assert "Qwen2.5-7B lora (2)" in hint
        await pilot.press("enter")
        await pilot.pause()
        assert store.names() == ["Qwen2.5-7B lora", "Qwen2.5-7B lora (2)"]
        # Escape cancels without saving.
        await pilot.press("s")
        await pilot.pause()
        await pilot.press("escape")
        await pilot.pause()
        assert len(store.list()) == 2


async def test_save_is_refused_while_the_form_is_invalid(
    catalog: Catalog, store: PlanStore
) -> None:
    app = PlannerApp(catalog, store, BASE)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await replace_text(pilot, "#plan-gpus", "0")
        app.query_one(PlannerPane).save_current("bad")
        await pilot.pause()
        assert store.list() == []
        assert any("fix the marked fields" in n.message for n in app._notifications)


async def test_sort_keys_headers_and_filters(catalog: Catalog, store: PlanStore) -> None:
    app = PlannerApp(catalog, store, BASE)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await pilot.pause()
        table = app.query_one(FlavorTable)
        table.focus()

        def fitting(rows: list) -> list:  # type: ignore[type-arg]
            return [fit for fit in rows if fit.verdict is not FitVerdict.NO]

        costs = [fit.cost for fit in fitting(table.shown) if fit.cost is not None]
        assert costs and costs == sorted(costs)
        assert table.shown[0].flavor.id == app.query_one(PlannerPane).report.recommended  # type: ignore[union-attr]
        await pilot.press("2")
        hours = [fit.hours for fit in fitting(table.shown) if fit.hours is not None]
        assert table.sort_by == "time" and hours == sorted(hours)
        await pilot.press("3")
        headroom = [fit.headroom_bytes for fit in fitting(table.shown)]
        assert table.sort_by == "memory" and headroom == sorted(headroom, reverse=True)
        await pilot.press("3")  # again: reversed
        headroom = [fit.headroom_bytes for fit in fitting(table.shown)]
        assert table.descending and headroom == sorted(headroom)
        # Click the "cost" heading.
        x = sum(col.get_render_width(table) for col in list(table.columns.values())[:3]) + 1
        await pilot.click(FlavorTable, offset=(x, 0))
        await pilot.pause()
        assert table.sort_by == "cost" and not table.descending
        # Filters: fits only, then one provider.
        total = len(table.shown)
        await pilot.press("o")
        await pilot.pause()
        assert 0 < len(table.shown) < total
        assert all(fit.verdict is not FitVerdict.NO for fit in table.shown)
        await pilot.press("v")  # all -> hf-jobs
        await pilot.pause()
        assert table.shown and {fit.flavor.provider for fit in table.shown} == {"hf-jobs"}
        await pilot.press("v")  # -> local
        await pilot.pause()
        assert {fit.flavor.provider for fit in table.shown} <= {"local"}
        assert table.row_count == len(table.shown)


async def test_load_plan_fills_the_form(catalog: Catalog, store: PlanStore) -> None:
    app = PlannerApp(catalog, store, BASE)
    loaded = Plan(
        model="phi-2",
        method=Method.FULL,
        batch=2,
        seq=512,
        gpus=2,
        zero=2,
        examples=1000,
        epochs=3,
        mfu=0.4,
        grad_ckpt=True,
        rl_reference=False,
    )
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        pane.load_plan(loaded)
        await pilot.pause()
        assert app.query_one("#plan-model", Input).value == "phi-2"
        assert app.query_one("#plan-epochs", Input).value == "3"
        assert app.query_one("#plan-mfu", Input).value == "0.4"
        assert pane.errors == {}
        assert pane.report is not None and pane.report.plan == loaded


async def test_no_overlap_at_80x24_and_two_columns_at_200x60(
    catalog: Catalog, store: PlanStore
) -> None:
    for size in ((80, 24), (200, 60)):
        app = PlannerApp(catalog, store, BASE)
        async with app.run_test(size=size, notifications=True) as pilot:
            await pilot.pause()
            form = app.query_one("#plan-form").region
            results = app.query_one("#plan-results").region
            assert not form.overlaps(results)
            assert form.right <= results.x
            assert results.right <= size[0]
            for row in app.query(".plan-field"):
                if row.region.height:
                    assert form.contains_region(row.region)
            summary = app.query_one("#plan-summary").region
            flavors = app.query_one("#plan-flavors").region
            assert not summary.overlaps(flavors)
            if size == (200, 60):
                # Wide: breakdown beside the table, the table using the full height.
                assert summary.right <= flavors.x
                assert flavors.height >= 50
            else:
                assert summary.bottom <= flavors.y


async def test_down_walks_into_the_matches_and_enter_picks_the_highlighted_one(
    catalog: Catalog, store: PlanStore
) -> None:
    app = PlannerApp(catalog, store, BASE)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await replace_text(pilot, "#plan-model", "qwen3-")
        matches = app.query_one("#plan-model-matches", OptionList)
        assert matches.has_class("-open") and matches.option_count >= 2
        second = matches.get_option_at_index(1).id
        await pilot.press("down")
        assert matches.has_focus
        await pilot.press("down", "enter")
        await pilot.pause()
        assert app.query_one("#plan-model", Input).value == second
        assert app.query_one("#plan-model", Input).has_focus
        pane = app.query_one(PlannerPane)
        assert pane.report is not None and pane.report.model.id == second


async def test_a_config_json_path_is_a_model(catalog: Catalog, store: PlanStore) -> None:
    from hwdash.core.models.config import resolve_model

    config = Path(__file__).parent.parent / "data" / "model_configs" / "llama-style" / "config.json"
    app = PlannerApp(catalog, store, BASE)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        pane = app.query_one(PlannerPane)
        pane.query_one("#plan-model", Input).value = str(config)
        await pilot.pause()
        assert pane.errors == {}
        assert pane.report is not None
        assert pane.report.model == resolve_model(str(config), catalog)
        assert not app.query_one("#plan-model-matches", OptionList).has_class("-open")


async def test_down_on_a_chosen_model_browses_the_whole_catalog(
    catalog: Catalog, store: PlanStore
) -> None:
    app = PlannerApp(catalog, store, BASE)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await pilot.click("#plan-model")
        await pilot.press("down")
        matches = app.query_one("#plan-model-matches", OptionList)
        assert matches.has_class("-open") and matches.has_focus
        assert matches.option_count == len(catalog.models)
        highlighted = matches.highlighted
        assert highlighted is not None
        assert matches.get_option_at_index(highlighted).id == BASE.model
        await pilot.press("down", "enter")
        await pilot.pause()
        chosen = app.query_one("#plan-model", Input).value
        assert chosen != BASE.model and chosen in catalog.models
        await pilot.press("tab")  # leaving the field closes the list
        await pilot.pause()
        assert not matches.has_class("-open")


async def test_the_model_list_closes_when_focus_leaves_the_pane(
    catalog: Catalog, store: PlanStore
) -> None:
    app = PlannerApp(catalog, store, BASE)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await replace_text(pilot, "#plan-model", "gemma")
        matches = app.query_one("#plan-model-matches", OptionList)
        assert matches.has_class("-open")
        app.set_focus(None)
        await pilot.pause()
        assert not matches.has_class("-open")


async def test_examples_typed_in_the_form_replace_a_loaded_token_count(
    catalog: Catalog, store: PlanStore
) -> None:
    app = PlannerApp(catalog, store, BASE)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        from_cli = Plan(model="qwen2.5-0.5b", tokens=50_000_000)
        pane.load_plan(from_cli)
        await pilot.pause()
        examples = app.query_one("#plan-examples", Input)
        assert examples.value == "" and "50.0M tokens" in examples.placeholder
        assert pane.report is not None and pane.report.tokens == 50_000_000
        await replace_text(pilot, "#plan-examples", "1000")
        assert pane.report.plan.tokens is None
        assert pane.report.tokens == evaluate_plan(pane.report.plan, catalog).tokens
        assert pane.report.tokens != 50_000_000


async def test_rl_rows_appear_for_grpo_and_feed_the_plan(
    catalog: Catalog, store: PlanStore
) -> None:
    app = PlannerApp(catalog, store, BASE)
    async with app.run_test(size=(100, 40), notifications=True) as pilot:
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        rl_row = app.query_one("#plan-row-vllm-memory-utilization")
        assert not rl_row.display or rl_row.region.height == 0
        app.query_one("#plan-method", Select).value = Method.GRPO
        await pilot.pause()
        assert pane.has_class("-rl") and rl_row.region.height > 0
        assert pane.report is not None and pane.report.plan.method is Method.GRPO
        with_vllm = pane.report.estimate.per_gpu.kv_cache
        await replace_text(pilot, "#plan-vllm-memory-utilization", "0")
        assert pane.report.plan.vllm_memory_utilization == 0
        assert pane.report.estimate.per_gpu.kv_cache < with_vllm
        await replace_text(pilot, "#plan-vllm-memory-utilization", "1.5")
        assert app.query_one("#plan-row-vllm-memory-utilization").has_class("-invalid")
        await replace_text(pilot, "#plan-vllm-memory-utilization", "0.3")
        app.query_one("#plan-rl-method", Select).value = Method.LORA
        await pilot.pause()
        assert pane.report.plan.rl_method is Method.LORA
        assert pane.errors == {}


async def test_quantize_row_is_for_inference_only(catalog: Catalog, store: PlanStore) -> None:
    app = PlannerApp(catalog, store, BASE)
    async with app.run_test(size=(100, 40), notifications=True) as pilot:
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        row = app.query_one("#plan-row-quant")
        assert not row.display or row.region.height == 0
        app.query_one("#plan-method", Select).value = Method.INFERENCE
        await pilot.pause()
        assert pane.has_class("-inference") and row.region.height > 0
        assert pane.report is not None
        full_weights = pane.report.estimate.per_gpu.weights
        app.query_one("#plan-quant", Select).value = Quant.NF4
        await pilot.pause()
        assert pane.report.plan.quant is Quant.NF4
        assert pane.report.estimate.per_gpu.weights < full_weights / 2
        # back to training: the hidden row does not make the plan invalid
        app.query_one("#plan-method", Select).value = Method.LORA
        await pilot.pause()
        assert pane.errors == {}
        assert pane.report.plan.method is Method.LORA and pane.report.plan.quant is Quant.NONE


async def test_lora_rows_show_only_for_plans_that_train_adapters(
    catalog: Catalog, store: PlanStore
) -> None:
    app = PlannerApp(catalog, store, BASE)
    async with app.run_test(size=(100, 40), notifications=True) as pilot:
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        rows = [app.query_one(f"#plan-row-{name}") for name in ("lora-r", "lora-dropout")]
        method = app.query_one("#plan-method", Select)
        method.value = Method.LORA
        await pilot.pause()
        assert pane.has_class("-lora") and all(row.region.height > 0 for row in rows)
        for hidden_for in (Method.FULL, Method.INFERENCE):
            method.value = hidden_for
            await pilot.pause()
            assert not pane.has_class("-lora"), hidden_for
            assert all(not row.display or row.region.height == 0 for row in rows), hidden_for
        # a half-typed rank in the hidden row does not block a full fine-tune
        method.value = Method.FULL
        await pilot.pause()
        app.query_one("#plan-lora-r", Input).value = "4.5"
        await pilot.pause()
        assert pane.errors == {} and pane.report is not None
        assert pane.report.plan.method is Method.FULL
        # an RL plan shows them when its policy trains adapters
        method.value = Method.PPO
        app.query_one("#plan-rl-method", Select).value = Method.DORA
        await pilot.pause()
        assert pane.has_class("-lora")
        app.query_one("#plan-rl-method", Select).value = Method.FULL
        await pilot.pause()
        assert not pane.has_class("-lora")


def shown(app: PlannerApp, row: str) -> bool:
    widget = app.query_one(f"#plan-row-{row}")
    return bool(widget.display) and widget.region.height > 0


async def test_framework_and_loss_rows_feed_the_savers_and_hide_for_inference(
    catalog: Catalog, store: PlanStore
) -> None:
    app = PlannerApp(catalog, store, BASE.model_copy(update={"seq": 4096}))
    async with app.run_test(size=(100, 50), notifications=True) as pilot:
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        assert shown(app, "framework") and shown(app, "loss")
        assert pane.report is not None and pane.report.plan.loss is None  # framework default
        standard = pane.report.estimate.per_gpu.total
        app.query_one("#plan-loss", Select).value = Loss.FUSED_LINEAR
        await pilot.pause()
        assert pane.report.plan.loss is Loss.FUSED_LINEAR
        assert pane.report.estimate.per_gpu.total < standard  # no fp32 logits
        # back to the framework's default; torchtune's is the chunked loss (and bf16 adapters)
        app.query_one("#plan-loss", Select).value = "framework default"
        app.query_one("#plan-framework", Select).value = Framework.TORCHTUNE
        await pilot.pause()
        assert pane.report.plan.loss is None and pane.report.plan.framework is Framework.TORCHTUNE
        assert pane.report.estimate.per_gpu.total < standard
        app.query_one("#plan-method", Select).value = Method.INFERENCE
        await pilot.pause()
        assert not shown(app, "framework") and not shown(app, "loss")
        assert pane.errors == {}


async def test_fsdp_rows_for_fine_tuning_and_tp_pp_for_full_training(
    catalog: Catalog, store: PlanStore
) -> None:
    full = BASE.model_copy(update={"method": Method.FULL, "gpus": 4})
    app = PlannerApp(catalog, store, full)
    async with app.run_test(size=(100, 60), notifications=True) as pilot:
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        assert shown(app, "fsdp") and shown(app, "tp") and shown(app, "pp")
        assert not shown(app, "fsdp-offload")  # only once FSDP is chosen
        assert pane.report is not None
        plain = pane.report.estimate.per_gpu.total
        app.query_one("#plan-fsdp", Select).value = FsdpMode.FULL
        await pilot.pause()
        assert shown(app, "fsdp-offload")
        assert pane.report.plan.fsdp is FsdpMode.FULL
        sharded = pane.report.estimate.per_gpu.total
        assert sharded < plain / 2  # states over 4 GPUs
        await pilot.click("#plan-fsdp-offload")
        await pilot.pause()
        assert pane.report.plan.fsdp_offload
        assert pane.report.estimate.per_gpu.total < sharded
        # FSDP with --tp is refused: the error lands on a field, the last estimate stays
        await replace_text(pilot, "#plan-tp", "2")
        assert pane.errors and set(pane.errors) <= {"fsdp", "tp", ""}
        app.query_one("#plan-fsdp", Select).value = FsdpMode.NONE
        await pilot.pause()
        assert pane.errors == {}
        assert pane.report.plan.tp == 2 and not pane.report.plan.fsdp_offload
        assert not shown(app, "fsdp-offload")
        # 4 GPUs is not a multiple of tp x pp = 2 x 3: the GPUs field says so
        await replace_text(pilot, "#plan-pp", "3")
        assert "gpus" in pane.errors
        await replace_text(pilot, "#plan-pp", "2")
        assert pane.errors == {} and (pane.report.plan.tp, pane.report.plan.pp) == (2, 2)
        # LoRA: the Megatron rows hide and their values no longer apply; FSDP stays
        app.query_one("#plan-method", Select).value = Method.LORA
        await pilot.pause()
        assert not shown(app, "tp") and shown(app, "fsdp")
        assert pane.errors == {} and (pane.report.plan.tp, pane.report.plan.pp) == (1, 1)
        # RL: no FSDP row (modelled for fine-tuning)
        app.query_one("#plan-method", Select).value = Method.GRPO
        await pilot.pause()
        assert not shown(app, "fsdp") and pane.errors == {}


async def test_load_plan_fills_the_issue_13_fields(catalog: Catalog, store: PlanStore) -> None:
    loaded = BASE.model_copy(
        update={
            "method": Method.FULL,
            "gpus": 8,
            "framework": Framework.UNSLOTH,
            "loss": Loss.CHUNKED,
            "fsdp": FsdpMode.HYBRID,
            "fsdp_offload": True,
        }
    )
    app = PlannerApp(catalog, store, BASE)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        pane.load_plan(loaded)
        await pilot.pause()
        assert app.query_one("#plan-framework", Select).value is Framework.UNSLOTH
        assert app.query_one("#plan-loss", Select).value is Loss.CHUNKED
        assert app.query_one("#plan-fsdp", Select).value is FsdpMode.HYBRID
        assert pane.report is not None and pane.report.plan == loaded
        pane.load_plan(BASE)  # loss None: the framework-default choice again
        await pilot.pause()
        assert app.query_one("#plan-loss", Select).value == "framework default"
        assert pane.report.plan == BASE


def test_warnings_name_form_fields_instead_of_flags() -> None:
    from hwdash.ui.planner_pane import form_words

    assert (
        form_words("try --grad-ckpt, a smaller --batch/--seq, or --flavor X")
        == "try grad ckpt, a smaller micro-batch/seq length, or --flavor X"
    )


async def test_enter_on_a_flavor_row_explains_it(catalog: Catalog, store: PlanStore) -> None:
    app = PlannerApp(catalog, store, BASE)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await pilot.pause()
        table = app.query_one(FlavorTable)
        table.focus()
        await pilot.press("ctrl+end", "enter")  # the last row: a flavor the plan does not fit
        await pilot.pause()
        last = table.shown[-1]
        assert last.verdict is FitVerdict.NO
        [note] = [n for n in app._notifications if n.title == last.flavor.name]
        assert "needs" in note.message


# -- fields added later: gradient accumulation, LoRA dropout, AdamW implementation ---------------


async def test_grad_accum_dropout_and_adamw_impl_feed_the_plan(
    catalog: Catalog, store: PlanStore
) -> None:
    app = PlannerApp(catalog, store, BASE)
    async with app.run_test(size=(100, 40), notifications=True) as pilot:
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        assert app.query_one("#plan-grad-accum", Input).value == "1"
        assert app.query_one("#plan-lora-dropout", Input).value == "0.05"
        await replace_text(pilot, "#plan-grad-accum", "4")
        await replace_text(pilot, "#plan-lora-dropout", "0")
        assert pane.errors == {}
        assert pane.report is not None
        assert (pane.report.plan.grad_accum, pane.report.plan.lora_dropout) == (4, 0.0)
        expected = evaluate_plan(
            BASE.model_copy(update={"grad_accum": 4, "lora_dropout": 0}), catalog
        )
        assert pane.report.estimate == expected.estimate
        app.query_one("#plan-optimizer-impl", Select).value = OptimizerImpl.FUSED
        await pilot.pause()
        assert pane.report.plan.optimizer_impl is OptimizerImpl.FUSED
        # Out-of-range values are marked on their own field; the last estimate stays.
        good = pane.report
        await replace_text(pilot, "#plan-lora-dropout", "1")
        assert app.query_one("#plan-row-lora-dropout").has_class("-invalid")
        assert "less than 1" in str(app.query_one("#plan-error-lora-dropout", Static).render())
        await replace_text(pilot, "#plan-grad-accum", "0")
        assert app.query_one("#plan-row-grad-accum").has_class("-invalid")
        assert "at least 1" in str(app.query_one("#plan-error-grad-accum", Static).render())
        assert pane.report is good and pane.has_class("-stale")


async def test_fused_adamw_lowers_a_full_fine_tune_at_the_optimizer_step(
    catalog: Catalog, store: PlanStore
) -> None:
    full = Plan(model="qwen2.5-0.5b", method=Method.FULL, batch=1, seq=512)
    app = PlannerApp(catalog, store, full)
    async with app.run_test(size=(100, 40), notifications=True) as pilot:
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        assert pane.report is not None
        foreach = pane.report.estimate
        app.query_one("#plan-optimizer-impl", Select).value = OptimizerImpl.FUSED
        await pilot.pause()
        fused = pane.report.estimate
        assert (
            fused
            == evaluate_plan(full.model_copy(update={"optimizer_impl": "fused"}), catalog).estimate
        )
        # foreach's step temporaries make the step the peak; fused has none, so the peak moves
        assert foreach.peak_phase == "optimizer step"
        assert fused.per_gpu.total < foreach.per_gpu.total
        assert fused.peak_phase != "optimizer step"
        # The breakdown names the phase of the peak under the total.
        text = str(app.query_one(MemoryBreakdownView).render())
        assert f"peak at     {fused.peak_phase}" in text


async def test_load_plan_fills_the_new_fields(catalog: Catalog, store: PlanStore) -> None:
    loaded = BASE.model_copy(
        update={"grad_accum": 8, "lora_dropout": 0.1, "optimizer_impl": OptimizerImpl.FOR_LOOP}
    )
    app = PlannerApp(catalog, store, BASE)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        pane.load_plan(loaded)
        await pilot.pause()
        assert app.query_one("#plan-grad-accum", Input).value == "8"
        assert app.query_one("#plan-lora-dropout", Input).value == "0.1"
        assert app.query_one("#plan-optimizer-impl", Select).value is OptimizerImpl.FOR_LOOP
        assert pane.report is not None and pane.report.plan == loaded


# -- the footer and the trace action -------------------------------------------------------------


class PlannerWithFooterApp(PlannerApp):
    def compose(self) -> ComposeResult:
        yield from super().compose()
        yield Footer()


async def test_the_footer_shows_the_pane_keys_while_the_pane_has_focus(
    catalog: Catalog, store: PlanStore
) -> None:
    app = PlannerWithFooterApp(catalog, store, BASE)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        app.query_one(FlavorTable).focus()
        await pilot.pause()
        await pilot.pause()
        shown = {key.key for key in app.query(FooterKey)}
        # The main ones; sorting (1/2/3), provider (v), fits only (o) and export (e) are in the
        # help, so the app's own keys keep their place in an 80-column footer.
        assert {"s", "t", "f"} <= shown
        # Every one of them is on screen at 80 columns.
        for key in app.query(FooterKey):
            if key.key in {"s", "t", "1", "2", "3", "f", "v"}:
                assert key.region.right <= 80 and key.region.width > 0
        app.set_focus(None)
        await pilot.pause()
        await pilot.pause()
        assert "t" not in {key.key for key in app.query(FooterKey)}


def _torch_installed() -> bool:
    return importlib.util.find_spec("torch") is not None


async def wait_for_trace(pilot, pane: PlannerPane) -> None:  # type: ignore[no-untyped-def]
    """Wait for the trace worker to finish and its result to reach the pane."""
    await pane.app.workers.wait_for_complete()
    await pilot.pause()
    await pilot.pause()


@pytest.mark.skipif(_torch_installed(), reason="checks the message shown without torch")
async def test_t_without_torch_says_what_is_missing(catalog: Catalog, store: PlanStore) -> None:
    app = PlannerApp(catalog, store, BASE)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        view = app.query_one(TraceView)
        assert view.region.height == 0  # nothing until the first trace
        app.query_one(FlavorTable).focus()
        await pilot.press("t")
        await wait_for_trace(pilot, pane)
        outcome = pane.trace_outcome
        assert outcome is not None and outcome.trace is None and outcome.message
        assert "needs torch" in outcome.message and "Traceback" not in outcome.message
        assert not view.running and view.region.height > 0
        shown = str(app.query_one("#trace-result", Static).render())
        assert shown.startswith("trace: needs torch")
        # The estimate is untouched.
        assert pane.report is not None and pane.report.plan == BASE


async def test_a_plan_that_cannot_be_traced_says_why_in_form_words(
    catalog: Catalog, store: PlanStore
) -> None:
    # QLoRA is refused before any package is imported: the same message with or without torch.
    app = PlannerApp(catalog, store, BASE.model_copy(update={"method": Method.QLORA}))
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        pane.action_trace()
        await wait_for_trace(pilot, pane)
        outcome = pane.trace_outcome
        assert outcome is not None and outcome.message is not None
        assert "bitsandbytes" in outcome.message
        assert "--method" not in outcome.message and "method lora" in outcome.message


async def test_a_form_change_marks_the_trace_stale_and_changing_back_restores_it(
    catalog: Catalog, store: PlanStore
) -> None:
    app = PlannerApp(catalog, store, BASE.model_copy(update={"method": Method.PPO}))
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        pane.action_trace()
        await wait_for_trace(pilot, pane)
        assert pane.trace_outcome is not None and not pane.trace_is_stale
        result = app.query_one("#trace-result", Static)
        assert STALE_HINT not in str(result.render())
        await replace_text(pilot, "#plan-seq", "1024")
        assert pane.trace_is_stale
        assert STALE_HINT in str(result.render())
        await replace_text(pilot, "#plan-seq", "0")  # invalid form: still stale
        assert pane.trace_is_stale
        await replace_text(pilot, "#plan-seq", "2048")  # the traced plan again
        assert not pane.trace_is_stale
        assert STALE_HINT not in str(result.render())


async def test_trace_is_refused_while_the_form_is_invalid(
    catalog: Catalog, store: PlanStore
) -> None:
    app = PlannerApp(catalog, store, BASE)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await replace_text(pilot, "#plan-batch", "0")
        app.query_one(PlannerPane).action_trace()
        await pilot.pause()
        assert not app.query_one(TraceView).running
        assert app.query_one(PlannerPane).trace_outcome is None
        assert any("Nothing to trace" in n.message for n in app._notifications)


@pytest.mark.validate
async def test_t_traces_a_tiny_model_and_shows_the_traced_peak(
    catalog: Catalog, store: PlanStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import threading

    import hwdash.ui.planner_pane as planner_module
    from hwdash.core.units import format_bytes
    from hwdash.tracing import comparable_estimate, relative_error

    # The real trace, held at a gate until the test has looked at the spinner: a tiny model with
    # torch already imported traces in milliseconds, faster than a frame.
    gate = threading.Event()
    real_trace = planner_module.run_trace_until_cancelled

    def gated_trace(*args: Any, **kwargs: Any) -> Any:
        gate.wait(30)
        return real_trace(*args, **kwargs)

    monkeypatch.setattr(planner_module, "run_trace_until_cancelled", gated_trace)

    plan = Plan(model="seed-2m", method=Method.FULL, batch=1, seq=128)
    app = PlannerApp(catalog, store, plan)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        view = app.query_one(TraceView)
        for _ in range(100):  # under load the first estimate may come a few frames later
            if pane.report is not None:
                break
            await pilot.pause(0.02)
        assert pane.report is not None
        app.query_one(FlavorTable).focus()
        await pilot.press("t")
        # The spinner shows while the worker thread traces; the event loop keeps running.
        assert view.running, [n.message for n in app._notifications]
        assert app.query_one("#trace-running").region.height == 1
        await pilot.press("2")  # keys still work meanwhile
        assert app.query_one(FlavorTable).sort_by == "time"
        gate.set()
        await wait_for_trace(pilot, pane)
        assert not view.running
        outcome = pane.trace_outcome
        assert outcome is not None and outcome.message is None and outcome.trace is not None
        assert outcome.trace.peak_bytes > 0
        estimate = comparable_estimate(plan, catalog.models["seed-2m"])
        assert outcome.estimate == estimate
        error = relative_error(
            estimate.per_gpu.total - estimate.per_gpu.overhead, outcome.trace.peak_bytes
        )
        assert error is not None and outcome.error == pytest.approx(error)
        shown = str(app.query_one("#trace-result", Static).render())
        assert f"traced      {format_bytes(outcome.trace.peak_bytes)}" in shown
        assert f"{error:+.1%}" in shown


# -- make it fit ------------------------------------------------------------------------------------


async def test_f_opens_the_options_for_the_selected_flavor_and_enter_applies_one(
    catalog: Catalog, store: PlanStore
) -> None:
    from hwdash.ui.widgets.planner_fit import FitOptionsDialog

    too_big = Plan(model="qwen2.5-7b", method=Method.LORA, batch=4, seq=2048, examples=10_000)
    app = PlannerApp(catalog, store, too_big)
    async with app.run_test(size=(120, 36), notifications=True) as pilot:
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        table = app.query_one(FlavorTable)
        table.focus()
        row = [fit.flavor.id for fit in table.shown].index("l4x1")
        table.move_cursor(row=row)
        await pilot.pause()
        assert table.shown[row].verdict is FitVerdict.NO
        await pilot.press("f")
        await pilot.pause()
        dialog = app.screen
        assert isinstance(dialog, FitOptionsDialog)
        assert dialog.search.target == "l4x1" and dialog.search.options
        first = dialog.search.options[0]
        assert first.keeps_experiment
        await pilot.press("enter")
        await pilot.pause()
        await pilot.pause()
        assert not isinstance(app.screen, FitOptionsDialog)
        assert pane.report is not None and pane.report.plan == first.plan
        l4 = next(fit for fit in pane.report.flavors if fit.flavor.id == "l4x1")
        assert l4.verdict is first.fit.verdict
        assert any("Applied:" in n.message for n in app._notifications)


async def test_escape_leaves_the_options_without_changing_the_form(
    catalog: Catalog, store: PlanStore
) -> None:
    from hwdash.ui.widgets.planner_fit import FitOptionsDialog

    app = PlannerApp(catalog, store, BASE)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        before = pane.report
        pane.query_one("#plan-fits-only").focus()  # in a text field f would be typed
        await pilot.press("f")  # focus is on no table: the recommended flavor, where it fits
        await pilot.pause()
        assert isinstance(app.screen, FitOptionsDialog)
        assert app.screen.search.fits_already
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, FitOptionsDialog)
        assert pane.report is before


async def test_the_monitors_gpus_become_the_local_flavor(tmp_path: Path) -> None:
    from snapshot_apps.fake_dashboard import fake_app, wait_for_frames

    app, _clock = fake_app("h100x8", data_dir=tmp_path, initial_tab="planner")
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for_frames(pilot, app, 1)
        await pilot.pause()
        await pilot.pause()
        pane = app.planner
        assert "local" in pane.catalog.flavors
        assert pane.catalog.flavors["local"].gpu_count == 8
        assert pane.report is not None
        assert "local" in {fit.flavor.id for fit in pane.report.flavors}
        rows = app.query_one(FlavorTable)
        assert any(
            "(this machine)" in str(rows.get_row(fit.flavor.id)[1])
            for fit in rows.shown
            if fit.flavor.id == "local"
        )


async def test_e_exports_the_current_plan_to_a_file(
    catalog: Catalog, store: PlanStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from hwdash.core.plans.exports import deepspeed_config
    from hwdash.ui.widgets.planner_export import ExportDialog

    monkeypatch.chdir(tmp_path)
    plan = Plan(model="qwen2.5-7b", method=Method.LORA, batch=2, grad_accum=4, zero=2)
    app = PlannerApp(catalog, store, plan)
    async with app.run_test(size=(120, 36), notifications=True) as pilot:
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        await pilot.press("e")
        await pilot.pause()
        assert isinstance(app.screen, ExportDialog)
        await pilot.press("enter")  # the first format: DeepSpeed
        await pilot.pause()
        # Not the folder hwdash started in: the exports folder in its data folder.
        assert pane.exported is not None
        assert pane.exported.parent == tmp_path / "xdg" / "hwdash" / "exports"
        assert json.loads(pane.exported.read_text()) == deepspeed_config(plan, plan.gpus)
        assert any(str(pane.exported) in n.message for n in app._notifications)


async def test_the_trace_spinner_exists_only_while_a_trace_runs() -> None:
    """A hidden LoadingIndicator still redraws 16 times a second: it is mounted only while running."""
    from textual.app import App
    from textual.widgets import LoadingIndicator

    class Host(App[None]):
        def compose(self):  # type: ignore[no-untyped-def]
            yield TraceView(id="trace")

    app = Host()
    async with app.run_test(size=(80, 12)) as pilot:
        view = app.query_one(TraceView)
        assert not app.query(LoadingIndicator)
        view.show_running("seed-2m")
        await pilot.pause()
        assert view.running and len(app.query(LoadingIndicator)) == 1
        view.show_running("seed-2m")  # a second start does not stack spinners
        await pilot.pause()
        assert len(app.query(LoadingIndicator)) == 1
        view.stop_running()
        await pilot.pause()
        assert not view.running and not app.query(LoadingIndicator)


async def test_saving_over_a_broken_plans_file_moves_it_aside_and_saves(
    catalog: Catalog, store: PlanStore
) -> None:
    store.path.parent.mkdir(parents=True)
    store.path.write_text("{broken")
    app = PlannerApp(catalog, store, BASE)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await pilot.pause()
        app.query_one(FlavorTable).focus()
        await pilot.press("s")
        await pilot.pause()
        assert isinstance(app.screen, NameDialog)
        assert store.path.read_text() == "{broken"  # opening the dialog moved nothing
        await pilot.press("enter")
        await pilot.pause()
        assert not isinstance(app.screen, NameDialog)
        assert [saved.name for saved in store.list()] == ["Qwen2.5-7B lora"]
        [backup] = store.path.parent.glob("plans.json.bak-*")
        assert backup.read_text() == "{broken"
        assert any("moved it to" in n.message for n in app._notifications)


async def test_the_sort_arrow_says_which_way_the_numbers_run(
    catalog: Catalog, store: PlanStore
) -> None:
    from textual.widgets.data_table import ColumnKey

    app = PlannerApp(catalog, store, BASE)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        table = app.query_one(FlavorTable)
        table.focus()

        def label(column: str) -> str:
            return table.columns[ColumnKey(column)].label.plain

        assert label("cost").endswith("▲")  # cheapest first: the numbers go up
        await pilot.press("3")
        assert table.sort_by == "memory"
        assert label("headroom").endswith("▼")  # most headroom first: the numbers go down
        await pilot.press("3")
        assert label("headroom").endswith("▲")


@pytest.mark.parametrize(
    "field, typed, message",
    [
        ("batch", "4.5", "'4.5' is not a whole number"),
        ("batch", "1e9", "'1e9' is not a whole number"),
        ("lora-dropout", "0.1.2", "'0.1.2' is not a number"),
        ("epochs", "inf", "'inf' is not a finite number"),
    ],
)
async def test_number_fields_keep_what_was_typed_and_say_what_is_wrong(
    catalog: Catalog, store: PlanStore, field: str, typed: str, message: str
) -> None:
    app = PlannerApp(catalog, store, BASE)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await pilot.pause()
        await replace_text(pilot, f"#plan-{field}", typed)
        # Typed key by key, as a user would: no character is dropped (4.5 used to become 45).
        assert app.query_one(f"#plan-{field}", Input).value == typed
        assert message in str(app.query_one(f"#plan-error-{field}", Static).render())
        assert app.query_one(PlannerPane).has_class("-stale")  # the last estimate, marked stale
