"""Probe one case at small depth: the storages alive at its peak, and hwdash's estimate (issue 14).

Needs the ``calibrate`` extra. Usage, from the repository root:

    .venv/bin/python bench/probe_gaps.py gemma-2-2b inference --seq 1024 --batch 1 --attention eager

Traces the case at the two depths the harness uses (``calibration.tracing.depths_for``) and prints,
for the deeper one, the largest groups of storages alive at the peak (op, shape, dtype), the
per-layer slope of the bytes alive at the end of the forward (or prefill) and of the peak, and
hwdash's per-layer activation count for the same plan. Used to find which tensors the formulas miss.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from calibration.cases import CalibrationCase  # noqa: E402
from calibration.inventory import make_inventory, summarize  # noqa: E402
from calibration.tracing import depths_for, trace_at_depth  # noqa: E402
from estimator_errors import calibration_catalog  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("method")
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--attention", default="sdpa")
    parser.add_argument("--ckpt", action="store_true")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--dropout", type=float, default=0.05)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--phase", default="", help="inventory of this phase label's peak")
    args = parser.parse_args()
    case = CalibrationCase(
        model=args.model,
        method=args.method,
        precision=args.precision,
        batch=args.batch,
        seq=args.seq,
        grad_ckpt=args.ckpt,
        attention=args.attention,
        lora_r=args.rank,
        lora_dropout=args.dropout,
    )
    spec = calibration_catalog().models[case.model]
    low, high = depths_for(spec)
    shallow = trace_at_depth(case, spec, low)
    inventory = make_inventory()
    deep = trace_at_depth(case, spec, high, inventory=inventory)
    print(case.case_id, "depths", low, high)
    for a, b in zip(shallow.phases, deep.phases, strict=True):
        slope = (b.total - a.total) / (high - low)
        end_slope = (b.end_total - a.end_total) / (high - low)
        print(
            f"step {a.step} {a.phase:9s} peak {a.total:>14,} {b.total:>14,} per layer {slope:>14,.0f}"
            f"  end per layer {end_slope:>14,.0f}"
        )
    if case.method != "inference" and case.precision == "bf16" and not case.grad_ckpt:
        from hwdash.core.estimator import architecture, layer_activation_bytes
        from hwdash.core.estimator.architecture import resolve_lora_targets
        from hwdash.core.plan import Attention

        arch = architecture(spec)
        adapted = case.method in ("lora", "dora")
        targets = resolve_lora_targets(arch, case.lora_targets) if adapted else ()
        counted = layer_activation_bytes(
            arch,
            case.batch,
            case.seq,
            2,
            Attention(case.attention),
            weight_bytes=2,
            lora_targets=targets,
            lora_rank=case.lora_r if adapted else 0,
            dora=case.method == "dora",
            lora_dropout=adapted and case.lora_dropout > 0,
        )
        step = 2
        ends = [
            next(p for p in t.phases if p.step == step and p.phase == "forward")
            for t in (shallow, deep)
        ]
        traced = (ends[1].end_total - ends[0].end_total) / (high - low)
        params = (deep.total_params - shallow.total_params) / (high - low)
        # the end-of-forward slope holds the layer's weights (and, in step 2, its optimizer
        # states); the activation and temp components alone are what autograd keeps
        acts = [
            p.end_components.get("activation", 0) + p.end_components.get("temp", 0) for p in ends
        ]
        kept = (acts[1] - acts[0]) / (high - low)
        tokens = case.batch * case.seq
        print(
            f"per layer, end of step-2 forward: all {traced:,.0f} (params {params:,.0f}); "
            f"activations {kept:,.0f} = {kept / tokens:,.1f} B/token; hwdash counts "
            f"{counted:,} = {counted / tokens:,.1f} B/token (CPU dropout masks: 4 B, hwdash 1 B)"
        )
    label = args.phase or inventory.peak_phase
    total, live = inventory.phase_peaks.get(label, (inventory.peak_total, inventory.peak_live))
    print(f"inventory at the peak of {label!r}: {total:,} bytes")
    for group in summarize(live, top=args.top):
        print(
            f"  {group['count']:>3}x {group['op']:40s} {group['shape']!s:28s} "
            f"{group['dtype']:9s} {group['bytes']:>14,}"
        )


if __name__ == "__main__":
    main()
