"""The tracer: :func:`trace_plan` decides the config, depths, device and kernels of a plan's trace,
runs the step at each depth (:mod:`hwdash.tracing.step`) and gathers the result."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from hwdash.core.plan import Method, Plan
from hwdash.core.specs import ModelSpec
from hwdash.tracing.cuda_emulation import _cpu_needs_math_sdpa
from hwdash.tracing.depths import _line_int, extrapolate_phases, layer_period, trace_depths
from hwdash.tracing.model_config import (
    _build_config,
    _supports_sdpa,
    build_hf_config_dict,
    local_config_dict,
)
from hwdash.tracing.results import TracePhase, TraceResult, TraceUnavailable
from hwdash.tracing.settings import TraceSettings, trace_settings, traced_plan
from hwdash.tracing.step import (
    _NO_HOOKS,
    MLM_MASKED_EVERY,
    TraceHooks,
    _DepthTrace,
    _RunOptions,
    _trace_at_depth,
)

_TRACE_LOCK = threading.Lock()


def check_trace_dependencies(plan: Plan) -> dict[str, str]:
    """Import what a trace of ``plan`` needs; raise :class:`TraceUnavailable` naming what is missing.

    Returns the versions found.
    """
    wanted = ["torch", "transformers"]
    if plan.method in (Method.LORA, Method.DORA):
        wanted.append("peft")
    versions: dict[str, str] = {}
    missing: list[str] = []
    for name in wanted:
        try:
            module = __import__(name)
        except ImportError:
            missing.append(name)
        else:
            versions[name] = str(getattr(module, "__version__", "?"))
    if missing:
        raise TraceUnavailable(
            f"needs {' and '.join(missing)}, not installed for this Python "
            f"(pip install {' '.join(missing)}); the estimate itself does not need them"
        )
    return versions


def trace_plan(
    plan: Plan,
    model: ModelSpec,
    *,
    device: str | None = None,
    full_depth: bool = False,
    sdpa_math: bool | None = None,
    hf_config: dict[str, Any] | None = None,
    hooks: TraceHooks | None = None,
    cuda_dropout: bool = True,
) -> TraceResult:
    """Run ``plan``'s step for ``model`` on fake tensors and return its traced peak memory.

    ``device`` is ``cuda`` or ``cpu``; None takes ``cuda`` when torch has a usable CUDA device, else
    ``cpu`` (fake tensors allocate nothing either way). Training runs two steps (forward, backward,
    optimizer step, zero_grad), because Adam creates its states in the first; the result is the
    maximum over both. Deep stacks are traced at two small depths and extrapolated unless
    ``full_depth``. ``sdpa_math`` forces (True) or forbids (False) SDPA's math kernel; None forces
    it where CUDA would take it and a CPU trace would not (fp32 on a grouped-query model).
    ``hf_config`` (transformers config fields, ``model_type`` included) builds the model instead of
    the catalog's dimensions or the plan's own config.json; ``hooks`` run the caller's extras inside
    the trace (:class:`TraceHooks`). The calibration harness uses both. ``cuda_dropout`` (on a CPU
    trace) runs every dropout through CUDA's fused kernel, whose mask is bool, as a GPU would
    (:func:`_cuda_fused_dropout`); False keeps CPU's own dropout (the calibration CSV's rows, which
    ``bench/estimator_errors.py`` converts).

    Raises :class:`TraceUnavailable` when a package is missing, the setting cannot be traced, or
    the trace itself fails.
    """
    settings = trace_settings(traced_plan(plan, model))
    if settings.lora_dropout != plan.lora_dropout and plan.method in (Method.LORA, Method.DORA):
        settings = replace(
            settings,
            notes=(
                *settings.notes,
                f"LoRA dropout {plan.lora_dropout:g} traced as 0: PEFT refuses dropout on fused "
                "expert weights (lora.ParamWrapper); compared with the estimate at dropout 0",
            ),
        )
    versions = check_trace_dependencies(plan)
    started = time.perf_counter()
    with _TRACE_LOCK:
        try:
            requested = _RequestedOptions(
                device, full_depth, sdpa_math, hf_config, hooks or _NO_HOOKS, cuda_dropout
            )
            return _trace(plan, model, settings, versions, requested, started)
        except TraceUnavailable:
            raise
        except Exception as exc:  # a library failing under fake tensors: one line, not a traceback
            first_line = (str(exc).strip().splitlines() or [""])[0][:300]
            raise TraceUnavailable(
                f"the fake-tensor trace failed ({type(exc).__name__}: {first_line})"
            ) from exc


def _pick_device(requested: str | None) -> str:
    import torch

    has_cuda = bool(torch.cuda.is_available())
    if requested is None:
        return "cuda" if has_cuda else "cpu"
    if requested not in ("cuda", "cpu"):
        raise TraceUnavailable(f"device must be cuda or cpu, not {requested!r}")
    if requested == "cuda" and not has_cuda:
        raise TraceUnavailable("device cuda asked for, but this torch has no usable CUDA device")
    return requested


@dataclass(frozen=True)
class _RequestedOptions:
    """The keyword arguments of :func:`trace_plan` that are not plan fields."""

    device: str | None
    full_depth: bool
    sdpa_math: bool | None
    hf_config: dict[str, Any] | None = None
    hooks: TraceHooks = _NO_HOOKS
    cuda_dropout: bool = True


def _trace(
    plan: Plan,
    model: ModelSpec,
    settings: TraceSettings,
    versions: dict[str, str],
    requested: _RequestedOptions,
    started: float,
) -> TraceResult:
    """Trace ``plan`` at the depths it needs and gather the result (the lock is held)."""
    import warnings

    device = _pick_device(requested.device)
    notes = list(settings.notes)
    base_fields, layers = _base_config_fields(plan, model, settings, requested, notes)
    with warnings.catch_warnings(), _quiet_transformers():
        warnings.simplefilter("ignore")
        full_config = _build_config(base_fields, settings, layers)
        settings = _attention_transformers_runs(settings, full_config, model, base_fields, notes)
        layer_types = getattr(full_config, "layer_types", None)
        depths = _depths_to_trace(base_fields, layers, layer_types, requested.full_depth)
        options = _run_options(requested, settings, full_config, base_fields, model, device, notes)
        traces = []
        for depth in depths:
            fields = dict(base_fields, num_hidden_layers=depth)
            if layer_types:
                fields["layer_types"] = list(layer_types)[:depth]
            config = _build_config(fields, settings, depth)
            traces.append(_trace_at_depth(config, settings, options, depth))
    phases, total_params, trainable = _at_full_depth(traces, layers, notes)
    if device == "cpu":
        notes.append(
            "CPU fake tensors: every storage rounded to 512 bytes as CUDA's allocator does; CPU "
            "autocast and kernel choices can differ slightly from CUDA's"
        )
    peak = max(phases, key=lambda p: p.total)
    return TraceResult(
        peak_bytes=peak.total,
        components=dict(peak.components),
        peak_step=peak.step,
        peak_phase=peak.phase,
        phases=tuple(phases),
        device=device,
        layers=layers,
        traced_layers=tuple(depths),
        total_params=total_params,
        trainable_params=trainable,
        seconds=time.perf_counter() - started,
        notes=tuple(notes),
        versions=versions,
    )


def _base_config_fields(
    plan: Plan,
    model: ModelSpec,
    settings: TraceSettings,
    requested: _RequestedOptions,
    notes: list[str],
) -> tuple[dict[str, Any], int]:
    """The transformers config fields the model is built from (the caller's, the plan's own
    config.json, or the model's), and the depth they stand for."""
    local = local_config_dict(plan)
    if requested.hf_config is not None:
        notes.append("model built from the caller's transformers config")
        base_fields = dict(requested.hf_config)
    elif local is not None:
        notes.append("model built from the plan's own config.json")
        base_fields = local
    else:
        base_fields = build_hf_config_dict(model)
        what = "the model's config" if model.hf_config is not None else "the catalog's dimensions"
        notes.append(f"model built from {what} as a {base_fields['model_type']}")
    layers = int(base_fields.get("num_hidden_layers") or model.layers)
    if model.encoder_only and model.encoder_head == "classification":
        base_fields["num_labels"] = model.num_labels
        # one class index per sequence, as the Trainer passes them (DeBERTa's loss otherwise
        # picks the labelled rows with a data-dependent nonzero(), which fake tensors cannot run)
        base_fields["problem_type"] = "single_label_classification"
    # Room for the traced sequence: RoPE models have no position table, but some configs check.
    base_fields["max_position_embeddings"] = max(
        int(base_fields.get("max_position_embeddings") or 0), settings.seq
    )
    return base_fields, layers


def _attention_transformers_runs(
    settings: TraceSettings,
    full_config: Any,
    model: ModelSpec,
    base_fields: dict[str, Any],
    notes: list[str],
) -> TraceSettings:
    """``settings`` with eager attention where transformers refuses SDPA for the architecture."""
    if settings.attention == "sdpa" and not _supports_sdpa(full_config, model):
        # transformers refuses SDPA for some architectures (Gemma 2's soft-capped attention)
        # and runs them with eager attention, which is what a real run gets.
        settings = replace(settings, attention="eager")
        full_config._attn_implementation = "eager"
        notes.append(
            f"{base_fields['model_type']} has no SDPA attention in transformers: traced with "
            "eager (what transformers runs for it)"
        )
    return settings


def _depths_to_trace(
    base_fields: dict[str, Any], layers: int, layer_types: Any, full_depth: bool
) -> tuple[int, ...]:
    """The full depth, or two small depths that hold whole repeats of the layer pattern and all of
    DeepSeek's leading dense blocks."""
    period = layer_period(list(layer_types) if layer_types else None)
    step = base_fields.get("interleave_moe_layer_step")
    if isinstance(step, int) and not isinstance(step, bool) and 1 < step <= layers:
        # Llama 4's MoE blocks every step-th layer (configuration_llama4.py): whole repeats of
        # both patterns
        period = math.lcm(period, step)
    depths = (layers,) if full_depth else trace_depths(layers, period)
    dense = base_fields.get("first_k_dense_replace")
    if len(depths) == 2 and isinstance(dense, int) and dense >= depths[0]:
        # DeepSeek's leading dense blocks: both depths hold all of them, so the line through
        # the two is exact (modeling_deepseek_v3.py: first_k_dense_replace)
        depths = (dense + 2, dense + 4) if dense + 4 < layers else (layers,)
    return depths


def _run_options(
    requested: _RequestedOptions,
    settings: TraceSettings,
    full_config: Any,
    base_fields: dict[str, Any],
    model: ModelSpec,
    device: str,
    notes: list[str],
) -> _RunOptions:
    """What each depth runs with: the device, SDPA's kernel, CUDA's dropout and the model head."""
    if settings.attention == "sdpa" and device == "cpu" and base_fields.get("kv_lora_rank"):
        notes.append(
            "latent attention's value heads are narrower than its query/key heads: CPU runs "
            "SDPA's math kernel (scores kept), CUDA the memory-efficient one (no scores, as "
            "estimated); compare with --attn eager"
        )
    sdpa_math = requested.sdpa_math
    if sdpa_math is None:
        sdpa_math = device == "cpu" and _cpu_needs_math_sdpa(settings, full_config)
        if sdpa_math:
            notes.append(
                "fp32 SDPA on a grouped-query model: forced the math kernel, which CUDA runs "
                "there (a CPU trace would take a flash-style kernel)"
            )
    elif settings.attention == "sdpa":
        notes.append(f"SDPA math kernel {'forced' if sdpa_math else 'not forced'} (asked)")
    cuda_dropout = device == "cpu" and requested.cuda_dropout
    if cuda_dropout and settings.lora_dropout > 0 and settings.method in ("lora", "dora"):
        notes.append(
            "LoRA dropout run through CUDA's fused kernel (a bool mask, as on a GPU; CPU's own "
            "dropout keeps a mask in the input's dtype)"
        )
    if cuda_dropout and settings.attention == "sdpa" and model.attention_dropout > 0:
        notes.append(
            "SDPA's attention dropout traced as CUDA's flash and memory-efficient kernels run "
            "it (the mask drawn inside the kernel, nothing s^2 kept): dropout_p 0 in the trace, "
            "where CPU's math kernel would keep the s^2 probabilities and masks"
        )
    head = model.encoder_head if model.encoder_only else "causal"
    if head != "causal":
        notes.append(_encoder_trace_note(model, settings, device))
    return _RunOptions(
        device=device,
        sdpa_math=sdpa_math and settings.attention == "sdpa",
        hooks=requested.hooks,
        cuda_dropout=cuda_dropout,
        head=head,
    )


def _at_full_depth(
    traces: list[_DepthTrace], layers: int, notes: list[str]
) -> tuple[list[TracePhase], int, int]:
    """(phases, parameters, trainable parameters) at ``layers``: the one full-depth trace, or the
    line through two small depths."""
    if len(traces) == 1:
        return traces[0].phases, traces[0].total_params, traces[0].trainable_params
    low, high = traces
    phases = extrapolate_phases((low.depth, low.phases), (high.depth, high.phases), layers)
    total_params = _line_int(low.total_params, high.total_params, low.depth, high.depth, layers)
    trainable = _line_int(
        low.trainable_params, high.trainable_params, low.depth, high.depth, layers
    )
    notes.append(
        f"traced at {low.depth} and {high.depth} layers and extrapolated linearly to {layers} "
        "(exact for a stack of identical layers)"
    )
    return phases, total_params, trainable


def _encoder_trace_note(model: ModelSpec, settings: TraceSettings, device: str) -> str:
    """How an encoder's step is traced (its head, labels and, on CPU, SDPA's dropout path)."""
    if model.encoder_head == "mlm":
        text = (
            "encoder built as AutoModelForMaskedLM; labels: the input ids on every "
            f"{MLM_MASKED_EVERY}th position, -100 elsewhere (the logits cover every position)"
        )
    else:
        text = (
            "encoder built as AutoModelForSequenceClassification "
            f"({model.num_labels} labels); one label per sequence"
        )
    if settings.method == "inference":
        text += "; inference: one forward pass, no generation"
    return text


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence transformers' advice (``use_cache`` vs checkpointing) for the trace, then restore."""
    from transformers.utils import logging as transformers_logging

    previous = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers_logging.set_verbosity(previous)
