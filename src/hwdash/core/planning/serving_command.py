"""A serving plan's server command line: ``vllm serve`` (or SGLang's ``python -m
sglang.launch_server``) with the plan's settings, what ``hwdash plan --export vllm`` and the
planner's export (``e``) write, and reading such a line back (``hwdash plan --from FILE``).

The flags are the engines' own: vLLM's ``vllm/engine/arg_utils.py`` (``EngineArgs``:
``--tensor-parallel-size``/``-tp``, ``--gpu-memory-utilization``, ``--max-model-len``,
``--max-num-seqs``, ``--max-num-batched-tokens``, ``--kv-cache-dtype``, ``--quantization``,
``--limit-mm-per-prompt``) and
SGLang's ``python/sglang/srt/server_args.py`` (``--model-path``, ``--tp-size``/``--tp``,
``--mem-fraction-static``, ``--context-length``, ``--max-running-requests``,
``--chunked-prefill-size``, ``--kv-cache-dtype``, ``--quantization``).
"""

from __future__ import annotations

import json
import shlex

from hwdash.core.estimator.serving import ServingMemory
from hwdash.core.plan import Engine, KvDtype, Quant
from hwdash.errors import UsageError

#: ``--quantization`` of a quantized checkpoint (vLLM's and SGLang's method names).
VLLM_QUANTIZATION = {Quant.GPTQ_4: "gptq", Quant.AWQ_4: "awq", Quant.NF4: "bitsandbytes"}


#: The flags each engine's line is written with, in this order: (the value's name, the flag).
_WRITTEN_FLAGS = {
    Engine.SGLANG.value: (
        ("tp", "--tp"),
        ("fraction", "--mem-fraction-static"),
        ("max_model_len", "--context-length"),
        ("max_num_seqs", "--max-running-requests"),
        ("max_num_batched_tokens", "--chunked-prefill-size"),
    ),
    "vllm": (
        ("tp", "--tensor-parallel-size"),
        ("fraction", "--gpu-memory-utilization"),
        ("max_model_len", "--max-model-len"),
        ("max_num_seqs", "--max-num-seqs"),
        ("max_num_batched_tokens", "--max-num-batched-tokens"),
    ),
}
#: ``--kv-cache-dtype`` for an fp8 KV cache, by engine.
_FP8_KV_CACHE = {Engine.SGLANG.value: "fp8_e5m2", "vllm": "fp8"}


def server_command(memory: ServingMemory, model_id: str, quant: Quant) -> str:
    """The ``vllm serve`` (or SGLang ``launch_server``) line with the plan's settings."""
    s = memory.settings
    sglang = s.engine == Engine.SGLANG.value
    engine = Engine.SGLANG.value if sglang else "vllm"
    values = {
        "tp": s.tp,
        "fraction": f"{memory.fraction:g}",
        "max_model_len": s.max_model_len,
        "max_num_seqs": s.max_num_seqs,
        "max_num_batched_tokens": s.max_num_batched_tokens,
    }
    if sglang:
        words = ["python", "-m", "sglang.launch_server", "--model-path", model_id]
    else:
        words = ["vllm", "serve", model_id]
    for name, flag in _WRITTEN_FLAGS[engine]:
        if values[name] is not None:
            words += [flag, str(values[name])]
    if s.kv_dtype is KvDtype.FP8:
        words += ["--kv-cache-dtype", _FP8_KV_CACHE[engine]]
    if not sglang:
        if quant in VLLM_QUANTIZATION:
            words += ["--quantization", VLLM_QUANTIZATION[quant]]
        words += _image_limit(memory)
    if s.kv_dtype is KvDtype.INT8:
        raise UsageError(
            "neither vllm serve nor SGLang takes an int8 KV cache: use --kv-dtype fp8 or auto",
            flag="--kv-dtype",
        )
    return shlex.join(words) + "\n"


def _image_limit(memory: ServingMemory) -> list[str]:
    """``vllm serve``'s ``--limit-mm-per-prompt`` for a plan with images."""
    images = getattr(memory, "images", None)
    if images is None:
        return []
    return ["--limit-mm-per-prompt", json.dumps({"image": images.images})]
