"""Trace one calibration case on fake tensors and return its peak memory, phase by phase.

Everything runs under ``FakeTensorMode``: shapes, dtypes and strides are real, no storage is
allocated, so a 47B-parameter Mixtral step costs the same few seconds as a 0.5B one. ``MemTracker``
(``torch.distributed._tools.mem_tracker``) follows every storage's life and classifies it as
parameter, buffer, gradient, activation, temp (backward) or optimizer state.

Depth: the time of a trace grows with the number of layers, not with their size. A case is traced at
two small depths (whole multiples of the family's layer period) and each phase's peak is extrapolated
linearly to the catalog depth: every component of a uniform decoder stack grows by the same bytes per
layer, so the line through two depths is exact while the peak stays at the same point of the step.
``--validate-depth`` traces a few cases at full depth to check that.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
from collections.abc import Iterator
from copy import deepcopy
from dataclasses import dataclass, field
from typing import Any

from calibration.architectures import build_config, family_of, layer_period
from calibration.cases import CalibrationCase
from hwdash.core.catalog import ModelSpec

#: The CUDA caching allocator rounds every block up to a multiple of 512 bytes
#: (c10/cuda/CUDACachingAllocator.cpp, kMinBlockSize); MemTracker applies that to cuda devices only.
CUDA_MIN_BLOCK_BYTES = 512

#: MemTracker's reference types, renamed to the snake-case keys our records use.
COMPONENT_NAMES = {
    "Parameter": "parameter",
    "Buffer": "buffer",
    "Gradient": "gradient",
    "Activation": "activation",
    "Temp": "temp",
    "Optstate": "optimizer",
    "Other": "other",
}

#: Dispatcher ops whose presence tells which attention kernel ran.
ATTENTION_OP_MARKERS = ("scaled_dot_product", "_softmax", "softmax")


@dataclass(frozen=True)
class PhasePeak:
    """Peak bytes during one phase of one step, with the breakdown at that instant."""

    step: int
    """1 for the first training step (optimizer states created lazily), 2 for a later one; 0 for inference."""
    phase: str
    """``forward`` (incl. loss), ``backward``, ``optimizer`` (step + zero_grad), ``prefill``, ``decode``."""
    total: int
    """Peak bytes of all live storages during the phase."""
    components: dict[str, int]
    """Bytes by MemTracker category at the peak instant (keys of :data:`COMPONENT_NAMES`)."""
    end_total: int = 0
    """Bytes alive when the phase ended (after forward: what backward will consume)."""
    end_components: dict[str, int] = field(default_factory=dict)
    """Bytes by category when the phase ended."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "step": self.step,
            "phase": self.phase,
            "total": self.total,
            "components": dict(self.components),
            "end_total": self.end_total,
            "end_components": dict(self.end_components),
        }


@dataclass
class DepthTrace:
    """What one trace at a given depth saw."""

    layers: int
    total_params: int
    trainable_params: int
    phases: list[PhasePeak]
    attention_ops: list[str] = field(default_factory=list)
    seconds: float = 0.0


@contextlib.contextmanager
def cuda_block_rounding() -> Iterator[None]:
    """Make MemTracker round every storage up to 512 bytes, as the CUDA caching allocator does."""
    from torch.distributed._tools import mem_tracker

    original = mem_tracker._WeakRefInfo._calculate_mem_consumed

    def rounded(self: Any) -> int:
        raw = int(self.size * self.element_size)
        return math.ceil(raw / CUDA_MIN_BLOCK_BYTES) * CUDA_MIN_BLOCK_BYTES

    mem_tracker._WeakRefInfo._calculate_mem_consumed = rounded
    try:
        yield
    finally:
        mem_tracker._WeakRefInfo._calculate_mem_consumed = original


def _snapshot_components(snapshot: dict[Any, dict[Any, int]]) -> tuple[int, dict[str, int]]:
    components = dict.fromkeys(COMPONENT_NAMES.values(), 0)
    total = 0
    for device_snapshot in snapshot.values():
        for key, value in device_snapshot.items():
            name = getattr(key, "value", key)
            if name == "Total":
                total += value
            elif name in COMPONENT_NAMES:
                components[COMPONENT_NAMES[name]] += value
    return total, components


