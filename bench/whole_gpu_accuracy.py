"""Score the estimator against public memory readings of multi-GPU and offloaded runs.

    PYTHONPATH=src .venv/bin/python bench/whole_gpu_accuracy.py            # held-out first, then derive
    PYTHONPATH=src .venv/bin/python bench/whole_gpu_accuracy.py --rows     # every row
    PYTHONPATH=src .venv/bin/python bench/whole_gpu_accuracy.py --split derive --rows
    PYTHONPATH=src .venv/bin/python bench/whole_gpu_accuracy.py --file bench/data/whole_gpu_readings_b.toml \
        --check-args                                                      # "ok" or the error per row, no number
    PYTHONPATH=src .venv/bin/python bench/whole_gpu_accuracy.py --rows \
        --file bench/data/whole_gpu_readings_c1.toml --file bench/data/whole_gpu_readings_c2.toml ...  # one set

The readings are ``bench/data/whole_gpu_readings.toml`` (issue 29): each row names its public source,
what the number is (``measure``: ``nvml`` for the whole GPU as nvidia-smi shows it, ``allocated`` for
``torch.cuda.max_memory_allocated``, ``reserved`` for ``max_memory_reserved``), the reading per GPU
and the ``hwdash plan`` arguments that re-plan it. Each row's ``split`` is fixed by a hash of its id
(``bench/whole_gpu_split.py``): formulas were derived looking only at ``derive`` rows; ``held_out`` rows
were scored once, at the end. A file whose top level says ``split = "held_out"``
(``bench/data/whole_gpu_readings_b.toml``, a second held-out set collected after the first was seen) is
held out as a whole: every row of it is ``held_out`` whatever the row says, and its rows need no ``split``.

``--check-args`` only builds each row's plan (parses its ``hwdash_args``, reads its ``--from`` file, resolves
its model and GPU and runs the estimator) and prints ``ok`` or the error per row: no estimate or reading is
printed, so a held-out file can be checked without anyone seeing hwdash's numbers for it.

Each row is estimated on its own GPU (the catalog accelerator named by ``gpu``) at its GPU count, and
the estimate's figure of the same kind is compared: the whole GPU (``MemoryEstimate.whole_gpu``, what
NVML shows), the allocator's peak or its reserved pool. Signed error is (estimate - reading) / reading:
negative is optimistic (the run would need more than the plan says).
"""

from __future__ import annotations

import argparse
import contextlib
import io
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
from hwdash.core.plan import Plan
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


def estimate_row(row: dict[str, Any], catalog: Catalog, plan: Plan | None = None) -> MemoryEstimate:
    """The row's plan (its ``hwdash_args``, as ``hwdash plan`` reads them; or ``plan``, already
    read by :func:`row_plan`) on its GPU."""
    plan = row_plan(row, catalog) if plan is None else plan
    model = resolve_model(plan.model, catalog)
    accelerator = catalog.accelerators[row["gpu"]]
    return estimate_memory(
        plan,
        model,
        gpus=plan.gpus,
        accelerator=accelerator,
        framework=catalog.framework_for(plan),
    )


def row_plan(row: dict[str, Any], catalog: Catalog) -> Plan:
    """The plan ``hwdash plan`` builds from the row's ``hwdash_args`` (its ``--from`` file read)."""
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
    return apply_framework_defaults(plan, catalog, argv, imported)


def load_rows(path: Path) -> list[dict[str, Any]]:
    """The file's rows, each with its ``split``: the file's top-level ``split = "held_out"`` wins over a row's."""
    with path.open("rb") as handle:
        data = tomllib.load(handle)
    whole = data.get("split")
    if whole is not None and whole != "held_out":
        raise ValueError(f'{path}: top-level split must be "held_out" when given, not {whole!r}')
    rows = []
    for row in data.get("reading", []):
        split = "held_out" if whole == "held_out" else row.get("split")
        if split not in ("held_out", "derive"):
            raise ValueError(
                f"{path}: row {row.get('id', '?')!r} has no split (held_out or derive)"
            )
        rows.append({**row, "split": split})
    return rows


def check_args(rows: list[dict[str, Any]], catalog: Catalog) -> tuple[list[str], int]:
    """One line per row, ``ok`` or the error building its plan; never a number. Returns (lines, failures)."""
    lines = []
    failures = 0
    for row in rows:
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                estimate_row(row, catalog)
        except SystemExit:
            # argparse rejected a flag or a value and wrote why (usage, then the error line)
            failures += 1
            said = stderr.getvalue()
            # argparse's message follows its "error: " (after the usage lines); keep it on one line
            message = " ".join(said.split("error:", 1)[-1].split()) if "error:" in said else ""
            lines.append(
                f"{row['id']}: error: {message or 'hwdash_args rejected by the plan parser'}"
            )
        except Exception as exc:  # any other reason the plan cannot be built: name it, no traceback
            failures += 1
            lines.append(f"{row['id']}: error: {type(exc).__name__}: {exc}")
        else:
            lines.append(f"{row['id']}: ok")
    return lines, failures


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
    parser.add_argument(
        "--file",
        "--readings",
        dest="files",
        type=Path,
        action="append",
        help="a readings table (default bench/data/whole_gpu_readings.toml); give it again to "
        "score several tables as one set",
    )
    parser.add_argument(
        "--check-args",
        action="store_true",
        help="only build each row's plan and print ok or its error; no estimate is printed",
    )
    args = parser.parse_args(argv)
    rows = []
    for path in args.files or [READINGS]:
        try:
            rows.extend(load_rows(path))
        except (OSError, ValueError, tomllib.TOMLDecodeError) as exc:
            parser.error(f"--file: {exc}")
    ids = [row["id"] for row in rows]
    if len(ids) != len(set(ids)):
        twice = sorted({i for i in ids if ids.count(i) > 1})
        parser.error("--file: a reading id is in two tables: " + ", ".join(twice))
    catalog = load_catalog(include_user=False)
    if args.check_args:
        lines, failures = check_args(rows, catalog)
        print("\n".join(lines))
        print(f"{len(rows) - failures} ok, {failures} failed")
        return 1 if failures else 0
    splits = [args.split] if args.split else ["held_out", "derive"]
    scored = score([row for row in rows if row["split"] in splits], catalog)
    print(report(scored, splits, args.rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
