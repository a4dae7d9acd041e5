"""Trace the LoRA-dropout tuning rows of issue 24 and compare them with the estimate.

Every row is a plan on a tuning-grid catalog model (never a held-out family), small enough to trace
in under a minute on two CPU cores (seq <= 2048, batch <= 2; the tracer extrapolates depth). Each
row is traced twice on CPU fake tensors:

* ``traced_cpu_dropout``: torch's own CPU dropout, whose multiply keeps a mask in the input's dtype
  (4 bytes per element inside PEFT's fp32 adapters): what ``hwdash plan --trace`` reported before
  issue 24, and how ``bench/data/calibration.csv`` was traced;
* ``traced``: dropout run through CUDA's fused ``native_dropout`` (a bool mask), as a GPU runs it
  (``hwdash.tracing._cuda_fused_dropout``, the default of ``hwdash plan --trace`` now).

and estimated with the source tree on ``PYTHONPATH`` (``comparable_estimate``, without overhead).
Run it on the tree before a change with ``--estimates-only`` to get the "before" column::

    PYTHONPATH=/path/to/base/src python bench/lora_dropout_rows.py --estimates-only > /tmp/before.json
    PYTHONPATH=src python bench/lora_dropout_rows.py --before /tmp/before.json \
        --csv bench/data/lora_dropout_rows.csv

Needs torch, transformers and peft (the ``calibrate`` extra).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

GIB = 1024**3

#: (row id, plan fields). Tuning-grid models only (issue 24's process: held-out rows are collected
#: elsewhere and must not be tuned on).
ROWS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("llama-3.1-8b lora bf16 b1 s2048", {"model": "llama-3.1-8b", "method": "lora"}),
    (
        "llama-3.1-8b lora bf16 b1 s2048 d0",
        {"model": "llama-3.1-8b", "method": "lora", "lora_dropout": 0.0},
    ),
    ("qwen2.5-0.5b lora bf16 b1 s2048", {"model": "qwen2.5-0.5b", "method": "lora"}),
    ("llama-3.2-1b lora bf16 b1 s2048", {"model": "llama-3.2-1b", "method": "lora"}),
    ("qwen2.5-1.5b lora bf16 b1 s2048", {"model": "qwen2.5-1.5b", "method": "lora"}),
    ("qwen3-0.6b lora bf16 b1 s2048", {"model": "qwen3-0.6b", "method": "lora"}),
    ("mistral-7b lora bf16 b1 s1024", {"model": "mistral-7b", "method": "lora", "seq": 1024}),
    ("tinyllama lora bf16 b2 s1024", {"model": "tinyllama-1.1b", "method": "lora", "batch": 2}),
    (
        "llama-3.2-1b lora amp b1 s1024",
        {"model": "llama-3.2-1b", "method": "lora", "precision": "amp", "seq": 1024},
    ),
    (
        "llama-3.2-1b lora fp32 b1 s1024",
        {"model": "llama-3.2-1b", "method": "lora", "precision": "fp32", "seq": 1024},
    ),
    (
        "llama-3.2-1b lora fp32 b1 s1024 d0",
        {
            "model": "llama-3.2-1b",
            "method": "lora",
            "precision": "fp32",
            "seq": 1024,
            "lora_dropout": 0.0,
        },
    ),
    (
        "phi-2 lora fp32 b1 s512",
        {"model": "phi-2", "method": "lora", "precision": "fp32", "seq": 512},
    ),
    (
        "phi-2 lora fp32 b1 s512 d0",
        {"model": "phi-2", "method": "lora", "precision": "fp32", "seq": 512, "lora_dropout": 0.0},
    ),
    (
        "gemma-2-2b lora fp32 b1 s512",
        {"model": "gemma-2-2b", "method": "lora", "precision": "fp32", "seq": 512},
    ),
    (
        "qwen2.5-0.5b lora q,v r8 fp32 b1 s1024",
        {
            "model": "qwen2.5-0.5b",
            "method": "lora",
            "precision": "fp32",
            "seq": 1024,
            "lora_r": 8,
            "lora_targets": ("q_proj", "v_proj"),
        },
    ),
    (
        "llama-3.2-1b lora bf16 ckpt b2 s2048",
        {"model": "llama-3.2-1b", "method": "lora", "batch": 2, "grad_ckpt": True},
    ),
    (
        "llama-3.2-1b lora fp32 ckpt b1 s1024",
        {
            "model": "llama-3.2-1b",
            "method": "lora",
            "precision": "fp32",
            "seq": 1024,
            "grad_ckpt": True,
        },
    ),
    (
        "llama-3.2-1b dora bf16 b1 s1024",
        {"model": "llama-3.2-1b", "method": "dora", "seq": 1024},
    ),
    (
        "qwen2.5-0.5b dora fp32 b1 s512",
        {"model": "qwen2.5-0.5b", "method": "dora", "precision": "fp32", "seq": 512},
    ),
    (
        "llama-3.2-3b lora r8 bf16 b2 s2048 (4k tokens)",
        {"model": "llama-3.2-3b", "method": "lora", "lora_r": 8, "batch": 2},
    ),
    (
        "llama-3.2-3b lora r8 bf16 b2 s2048 (4k tokens) d0",
        {"model": "llama-3.2-3b", "method": "lora", "lora_r": 8, "batch": 2, "lora_dropout": 0.0},
    ),
    (
        "gemma-2-2b lora bf16 ckpt b2 s2048",
        {"model": "gemma-2-2b", "method": "lora", "batch": 2, "grad_ckpt": True},
    ),
    (
        "gemma-2-2b lora bf16 ckpt b2 s2048 d0",
        {
            "model": "gemma-2-2b",
            "method": "lora",
            "batch": 2,
            "grad_ckpt": True,
            "lora_dropout": 0.0,
        },
    ),
    (
        "gemma-2-2b lora bf16 b1 s2048",
        {"model": "gemma-2-2b", "method": "lora"},
    ),
)

COLUMNS = (
    "row",
    "model",
    "method",
    "precision",
    "batch",
    "seq",
    "grad_ckpt",
    "lora_r",
    "lora_targets",
    "lora_dropout",
    "traced_cpu_dropout_gib",
    "traced_gib",
    "estimate_before_gib",
    "estimate_after_gib",
    "error_before_vs_cpu_trace",
    "error_before",
    "error_after",
)


def _plan(fields: dict[str, Any]) -> Any:
    from hwdash.core.plan import Plan

    defaults: dict[str, Any] = {"batch": 1, "seq": 2048}
    return Plan(**{**defaults, **fields})


def _estimate(plan: Any, catalog: Any) -> int:
    from hwdash.tracing import comparable_estimate

    per_gpu = comparable_estimate(plan, catalog.models[plan.model]).per_gpu
    return int(per_gpu.total - per_gpu.overhead)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--estimates-only", action="store_true", help="print estimates as JSON")
    parser.add_argument("--before", type=Path, help="JSON of --estimates-only on the base tree")
    parser.add_argument("--csv", type=Path, help="write the rows here")
    parser.add_argument("--only", default="", help="rows whose id contains this text")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

    from hwdash.core.catalog import load_catalog

    catalog = load_catalog(include_user=False)
    rows = [(name, fields) for name, fields in ROWS if args.only in name]
    if args.estimates_only:
        print(json.dumps({name: _estimate(_plan(fields), catalog) for name, fields in rows}))
        return 0

    from hwdash.tracing import trace_plan

    before = json.loads(args.before.read_text(encoding="utf-8")) if args.before else {}
    out = []
    for name, fields in rows:
        plan = _plan(fields)
        spec = catalog.models[plan.model]
        cpu = trace_plan(plan, spec, device="cpu", cuda_dropout=False).peak_bytes
        cuda = trace_plan(plan, spec, device="cpu", cuda_dropout=True).peak_bytes
        after = _estimate(plan, catalog)
        was = int(before.get(name, after))
        row = {
            "row": name,
            "model": plan.model,
            "method": plan.method.value,
            "precision": plan.precision.value,
            "batch": plan.batch,
            "seq": plan.seq,
            "grad_ckpt": plan.grad_ckpt,
            "lora_r": plan.lora_r,
            "lora_targets": "+".join(plan.lora_targets),
            "lora_dropout": plan.lora_dropout,
            "traced_cpu_dropout_gib": f"{cpu / GIB:.2f}",
            "traced_gib": f"{cuda / GIB:.2f}",
            "estimate_before_gib": f"{was / GIB:.2f}",
            "estimate_after_gib": f"{after / GIB:.2f}",
            "error_before_vs_cpu_trace": f"{(was - cpu) / cpu:+.1%}",
            "error_before": f"{(was - cuda) / cuda:+.1%}",
            "error_after": f"{(after - cuda) / cuda:+.1%}",
        }
        out.append(row)
        print(
            f"{name:52s} cpu-dropout trace {row['traced_cpu_dropout_gib']:>6s}  "
            f"trace {row['traced_gib']:>6s}  before {row['estimate_before_gib']:>6s} "
            f"({row['error_before_vs_cpu_trace']} vs cpu, {row['error_before']})  "
            f"after {row['estimate_after_gib']:>6s} ({row['error_after']})",
            flush=True,
        )
    if args.csv:
        with args.csv.open("w", encoding="utf-8", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=COLUMNS, lineterminator="\n")
            writer.writeheader()
            writer.writerows(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
