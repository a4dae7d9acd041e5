"""Fit the caching allocator's pool of a distributed training process on the seen readings (issue 29).

    PYTHONPATH=src .venv/bin/python bench/fit_allocator_pool.py            # the table and the fit
    PYTHONPATH=src .venv/bin/python bench/fit_allocator_pool.py --check    # exit 1 if the catalog differs

For every reserved or whole-GPU reading of the seen sets (every ``bench/data/whole_gpu_readings*.toml``
that has been scored: A to G, public readings and hwdash's own H100 runs; the held-out set of the
moment, ``SEEN``'s complement, is never read here), the pool the reading implies is what it holds
beyond hwdash's allocated tensors, as a fraction of them:

* a ``reserved`` reading: ``(reading - side-stream cache - allocated) / allocated``;
* an ``nvml`` reading also less what lies outside the allocator (the CUDA context row, NCCL's
  communicators, managed memory): ``(reading - those - side-stream cache - allocated) / allocated``.

Allocated readings say nothing about the pool and are left out, and so is an nvml reading of a run
whose reserved reading is in the same table (one run, one vote: the reserved reading is the pool's
own). Two fractions are fitted, each the median over its rows (the median, so that a row whose
tensors hwdash misjudges moves it little): ``param_offload`` over the rows whose plan takes the
distributed pool with parameters on the host (``estimate.param_offload_pool``: ZeRO-3 parameter
offload, FSDP CPU offload), ``distributed`` over the other rows that take the distributed pool
(training on more than one GPU, or under ZeRO or FSDP: ``estimate.distributed_pool``).
``catalog/software.toml``'s ``[[allocator_pool]]`` holds both rounded to a hundredth. Each fit's
held-out test is a set collected after it and never read here (C and D for the first fit, F for the
second, H for this one).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from whole_gpu_accuracy import GIB, REPO, estimate_row, load_rows, row_plan

from hwdash.core.catalog import load_catalog
from hwdash.core.estimator.estimate import distributed_pool, param_offload_pool

DATA = REPO / "bench" / "data"
SEEN = (
    DATA / "whole_gpu_readings.toml",
    *(DATA / f"whole_gpu_readings_{name}.toml" for name in ("b", "c1", "c2", "c3", "c4")),
    *(DATA / f"whole_gpu_readings_{name}.toml" for name in ("d1", "d2", "e", "f", "g1", "g2")),
)
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
    distributed: bool
    """The plan takes the distributed pool."""
    param_offload: bool
    """... with its parameters on the host."""


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
            distributed = distributed_pool(plan, estimate.gpus)
            side = sum(b for name, b in estimate.details if name.startswith(SIDE))
            reading = row["per_gpu_gib"] * GIB
            if row["measure"] == "nvml":
                outside = sum(b for name, b in estimate.details if name.startswith(OUTSIDE))
                reading -= outside + estimate.managed_bytes
            allocated = estimate.allocated_bytes
            fraction = (reading - side - allocated) / allocated
            offloaded = distributed and param_offload_pool(plan)
            out.append(
                Implied(
                    row["id"],
                    row["measure"],
                    estimate.gpus,
                    allocated,
                    fraction,
                    distributed,
                    offloaded,
                )
            )
    return out


def fit(rows: list[Implied], param_offload: bool = False) -> float:
    """The median implied fraction of the distributed-pool rows with (``param_offload``) or
    without parameters on the host, rounded to a hundredth."""
    chosen = [r.fraction for r in rows if r.distributed and r.param_offload == param_offload]
    return round(statistics.median(chosen), 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the catalog differs")
    args = parser.parse_args(argv)
    rows = implied()
    for r in sorted(rows, key=lambda r: (r.distributed, r.param_offload, r.fraction)):
        print(
            f"{r.id:56} {r.measure:8} gpus {r.gpus:3}  allocated {r.allocated / GIB:7.2f} GiB"
            f"  implied pool {r.fraction:+7.1%}" + ("  (parameters offloaded)" * r.param_offload)
        )
    offloaded = [r for r in rows if r.distributed and r.param_offload]
    multi = [r for r in rows if r.distributed and not r.param_offload]
    single = [r for r in rows if not r.distributed]
    value, value_offloaded = fit(rows), fit(rows, param_offload=True)
    print(f"distributed-pool rows: {len(multi)}, median implied pool {value:.2f}")
    print(f"parameter-offload rows: {len(offloaded)}, median implied pool {value_offloaded:.2f}")
    if single:
        median = statistics.median(r.fraction for r in single)
        print(f"single-GPU pool rows: {len(single)}, median implied pool {median:.2f} (not fitted)")
    catalog = load_catalog(include_user=False)
    assert catalog.software is not None
    held = (catalog.software.pool.distributed, catalog.software.pool.param_offload)
    print(f"catalog/software.toml [[allocator_pool]] distributed, param_offload = {held}")
    if args.check and held != (value, value_offloaded):
        print("the catalog differs from the fit", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
