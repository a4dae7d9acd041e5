"""Trace the bytes autograd keeps per decoder layer and compare with ``layer_activation_bytes``.

Needs the ``calibrate`` extra (torch CPU build, transformers, peft); no GPU, no network, no
weights (random init). Run from the repository root:

    PYTHONPATH=src .venv-cal/bin/python bench/trace_layer_activations.py

How: a small Llama is built at 2 and at 4 layers; a forward runs under
``torch.autograd.graph.saved_tensors_hooks`` whose pack hook keeps a weak reference to every tensor
autograd saves. After the forward, the tensors still alive (graphs that died, such as DoRA's
detached weight-norm path, drop out) are summed by storage, parameters excluded. Per layer =
(4-layer sum - 2-layer sum) / 2. bf16 LoRA/DoRA and amp run under ``torch.autocast`` as the HF
Trainer does with ``bf16=True``. The numbers printed here are the ones pinned in
``tests/unit/test_estimator.py::TINY_LLAMA_TRACED``.

Known difference: plain fp32 with GQA, where the CPU SDPA kernel keeps no scores and we assume
CUDA's math fallback (which does).
"""

from __future__ import annotations

import gc
import warnings
import weakref
from typing import Any

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from hwdash.core.estimator import architecture, layer_activation_bytes
from hwdash.core.plan import Attention
from hwdash.core.specs import ModelSpec

HIDDEN, HEADS, HEAD_DIM, INTERMEDIATE, VOCAB = 256, 4, 64, 704, 512
BATCH, SEQ, RANK = 2, 128, 8


def _build(layers: int, attention: str, kv_heads: int, adapter: str | None, dtype: Any) -> Any:
    config = LlamaConfig(
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=layers,
        num_attention_heads=HEADS,
        num_key_value_heads=kv_heads,
        vocab_size=VOCAB,
        max_position_embeddings=4096,
        attn_implementation=attention,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(dtype)
    if adapter:
        lora = LoraConfig(
            r=RANK, target_modules="all-linear", lora_dropout=0.0, use_dora=adapter == "dora"
        )
        model = get_peft_model(model, lora)
    model.train()
    return model


def _kept_bytes(model: Any, ids: Any, autocast: bool) -> int:
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    refs: list[weakref.ref[torch.Tensor]] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        refs.append(weakref.ref(tensor))
        return tensor

    with (
        torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor),
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast),
    ):
        output = model(input_ids=ids)
    gc.collect()
    storages: dict[int, int] = {}
    for ref in refs:
        tensor = ref()
        if tensor is None:
            continue
        storage = tensor.untyped_storage()
        if storage.data_ptr() and storage.data_ptr() not in params:
            storages[storage.data_ptr()] = storage.nbytes()
    del output
    return sum(storages.values())


def main() -> None:
    warnings.filterwarnings("ignore")
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    cases = [
        ("bf16", attention, kv, adapter)
        for attention in ("sdpa", "eager")
        for kv in (4, 2)
        for adapter in (None, "lora", "dora")
    ] + [("amp", "sdpa", 2, None), ("amp", "sdpa", 2, "lora"), ("fp32", "sdpa", 2, None)]
    print(f"{'layout':6} {'attn':6} {'kv':>3} {'method':6} {'traced':>10} {'hwdash':>10} ratio")
    for layout, attention, kv, adapter in cases:
        dtype = torch.bfloat16 if layout == "bf16" else torch.float32
        autocast = layout == "amp" or (layout == "bf16" and adapter is not None)
        sums = [
            _kept_bytes(_build(layers, attention, kv, adapter, dtype), ids, autocast)
            for layers in (2, 4)
        ]
        traced = (sums[1] - sums[0]) // 2
        spec = ModelSpec(
            id="tiny",
            name="tiny",
            layers=2,
            hidden_size=HIDDEN,
            heads=HEADS,
            kv_heads=kv,
            head_dim=HEAD_DIM,
            intermediate_size=INTERMEDIATE,
            vocab_size=VOCAB,
            max_context=4096,
            source="traced configuration",
        )
        arch = architecture(spec)
        estimate = layer_activation_bytes(
            arch,
            BATCH,
            SEQ,
            4 if layout == "fp32" else 2,
            Attention(attention),
            weight_bytes=2 if layout == "bf16" else 4,
            lora_targets=arch.linears if adapter else (),
            lora_rank=RANK if adapter else 0,
            dora=adapter == "dora",
        )
        print(
            f"{layout:6} {attention:6} {kv:3} {adapter or 'full':6} {traced:10d} {estimate:10d}"
            f" {estimate / traced:5.3f}"
        )


if __name__ == "__main__":
    main()
