"""The serving plan's entries of the plan field registry (:mod:`hwdash.core.plan_fields`, issue 30):
``--engine`` and the settings a vLLM or SGLang server reads, in the ``--help`` section ``serving
(--method inference)``. Their form rows show only for inference (``--engine``) and for a serving
plan (the rest: the planner pane's ``-serving`` class).
"""

from __future__ import annotations

from hwdash.core.plan import Engine, EngineVersion, KvDtype
from hwdash.core.plan_field_types import FormRow, PlanField, _values

SERVING = "serving (--method inference)"
#: The serving rows: an inference plan with ``--engine vllm|sglang`` (the pane's ``-serving``).
_SERVING_ROW = "-serving-only"

#: The serving fields' entries, in ``--help`` order.
SERVING_PLAN_FIELDS: tuple[PlanField, ...] = (
    PlanField(
        "engine", "--engine", SERVING,
        "hf: one transformers generate call (default); vllm or sglang: the server's memory "
        "as the engine allocates it, its KV blocks and maximum concurrency on --flavor",
        choices=_values(Engine), form=FormRow("engine", "select", "-inference-only"),
    ),
    PlanField(
        "engine_version", "--engine-version", SERVING,
        "vLLM's engine: v1 (0.8 on: profiles --max-num-batched-tokens) or v0 (profiles "
        "the whole --max-model-len; default v1)",
        choices=_values(EngineVersion),
    ),
    PlanField(
        "gpu_memory_utilization", "--gpu-memory-utilization", SERVING,
        "share of the GPU's memory the engine may use, 0-1 (vLLM's default 0.9; SGLang's "
        "mem_fraction_static, about 0.88)",
        parse="number", metavar="F",
        form=FormRow("mem. util.", "number", _SERVING_ROW, placeholder="engine default"),
    ),
    PlanField(
        "max_model_len", "--max-model-len", SERVING,
        "longest sequence (prompt + output) the server accepts (default --seq)",
        parse="whole", metavar="N",
        form=FormRow("max len", "integer", _SERVING_ROW, placeholder="seq length"),
    ),
    PlanField(
        "max_num_seqs", "--max-num-seqs", SERVING,
        "sequences at once (vLLM's default 256; 1024 on a GPU of 70 GiB or more, not an A100)",
        parse="whole", metavar="N",
        form=FormRow("max seqs", "integer", _SERVING_ROW, placeholder="engine default"),
    ),
    PlanField(
        "max_num_batched_tokens", "--max-num-batched-tokens", SERVING,
        "tokens the scheduler runs in one step (chunked prefill): vLLM V1's profile run and a "
        "sliding-window layer's blocks (vLLM's default 2048; 8192 on a GPU of 70 GiB or more, "
        "not an A100; SGLang's --chunked-prefill-size)",
        parse="whole", metavar="N",
        form=FormRow("max batched", "integer", _SERVING_ROW, placeholder="engine default"),
    ),
    PlanField(
        "kv_dtype", "--kv-dtype", SERVING,
        "KV cache element type: auto (the model's), fp8 or int8 (one byte)",
        choices=_values(KvDtype), form=FormRow("KV dtype", "select", _SERVING_ROW),
    ),
)  # fmt: skip
