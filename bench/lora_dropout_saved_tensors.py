"""What autograd keeps for three PEFT LoRA linears reading one input (q, k, v), with and without
dropout, in the dtype setups hwdash counts (issue 24).

Needs torch and peft (the ``calibrate`` extra); real CPU tensors, no GPU, seconds. Every tensor
autograd saves during the forward is recorded by storage (``saved_tensors_hooks``); parameters and
the block's input are left out; bytes are printed per token. Each setup runs with torch's own CPU
dropout (``composite``: ``input * noise``, the noise kept in the input's dtype) and with CUDA's
fused kernel called on CPU (``native``: ``aten.native_dropout``, a bool mask), which is what a GPU
keeps::

    PYTHONPATH=src python bench/lora_dropout_saved_tensors.py

What it showed (hidden 64, bytes per token): with a cast (bf16 under autocast, amp, a bf16 base
under an fp32 adapter) dropout adds the three masks only (3 x 64 bool = 192 with ``native``,
3 x 64 x 4 = 768 with ``composite``); without one (fp32; a bf16 base with bf16 adapters) the one
shared input becomes three dropped copies, 2 x 64 x e more besides the masks.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import torch
from peft import LoraConfig, get_peft_model
from torch import nn

HIDDEN, TOKENS = 64, 128


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.k = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.v = nn.Linear(HIDDEN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q(x) + self.k(x) + self.v(x)


@contextlib.contextmanager
def _native_dropout(enabled: bool) -> Any:
    functional = torch.nn.functional
    original = functional.dropout

    def fused(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        if training and not inplace and 0 < p < 1:
            return torch.ops.aten.native_dropout(input, p, True)[0]
        return original(input, p, training, inplace)

    if enabled:
        functional.dropout = fused
    try:
        yield
    finally:
        functional.dropout = original


def saved(base: torch.dtype, fp32_adapter: bool, autocast: bool, p: float, native: bool) -> tuple:
    """Bytes per token autograd keeps, and the kept tensors (dtype, bytes per token)."""
    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=p, target_modules=["q", "k", "v"])
    model = get_peft_model(_Block().to(base), config, autocast_adapter_dtype=fp32_adapter)
    model.train()
    leaf = torch.randn(TOKENS, HIDDEN, dtype=base, requires_grad=True)
    kept: dict[int, tuple[str, int]] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        kept[storage.data_ptr()] = (str(tensor.dtype).replace("torch.", ""), storage.nbytes())
        return tensor

    cast = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with _native_dropout(native), cast, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(leaf * 1)  # a non-leaf input, as a norm's output is
    skip = {param.untyped_storage().data_ptr() for param in model.parameters()}
    skip.add(leaf.untyped_storage().data_ptr())
    tensors = [value for ptr, value in kept.items() if ptr not in skip]
    big = sorted((dtype, nbytes // TOKENS) for dtype, nbytes in tensors if nbytes >= TOKENS * 8)
    return sum(nbytes for _, nbytes in tensors) // TOKENS, big


SETUPS = (
    ("bf16 base, fp32 adapter, autocast (the Trainer's bf16)", torch.bfloat16, True, True),
    ("fp32 base and adapter, amp autocast", torch.float32, True, True),
    ("bf16 base, fp32 adapter, no autocast", torch.bfloat16, True, False),
    ("fp32 base and adapter (fp32)", torch.float32, True, False),
    ("bf16 base, bf16 adapter (16-bit adapters)", torch.bfloat16, False, False),
)


def main() -> None:
    warnings.filterwarnings("ignore")
    for name, base, fp32_adapter, autocast in SETUPS:
        for native in (False, True):
            without, _ = saved(base, fp32_adapter, autocast, 0.0, native)
            with_dropout, tensors = saved(base, fp32_adapter, autocast, 0.05, native)
            kind = "native" if native else "composite"
            print(
                f"{name:55s} {kind:9s} p=0: {without:5d} B/token, p=0.05: {with_dropout:5d} "
                f"(+{with_dropout - without})"
            )
            if native:
                print(f"    kept with dropout: {tensors}")


if __name__ == "__main__":
    main()
