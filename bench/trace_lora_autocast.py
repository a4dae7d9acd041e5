"""Trace the calibration grid's bf16 LoRA/DoRA cases under bf16 autocast, as the Hugging Face Trainer
runs them with ``bf16=True`` (accelerate wraps the forward in ``torch.autocast``).

The calibration harness (``bench/calibrate.py``) enables autocast for ``amp`` only, so its bf16 LoRA
rows trace a plain PyTorch loop: PEFT casts each adapted input to the fp32 adapters and, without
autocast, lora_A keeps that fp32 copy (4 bytes per element, not 2) and the LoRA output is fp32. The
estimator models the Trainer. This script reuses the harness's tracer with one change, autocast
around the forward for ``bf16`` as for ``amp``, and writes ``bench/data/calibration-lora-autocast.csv``
(case id and the traced peak), which ``bench/estimator_errors.py`` and the unit tests read.

Needs the ``calibrate`` extra. From the repository root (about 4 minutes on 2 cores):

    PYTHONPATH=src .venv-cal/bin/python bench/trace_lora_autocast.py [--only TEXT] [--jobs N]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from calibration import tracing  # noqa: E402
from calibration.cases import CalibrationCase, calibration_grid  # noqa: E402

OUT_JSONL = REPO / "bench" / "out" / "calibration-lora-autocast.jsonl"
DATA_CSV = REPO / "bench" / "data" / "calibration-lora-autocast.csv"
CSV_COLUMNS = ("case_id", "peak_bytes", "peak_step", "peak_phase")


def _train_under_autocast(
    case: CalibrationCase, model: Any, tracker: Any, recorder: Any, inventory: Any = None
) -> list[Any]:
    """The harness's training loop (two steps) with bf16 autocast around every forward."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = tracing._build_optimizer(case, params)
    tracker.track_external(model, optimizer)
    ids = torch.randint(0, model.config.vocab_size, (case.batch, case.seq))
    phases = []
    collect = case.method == "dora"
    with tracker, tracing._sdpa_backend(case):
        for step in (1, 2):
            if step == 2:
                tracker.reset_mod_stats()
            recording = recorder if step == 1 else contextlib.nullcontext()
            with recording, torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            phases.append(tracing._close_phase(tracker, step, "forward", collect=collect))
            loss.backward()
            del loss
            phases.append(tracing._close_phase(tracker, step, "backward", collect=collect))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            phases.append(tracing._close_phase(tracker, step, "optimizer", collect=collect))
    return phases


def _measure(case: CalibrationCase) -> dict[str, Any]:
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from hwdash.core.catalog import load_catalog

    tracing._train = _train_under_autocast
    spec = load_catalog(include_user=False).models[case.model]
    try:
        return tracing.measure(case, spec)
    except Exception as exc:  # one untraceable case must not end the run
        return {"case_id": case.case_id, "failed": f"{type(exc).__name__}: {exc}"}


def write_csv(records: list[dict[str, Any]], path: Path) -> None:
    """The committed summary: one row per traced case."""
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for record in sorted(records, key=lambda r: r["case_id"]):
            writer.writerow({name: record[name] for name in CSV_COLUMNS})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="trace cases whose id contains this text")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    cases = [
        c
        for c in calibration_grid()
        if c.method in ("lora", "dora") and c.precision == "bf16" and args.only in c.case_id
    ]
    OUT_JSONL.parent.mkdir(parents=True, exist_ok=True)
    records = []
    with OUT_JSONL.open("w", encoding="utf-8") as out, ProcessPoolExecutor(args.jobs) as pool:
        for record in pool.map(_measure, cases):
            out.write(json.dumps(record) + "\n")
            print(record["case_id"], record.get("peak_bytes", record.get("failed")), flush=True)
            if "failed" not in record:
                records.append(record)
    write_csv(records, DATA_CSV)
    print(f"wrote {DATA_CSV.relative_to(REPO)} ({len(records)} rows)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