def _close_phase(tracker: Any, step: int, phase: str, *, collect: bool = False) -> PhasePeak:
    """Read the peak since the last phase boundary, then restart peak tracking from now.

    ``collect`` runs Python's cyclic garbage collector first. DoRA's forward (peft 0.21) leaves
    reference cycles that hold activation-sized tensors until a collection, which made its traces
    differ run to run by up to 15%; collecting at every boundary makes them repeatable. Full and
    LoRA traces are identical with the collector disabled (checked on Llama-3.2-1B), and a
    collection costs about half a second, so only DoRA cases collect.
    """
    if collect:
        gc.collect()
    total, components = _snapshot_components(tracker.get_tracker_snapshot("peak"))
    current = tracker.get_tracker_snapshot("current")
    # MemTracker keeps one running peak; restart it so each phase reports its own (private fields,
    # torch 2.13: ``_peak_mem`` and ``_peak_mem_snap``).
    tracker._peak_mem = {dev: snap["Total"] for dev, snap in current.items()}
    tracker._peak_mem_snap = deepcopy(current)
    end_total, end_components = _snapshot_components(current)
    return PhasePeak(
        step=step,
        phase=phase,
        total=total,
        components=components,
        end_total=end_total,
        end_components=end_components,
    )


class _NoHook:
    """Stands in for a hook handle on a frozen parameter (nothing to remove)."""

    def remove(self) -> None:
        return None


def _new_tracker() -> Any:
    """A MemTracker that tolerates frozen parameters and keeps only the global peak.

    Two changes to torch 2.13's MemTracker, both in a subclass:

    - it registers a gradient hook on every parameter of a module it meets and fails on frozen ones
      ("cannot register a hook on a tensor that doesn't require gradient"), so LoRA and inference
      could not be traced: frozen parameters are marked as already hooked;
    - after every op it refreshes the peak of every module seen so far, which makes a trace
      quadratic in the number of modules (LoRA adds three per adapted linear); we read only the
      global peak, so only that is kept. Totals and categories are unchanged.
    """
    from torch.distributed._tools.mem_tracker import MemTracker

    class PeakOnlyMemTracker(MemTracker):
        def _track_module_params_and_buffers(self, module: Any, install_grad_hooks: bool = True):  # type: ignore[no-untyped-def]
            for param in module.parameters():
                if not param.requires_grad and param not in self._param_to_grad_hook_handles:
                    self._param_to_grad_hook_handles[param] = (_NoHook(), _NoHook())
            return super()._track_module_params_and_buffers(module, install_grad_hooks)

        def _update_peak_stats(self, peak_state: Any) -> None:
            for device, snapshot in self._curr_mem_snap.items():
                if self._peak_mem.get(device, 0) < snapshot["Total"]:
                    self._peak_mem[device] = snapshot["Total"]
                    self._peak_mem_snap[device] = deepcopy(snapshot)

    return PeakOnlyMemTracker()


def _op_recorder() -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class AttentionOpRecorder(TorchDispatchMode):
        """Records the names of attention-related dispatcher ops that run."""

        def __init__(self) -> None:
            super().__init__()
            self.seen: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            name = str(func.overloadpacket.__name__)
            if any(marker in name for marker in ATTENTION_OP_MARKERS):
                self.seen.add(name)
            return func(*args, **(kwargs or {}))

    return AttentionOpRecorder()


def _compute_dtype(precision: str) -> Any:
    import torch

    return torch.bfloat16 if precision in ("bf16", "mixed") else torch.float32


def _build_model(case: CalibrationCase, spec: ModelSpec, layers: int) -> Any:
    """Build the model (and its adapters) on the meta device; :func:`_materialize_fake` follows.

    Built on meta rather than under the fake mode because ``Module.to`` and peft's adapter moves
    cannot swap fake parameters in torch 2.13 ("Couldn't swap Linear.weight").
    """
    import torch
    from transformers import AutoModelForCausalLM

    config = build_config(spec, layers, case.attention)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            config, attn_implementation=case.attention, dtype=_compute_dtype(case.precision)
        )
    if case.method == "inference":
        model.eval()
        model.requires_grad_(False)
        return model
    model.train()
    if case.grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if case.method in ("lora", "dora"):
        from peft import LoraConfig, get_peft_model

        targets: str | list[str] = (
            "all-linear" if case.lora_targets == ("all-linear",) else list(case.lora_targets)
        )
        lora = LoraConfig(
            r=case.lora_r,
            lora_alpha=2 * case.lora_r,
            lora_dropout=case.lora_dropout,
            target_modules=targets,
            use_dora=case.method == "dora",
            task_type="CAUSAL_LM",
        )
        # peft keeps adapter weights in fp32 when the base model is bf16 (autocast_adapter_dtype=True,
        # its default), exactly as a real run does.
        model = get_peft_model(model, lora)
    return model


