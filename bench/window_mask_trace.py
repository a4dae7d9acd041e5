"""Sliding-window layers under SDPA below and above the window, traced, against the estimate.

Needs torch and transformers (the main environment's). From the repository root:

    PYTHONPATH=src /work/main/.venv/bin/python bench/window_mask_trace.py [--out CSV]

For each row, a full bf16 training step (two steps, AdamW) of the model's ``config.json`` is
traced on fake CPU tensors with :func:`hwdash.tracing.trace_plan` at two depths that differ by one
decoder layer of the named attention kind (``sliding`` or ``full``); the growth of the activations
and temporaries alive at the end of the step-2 forward is that layer's saved tensors, printed
beside the growth of :func:`hwdash.core.estimator.training_activation_bytes` between the same two
depths (so through :attr:`~hwdash.core.estimator.layout.Architecture.block_kinds`, the path every
plan takes). Then the whole model at its own depth is traced as ``hwdash plan --trace`` does
(deep stacks extrapolated from two depths) beside the estimate without overhead.

``role`` says which rows the per-layer term was derived from (``derive``) and which were only
scored once the term was in (``held-out``). The output is ``bench/data/window_mask_trace.csv``.
"""

from __future__ import annotations

import argparse
import csv
import json
import warnings
from pathlib import Path

from hwdash.core.estimator import architecture, resolve_lora_targets, training_activation_bytes
from hwdash.core.models.config import model_from_config
from hwdash.core.plan import Attention, Method, Plan
from hwdash.tracing import trace_plan
from hwdash.tracing.comparison import comparable_estimate, trace_document

CONFIGS = Path("tests/data/model_configs/catalog")
OUT = Path("bench/data/window_mask_trace.csv")
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")

#: (role, model, config overrides, method, batch, seq, layer kind whose growth is measured)
ROWS: list[tuple[str, str, dict, Method, int, int, str]] = [
    ("derive", "gemma-3-1b", {}, Method.LORA, 1, 256, "sliding"),
    ("derive", "gemma-3-1b", {}, Method.LORA, 1, 512, "sliding"),
    ("derive", "gemma-3-1b", {}, Method.LORA, 1, 1024, "sliding"),
    ("derive", "gemma-3-1b", {}, Method.LORA, 1, 1024, "full"),
    ("derive", "mistral-7b", {"sliding_window": 512}, Method.LORA, 2, 256, "sliding"),
    ("derive", "mistral-7b", {"sliding_window": 512}, Method.LORA, 2, 1024, "sliding"),
    ("held-out", "gemma-3-1b", {}, Method.FULL, 2, 2048, "sliding"),
    ("held-out", "mistral-7b", {}, Method.FULL, 1, 2048, "sliding"),
    ("held-out", "mistral-7b", {}, Method.FULL, 1, 6144, "sliding"),
    ("held-out", "gemma-2-2b", {}, Method.LORA, 1, 2048, "sliding"),
    ("held-out", "gemma-2-2b", {}, Method.LORA, 1, 6144, "sliding"),
]


#: What a row's per-layer figure shows besides the term (written into the CSV's note column).
NOTES = {
    "full": "no mask (is_causal); the first full layer also brings Gemma 3's global RoPE cos and "
    "sin (2 x s x head_dim bf16), made once per model, not per layer",
    "eager": "no SDPA in transformers (soft-capped scores): eager, whose one mask per forward "
    "backward does not keep",
}


def _layer_types(fields: dict, depth: int) -> dict:
    """The config at ``depth`` layers (a listed ``layer_types`` cut to it)."""
    fields = {**fields, "num_hidden_layers": depth}
    if isinstance(fields.get("layer_types"), list):
        fields["layer_types"] = fields["layer_types"][:depth]
    return fields


def _plan(name: str, method: Method, batch: int, seq: int, attention: Attention) -> Plan:
    return Plan(
        model=name,
        method=method,
        batch=batch,
        seq=seq,
        attention=attention,
        lora_targets=TARGETS,
        lora_dropout=0.0,
    )


def _end_of_forward(fields: dict, name: str, plan: Plan) -> int:
    model = model_from_config(fields, name=name, source="bench")
    result = trace_plan(plan, model, device="cpu", full_depth=True, hf_config=fields)
    end = next(p for p in result.phases if p.step == 2 and p.phase == "forward")
    return end.end_components.get("activations", 0) + end.end_components.get("temporaries", 0)


def _counted(fields: dict, name: str, plan: Plan, attention: Attention) -> int:
    arch = architecture(model_from_config(fields, name=name, source="bench"))
    lora = plan.method is Method.LORA
    return training_activation_bytes(
        arch,
        plan.batch,
        plan.seq,
        2,
        attention,
        False,
        weight_bytes=2,
        lora_targets=resolve_lora_targets(arch, TARGETS) if lora else (),
        lora_rank=16 if lora else 0,
    )


def _depths(fields: dict, name: str, kind: str) -> int:
    """The smallest depth whose next layer is of ``kind``."""
    model = model_from_config(fields, name=name, source="bench")
    kinds = model.layer_attention or ("full",) * model.layers
    return next(i for i in range(1, len(kinds)) if kinds[i] == kind)


def row(spec: tuple[str, str, dict, Method, int, int, str]) -> dict:
    role, name, overrides, method, batch, seq, kind = spec
    config = json.loads((CONFIGS / name / "config.json").read_text(encoding="utf-8"))
    config.update(overrides)
    model = model_from_config(config, name=name, source="bench")
    # Gemma 2 has no SDPA in transformers (soft-capped scores): runs, and is counted, as eager
    attention = Attention.EAGER if model.attn_logit_softcap is not None else Attention.SDPA
    plan = _plan(name, method, batch, seq, Attention.SDPA)
    depth = _depths(config, name, kind)
    small, large = _layer_types(config, depth), _layer_types(config, depth + 1)
    traced = _end_of_forward(large, name, plan) - _end_of_forward(small, name, plan)
    counted = _counted(large, name, plan, attention) - _counted(small, name, plan, attention)
    whole = trace_plan(plan, model, device="cpu", hf_config=config)
    document = trace_document(whole, comparable_estimate(plan, model))
    window = model.sliding_window
    return {
        "role": role,
        "model": name + (f" (window {window})" if overrides else ""),
        "method": method.value,
        "batch": batch,
        "seq": seq,
        "window": window,
        "attention": attention.value,
        "layer": f"{kind} (layer {depth})",
        "layer_traced_bytes": traced,
        "layer_counted_bytes": counted,
        "layer_error": f"{counted / traced - 1:+.2%}",
        "step_traced_gib": f"{whole.peak_bytes / 2**30:.3f}",
        "step_estimate_gib": f"{document['estimate']['without_overhead'] / 2**30:.3f}",
        "step_error": f"{document['error']:+.2%}",
        "note": NOTES.get(kind, NOTES.get(attention.value, "")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--role", choices=("derive", "held-out"), default=None)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    rows = [row(spec) for spec in ROWS if args.role in (None, spec[0])]
    with args.out.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    for item in rows:
        print(
            f"{item['role']:8s} {item['model']:26s} {item['method']:4s} b{item['batch']} "
            f"s{item['seq']:<5} {item['layer']:18s} traced {item['layer_traced_bytes']:>13,} "
            f"counted {item['layer_counted_bytes']:>13,} ({item['layer_error']}); step "
            f"{item['step_traced_gib']} vs {item['step_estimate_gib']} GiB ({item['step_error']})"
        )


if __name__ == "__main__":
    main()
