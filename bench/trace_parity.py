"""Re-trace the calibration grid with the shipped tracer and compare with the harness's peaks.

``hwdash plan --trace`` (:func:`hwdash.tracing.trace_plan`) and the calibration harness
(``bench/calibration/tracing.py``) are two implementations of the same fake-tensor step. This script
runs the shipped one on every row of ``bench/data/calibration.csv`` (forcing SDPA's math kernel
where the row did) and reports how many peaks agree to the byte, and the time each trace took. The
shipped tracer runs bf16 LoRA/DoRA under autocast, as the Trainer does; those rows are compared with
the harness's rows, traced the same way since its tracing rules 2. Needs the ``calibrate``
extra (torch, transformers, peft).

    python bench/trace_parity.py                 # every row
    python bench/trace_parity.py --only qwen2.5-0.5b/lora
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA_CSV = REPO / "bench" / "data" / "calibration.csv"

#: The harness's optimizer implementation names -> ``Plan.optimizer_impl``.
IMPL_NAMES = {"fused": "fused", "foreach": "foreach", "single": "for-loop"}


def _plan_fields(row: dict[str, str]) -> dict[str, object]:
    return {
        "model": row["model"],
        "method": row["method"],
        "precision": row["precision"],
        "batch": int(row["batch"]),
        "seq": int(row["seq"]),
        "grad_ckpt": row["grad_ckpt"] == "True",
        "attention": row["attention"],
        "optimizer": row["optimizer"],
        "lora_r": int(row["lora_r"]),
        "lora_targets": tuple(row["lora_targets"].split("+")),
        "lora_dropout": float(row["lora_dropout"]),
        "optimizer_impl": IMPL_NAMES[row["optimizer_impl"]],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="rows whose case id contains this text")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

    from hwdash.core.catalog import load_catalog
    from hwdash.core.plan import Plan
    from hwdash.tracing import TraceUnavailable, trace_plan

    catalog = load_catalog(include_user=False)
    rows = [r for r in csv.DictReader(DATA_CSV.open(encoding="utf-8")) if args.only in r["case_id"]]
    same = 0
    different: list[str] = []
    failed: list[str] = []
    seconds: list[float] = []
    for index, row in enumerate(rows, 1):
        plan = Plan(**_plan_fields(row))  # type: ignore[arg-type]
        started = time.perf_counter()
        try:
            trace = trace_plan(
                plan,
                catalog.models[plan.model],
                device="cpu",
                sdpa_math=row["sdpa_backend"] == "math",
                cuda_dropout=False,  # the harness's rows keep CPU's own dropout masks
            )
        except TraceUnavailable as exc:
            failed.append(f"{row['case_id']}: {exc}")
            print(f"[{index}/{len(rows)}] FAILED {row['case_id']}: {exc}", flush=True)
            continue
        seconds.append(time.perf_counter() - started)
        harness = int(row["peak_bytes"])
        if trace.peak_bytes == harness:
            same += 1
            verdict = "same"
        else:
            different.append(row["case_id"])
            verdict = f"DIFFERENT by {trace.peak_bytes - harness:+d} bytes"
        print(
            f"[{index}/{len(rows)}] {row['case_id']}: {verdict} ({seconds[-1]:.1f} s)", flush=True
        )
    print(
        f"{same} of {len(rows)} peaks identical to the harness; {len(different)} different, "
        f"{len(failed)} failed"
    )
    if seconds:
        print(f"trace time: median {statistics.median(seconds):.1f} s, max {max(seconds):.1f} s")
    for case in different:
        print(f"different: {case}")
    return 0 if not different and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
