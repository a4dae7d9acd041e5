"""Per-layer training activations of a tiny Llama 4 text model, traced, against the estimate.

Needs torch and transformers (the main environment's). From the repository root:

    PYTHONPATH=src /work/main/.venv/bin/python bench/llama4_trace_rows.py

Builds ``tests/data/model_configs/llama4/tiny-llama4-text`` at 1 to 4 layers (layer 0 dense,
1 MoE, 2 dense, 3 MoE; layers 0-2 RoPE with chunked attention, 3 NoPE) and traces a full bf16
training step on fake tensors with :func:`hwdash.tracing.trace_plan` (batch 2 x 512 tokens, SDPA).
The bytes autograd keeps for one layer are the growth, from one depth to the next, of the
activations and temporaries alive at the end of the step-2 forward; they are printed beside
:func:`hwdash.core.estimator.layer_activation_bytes` for the same layer kind. The figures are the
ones pinned in ``tests/unit/test_family_llama4.py``.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from hwdash.core.estimator import architecture, layer_activation_bytes, resolve_lora_targets
from hwdash.core.estimator.architecture import dense_block_adapted
from hwdash.core.models.config import model_from_config
from hwdash.core.plan import Attention, Method, Plan
from hwdash.tracing import trace_plan

CONFIG = Path("tests/data/model_configs/llama4/tiny-llama4-text/config.json")
BATCH, SEQ = 2, 512
KINDS = {1: "MoE, RoPE", 2: "dense, RoPE", 3: "MoE, NoPE"}


def _end_of_forward(config: dict, depth: int, method: Method, targets: tuple[str, ...]) -> int:
    fields = {**config, "num_hidden_layers": depth}
    model = model_from_config(fields, name="tiny-llama4", source="bench")
    plan = Plan(
        model="tiny-llama4",
        method=method,
        batch=BATCH,
        seq=SEQ,
        attention=Attention.SDPA,
        lora_targets=targets or ("q_proj", "v_proj"),
        lora_dropout=0.0,
    )
    result = trace_plan(plan, model, device="cpu", full_depth=True, hf_config=fields)
    end = next(p for p in result.phases if p.step == 2 and p.phase == "forward")
    return end.end_components.get("activations", 0) + end.end_components.get("temporaries", 0)


def main() -> None:
    warnings.filterwarnings("ignore")
    config = json.loads(CONFIG.read_text(encoding="utf-8"))
    model = model_from_config(config, name="tiny-llama4", source="bench")
    arch = architecture(model)
    # block_kinds: (MoE, RoPE), (MoE, NoPE), (dense, RoPE), the order of KINDS' layers 1, 3, 2
    kind_of = {1: arch.block_kinds[0][1], 3: arch.block_kinds[1][1], 2: arch.block_kinds[2][1]}
    for method, targets in (
        (Method.FULL, ()),
        (Method.LORA, ("q_proj", "v_proj")),
        (Method.LORA, ("gate_proj", "up_proj", "down_proj")),
    ):
        ends = [_end_of_forward(config, depth, method, targets) for depth in range(1, 5)]
        names = (
            {linear.name for linear in resolve_lora_targets(arch, targets)} if targets else set()
        )
        for depth, label in KINDS.items():
            kind = kind_of[depth]
            if kind.experts == arch.experts:
                adapted = tuple(linear for linear in kind.linears if linear.name in names)
            else:
                adapted = dense_block_adapted(arch, kind, names)
            traced = ends[depth] - ends[depth - 1]
            counted = layer_activation_bytes(
                kind,
                BATCH,
                SEQ,
                2,
                Attention.SDPA,
                lora_targets=adapted,
                lora_rank=16 if adapted else 0,
            )
            print(
                f"{method.value:5s} {'/'.join(targets) or 'all':24s} layer {depth} ({label}): traced {traced:>12,}  counted "
                f"{counted:>12,}  ({counted / traced - 1:+.1%})"
            )


if __name__ == "__main__":
    main()