def _materialize_fake(model: Any) -> None:
    """Replace every meta parameter and buffer by a fake CPU tensor of the same shape and dtype.

    Must run inside ``FakeTensorMode``. Shared (tied) parameters stay shared.
    """
    import torch

    replaced: dict[int, Any] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            if id(param) not in replaced:
                fake = torch.empty(param.shape, dtype=param.dtype, device="cpu")
                replaced[id(param)] = torch.nn.Parameter(fake, requires_grad=param.requires_grad)
            module._parameters[name] = replaced[id(param)]
        for name, buffer in list(module._buffers.items()):
            if buffer is None:
                continue
            if id(buffer) not in replaced:
                replaced[id(buffer)] = torch.empty(buffer.shape, dtype=buffer.dtype, device="cpu")
            module._buffers[name] = replaced[id(buffer)]


def _build_optimizer(case: CalibrationCase, params: list[Any]) -> Any:
    import torch

    if case.optimizer == "adamw":
        if case.optimizer_impl == "fused":
            return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0, fused=True)
        return torch.optim.AdamW(
            params, lr=1e-4, weight_decay=0.0, foreach=case.optimizer_impl == "foreach"
        )
    if case.optimizer == "sgd":
        # The Hugging Face Trainer's "sgd" is torch.optim.SGD without momentum: no state.
        return torch.optim.SGD(params, lr=1e-3, foreach=case.optimizer_impl == "foreach")
    if case.optimizer == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(
            params, lr=1e-3, scale_parameter=False, relative_step=False, warmup_init=False
        )
    raise ValueError(f"optimizer {case.optimizer!r} is not traceable here")


def _sdpa_backend(case: CalibrationCase) -> Any:
    """Force SDPA's math kernel when the case asks for it (what CUDA runs for fp32 inputs)."""
    if case.sdpa_backend == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.MATH])


def _label(inventory: Any, text: str) -> None:
    if inventory is not None:
        inventory.phase = text


#: Version of the tracing rules a record was made with; ``bench/calibrate.py`` re-traces records made
#: under older rules. 2: bf16/mixed LoRA and DoRA under autocast (:func:`forward_autocast`), full-depth
#: fallback when the two-depth line goes negative (:func:`measure`).
TRACE_RULES = 2


def forward_autocast(case: CalibrationCase) -> bool:
    """Whether the forward runs under bf16 autocast, as the Hugging Face Trainer would run it.

    ``amp`` is an fp32 model under autocast by definition. With ``bf16=True`` the Trainer (through
    accelerate) also wraps a bf16 model's forward in ``torch.autocast``; for full fine-tuning that
    changes nothing we can see (every weight is bf16 already), but PEFT's adapters are fp32
    (``autocast_adapter_dtype=True``), so for LoRA and DoRA autocast decides whether the adapted
    inputs they keep are 2 or 4 bytes per element. ``mixed`` models the same 16-bit forward.
    """
    if case.precision == "amp":
        return True
    return case.precision in ("bf16", "mixed") and case.method in ("lora", "dora")


