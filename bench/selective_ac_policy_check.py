"""Check ``--selective-ac op``'s count against torch's selective checkpointing on real transformers
blocks (CPU; needs torch and transformers: run with the calibrate environment).

hwdash's tracer builds models with ``gradient_checkpointing_enable`` and has no selective policy, so
this script applies one itself: a policy written after torchtitan's ``_apply_op_sac``
(``torchtitan/distributed/activation_checkpoint.py``: ``aten.mm`` outputs saved except every second
one, counted per block; the fused SDPA kernels' outputs saved; everything else recomputed), passed
to ``torch.utils.checkpoint.create_selective_checkpoint_contexts`` through transformers'
``gradient_checkpointing_kwargs`` (``context_fn``). It records which ops the policy saves in one
block's forward and compares them with :func:`hwdash.core.estimator.selective_ac.op_saved_tensors`
for the same config: a tiny Llama (bias-free projections) and a tiny Qwen2 (q/k/v biases, which
run as ``aten.addmm``).

On CPU, SDPA dispatches to ``_scaled_dot_product_flash_attention_for_cpu``, which is not on
torchtitan's list (its list names the CUDA kernels), so the check compares the matmuls; it prints
the attention op it saw.

    PYTHONPATH=src /path/to/calibrate-venv/bin/python bench/selective_ac_policy_check.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

TINY = {
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 128,
    "max_position_embeddings": 256,
    "torch_dtype": "bfloat16",
}
CONFIGS = {
    "llama": {**TINY, "model_type": "llama", "architectures": ["LlamaForCausalLM"]},
    "qwen2": {**TINY, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]},
}
BATCH, SEQ = 2, 16
#: The SDPA ops the policy saw (printed: on CPU not one of torchtitan's CUDA kernels).
ATTENTION_OPS: set[str] = set()


def _saved_ops(config: dict[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    """The ops the policy marks MUST_SAVE in the first block's forward: (op, output shape)."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    from transformers import AutoConfig, AutoModelForCausalLM

    fused_sdpa = {
        torch.ops.aten._scaled_dot_product_efficient_attention.default,
        torch.ops.aten._scaled_dot_product_flash_attention.default,
        torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    }
    blocks: list[list[tuple[str, tuple[int, ...]]]] = []

    def context_fn() -> Any:
        counts: dict[str, int] = defaultdict(int)
        saved: list[tuple[str, tuple[int, ...]]] = []
        blocks.append(saved)

        def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
            mode = "recompute" if ctx.is_recompute else "forward"
            if "scaled_dot_product" in str(func):
                ATTENTION_OPS.add(str(func))
            if func == torch.ops.aten.mm.default:
                counts[mode] += 1
                keep = counts[mode] % 2 == 1
            else:
                keep = func in fused_sdpa
            if keep and not ctx.is_recompute:
                saved.append((str(func), _mm_shape(func, args)))
            return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    cfg = AutoConfig.for_model(**{k: v for k, v in config.items() if k != "architectures"})
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.bfloat16)
    model.train()
    model.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs={"use_reentrant": False, "context_fn": context_fn}
    )
    ids = torch.randint(0, TINY["vocab_size"], (BATCH, SEQ))
    model(input_ids=ids, labels=ids).loss.backward()
    return blocks[0]


def _mm_shape(func: Any, args: tuple[Any, ...]) -> tuple[int, ...]:
    """An mm's output shape from its operands (rows of the first, columns of the second)."""
    import torch

    if func == torch.ops.aten.mm.default:
        return (args[0].shape[0], args[1].shape[1])
    return tuple(args[0].shape)


def main() -> int:
    from hwdash.core.catalog import load_catalog
    from hwdash.core.estimator.architecture import architecture
    from hwdash.core.estimator.selective_ac import op_saved_tensors
    from hwdash.core.models.config import resolve_model
    from hwdash.core.plan import Attention

    catalog = load_catalog(include_user=False)
    failed = False
    for name, config in CONFIGS.items():
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "config.json"
            path.write_text(json.dumps(config))
            arch = architecture(resolve_model(str(path), catalog))
        expected = [
            (what, size // (2 * BATCH * SEQ))
            for what, size in op_saved_tensors(arch, BATCH, SEQ, 2, Attention.EAGER)
        ]
        saved = _saved_ops(config)
        widths = [shape[1] for op, shape in saved if op == "aten.mm.default"]
        others = [op for op, _ in saved if op != "aten.mm.default"]
        ok = widths == [width for _, width in expected]
        rows = {shape[0] for op, shape in saved if op == "aten.mm.default"}
        ok = ok and rows == {BATCH * SEQ}
        failed |= not ok
        print(f"{name}: torch saved mm widths {widths} (rows {sorted(rows)}); hwdash {expected}")
        print(f"  other saved ops: {others or 'none'} -> {'ok' if ok else 'MISMATCH'}")
        print(f"  attention ops seen (recomputed): {sorted(ATTENTION_OPS)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
