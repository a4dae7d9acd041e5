"""Calibrate hwdash's memory estimator against fake-tensor traces of real training steps (issue 5).

Needs the ``calibrate`` extra (torch 2.13 CPU build, transformers, peft); no GPU, no network, no
weights. Usage, from the repository root:

    python bench/calibrate.py                 # the whole grid (about 10 minutes on 2 cores)
    python bench/calibrate.py --quick         # four cases, to check the setup
    python bench/calibrate.py --only qwen2.5-0.5b/lora
    python bench/calibrate.py --validate-depth  # a few cases at full depth vs extrapolation
    python bench/calibrate.py --compare-only  # = python bench/report_accuracy.py (no tracing, no torch)

Writes ``bench/out/calibration.jsonl`` (every trace, git-ignored), ``bench/data/calibration.csv``
(the committed ground truth) and the generated blocks of ``docs/accuracy.md``. Records traced under
older tracing rules (``calibration.tracing.COMPATIBLE_TRACE_RULES``) are traced again; the rest are
reused. The step itself is ``hwdash.tracing.trace_plan``'s (``calibration/tracing.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibration.cases import (  # noqa: E402
    CalibrationCase,
    calibration_grid,
    held_out_case_ids,
    held_out_grid,
    quick_grid,
)
from calibration.compare import kernel_matches_cuda  # noqa: E402
from calibration.report import csv_row, read_csv, update_findings_doc, write_csv  # noqa: E402
from report_accuracy import DATA_CSV, regenerate  # noqa: E402

OUT_JSONL = REPO / "bench" / "out" / "calibration.jsonl"
DEPTH_JSONL = REPO / "bench" / "out" / "depth-validation.jsonl"
FINDINGS_JSON = REPO / "bench" / "out" / "findings.json"
ACCURACY_DOC = REPO / "docs" / "accuracy.md"

#: Cases traced at full depth by ``--validate-depth`` to check the two-depth extrapolation.
DEPTH_VALIDATION = (
    CalibrationCase(model="qwen2.5-0.5b"),
    CalibrationCase(model="qwen2.5-0.5b", method="lora", grad_ckpt=True),
    CalibrationCase(model="llama-3.2-1b", precision="amp"),
    CalibrationCase(model="llama-3.2-1b", method="inference", batch=1, seq=4096),
    CalibrationCase(model="gemma-2-2b", method="lora", attention="eager"),
)


def _catalog() -> Any:
    # the built-in catalog plus the held-out architectures (bench/calibration/heldout_models.toml)
    from estimator_errors import calibration_catalog

    return calibration_catalog()


def _measure_one(case: CalibrationCase, full_depth: bool) -> dict[str, Any]:
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from calibration.tracing import measure

    spec = _catalog().models[case.model]
    try:
        return measure(case, spec, full_depth=full_depth)
    except Exception as exc:  # one untraceable setting must not end the grid
        return {"case_id": case.case_id, "failed": f"{type(exc).__name__}: {exc}"}


def run_cases(cases: list[CalibrationCase], jobs: int, full_depth: bool, out: Path) -> list[dict]:
    """Trace every case (``jobs`` processes), appending each record to ``out`` as it finishes."""
    out.parent.mkdir(parents=True, exist_ok=True)
    from calibration.tracing import COMPATIBLE_TRACE_RULES

    done: dict[str, dict[str, Any]] = {}
    if out.exists():
        for line in out.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            # a record made under older tracing rules is traced again
            if "failed" not in record and record.get("trace_rules", 1) >= COMPATIBLE_TRACE_RULES:
                done[record["case_id"]] = record
    todo = [c for c in cases if c.case_id not in done]
    print(f"{len(cases)} cases, {len(cases) - len(todo)} already traced, {len(todo)} to trace")
    started = time.perf_counter()
    with out.open("a", encoding="utf-8") as handle, ProcessPoolExecutor(jobs) as pool:
        futures = {pool.submit(_measure_one, case, full_depth): case for case in todo}
        for index, future in enumerate(as_completed(futures), 1):
            record = future.result()
            handle.write(json.dumps(record) + "\n")
            handle.flush()
            if "failed" in record:
                print(f"[{index}/{len(todo)}] FAILED {record['case_id']}: {record['failed']}")
                continue
            done[record["case_id"]] = record
            print(
                f"[{index}/{len(todo)}] {record['case_id']}: "
                f"{record['peak_bytes'] / 2**30:.2f} GiB at step {record['peak_step']} "
                f"{record['peak_phase']} ({record['trace_seconds']:.1f} s)"
            )
    print(f"traced in {time.perf_counter() - started:.0f} s")
    wanted = {c.case_id for c in cases}
    return [r for cid, r in done.items() if cid in wanted]


def load_records(path: Path) -> list[dict[str, Any]]:
    """The latest successful record of each case in a JSONL file."""
    records: dict[str, dict[str, Any]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if "failed" not in record:
            records[record["case_id"]] = record
    return list(records.values())


def compare_and_write(records: list[dict[str, Any]]) -> None:
    """Write the measured columns of the CSV from the records, then score it and rewrite the doc.

    Rows of the committed CSV that no record replaces are kept (``bench/out`` is not committed, so a
    run that traces a few cases must not drop the rest of the table).
    """
    catalog = _catalog()
    held_out = held_out_case_ids()
    rows = {row["case_id"]: row for row in read_csv(DATA_CSV)} if DATA_CSV.exists() else {}
    for record in records:
        spec = catalog.models[record["plan"]["model"]]
        matches = kernel_matches_cuda(record, spec)
        rows[record["case_id"]] = csv_row({**record, "kernel_matches_cuda": matches})
    for case_id, row in rows.items():
        row["held_out"] = case_id in held_out
    write_csv(list(rows.values()), DATA_CSV)
    regenerate()


def validate_depth(jobs: int) -> None:
    """Trace the validation cases at full depth and compare with the two-depth extrapolation."""
    cases = list(DEPTH_VALIDATION)
    extrapolated = {r["case_id"]: r for r in run_cases(cases, jobs, False, OUT_JSONL)}
    full = {r["case_id"]: r for r in run_cases(cases, jobs, True, DEPTH_JSONL)}
    for case in cases:
        a, b = extrapolated.get(case.case_id), full.get(case.case_id)
        if a is None or b is None:
            print(f"{case.case_id}: missing")
            continue
        diff = (a["peak_bytes"] - b["peak_bytes"]) / b["peak_bytes"]
        print(
            f"{case.case_id}: extrapolated {a['peak_bytes']} (depths {a['traced_depths']}) vs "
            f"full depth {b['peak_bytes']} ({b['trace_seconds']:.1f} s): {diff * 100:+.3f}%"
        )


def run_findings(only: str) -> None:
    """Run the probes, save them to bench/out/findings.json and print their table."""
    warnings.filterwarnings("ignore")
    from calibration.findings import markdown, run_probes

    results = run_probes(_catalog(), only)
    FINDINGS_JSON.parent.mkdir(parents=True, exist_ok=True)
    FINDINGS_JSON.write_text(json.dumps(results, indent=1), encoding="utf-8")
    table = markdown(results)
    print(table)
    if not only and update_findings_doc(table, ACCURACY_DOC):
        print(f"updated the findings table of {ACCURACY_DOC.relative_to(REPO)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="trace four cases only")
    parser.add_argument("--only", default="", help="trace cases whose id contains this text")
    parser.add_argument("--jobs", type=int, default=max(1, min(2, os.cpu_count() or 1)))
    parser.add_argument("--full-depth", action="store_true", help="trace every layer (slow)")
    parser.add_argument("--validate-depth", action="store_true")
    parser.add_argument("--compare-only", action="store_true")
    parser.add_argument(
        "--findings", action="store_true", help="run the probes behind docs/accuracy.md's findings"
    )
    parser.add_argument("--fresh", action="store_true", help="forget saved traces")
    args = parser.parse_args(argv)
    if args.compare_only:
        return regenerate()
    if args.findings:
        run_findings(args.only)
        return 0
    if args.validate_depth:
        validate_depth(args.jobs)
        return 0
    if args.fresh and OUT_JSONL.exists():
        OUT_JSONL.unlink()
    cases = quick_grid() if args.quick else calibration_grid() + held_out_grid()
    if args.only:
        cases = [c for c in cases if args.only in c.case_id]
    run_cases(cases, args.jobs, args.full_depth, OUT_JSONL)
    compare_and_write(load_records(OUT_JSONL))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
