"""How long one planner recompute takes: the estimator alone, and the pane's whole update.

Run: ``.venv/bin/python bench/planner_bench.py``. Prints medians in milliseconds. The pane figure is
the synchronous work done per keystroke (read the form, validate, evaluate, refill the breakdown and
the flavor table), not counting the terminal redraw.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from textual.app import App, ComposeResult

from hwdash.core.catalog import Catalog, load_catalog
from hwdash.core.plan import Method, Plan
from hwdash.core.planning.fit import evaluate_plan
from hwdash.core.plans.store import PlanStore
from hwdash.ui.planner_pane import PlannerPane

PLANS = (
    Plan(model="qwen2.5-7b", method=Method.LORA, batch=4, seq=2048, examples=50_000),
    Plan(model="llama-3.1-70b", method=Method.QLORA, batch=1, seq=4096, grad_ckpt=True),
    Plan(model="qwen2.5-7b", method=Method.GRPO, examples=10_000),
)


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def bench_estimator(catalog: Catalog, repeats: int = 200) -> None:
    for plan in PLANS:
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            evaluate_plan(plan, catalog)
            samples.append(time.perf_counter() - start)
        print(
            f"evaluate_plan {plan.model} {plan.method.value}: {median_ms(samples):.2f} ms "
            f"(median of {repeats}, {len(catalog.flavors)} flavors)"
        )


class _BenchApp(App[None]):
    def __init__(self, catalog: Catalog, store: PlanStore) -> None:
        super().__init__()
        self.catalog = catalog
        self.store = store

    def compose(self) -> ComposeResult:
        yield PlannerPane(self.catalog, self.store, initial=PLANS[0])


async def bench_pane(catalog: Catalog, repeats: int = 50) -> None:
    with tempfile.TemporaryDirectory() as folder:
        app = _BenchApp(catalog, PlanStore(Path(folder) / "plans.json"))
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            pane = app.query_one(PlannerPane)
            samples = []
            for _ in range(repeats):
                start = time.perf_counter()
                pane._recompute()
                samples.append(time.perf_counter() - start)
            print(f"PlannerPane recompute (form -> breakdown + table): {median_ms(samples):.2f} ms")


def main() -> None:
    catalog = load_catalog(include_user=False)
    bench_estimator(catalog)
    asyncio.run(bench_pane(catalog))


if __name__ == "__main__":
    main()
