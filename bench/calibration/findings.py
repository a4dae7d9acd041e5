"""Probes behind the findings of ``docs/accuracy.md``: per-layer saved bytes and the peak's contents.

Each probe traces one setting at two depths. The slope of what is alive at the end of the forward
pass (per added layer, divided by batch x seq tokens) is the bytes one layer saves for backward per
token; the inventory of the deeper trace lists which storages make the overall peak.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from calibration.cases import CalibrationCase
from calibration.inventory import make_inventory, summarize
from calibration.tracing import DepthTrace, depths_for, trace_at_depth
from hwdash.core.specs import ModelSpec

PROBE_BASE = CalibrationCase(model="llama-3.2-1b", batch=2, seq=1024)

#: (label, case) pairs. Each differs from PROBE_BASE in one or two fields.
PROBES: tuple[tuple[str, CalibrationCase], ...] = (
    ("full bf16 sdpa", PROBE_BASE),
    ("full bf16 sdpa ckpt", replace(PROBE_BASE, grad_ckpt=True)),
    ("full amp sdpa", replace(PROBE_BASE, precision="amp")),
    ("full amp sdpa ckpt", replace(PROBE_BASE, precision="amp", grad_ckpt=True)),
    ("full fp32 sdpa", replace(PROBE_BASE, precision="fp32")),
    ("full fp32 sdpa ckpt", replace(PROBE_BASE, precision="fp32", grad_ckpt=True)),
    ("full bf16 eager", replace(PROBE_BASE, attention="eager")),
    ("full bf16 eager s2048", replace(PROBE_BASE, attention="eager", seq=2048)),
    ("full fp32 eager", replace(PROBE_BASE, precision="fp32", attention="eager")),
    ("full fp32 eager s2048", replace(PROBE_BASE, precision="fp32", attention="eager", seq=2048)),
    ("full fp32 sdpa math", replace(PROBE_BASE, precision="fp32", sdpa_backend="math")),
    (
        "full fp32 sdpa math s2048",
        replace(PROBE_BASE, precision="fp32", sdpa_backend="math", seq=2048),
    ),
    ("full bf16 sdpa math", replace(PROBE_BASE, sdpa_backend="math")),
    ("full bf16 sdpa math s2048", replace(PROBE_BASE, sdpa_backend="math", seq=2048)),
    ("full amp sdpa math", replace(PROBE_BASE, precision="amp", sdpa_backend="math")),
    ("qwen2.5-0.5b full bf16 sdpa", replace(PROBE_BASE, model="qwen2.5-0.5b")),
    ("qwen2.5-0.5b full bf16 sdpa ckpt", replace(PROBE_BASE, model="qwen2.5-0.5b", grad_ckpt=True)),
    (
        "qwen2.5-0.5b lora bf16 dropout 0",
        replace(PROBE_BASE, model="qwen2.5-0.5b", method="lora", lora_dropout=0.0),
    ),
    (
        "qwen2.5-0.5b lora bf16 dropout 0.05",
        replace(PROBE_BASE, model="qwen2.5-0.5b", method="lora"),
    ),
    ("lora bf16 dropout 0.05", replace(PROBE_BASE, method="lora")),
    ("lora bf16 dropout 0", replace(PROBE_BASE, method="lora", lora_dropout=0.0)),
    ("lora bf16 ckpt", replace(PROBE_BASE, method="lora", grad_ckpt=True)),
    ("lora amp dropout 0", replace(PROBE_BASE, method="lora", precision="amp", lora_dropout=0.0)),
    (
        "lora bf16 q,v r8 dropout 0",
        replace(
            PROBE_BASE, method="lora", lora_r=8, lora_targets=("q_proj", "v_proj"), lora_dropout=0.0
        ),
    ),
    ("dora bf16 dropout 0.05", replace(PROBE_BASE, method="dora")),
    ("dora bf16 dropout 0", replace(PROBE_BASE, method="dora", lora_dropout=0.0)),
    ("inference bf16", replace(PROBE_BASE, method="inference", batch=1, seq=4096)),
)


def _forward_end(trace: DepthTrace, step: int) -> dict[str, int]:
    for phase in trace.phases:
        if phase.step == step and phase.phase in ("forward", "prefill"):
            components = dict(phase.end_components)
            components["total"] = phase.end_total
            return components
    raise ValueError("no forward phase")


def _is_logits_sized(entry: dict[str, Any], vocab: int, tokens: int) -> bool:
    """A per-token vocabulary buffer (logits, log-probabilities, their gradients), not a weight."""
    shape = entry["shape"]
    numel = 1
    for dim in shape:
        numel *= dim
    return bool(shape) and shape[-1] == vocab and numel == tokens * vocab


def probe(label: str, case: CalibrationCase, spec: ModelSpec) -> dict[str, Any]:
    """Per-layer saved bytes per token and the peak's largest storages for one setting."""
    low, high = depths_for(spec)
    shallow = trace_at_depth(case, spec, low)
    inventory = make_inventory()
    deep = trace_at_depth(case, spec, high, inventory=inventory)
    step = 0 if case.method == "inference" else 2
    a, b = _forward_end(shallow, step), _forward_end(deep, step)
    tokens = case.batch * (case.seq - 1 if case.method == "inference" else case.seq)
    per_layer = {k: (b[k] - a[k]) / (high - low) for k in a}
    saved = per_layer["activation"] + per_layer.get("temp", 0)
    groups = summarize(inventory.peak_live, top=40)
    vocab_groups = [g for g in groups if _is_logits_sized(g, spec.vocab_size, tokens)]
    peak = max(deep.phases, key=lambda p: p.total)
    forward_label = "step 0 prefill" if case.method == "inference" else f"step {step} forward"
    forward_label = forward_label if forward_label in inventory.phase_peaks else "setup"
    forward_groups = summarize(inventory.phase_peaks[forward_label][1], top=40)
    forward_vocab = [g for g in forward_groups if _is_logits_sized(g, spec.vocab_size, tokens)]
    return {
        "label": label,
        "case_id": case.case_id,
        "depths": [low, high],
        "tokens": tokens,
        "layers_traced_for_inventory": high,
        "hidden_size": spec.hidden_size,
        "saved_bytes_per_layer": saved,
        "saved_bytes_per_layer_per_token": saved / tokens,
        "saved_per_token_in_hidden_units": saved / tokens / spec.hidden_size,
        "peak_step": peak.step,
        "peak_phase": peak.phase,
        "peak_components": peak.components,
        "peak_inventory_phase": inventory.peak_phase,
        "vocab_buffers_at_peak": [
            {"op": g["op"], "dtype": g["dtype"], "count": g["count"]} for g in vocab_groups
        ],
        "vocab_bytes_per_token_at_peak": sum(g["bytes"] for g in vocab_groups)
        / tokens
        / spec.vocab_size,
        "vocab_buffers_at_forward_peak": [
            {"op": g["op"], "dtype": g["dtype"], "count": g["count"]} for g in forward_vocab
        ],
        "vocab_bytes_per_token_at_forward_peak": sum(g["bytes"] for g in forward_vocab)
        / tokens
        / spec.vocab_size,
        "attention_ops": deep.attention_ops,
        "largest_at_peak": groups[:10],
    }


