"""Score the estimator against public memory readings of multi-GPU and offloaded runs.

    PYTHONPATH=src .venv/bin/python bench/whole_gpu_accuracy.py            # held-out first, then derive
    PYTHONPATH=src .venv/bin/python bench/whole_gpu_accuracy.py --rows     # every row
    PYTHONPATH=src .venv/bin/python bench/whole_gpu_accuracy.py --split derive --rows

The readings are ``bench/data/whole_gpu_readings.toml`` (issue 29): each row names its public source,
what the number is (``measure``: ``nvml`` for the whole GPU as nvidia-smi shows it, ``allocated`` for
``torch.cuda.max_memory_allocated``, ``reserved`` for ``max_memory_reserved``), the reading per GPU
and the ``hwdash plan`` arguments that re-plan it. Each row's ``split`` is fixed by a hash of its id
(``bench/whole_gpu_split.py``): formulas were derived looking only at ``derive`` rows; ``held_out`` rows
were scored once, at the end.

Each row is estimated on its own GPU (the catalog accelerator named by ``gpu``) at its GPU count, and
the estimate's figure of the same kind is compared: the whole GPU (``MemoryEstimate.whole_gpu``, what
NVML shows), the allocator's peak or its reserved pool. Signed error is (estimate - reading) / reading:
negative is optimistic (the run would need more than the plan says).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hwdash.cli import build_parser
from hwdash.commands.plan_inputs import apply_framework_defaults, plan_from_args
from hwdash.core.catalog import Catalog, load_catalog
from hwdash.core.estimator import estimate_memory
from hwdash.core.models.config import resolve_model
from hwdash.core.plans.imports import read_plan_file
from hwdash.core.results import MemoryEstimate

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
READINGS = REPO / "bench" / "data" / "whole_gpu_readings.toml"
GIB = 2**30


@dataclass(frozen=True)
class Scored:
    """One reading against the estimate of the same kind."""

    id: str
    split: str
    measure: str
    parallel: str
    reading_gib: float
    estimate_gib: float

    @property
    def error(self) -> float:
        return (self.estimate_gib - self.reading_gib) / self.reading_gib


def figure(estimate: MemoryEstimate, measure: str) -> int:
    """The estimate's bytes of the kind the reading measured: ``allocated_bytes`` (the allocator's
    peak), ``reserved_bytes`` (its pool) or ``whole_gpu_bytes`` (what NVML shows)."""
    if measure == "allocated":
        return int(estimate.allocated_bytes)
    if measure == "reserved":
        return int(estimate.reserved_bytes)
    return int(estimate.whole_gpu_bytes)


def estimate_row(row: dict[str, Any], catalog: Catalog) -> MemoryEstimate:
    """The row's plan (its ``hwdash_args``, as ``hwdash plan`` reads them) on its GPU."""
    argv = shlex.split(row["hwdash_args"])
    args = build_parser("plan").parse_args(["plan", *argv])
    imported = None
    if args.from_file:
        imported = read_plan_file(REPO / args.from_file)
        if not args.model and "model" in imported.updates:
            args.model = imported.updates["model"]
    plan = plan_from_args(args)
    if imported is not None:
        from hwdash.commands.plan_inputs import apply_imported

        plan = apply_imported(plan, imported, argv, args.from_file)
    plan = apply_framework_defaults(plan, catalog, argv, imported)
    model = resolve_model(plan.model, catalog)
    accelerator = catalog.accelerators[row["gpu"]]
    return estimate_memory(
        plan,
        model,
        gpus=plan.gpus,
        accelerator=accelerator,
        framework=catalog.framework_for(plan),
    )


def score(rows: list[dict[str, Any]], catalog: Catalog) -> list[Scored]:
    out = []
    for row in rows:
        estimate = estimate_row(row, catalog)
        out.append(
            Scored(
                id=row["id"],
                split=row["split"],
                measure=row["measure"],
                parallel=row["parallel"],
                reading_gib=float(row["per_gpu_gib"]),
                estimate_gib=figure(estimate, row["measure"]) / GIB,
            )
        )
    return out


def summary(label: str, scored: list[Scored]) -> str:
    if not scored:
        return f"{label:34} {0:>4}"
    errors = [s.error for s in scored]
    optimistic = sum(1 for e in errors if e < 0)
    return (
        f"{label:34} {len(scored):>4}  median |err| {statistics.median(abs(e) for e in errors):6.1%}"
        f"  median signed {statistics.median(errors):+6.1%}  optimistic {optimistic}/{len(errors)}"
    )


def report(scored: list[Scored], splits: list[str], rows: bool) -> str:
    lines = []
    for split in splits:
        part = [s for s in scored if s.split == split]
        lines.append(summary(f"{split}: all", part))
        for measure in ("nvml", "reserved", "allocated"):
            lines.append(summary(f"{split}: {measure}", [s for s in part if s.measure == measure]))
        for kind in sorted({s.parallel for s in part}):
            lines.append(summary(f"{split}: {kind}", [s for s in part if s.parallel == kind]))
        if rows:
            for s in sorted(part, key=lambda s: s.error):
                lines.append(
                    f"    {s.id:52} {s.measure:9} reading {s.reading_gib:7.2f} GiB"
                    f"  estimate {s.estimate_gib:7.2f} GiB  {s.error:+6.1%}"
                )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", action="store_true", help="every row, not only the medians")
    parser.add_argument("--split", choices=("held_out", "derive"), help="one split only")
    parser.add_argument("--readings", type=Path, default=READINGS)
    args = parser.parse_args(argv)
    with args.readings.open("rb") as handle:
        rows = tomllib.load(handle)["reading"]
    catalog = load_catalog(include_user=False)
    splits = [args.split] if args.split else ["held_out", "derive"]
    scored = score([row for row in rows if row["split"] in splits], catalog)
    print(report(scored, splits, args.rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
