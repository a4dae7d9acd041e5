"""The serving choices of an inference plan (``--engine``, ``--engine-version``, ``--kv-dtype``).

Their own module so :mod:`hwdash.core.plan` stays within its size; :mod:`hwdash.core.plan`
re-exports them, and callers import them from there.
"""

from __future__ import annotations

from enum import Enum


class Engine(str, Enum):
    """What serves an inference plan (``--engine``; :mod:`hwdash.core.estimator.serving`)."""

    HF = "hf"
    """transformers' ``generate``: one call with one KV cache (the plan as before)."""
    VLLM = "vllm"
    """vLLM: paged KV blocks in what ``--gpu-memory-utilization`` leaves."""
    SGLANG = "sglang"
    """SGLang: a token pool in what ``mem_fraction_static`` leaves."""


class EngineVersion(str, Enum):
    """vLLM's engine (``--engine-version``): where the profile run's size changed."""

    V1 = "v1"
    """vLLM 0.8 on: profiles ``max_num_batched_tokens`` (chunked prefill)."""
    V0 = "v0"
    """The older engine: profiles the whole ``max_model_len``."""


class KvDtype(str, Enum):
    """The KV cache's element type (``--kv-dtype``): auto keeps the model's dtype."""

    AUTO = "auto"
    FP8 = "fp8"
    INT8 = "int8"