def _train(
    case: CalibrationCase, model: Any, tracker: Any, recorder: Any, inventory: Any = None
) -> list[PhasePeak]:
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    masters: list[Any] = []
    if case.precision == "mixed":
        # DeepSpeed-style bf16 training emulated: bf16 weights and gradients, an fp32 master copy,
        # fp32 gradients for the step, fp32 Adam states on the masters.
        masters = [p.detach().float() for p in params]
        optimizer = _build_optimizer(case, masters)

        def to_masters(opt: Any, args: Any, kwargs: Any) -> None:
            for p, m in zip(params, masters, strict=True):
                m.grad = None if p.grad is None else p.grad.float()
                p.grad = None

        def from_masters(opt: Any, args: Any, kwargs: Any) -> None:
            with torch.no_grad():
                for p, m in zip(params, masters, strict=True):
                    p.copy_(m)

        optimizer.register_step_pre_hook(to_masters)
        optimizer.register_step_post_hook(from_masters)
    else:
        optimizer = _build_optimizer(case, params)
    tracker.track_external(model, optimizer, *masters)
    ids = torch.randint(0, model.config.vocab_size, (case.batch, case.seq))
    autocast = (
        torch.autocast("cpu", dtype=torch.bfloat16)
        if forward_autocast(case)
        else contextlib.nullcontext()
    )
    phases: list[PhasePeak] = []
    collect = case.method == "dora"
    with tracker, _sdpa_backend(case):
        for step in (1, 2):
            if step == 2:
                tracker.reset_mod_stats()
            _label(inventory, f"step {step} forward")
            with recorder if step == 1 else contextlib.nullcontext(), autocast:
                loss = model(input_ids=ids, labels=ids).loss
            phases.append(_close_phase(tracker, step, "forward", collect=collect))
            _label(inventory, f"step {step} backward")
            loss.backward()
            del loss
            phases.append(_close_phase(tracker, step, "backward", collect=collect))
            _label(inventory, f"step {step} optimizer")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            phases.append(_close_phase(tracker, step, "optimizer", collect=collect))
    return phases


