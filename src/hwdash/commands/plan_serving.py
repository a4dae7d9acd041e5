"""``hwdash plan --method inference --engine vllm|sglang``: the serving plan's flags, its KV pool on
each flavor, its lines in the report and ``--export vllm`` (the server's command line).

The memory model is :mod:`hwdash.core.estimator.serving`; this module reads the flags, checks them
(a bad value is a :class:`UsageError` naming its flag) and puts the answer beside the plan: JSON
``serving`` for the first ``--flavor``, the flavor table's verdicts (a serving plan fits a flavor
when its KV pool holds one ``--max-model-len`` sequence) and the text lines.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
from typing import Any

from hwdash.core.estimator.serving import (
    Engine,
    KvDtype,
    ServingMemory,
    ServingSettings,
    serving_memory,
)
from hwdash.core.plan import Method, Plan, Precision, Quant
from hwdash.core.results import FitVerdict, PlanReport
from hwdash.errors import UsageError

#: The flags a serving engine reads; with ``--engine hf`` they are refused.
_ENGINE_FLAGS = (
    ("gpu_memory_utilization", "--gpu-memory-utilization"),
    ("max_model_len", "--max-model-len"),
    ("max_num_seqs", "--max-num-seqs"),
)
#: Bits per weight of a ``--quant`` load (None: as the checkpoint stores it).
_QUANT_BITS = {Quant.NF4: 4, Quant.GPTQ_4: 4, Quant.AWQ_4: 4, Quant.INT8: 8}
#: ``--export vllm``'s ``--quantization`` for a quantized checkpoint.
_VLLM_QUANTIZATION = {Quant.GPTQ_4: "gptq", Quant.AWQ_4: "awq", Quant.NF4: "bitsandbytes"}


def add_serving_flags(parser: argparse.ArgumentParser, whole: Any, number: Any) -> None:
    """The ``serving`` flag group (``whole``/``number``: the plan command's argparse types)."""
    group = parser.add_argument_group("serving (--method inference)")
    group.add_argument(
        "--engine",
        choices=[engine.value for engine in Engine],
        default=Engine.HF.value,
        help="hf: one transformers generate call (default); vllm or sglang: the server's memory "
        "as the engine allocates it, its KV blocks and maximum concurrency on --flavor",
    )
    group.add_argument(
        "--engine-version",
        choices=["v1", "v0"],
        default="v1",
        help="vLLM's engine: v1 (0.8 on: profiles --max-num-batched-tokens) or v0 (profiles "
        "the whole --max-model-len; default v1)",
    )
    group.add_argument(
        "--gpu-memory-utilization",
        type=number,
        metavar="F",
        help="share of the GPU's memory the engine may use, 0-1 (vLLM's default 0.9; SGLang's "
        "mem_fraction_static, about 0.88)",
    )
    group.add_argument(
        "--max-model-len",
        type=whole,
        metavar="N",
        help="longest sequence (prompt + output) the server accepts (default --seq)",
    )
    group.add_argument(
        "--max-num-seqs", type=whole, metavar="N", help="sequences at once (vLLM's default 256)"
    )
    group.add_argument(
        "--kv-dtype",
        choices=[dtype.value for dtype in KvDtype],
        default=KvDtype.AUTO.value,
        help="KV cache element type: auto (the model's), fp8 or int8 (one byte)",
    )


def serving_settings(
    args: argparse.Namespace, plan: Plan, model: Any = None
) -> ServingSettings | None:
    """The serving settings the flags ask for (None: ``--engine hf``), checked; with ``model``
    (the plan's ModelSpec) a request's length counts its images' tokens."""
    engine = Engine(getattr(args, "engine", None) or Engine.HF.value)
    given = [flag for name, flag in _ENGINE_FLAGS if getattr(args, name, None) is not None]
    if getattr(args, "kv_dtype", "auto") != KvDtype.AUTO.value:
        given.append("--kv-dtype")
    if engine is Engine.HF:
        if given:
            raise UsageError("needs --engine vllm or sglang (a serving plan)", flag=given[0])
        return None
    if plan.method is not Method.INFERENCE:
        raise UsageError(
            f"a serving engine runs inference, not {plan.method.value}: add --method inference",
            flag="--engine",
        )
    fraction = getattr(args, "gpu_memory_utilization", None)
    if fraction is not None and not 0 < fraction <= 1:
        raise UsageError(
            f"{fraction:g} is not a share of the GPU: give a number above 0 and at most 1",
            flag="--gpu-memory-utilization",
        )
    engine_id = engine.value
    if engine is Engine.VLLM and getattr(args, "engine_version", "v1") == "v0":
        engine_id = "vllm-v0"
    return ServingSettings(
        engine=engine_id,
        max_model_len=_request_length(args, plan, model),
        gpu_memory_utilization=fraction,
        max_num_seqs=getattr(args, "max_num_seqs", None),
        kv_dtype=KvDtype(getattr(args, "kv_dtype", "auto")),
        tp=plan.gpus,
        quant_bits=_QUANT_BITS.get(plan.quant),
    )


def _memory_on(
    report: PlanReport, settings: ServingSettings, accelerator: Any, catalog: Any
) -> ServingMemory:
    from hwdash.core.estimator.architecture import architecture
    from hwdash.core.estimator.serving_images import request_images, with_images

    element = 4 if report.plan.precision is Precision.FP32 else 2
    memory = serving_memory(
        architecture(report.model),
        accelerator,
        settings,
        element_bytes=element,
        software=catalog.software,
        engines=catalog.engines or None,
    )
    return with_images(memory, request_images(report.plan, report.model), element)


# --- images in serving plans (--images N --image-tokens T; core/estimator/serving_images.py) ---


def _request_length(args: argparse.Namespace, plan: Plan, model: Any) -> int:
    """``--max-model-len``, else ``--seq`` plus the images' tokens of a request."""
    from hwdash.core.estimator.serving_images import request_images, request_tokens

    images = request_images(plan, model) if model is not None else None
    return request_tokens(plan, images, getattr(args, "max_model_len", None))


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


def _image_limit(memory: ServingMemory) -> list[str]:
    """``vllm serve``'s ``--limit-mm-per-prompt`` for a plan with images."""
    images = getattr(memory, "images", None)
    if images is None:
        return []
    return ["--limit-mm-per-prompt", json.dumps({"image": images.images})]


# --- end of images ---


def serving_on_flavors(
    report: PlanReport, settings: ServingSettings, catalog: Any
) -> tuple[PlanReport, dict[str, ServingMemory]]:
    """The report with each GPU flavor's verdict a serving plan's (fits when the pool holds one
    ``max_model_len`` sequence on the flavor's GPUs, split ``tp`` ways), and each one's memory."""
    memories: dict[str, ServingMemory] = {}
    fits = []
    for fit in report.flavors:
        accelerator = fit.accelerator
        if accelerator is None or accelerator.kind != "gpu" or fit.flavor.gpu_count < settings.tp:
            fits.append(fit)
            continue
        memory = _memory_on(report, settings, accelerator, catalog)
        memories[fit.flavor.id] = memory
        verdict = FitVerdict.FITS if memory.fits else FitVerdict.NO
        reason = (
            f"serving: {memory.max_concurrency:.2f}x {settings.max_model_len:,}-token sequences"
            if memory.fits
            else f"KV pool holds {memory.kv_tokens:,} tokens, under one --max-model-len "
            f"{settings.max_model_len:,} sequence"
        )
        fits.append(dataclasses.replace(fit, verdict=verdict, reason=reason))
    fitting = [fit.flavor.id for fit in fits if fit.verdict is FitVerdict.FITS]
    # the table is cheapest first: the recommendation is the first flavor that still fits
    recommended = fitting[0] if fitting else None
    fastest = report.fastest if report.fastest in fitting else None
    changed = dataclasses.replace(
        report, flavors=tuple(fits), recommended=recommended, fastest=fastest
    )
    return changed, memories


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
    if not memory.fits:
        lines.append(
            f"  does not fit: the engine refuses to start (one {s.max_model_len:,}-token sequence "
            "needs more cache): lower --max-model-len or raise --gpu-memory-utilization"
        )
    return lines


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
        if s.kv_dtype is KvDtype.FP8:
            words += ["--kv-cache-dtype", "fp8"]
        if quant in _VLLM_QUANTIZATION:
            words += ["--quantization", _VLLM_QUANTIZATION[quant]]
        words += _image_limit(memory)
    if s.kv_dtype is KvDtype.INT8:
        raise UsageError(
            "neither vllm serve nor SGLang takes an int8 KV cache: use --kv-dtype fp8 or auto",
            flag="--kv-dtype",
        )
    return shlex.join(words) + "\n"


def serving_max_concurrency(report: PlanReport, target: str, memory: ServingMemory) -> Any:
    """``--max concurrency`` for a serving plan: the whole ``--max-model-len`` sequences the KV
    pool holds at once on ``target`` (vLLM's "Maximum concurrency", rounded down), with the pool's
    leftover as the headroom."""
    from hwdash.core.planning.max_fit import MaxField, MaxFit

    fit = next(fit for fit in report.flavors if fit.flavor.id == target)
    length = memory.settings.max_model_len
    value = memory.whole_requests
    leftover = memory.kv_cache_bytes - value * memory.request_bytes
    # the flavor's fit at the answer, its headroom the pool's leftover (one GPU's bytes)
    at_answer = dataclasses.replace(fit, need_bytes=fit.usable_bytes - leftover)
    return MaxFit(
        field=MaxField.CONCURRENCY,
        target=target,
        value=value or None,
        fit=at_answer,
        plan_seq=length,
        accelerator_name=fit.accelerator.name if fit.accelerator is not None else "",
        flavor_gpus=fit.flavor.gpu_count,
    )
