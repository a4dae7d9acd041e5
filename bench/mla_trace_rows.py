"""Trace DeepSeek-V2-Lite (multi-head latent attention, DeepSeekMoE) from its config.json and compare
each traced component with the estimate (issue 30: "an MLA traced step within 5%").

The config is the held-out one, ``tests/data/model_configs/heldout/DeepSeek-V2-Lite/config.json``
(15.7B parameters); nothing was tuned on it. Each row is one ``hwdash plan --trace`` step on CPU fake
tensors (transformers builds ``DeepseekV2ForCausalLM`` from the config; the tracer runs 2 and 4
layers and extrapolates to 27), estimated with the source tree on ``PYTHONPATH``
(``comparable_estimate``, without overhead). Run it on a tree before a change with
``--estimates-only`` to get the "before" column::

    PYTHONPATH=/path/to/base/src python bench/mla_trace_rows.py --estimates-only > /tmp/before.json
    PYTHONPATH=src python bench/mla_trace_rows.py --before /tmp/before.json \
        --csv bench/data/deepseek_v2_lite_trace.csv

Needs torch, transformers and peft (the ``calibrate`` extra). About 10 s a row on two CPU cores.
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
CONFIG = (
    Path(__file__).resolve().parent.parent
    / "tests"
    / "data"
    / "model_configs"
    / "heldout"
    / "DeepSeek-V2-Lite"
    / "config.json"
)

#: (row id, plan fields); batch 1 x 1024 tokens, bf16, LoRA r16 on all-linear at dropout 0 (PEFT
#: refuses dropout on fused expert weights, lora.ParamWrapper)
ROWS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("lora bf16 b1 s1024 sdpa", {"method": "lora"}),
    ("lora bf16 b1 s1024 eager", {"method": "lora", "attention": "eager"}),
    ("lora bf16 b1 s1024 ckpt", {"method": "lora", "grad_ckpt": True}),
    ("full bf16 b1 s1024 ckpt", {"method": "full", "grad_ckpt": True}),
    ("full bf16 b1 s1024", {"method": "full"}),
    ("inference bf16 b1 s1024 eager", {"method": "inference", "attention": "eager"}),
    (
        "inference bf16 b4 s4096 eager",
        {"method": "inference", "attention": "eager", "batch": 4, "seq": 4096},
    ),
)

#: (column, estimate's MemoryBreakdown keys, trace's component keys)
PARTS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("weights", ("weights",), ("parameters", "buffers")),
    ("gradients", ("gradients",), ("gradients",)),
    ("optimizer", ("optimizer",), ("optimizer", "other")),
    ("activations", ("activations", "kv_cache"), ("activations", "temporaries")),
)


def _plan(fields: dict[str, Any]) -> Any:
    from hwdash.core.plan import Plan

    defaults: dict[str, Any] = {
        "model": "DeepSeek-V2-Lite",
        "batch": 1,
        "seq": 1024,
        "lora_dropout": 0.0,
    }
    return Plan(**{**defaults, **fields})


def _model() -> Any:
    from hwdash.core.models.config import model_from_config_file

    return model_from_config_file(CONFIG)


def _estimate(plan: Any, model: Any) -> dict[str, int]:
    from hwdash.tracing import comparable_estimate

    return comparable_estimate(plan, model).per_gpu.as_dict()


def _gib(value: int) -> str:
    return f"{value / GIB:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--estimates-only", action="store_true", help="print estimates as JSON")
    parser.add_argument("--before", type=Path, help="JSON of --estimates-only on the base tree")
    parser.add_argument("--csv", type=Path, help="write the rows here")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    model = _model()
    if args.estimates_only:
        estimates = {name: _estimate(_plan(fields), model) for name, fields in ROWS}
        print(json.dumps({name: e["total"] - e["overhead"] for name, e in estimates.items()}))
        return 0

    from hwdash.tracing import trace_plan

    before = json.loads(args.before.read_text(encoding="utf-8")) if args.before else {}
    columns = ["row", "traced_gib", "traced_phase"]
    columns += [f"{part}_{side}_gib" for part, _, _ in PARTS for side in ("traced", "estimate")]
    columns += ["trainable_params", "estimate_before_gib", "estimate_gib", "error_before", "error"]
    out = []
    for name, fields in ROWS:
        plan = _plan(fields)
        trace = trace_plan(plan, model)
        estimate = _estimate(plan, model)
        total = estimate["total"] - estimate["overhead"]
        row: dict[str, Any] = {
            "row": name,
            "traced_gib": _gib(trace.peak_bytes),
            "traced_phase": f"step {trace.peak_step} {trace.peak_phase}",
        }
        for part, estimated, traced in PARTS:
            row[f"{part}_traced_gib"] = _gib(sum(trace.components[key] for key in traced))
            row[f"{part}_estimate_gib"] = _gib(sum(estimate[key] for key in estimated))
        old = before.get(name)
        row["trainable_params"] = trace.trainable_params
        row["estimate_before_gib"] = _gib(old) if old is not None else ""
        row["estimate_gib"] = _gib(total)
        row["error_before"] = f"{(old - trace.peak_bytes) / trace.peak_bytes:+.1%}" if old else ""
        row["error"] = f"{(total - trace.peak_bytes) / trace.peak_bytes:+.1%}"
        out.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    handle = args.csv.open("w", newline="", encoding="utf-8") if args.csv else sys.stdout
    writer = csv.DictWriter(handle, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(out)
    if args.csv:
        handle.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