def _infer(
    case: CalibrationCase, model: Any, tracker: Any, recorder: Any, inventory: Any = None
) -> list[PhasePeak]:
    import torch

    tracker.track_external(model)
    ids = torch.randint(0, model.config.vocab_size, (case.batch, case.seq))
    phases: list[PhasePeak] = []
    with torch.no_grad(), tracker, _sdpa_backend(case):
        # generate() asks the model for the last position's logits only (logits_to_keep=1).
        with recorder:
            out = model(input_ids=ids[:, :-1], use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        del out
        phases.append(_close_phase(tracker, 0, "prefill"))
        _label(inventory, "decode")
        tracker.reset_mod_stats()
        out = model(input_ids=ids[:, -1:], past_key_values=cache, use_cache=True, logits_to_keep=1)
        del out, cache
        phases.append(_close_phase(tracker, 0, "decode"))
    return phases


def trace_at_depth(
    case: CalibrationCase, spec: ModelSpec, layers: int, inventory: Any = None
) -> DepthTrace:
    """Trace ``case`` with ``layers`` decoder blocks on fake tensors.

    ``inventory`` (from :func:`calibration.inventory.make_inventory`) also records every live
    storage at the peak.
    """
    started = time.perf_counter()
    # Collect what earlier traces left, then freeze the survivors (imported modules, the catalog) so
    # that the collections at phase boundaries scan only this trace's objects: a full collection of
    # the transformers/peft heap costs about half a second.
    gc.collect()
    gc.freeze()
    try:
        return _trace(case, spec, layers, inventory, started)
    finally:
        gc.unfreeze()


def _trace(
    case: CalibrationCase, spec: ModelSpec, layers: int, inventory: Any, started: float
) -> DepthTrace:
    from torch._subclasses.fake_tensor import FakeTensorMode

    model = _build_model(case, spec, layers)
    with cuda_block_rounding(), FakeTensorMode():
        _materialize_fake(model)
        if inventory is not None:
            for param in model.parameters():
                inventory.add(param, "parameter")
        inventory_context = inventory if inventory is not None else contextlib.nullcontext()
        seen: dict[int, Any] = {}
        for p in model.parameters():
            seen[id(p)] = p
        total_params = sum(p.numel() for p in seen.values())
        trainable = sum(p.numel() for p in seen.values() if p.requires_grad)
        tracker = _new_tracker()
        recorder = _op_recorder()
        with inventory_context:
            if case.method == "inference":
                phases = _infer(case, model, tracker, recorder, inventory)
            else:
                phases = _train(case, model, tracker, recorder, inventory)
    return DepthTrace(
        layers=layers,
        total_params=int(total_params),
        trainable_params=int(trainable),
        phases=phases,
        attention_ops=sorted(recorder.seen),
        seconds=time.perf_counter() - started,
    )


def depths_for(spec: ModelSpec, small: int = 2) -> tuple[int, int]:
    """The two depths a case is traced at: ``small`` and twice that, rounded to the layer period."""
    period = layer_period(spec)
    first = max(period, math.ceil(small / period) * period)
    return first, 2 * first


def _line(a: int, b: int, la: int, lb: int, layers: int) -> int:
    # Exact integer extrapolation: per-layer bytes are whole numbers.
    return a + (b - a) * (layers - la) // (lb - la)


def extrapolate(a: DepthTrace, b: DepthTrace, layers: int) -> DepthTrace:
    """Each phase's peak and components, and the parameter counts, on the line through two depths."""
    if [(p.step, p.phase) for p in a.phases] != [(p.step, p.phase) for p in b.phases]:
        raise ValueError("the two traces did not run the same phases")
    phases = []
    for pa, pb in zip(a.phases, b.phases, strict=True):
        components = {
            name: _line(pa.components[name], pb.components[name], a.layers, b.layers, layers)
            for name in pa.components
        }
        end_components = {
            name: _line(
                pa.end_components[name], pb.end_components[name], a.layers, b.layers, layers
            )
            for name in pa.end_components
        }
        phases.append(
            PhasePeak(
                step=pa.step,
                phase=pa.phase,
                total=_line(pa.total, pb.total, a.layers, b.layers, layers),
                components=components,
                end_total=_line(pa.end_total, pb.end_total, a.layers, b.layers, layers),
                end_components=end_components,
            )
        )
    return DepthTrace(
        layers=layers,
        total_params=_line(a.total_params, b.total_params, a.layers, b.layers, layers),
        trainable_params=_line(a.trainable_params, b.trainable_params, a.layers, b.layers, layers),
        phases=phases,
        attention_ops=sorted(set(a.attention_ops) | set(b.attention_ops)),
        seconds=a.seconds + b.seconds,
    )


def negative_components(trace: DepthTrace) -> list[str]:
    """The phases whose extrapolated peak breakdown has a negative component, as readable text."""
    found = []
    for phase in trace.phases:
        bad = sorted(name for name, value in phase.components.items() if value < 0)
        if bad:
            found.append(f"step {phase.step} {phase.phase}: {', '.join(bad)}")
    return found


def measure(case: CalibrationCase, spec: ModelSpec, *, full_depth: bool = False) -> dict[str, Any]:
    """Trace a case (two small depths and extrapolation, or the full depth) and return its record."""
    import peft
    import torch
    import transformers

    depth_note = ""
    if full_depth or spec.layers <= depths_for(spec)[1]:
        trace = trace_at_depth(case, spec, spec.layers)
        traced_depths = [spec.layers]
    else:
        low, high = depths_for(spec)
        trace = extrapolate(
            trace_at_depth(case, spec, low), trace_at_depth(case, spec, high), spec.layers
        )
        traced_depths = [low, high]
        negative = negative_components(trace)
        if negative:
            # The phase peaked at different instants at the two depths (seen in checkpointed
            # backward: the loss gradient at one depth, a recomputed layer at the other), so the
            # line through them means nothing; only a full-depth trace gives that phase's peak.
            depth_note = f"negative when extrapolated ({'; '.join(negative)}): traced at full depth"
            trace = trace_at_depth(case, spec, spec.layers)
            traced_depths = [spec.layers]
    peak = max(trace.phases, key=lambda p: p.total)
    first_step = [p.total for p in trace.phases if p.step in (0, 1)]
    later_step = [p.total for p in trace.phases if p.step == 2]
    return {
        "case_id": case.case_id,
        "plan": case.plan_fields(),
        "optimizer_impl": case.optimizer_impl,
        "lora_dropout": case.lora_dropout,
        "sdpa_backend": case.sdpa_backend,
        "family": family_of(spec),
        "layers": spec.layers,
        "traced_depths": traced_depths,
        "total_params": trace.total_params,
        "trainable_params": trace.trainable_params,
        "peak_bytes": peak.total,
        "peak_step": peak.step,
        "peak_phase": peak.phase,
        "peak_components": peak.components,
        "first_step_peak_bytes": max(first_step),
        "later_step_peak_bytes": max(later_step) if later_step else None,
        "phases": [p.as_dict() for p in trace.phases],
        "attention_ops": trace.attention_ops,
        "trace_seconds": round(trace.seconds, 3),
        "autocast": forward_autocast(case),
        "trace_rules": TRACE_RULES,
        "depth_note": depth_note,
        "step_peak_bytes": max(
            (p.total for p in trace.phases if p.phase == "optimizer"), default=None
        ),
        "fake_device": "cpu",
        "cuda_block_rounding": CUDA_MIN_BLOCK_BYTES,
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
        },
    }