def run_probes(catalog: Any, only: str = "") -> list[dict[str, Any]]:
    """Every probe whose label contains ``only``."""
    return [
        probe(label, case, catalog.models[case.model]) for label, case in PROBES if only in label
    ]


def markdown(results: list[dict[str, Any]]) -> str:
    """A table of the probes for the findings section."""
    lines = [
        "| probe (llama-3.2-1b unless named; b=2, s=1024) | saved bytes / layer / token | in units of hidden | logits-sized buffers at "
        "the peak (bytes / token / vocab entry) | at the forward peak | peak at | attention ops |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        at_peak = ", ".join(
            f"{g['count']}x {g['op']} {g['dtype']}" for g in r["vocab_buffers_at_peak"]
        )
        at_forward = ", ".join(
            f"{g['count']}x {g['op']} {g['dtype']}" for g in r["vocab_buffers_at_forward_peak"]
        )
        lines.append(
            f"| {r['label']} | {r['saved_bytes_per_layer_per_token']:.0f} | "
            f"{r['saved_per_token_in_hidden_units']:.2f} h | {at_peak or 'none'} "
            f"({r['vocab_bytes_per_token_at_peak']:.1f}) | {at_forward or 'none'} "
            f"({r['vocab_bytes_per_token_at_forward_peak']:.1f}) | "
            f"step {r['peak_step']} {r['peak_phase']} | {', '.join(r['attention_ops'])} |"
        )
    return "\n".join(lines)
