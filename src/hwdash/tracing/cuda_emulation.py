"""CUDA emulated on a CPU trace: the allocator's block rounding, the fused dropout kernel, and which
SDPA kernel CUDA would take (torch imported inside the functions only)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

from hwdash.tracing.settings import TraceSettings

#: The CUDA caching allocator rounds every block up to 512 bytes (``kMinBlockSize`` in
#: c10/cuda/CUDACachingAllocator.cpp). MemTracker applies it to ``cuda`` tensors itself; on the CPU
#: path we apply it too, so a CPU trace counts what CUDA's ``max_memory_allocated`` would.
CUDA_MIN_BLOCK_BYTES = 512


@contextlib.contextmanager
def _cuda_block_rounding() -> Iterator[None]:
    """Make MemTracker round every storage to 512 bytes, as it already does for cuda tensors."""
    from torch.distributed._tools import mem_tracker

    info_class = mem_tracker._WeakRefInfo
    original = info_class._calculate_mem_consumed

    def rounded(self: Any) -> int:
        raw_bytes = int(self.size) * int(self.element_size)
        return math.ceil(raw_bytes / CUDA_MIN_BLOCK_BYTES) * CUDA_MIN_BLOCK_BYTES

    info_class._calculate_mem_consumed = rounded
    try:
        yield
    finally:
        info_class._calculate_mem_consumed = original


@contextlib.contextmanager
def _cuda_fused_dropout(keep_sdpa_dropout: bool = False) -> Iterator[None]:
    """Run ``torch.nn.functional.dropout`` (what ``nn.Dropout`` calls) as CUDA runs it.

    torch's ``dropout`` (``aten/src/ATen/native/Dropout.cpp``) takes the fused ``native_dropout``
    only where ``is_fused_kernel_acceptable`` holds (CUDA, XPU, lazy and private-use devices);
    elsewhere, CPU included, a composite ``input * noise`` whose multiply keeps the noise, a mask in
    the input's dtype (4 bytes per element inside PEFT's fp32 adapters). ``native_dropout`` keeps a
    bool mask and nothing else (``NativeDropoutBackward0`` saves ``result1``, the mask). Calling
    it on CPU fake tensors keeps what a GPU keeps; p = 0, eval mode and in-place dropout go to
    torch's own function, which returns the input (or takes the composite path) as before.
    """
    import torch

    functional = torch.nn.functional
    original = functional.dropout

    def fused(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        if training and not inplace and 0 < p < 1 and input.numel() > 0:
            return torch.ops.aten.native_dropout(input, p, True)[0]
        return original(input, p, training, inplace)

    original_sdpa = functional.scaled_dot_product_attention

    def in_kernel(*args: Any, **kwargs: Any) -> Any:
        # (query, key, value, attn_mask=None, dropout_p=0.0, ...): CPU's flash kernel refuses
        # dropout (sdp_utils_cpp.cpp) and falls to the math kernel, which keeps the s^2
        # probabilities and a mask; CUDA's flash and memory-efficient kernels take dropout_p and
        # regenerate the mask in backward from the RNG state (their saved tensors are the output
        # and log-sum-exp, with or without dropout). At p 0 the CPU trace takes the same kind of
        # kernel. A math kernel forced for the trace (sdpa_math) is left alone.
        if len(args) > 4 and args[4]:
            args = (*args[:4], 0.0, *args[5:])
        elif kwargs.get("dropout_p"):
            kwargs["dropout_p"] = 0.0
        return original_sdpa(*args, **kwargs)

    functional.dropout = fused
    if not keep_sdpa_dropout:
        functional.scaled_dot_product_attention = in_kernel
    try:
        yield
    finally:
        functional.dropout = original
        functional.scaled_dot_product_attention = original_sdpa


def _cpu_needs_math_sdpa(settings: TraceSettings, config: Any) -> bool:
    """fp32 SDPA on a GQA model: CUDA takes the math kernel, CPU a flash-style one.

    On CUDA, flash attention takes fp16/bf16 only, and fp32 grouped-query inputs (transformers
    passes ``enable_gqa``) fall to the O(s^2) math path; on CPU, SDPA's flash kernel takes fp32 too
    (docs/accuracy.md, finding 4). Forcing the math kernel makes a CPU trace keep what CUDA keeps.
    """
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    kv_heads = int(getattr(config, "num_key_value_heads", heads) or heads)
    return (
        settings.attention == "sdpa"
        and settings.weight_dtype == "float32"
        and not settings.autocast
        and settings.method != "inference"
        and kv_heads < heads
    )
