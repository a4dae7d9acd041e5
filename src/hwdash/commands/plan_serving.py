"""``hwdash plan --method inference --engine vllm|sglang``: the serving plan's flags, its KV pool on
each flavor, its lines in the report and ``--export vllm`` (the server's command line).

The memory model is :mod:`hwdash.core.estimator.serving`. The flags are Plan fields (their entries
in :mod:`hwdash.core.plan_fields`; the Plan checks them, a bad value is a :class:`UsageError`
naming its flag) and :mod:`hwdash.core.planning.serving_plan` reads them; this module puts the
answer beside the plan: JSON ``serving`` for the first ``--flavor``, the flavor table's verdicts (a
serving plan fits a flavor when its KV pool holds one ``--max-model-len`` sequence) and the text
lines.
"""

from __future__ import annotations

from typing import Any

from hwdash.core.estimator.serving import ServingMemory, ServingSettings
from hwdash.core.plan import Plan, Quant
from hwdash.core.planning import serving_command, serving_plan
from hwdash.core.results import PlanReport


def serving_settings(plan: Plan, model: Any = None) -> ServingSettings | None:
    """The serving settings of the plan's fields (None: ``--engine hf``); the Plan checked them
    (a bad value is refused naming its flag), :mod:`hwdash.core.planning.serving_plan` reads them;
    with ``model`` (the plan's ModelSpec) a request's length counts its images' tokens."""
    return serving_plan.serving_settings(plan, model)


def serving_on_flavors(
    report: PlanReport, settings: ServingSettings, catalog: Any
) -> tuple[PlanReport, dict[str, ServingMemory]]:
    """The report with the flavors' serving verdicts, and each GPU flavor's memory
    (:func:`hwdash.core.planning.serving_plan.serving_on_flavors`)."""
    return serving_plan.serving_on_flavors(report, settings, catalog)


def serving_lines(memory: ServingMemory, flavor_id: str) -> list[str]:
    """The text report's serving lines for one flavor, in the engine's own terms."""
    gib = 2**30
    s, e = memory.settings, memory.engine
    profile = (
        f"profile run's activation peak ({memory.profile_tokens:,} tokens)"
        if memory.profile_tokens
        else "no profile run (activations in the share left out)"
    )
    fraction = memory.fraction
    lines = [
        f"Serving ({e.name}, TP {s.tp}) on {flavor_id}, per GPU:",
        f"  budget {fraction:g} x {memory.total_bytes / gib:.2f} GiB = "
        f"{memory.budget_bytes / gib:.2f} GiB",
        f"  - weights {memory.weight_bytes / gib:.2f} GiB, {profile} "
        f"{memory.activation_bytes / gib:.2f} GiB, non-torch {memory.non_torch_bytes / gib:.2f} GiB",
        f"  = KV cache {memory.kv_cache_bytes / gib:.2f} GiB: {memory.kv_blocks:,} blocks of "
        f"{memory.block_tokens} = {memory.kv_tokens:,} tokens "
        f"({memory.kv_bytes_per_token:,} bytes per token)",
        *memory.group_lines(),
        f"  Maximum concurrency for {s.max_model_len:,} tokens per request: "
        f"{memory.max_concurrency:.2f}x",
    ]
    lines += _image_lines(memory)
    if memory.cuda_graph_bytes:
        lines.append(
            f"  (CUDA graphs: about {memory.cuda_graph_bytes / gib:.2f} GiB more, outside the budget)"
        )
    if memory.context_bytes:
        lines.append(
            f"  (CUDA context: {memory.context_bytes / gib:.2f} GiB more, outside the budget: "
            "it exists before the engine's baseline snapshot)"
        )
    lines += _tp_buffer_lines(memory)
    if not memory.fits:
        lines.append(
            f"  does not fit: the engine refuses to start (one {s.max_model_len:,}-token sequence "
            "needs more cache): lower --max-model-len or raise --gpu-memory-utilization"
        )
    return lines


def _tp_buffer_lines(memory: ServingMemory) -> list[str]:
    """The line on a TP rank's communicator buffers and whether the engine counts them
    (:func:`~hwdash.core.estimator.serving.tp_buffer_bytes`); none on one GPU."""
    if not memory.tp_buffer_bytes:
        return []
    where = {
        "in-budget": "counted in non-torch",
        "outside": "outside the budget",
        "fraction": f"the pool loses {memory.fraction:g} x of them",
    }[memory.engine.tp_buffers]
    size = memory.tp_buffer_bytes / 2**20
    return [f"  (TP communicator buffers: {size:.0f} MiB per GPU, {where})"]


def server_command(memory: ServingMemory, model_id: str, quant: Quant) -> str:
    """The ``vllm serve`` (or SGLang ``launch_server``) line with the plan's settings
    (:func:`hwdash.core.planning.serving_command.server_command`, which the planner's export
    writes too)."""
    return serving_command.server_command(memory, model_id, quant)


def serving_max_concurrency(report: PlanReport, target: str, memory: ServingMemory) -> Any:
    """``--max concurrency`` for a serving plan: the engine's
    (:func:`hwdash.core.planning.serving_plan.max_concurrency`)."""
    return serving_plan.max_concurrency(report, target, memory)


# --- images in serving plans (--images N --image-tokens T; core/estimator/serving_images.py) ---


def _image_lines(memory: ServingMemory) -> list[str]:
    """The serving report's lines about images (none for a text-only plan)."""
    images, encoder = getattr(memory, "images", None), getattr(memory, "encoder", None)
    if images is None:
        return []
    gib = 2**30
    lines = [
        f"  images: {images.images} per request x {images.tokens_per_image:,} tokens, counted "
        f"in its {memory.settings.max_model_len:,}-token length; the vision tower's weights "
        "are in the weights"
    ]
    if encoder is None:
        lines.append(f"  ({memory.engine.name} has no multimodal profile run modelled)")
        return lines
    lines.append(
        f"  encoder cache budget {encoder.budget_tokens:,} tokens, profiled with "
        f"{encoder.items} image item(s): encoder {encoder.working_bytes / gib:.2f} GiB, "
        f"its outputs {encoder.cache_bytes / gib:.2f} GiB (in the activation peak)"
    )
    return lines
