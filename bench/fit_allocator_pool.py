"""Fit the caching allocator's pool of a distributed training process on the seen readings (issue 29).

    PYTHONPATH=src .venv/bin/python bench/fit_allocator_pool.py            # the table and the fit
    PYTHONPATH=src .venv/bin/python bench/fit_allocator_pool.py --check    # exit 1 if the catalog differs

For every reserved or whole-GPU reading of the seen sets (every ``bench/data/whole_gpu_readings*.toml``
that has been scored: A to H, public readings and hwdash's own H100 runs; a held-out set, collected
after the fit, is never read here), the pool the reading implies is what it holds
beyond hwdash's allocated tensors, as a fraction of them:

* a ``reserved`` reading: ``(reading - side-stream cache - allocated) / allocated``;
* an ``nvml`` reading also less what lies outside the allocator (the CUDA context row, NCCL's
  communicators, managed memory): ``(reading - those - side-stream cache - allocated) / allocated``.

Allocated readings say nothing about the pool and are left out, and so is an nvml reading of a run
whose reserved reading is in the same table (one run, one vote: the reserved reading is the pool's
own). Three fractions are fitted, each the median over the rows of its kind (``estimate.pool_kind``;
the median, so that a row whose tensors hwdash misjudges moves it little): ``megatron`` (training on
the Megatron-LM path), ``param_offload`` (ZeRO-3 parameter offload, FSDP CPU offload) and
``distributed`` (any other training under a parallel group, ZeRO or FSDP). ``catalog/software.toml``'s
``[[allocator_pool]]`` holds them rounded to a hundredth. Each fit's held-out test is a set collected
after it and never read here: C and D for the first fit (0.14), F for the second (0.19), H for the
third (0.24 and 0.35, commit c96669e); this fit, on A to H, has none yet.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from whole_gpu_accuracy import GIB, REPO, estimate_row, load_rows, row_plan

from hwdash.core.catalog import load_catalog
from hwdash.core.estimator.estimate import pool_kind

DATA = REPO / "bench" / "data"
SEEN = (
    DATA / "whole_gpu_readings.toml",
    *(DATA / f"whole_gpu_readings_{name}.toml" for name in ("b", "c1", "c2", "c3", "c4")),
    *(DATA / f"whole_gpu_readings_{name}.toml" for name in ("d1", "d2", "e", "f", "g1", "g2")),
    *(DATA / f"whole_gpu_readings_{name}.toml" for name in ("h1", "h2", "h3")),
)
KINDS = ("distributed", "param_offload", "megatron")
"""The fitted kinds (``single_gpu`` keeps hwdash's own H200 measurement)."""
OUTSIDE = ("CUDA context", "runtime context", "NCCL (")
SIDE = "FSDP1 side streams"


@dataclass(frozen=True)
class Implied:
    """One reading's implied pool."""

    id: str
    measure: str
    gpus: int
    allocated: int
    fraction: float
    kind: str
    """The plan's pool kind (``estimate.pool_kind``)."""


def implied(files: tuple[Path, ...] = SEEN) -> list[Implied]:
    """Every reserved or whole-GPU reading's implied pool fraction."""
    catalog = load_catalog(include_user=False)
    out = []
    for path in files:
        rows = load_rows(path)
        reserved = {
            (row["source"], row["hwdash_args"]) for row in rows if row["measure"] == "reserved"
        }
        for row in rows:
            if row["measure"] == "allocated":
                continue
            if row["measure"] == "nvml" and (row["source"], row["hwdash_args"]) in reserved:
                continue
            plan = row_plan(row, catalog)
            estimate = estimate_row(row, catalog, plan)
            kind = pool_kind(plan, estimate.gpus)
            side = sum(b for name, b in estimate.details if name.startswith(SIDE))
            reading = row["per_gpu_gib"] * GIB
            if row["measure"] == "nvml":
                outside = sum(b for name, b in estimate.details if name.startswith(OUTSIDE))
                reading -= outside + estimate.managed_bytes
            allocated = estimate.allocated_bytes
            fraction = (reading - side - allocated) / allocated
            out.append(Implied(row["id"], row["measure"], estimate.gpus, allocated, fraction, kind))
    return out


def fit(rows: list[Implied], kind: str = "distributed") -> float:
    """The median implied fraction of the rows of ``kind``, rounded to a hundredth."""
    return round(statistics.median(r.fraction for r in rows if r.kind == kind), 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the catalog differs")
    args = parser.parse_args(argv)
    rows = implied()
    for r in sorted(rows, key=lambda r: (r.kind, r.fraction)):
        print(
            f"{r.id:56} {r.measure:8} gpus {r.gpus:3}  allocated {r.allocated / GIB:7.2f} GiB"
            f"  implied pool {r.fraction:+7.1%}  {r.kind}"
        )
    fitted = {kind: fit(rows, kind) for kind in KINDS}
    for kind in (*KINDS, "single_gpu"):
        count = len([r for r in rows if r.kind == kind])
        median = statistics.median(r.fraction for r in rows if r.kind == kind)
        print(f"{kind} rows: {count}, median implied pool {median:.2f}")
    print("(single_gpu is not fitted: the catalog keeps hwdash's own H200 measurement)")
    catalog = load_catalog(include_user=False)
    assert catalog.software is not None
    held = {kind: getattr(catalog.software.pool, kind) for kind in KINDS}
    print(f"catalog/software.toml [[allocator_pool]]: {held}")
    if args.check and held != fitted:
        print("the catalog differs from the fit", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
