"""Time ``--fit``: the make-it-fit search for one flavor and for every flavor (``any``).

Run: ``.venv/bin/python bench/fit_bench.py``. Prints, per plan, the median and worst of five runs
and how many combinations the estimator was asked about. Goals (issue "make it fit"): one flavor
under 200 ms of search, ``any`` under 1 s, on the 2-core development machine. Timings live here,
never in unit tests.
"""

from __future__ import annotations

import statistics
import time

from hwdash.core.catalog import load_catalog
from hwdash.core.models.config import resolve_model
from hwdash.core.plan import Method, Plan
from hwdash.core.planning.fit_options import find_fit_options

CASES = [
    (
        "7B full, b4 s1024 -> 12 GB card",
        Plan(model="mistral-7b", method=Method.FULL, batch=4, seq=1024),
        "local-rtx-3060",
    ),
    (
        "7B full, b4 s1024 -> L4",
        Plan(model="qwen2.5-7b", method=Method.FULL, batch=4, seq=1024),
        "l4x1",
    ),
    (
        "7B LoRA, b4 s2048 -> L4",
        Plan(model="qwen2.5-7b", method=Method.LORA, batch=4, seq=2048),
        "l4x1",
    ),
    (
        "8B DoRA, b8 s4096 -> A10G x2",
        Plan(model="llama-3.1-8b", method=Method.DORA, batch=8, seq=4096),
        "a10g-largex2",
    ),
    (
        "70B full -> T4 (nothing fits)",
        Plan(model="llama-3.1-70b", method=Method.FULL, batch=1, seq=1024),
        "t4-small",
    ),
    (
        "7B full, b4 s1024 -> any",
        Plan(model="qwen2.5-7b", method=Method.FULL, batch=4, seq=1024, examples=10_000),
        "any",
    ),
    (
        "14B LoRA, b8 s4096 -> any",
        Plan(model="qwen2.5-14b", method=Method.LORA, batch=8, seq=4096, examples=10_000),
        "any",
    ),
]


def main() -> None:
    catalog = load_catalog(include_user=False)
    print(f"{'case':36} {'median ms':>10} {'worst ms':>9} {'evaluated':>10} {'options':>8}")
    for label, plan, target in CASES:
        model = resolve_model(plan.model, catalog)
        flavors = list(catalog.flavors.values()) if target == "any" else [catalog.flavors[target]]
        times = []
        search = None
        for _ in range(5):
            start = time.perf_counter()
            search = find_fit_options(plan, model, catalog, target, flavors)
            times.append(time.perf_counter() - start)
        assert search is not None
        print(
            f"{label:36} {statistics.median(times) * 1000:10.0f} {max(times) * 1000:9.0f} "
            f"{search.evaluated:10d} {len(search.options):8d}"
        )


if __name__ == "__main__":
    main()
