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


def server_command(memory: ServingMemory, model_id: str, quant: Quant) -> str:
    """The ``vllm serve`` (or SGLang ``launch_server``) line with the plan's settings."""
    s = memory.settings
    fraction = memory.fraction
    if s.engine == Engine.SGLANG.value:
        words = ["python", "-m", "sglang.launch_server", "--model-path", model_id]
        words += ["--tp", str(s.tp), "--mem-fraction-static", f"{fraction:g}"]
        words += ["--context-length", str(s.max_model_len)]
        if s.max_num_seqs is not None:
            words += ["--max-running-requests", str(s.max_num_seqs)]
        if s.max_num_batched_tokens is not None:
            words += ["--chunked-prefill-size", str(s.max_num_batched_tokens)]
        if s.kv_dtype is KvDtype.FP8:
            words += ["--kv-cache-dtype", "fp8_e5m2"]
    else:
        words = ["vllm", "serve", model_id, "--tensor-parallel-size", str(s.tp)]
        words += [
            "--gpu-memory-utilization",
            f"{fraction:g}",
            "--max-model-len",
            str(s.max_model_len),
        ]
        if s.max_num_seqs is not None:
            words += ["--max-num-seqs", str(s.max_num_seqs)]
        if s.max_num_batched_tokens is not None:
            words += ["--max-num-batched-tokens", str(s.max_num_batched_tokens)]
        if s.kv_dtype is KvDtype.FP8:
            words += ["--kv-cache-dtype", "fp8"]
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
