"""Time the planner core: ``estimate_memory`` (reruns on every keystroke in the TUI) and ``evaluate_plan``.

Run: ``.venv/bin/python bench/estimator_bench.py``. Prints the median and 95th-percentile time per
call for a few representative plans on the real catalog. Timings live here, never in unit tests.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import partial

from hwdash.core.catalog import load_catalog
from hwdash.core.estimator import estimate_memory
from hwdash.core.plan import Method, Plan
from hwdash.core.planning.fit import evaluate_plan

PLANS = {
    "qwen2.5-7b lora": Plan(model="qwen2.5-7b", method=Method.LORA, batch=4, grad_ckpt=True),
    "qwen2.5-7b ppo dora zero3": Plan(
        model="qwen2.5-7b", method=Method.PPO, rl_method=Method.DORA, zero=3
    ),
    "mixtral qlora": Plan(model="mixtral-8x7b", method=Method.QLORA),
    "llama-3-70b inference": Plan(model="llama-3-70b", method=Method.INFERENCE, seq=8192),
}


def _time(call: Callable[[], object], repeat: int) -> tuple[float, float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    samples.sort()
    return statistics.median(samples), samples[int(0.95 * (len(samples) - 1))]


def main() -> None:
    catalog = load_catalog(include_user=False)
    accelerator = catalog.accelerators["a100-80gb"]
    print(f"{'plan':32} {'estimate_memory':>22} {'evaluate_plan (all flavors)':>30}")
    for name, plan in PLANS.items():
        model = catalog.models[plan.model]
        med, p95 = _time(partial(estimate_memory, plan, model, accelerator=accelerator), 2000)
        emed, ep95 = _time(partial(evaluate_plan, plan, catalog, model), 200)
        print(
            f"{name:32} {med * 1e6:8.1f} us (p95 {p95 * 1e6:6.1f})"
            f" {emed * 1e3:10.2f} ms (p95 {ep95 * 1e3:5.2f}, {len(catalog.flavors)} flavors)"
        )


if __name__ == "__main__":
    main()
