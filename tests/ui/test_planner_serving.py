"""The planner's serving rows (engine, memory utilization, max len, max seqs, KV dtype), its
serving lines (KV cache, blocks, tokens, maximum concurrency at max len) and the context, Ulysses
and expert parallelism rows (issue 30)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Select, Static

from hwdash.cli import main
from hwdash.core.catalog import Catalog, load_catalog
from hwdash.core.plan import Engine, KvDtype, Method, Plan
from hwdash.core.planning.serving_plan import engine_total_bytes, memory_on, serving_settings
from hwdash.core.plans.store import PlanStore
from hwdash.core.units import format_bytes
from hwdash.ui.planner_pane import PlannerPane
from hwdash.ui.widgets.planner_breakdown import MemoryBreakdownView
from hwdash.ui.widgets.planner_flavors import FlavorTable

SERVING_ROWS = (
    "gpu-memory-utilization",
    "max-model-len",
    "max-num-seqs",
    "kv-dtype",
    "max-num-batched-tokens",
)
INFERENCE = Plan(model="qwen2.5-7b", method=Method.INFERENCE, flavors=("l4x1", "h200"))


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(include_user=False)


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PlanStore:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    return PlanStore()


class PaneApp(App[None]):
    def __init__(self, catalog: Catalog, store: PlanStore, initial: Plan) -> None:
        super().__init__()
        self.catalog, self.store, self.initial = catalog, store, initial

    def compose(self) -> ComposeResult:
        yield PlannerPane(self.catalog, self.store, initial=self.initial)


def shown(app: App[None], row: str) -> bool:
    widget = app.query_one(f"#plan-row-{row}")
    return bool(widget.display) and widget.region.height > 0


async def replace_text(pilot, selector: str, text: str) -> None:  # type: ignore[no-untyped-def]
    await pilot.click(selector)
    await pilot.press("end", "ctrl+u", *list(text))
    await pilot.pause()


def serving_lines(app: App[None]) -> str:
    view = app.query_one("#plan-serving", Static)
    return str(view.render()) if view.display else ""


async def test_engine_rows_feed_a_serving_plan_and_its_lines(
    catalog: Catalog, store: PlanStore
) -> None:
    app = PaneApp(catalog, store, INFERENCE)
    async with app.run_test(size=(100, 60)) as pilot:
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        # one generate call: the engine row, none of the server's settings, no serving lines
        assert shown(app, "engine") and not any(shown(app, row) for row in SERVING_ROWS)
        assert serving_lines(app) == ""
        app.query_one("#plan-engine", Select).value = Engine.VLLM
        await pilot.pause()
        assert all(shown(app, row) for row in SERVING_ROWS)
        await replace_text(pilot, "#plan-max-model-len", "8192")
        await replace_text(pilot, "#plan-max-num-seqs", "64")
        await replace_text(pilot, "#plan-max-num-batched-tokens", "4096")
        app.query_one("#plan-kv-dtype", Select).value = KvDtype.FP8
        await pilot.pause()
        assert pane.errors == {} and pane.report is not None
        plan = pane.report.plan
        assert (plan.engine, plan.max_model_len, plan.max_num_seqs) == (Engine.VLLM, 8192, 64)
        assert plan.kv_dtype is KvDtype.FP8 and plan.max_num_batched_tokens == 4096
        # the lines are the engine's pool on the first --flavor, as hwdash plan prints them
        settings = serving_settings(plan)
        assert settings is not None
        fit = next(f for f in pane.report.flavors if f.flavor.id == "l4x1")
        memory = memory_on(pane.report, settings, fit.accelerator, catalog)
        text = serving_lines(app)
        assert "vLLM (V1 engine), TP 1 on l4x1" in text
        assert f"{memory.kv_blocks:,} blocks of 16 = {memory.kv_tokens:,} tokens" in text
        assert f"max concurrency at 8,192 tokens: {memory.max_concurrency:.2f}x" in text
        # the flavor table's verdicts are the engine's (fits: the pool holds one sequence)
        assert "serving:" in (fit.reason or "")
        # a share above 1 is refused on its row; the last estimate stays
        await replace_text(pilot, "#plan-gpu-memory-utilization", "1.5")
        assert "not a share of the GPU" in pane.errors["gpu_memory_utilization"]
        await replace_text(pilot, "#plan-gpu-memory-utilization", "0.8")
        assert pane.errors == {} and pane.report.plan.gpu_memory_utilization == 0.8
        # back to hf: the server's settings hide and no longer apply
        app.query_one("#plan-engine", Select).value = Engine.HF
        await pilot.pause()
        assert not any(shown(app, row) for row in SERVING_ROWS) and serving_lines(app) == ""
        assert pane.errors == {} and pane.report.plan.max_model_len is None
        assert pane.report.plan.kv_dtype is KvDtype.AUTO
        # training: no engine row, the plan is not a serving plan
        app.query_one("#plan-engine", Select).value = Engine.SGLANG
        app.query_one("#plan-method", Select).value = Method.LORA
        await pilot.pause()
        assert not shown(app, "engine") and not any(shown(app, row) for row in SERVING_ROWS)
        assert pane.errors == {} and pane.report.plan.engine is Engine.HF


async def test_a_loaded_serving_plan_shows_its_lines_at_80x24(
    catalog: Catalog, store: PlanStore
) -> None:
    plan = INFERENCE.model_copy(
        update={"engine": Engine.VLLM, "max_model_len": 131072, "flavors": ("l4x1",)}
    )
    app = PaneApp(catalog, store, Plan.model_validate(plan.model_dump()))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        assert pane.errors == {} and pane.report is not None
        assert app.query_one("#plan-engine", Select).value is Engine.VLLM
        # the pool holds no 131,072-token sequence on an L4: the lines say so, in red
        text = serving_lines(app)
        assert "max concurrency at 131,072 tokens: 0." in text
        assert "would not start" in text
        view = app.query_one("#plan-serving").region
        results = app.query_one("#plan-side").region
        assert view.height >= 4 and results.contains_region(view)
        assert not app.query_one("#plan-form").region.overlaps(view)


async def test_headline_and_bars_of_a_serving_plan_are_the_engines(
    catalog: Catalog, store: PlanStore
) -> None:
    """The headline's per-GPU total and the breakdown's bars are what the engine takes on the
    flavor of the serving lines (its budget, the CUDA-graph pool and V1's CUDA context), not one
    generate call's."""
    plan = INFERENCE.model_copy(
        update={"engine": Engine.VLLM, "max_model_len": 8192, "flavors": ("h200",)}
    )
    app = PaneApp(catalog, store, Plan.model_validate(plan.model_dump()))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        assert pane.errors == {} and pane.report is not None
        settings = serving_settings(pane.report.plan)
        assert settings is not None
        fit = next(f for f in pane.report.flavors if f.flavor.id == "h200")
        memory = memory_on(pane.report, settings, fit.accelerator, catalog)
        per_gpu = pane.report.estimate.per_gpu
        assert per_gpu.total == engine_total_bytes(memory) == fit.need_bytes
        # on top of the budget: the CUDA-graph pool and V1's CUDA context (software.toml's row)
        assert memory.context_bytes == 804_061_184
        outside = memory.cuda_graph_bytes + memory.context_bytes
        assert per_gpu.total == memory.budget_bytes + outside
        assert per_gpu.kv_cache == memory.kv_cache_bytes and per_gpu.weights == memory.weight_bytes
        headline = str(app.query_one("#plan-headline", Static).render())
        assert f"{format_bytes(per_gpu.total)} per GPU" in headline
        bars = str(app.query_one(MemoryBreakdownView).render())
        assert format_bytes(memory.kv_cache_bytes) in bars
        assert format_bytes(per_gpu.total) in bars
        # the KV pool is most of an H200's budget: one generate call's cache is a sliver
        assert memory.kv_cache_bytes > per_gpu.total / 2
        # back to one generate call: its own (much smaller) estimate again
        app.query_one("#plan-engine", Select).value = Engine.HF
        await pilot.pause()
        assert pane.report.estimate.per_gpu.total < memory.budget_bytes / 3


async def test_context_ulysses_and_expert_rows(catalog: Catalog, store: PlanStore) -> None:
    full = Plan(model="qwen2.5-7b", method=Method.FULL, gpus=4, seq=4096)
    app = PaneApp(catalog, store, full)
    async with app.run_test(size=(100, 60)) as pilot:
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        assert shown(app, "cp") and shown(app, "sp-ulysses") and shown(app, "ep")
        assert pane.report is not None
        whole = pane.report.estimate.per_gpu.activations
        await replace_text(pilot, "#plan-cp", "2")
        assert pane.errors == {} and pane.report.plan.cp == 2
        # ring attention splits the activations along the sequence over 2 GPUs
        assert pane.report.estimate.per_gpu.activations < whole
        # Megatron's refusal lands on the row: the sequence must split into 2 x cp chunks
        await replace_text(pilot, "#plan-cp", "3")
        assert "cp" in pane.errors and "multiple of 2 x cp" in pane.errors["cp"]
        await replace_text(pilot, "#plan-cp", "1")
        # LoRA: no expert row (Megatron's path is full training); the sequence rows stay
        app.query_one("#plan-method", Select).value = Method.LORA
        await pilot.pause()
        assert not shown(app, "ep") and shown(app, "cp") and shown(app, "sp-ulysses")
        assert pane.errors == {}
        # inference and RL: none of them
        for method in (Method.INFERENCE, Method.GRPO):
            app.query_one("#plan-method", Select).value = method
            await pilot.pause()
            assert not any(shown(app, row) for row in ("cp", "sp-ulysses", "ep"))
            assert pane.errors == {}


async def test_the_max_column_of_a_serving_plan_is_the_engines_concurrency(
    catalog: Catalog, store: PlanStore, capsys: pytest.CaptureFixture[str]
) -> None:
    flavors = ("l4x1", "h200")
    plan = INFERENCE.model_copy(update={"engine": Engine.VLLM, "max_model_len": 8192})
    # what hwdash plan --max concurrency answers on each flavor (the engine's pool)
    expected = {}
    for flavor in flavors:
        argv = ["plan", "--model", "qwen2.5-7b", "--method", "inference", "--engine", "vllm"]
        argv += ["--max-model-len", "8192", "--flavor", flavor, "--max", "concurrency", "--json"]
        assert main(argv) == 0
        expected[flavor] = str(json.loads(capsys.readouterr().out)["max"]["value"])
    app = PaneApp(catalog, store, Plan.model_validate(plan.model_dump()))
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.pause()
        table = app.query_one(FlavorTable)
        table.focus()
        await pilot.press("x", "x")  # seq, then an inference plan's concurrency
        await pilot.pause()
        cells = {
            str(row.value): str(table.get_cell(row, "max"))
            for row in table.rows
            if str(row.value) in flavors
        }
        assert cells == expected


@pytest.mark.parametrize("engine", [Engine.VLLM, Engine.SGLANG])
async def test_e_exports_the_server_command_line_of_a_serving_plan(
    catalog: Catalog,
    store: PlanStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    engine: Engine,
) -> None:
    """``e`` on a serving plan lists the server's command line first and writes the text of
    ``hwdash plan --export vllm`` for the same plan and flavor (SGLang's launch_server line for
    --engine sglang); a plan that is not a serving plan has no such format."""
    from textual.widgets import OptionList

    from hwdash.ui.widgets.planner_export import ExportDialog

    monkeypatch.chdir(tmp_path)
    argv = ["plan", "--model", "qwen2.5-7b", "--method", "inference", "--engine", engine.value]
    argv += ["--max-model-len", "8192", "--max-num-seqs", "64", "--kv-dtype", "fp8"]
    argv += ["--flavor", "h200", "--export", "vllm"]
    assert main(argv) == 0
    expected = capsys.readouterr().out
    assert expected.startswith("vllm serve" if engine is Engine.VLLM else "python -m sglang")
    plan = INFERENCE.model_copy(
        update={
            "engine": engine,
            "max_model_len": 8192,
            "max_num_seqs": 64,
            "kv_dtype": KvDtype.FP8,
            "flavors": ("h200",),
        }
    )
    app = PaneApp(catalog, store, Plan.model_validate(plan.model_dump()))
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        assert pane.errors == {}
        await pilot.press("e")
        await pilot.pause()
        assert isinstance(app.screen, ExportDialog)
        first = app.screen.query_one(OptionList).get_option_at_index(0)
        assert first.id == "vllm"
        await pilot.press("enter")  # the first format: the server's command line
        await pilot.pause()
        assert pane.exported is not None and pane.exported.suffix == ".sh"
        assert pane.exported.read_text() == expected
        assert any("sized for h200" in n.message for n in app._notifications)
        # one generate call (--engine hf): no server to write a line for
        app.query_one("#plan-engine", Select).value = Engine.HF
        await pilot.pause()
        await pilot.press("e")
        await pilot.pause()
        assert isinstance(app.screen, ExportDialog)
        ids = [option.id for option in app.screen.query_one(OptionList).options]
        assert "vllm" not in ids


async def test_the_fit_view_of_a_serving_plan_shows_the_engine_options(
    catalog: Catalog, store: PlanStore
) -> None:
    # The planner's f (make it fit) asks the core function hwdash plan --fit asks: for a serving
    # plan, the engine's knobs (core/planning/serving_fit.py), not one generate call's.
    from hwdash.core.planning.serving_fit import fit_options_for
    from hwdash.ui.widgets.planner_fit import FitOptionsDialog

    plan = Plan(
        model="llama-3.1-8b",
        method=Method.INFERENCE,
        engine=Engine.VLLM,
        max_model_len=131072,
        flavors=("l4x1",),
    )
    app = PaneApp(catalog, store, plan)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        table = app.query_one(FlavorTable)
        table.focus()
        table.move_cursor(row=[fit.flavor.id for fit in table.shown].index("l4x1"))
        await pilot.pause()
        await pilot.press("f")
        await pilot.pause()
        dialog = app.screen
        assert isinstance(dialog, FitOptionsDialog)
        shown = [option.words for option in dialog.search.options]
        model = app.query_one(PlannerPane).report.model  # type: ignore[union-attr]
    flavor = catalog.flavors["l4x1"]
    expected = fit_options_for(plan, model, catalog, "l4x1", [flavor])
    assert shown and shown == [option.words for option in expected.options]
    assert any(word.startswith("--max-model-len") for words in shown for word in words)
