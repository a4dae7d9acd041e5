"""The step runner: build the model on fake tensors and run its training or inference step at one
depth under the tracker (torch, transformers and peft imported inside the functions only)."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from hwdash.tracing.cuda_emulation import _cuda_block_rounding, _cuda_fused_dropout
from hwdash.tracing.results import TracePhase, TraceUnavailable
from hwdash.tracing.settings import TraceSettings
from hwdash.tracing.tracker import _make_tracker

#: ``Plan.optimizer_impl`` -> the ``foreach`` argument of torch's optimizers (fused is separate).
_FOREACH_BY_IMPL = {"fused": False, "foreach": True, "for-loop": False}


#: Learning rates do not change memory; any positive value does.
_LEARNING_RATE = 1e-4


#: Of every sequence, the share of positions a masked-LM trainer masks and scores (BERT's 15%:
#: Devlin et al. 2019, arXiv:1810.04805, section 3.1; ``DataCollatorForLanguageModeling``'s
#: ``mlm_probability``); the others carry label -100.
MLM_MASKED_EVERY = 7


@dataclass(frozen=True)
class TraceHooks:
    """What a caller may run inside the trace besides the step itself (the calibration harness's
    extras: it records which attention ops run and inventories the live storages at the peak).

    Neither changes what is allocated; both default to nothing.
    """

    around_run: Callable[[Any], contextlib.AbstractContextManager[Any]] | None = None
    """Given the fake model, a context entered inside the fake-tensor mode around the whole run."""
    on_phase: Callable[[int, str], None] | None = None
    """Called as each phase starts, with its step and name (``forward``, ``backward``,
    ``optimizer``, ``prefill``, ``decode``)."""

    def phase(self, step: int, name: str) -> None:
        """Tell the caller a phase starts."""
        if self.on_phase is not None:
            self.on_phase(step, name)


_NO_HOOKS = TraceHooks()


@dataclass(frozen=True)
class _RunOptions:
    """What one depth's trace runs with, once the device and the SDPA kernel are decided."""

    device: str
    sdpa_math: bool
    hooks: TraceHooks = _NO_HOOKS
    cuda_dropout: bool = False
    head: str = "causal"
    """What to build: ``causal`` (AutoModelForCausalLM), or an encoder's ``mlm``
    (AutoModelForMaskedLM) or ``classification`` (AutoModelForSequenceClassification)."""


@dataclass
class _DepthTrace:
    depth: int
    phases: list[TracePhase]
    total_params: int
    trainable_params: int


@contextlib.contextmanager
def _frozen_survivors() -> Iterator[None]:
    """Collect what earlier work left, then freeze the survivors for the length of a trace.

    PEFT's DoRA forward leaves reference cycles that hold activation-sized tensors until Python's
    cyclic collector runs, so a DoRA peak depends on when collections happen. We collect at every
    phase boundary (``close_phase``) and start from a clean, frozen heap, as the calibration harness
    does. That makes a trace repeatable from a fresh process, not exact: on Llama-3.2-1B (DoRA,
    bf16, batch 2 x 1024, dropout 0.05, no autocast) the first trace in a process peaked at 23.67
    GB, later ones at 24.03 GB (+1.5%), and 29.02 GB (+23%) with the collector held off until each
    phase ends. Against the harness's autocast traces (bench/data/calibration-lora-autocast.csv)
    four DoRA rows match to the byte and the two without checkpointing, whose peak is in the first
    forward, come out 2.5% and 11.9% lower (bench/trace_parity.py): the collector's timing is part
    of DoRA's real peak too.
    Full and LoRA traces do not depend on the collector.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _trace_at_depth(
    config: Any, settings: TraceSettings, options: _RunOptions, depth: int
) -> _DepthTrace:
    from torch._subclasses.fake_tensor import FakeTensorMode

    collecting = _frozen_survivors() if settings.method == "dora" else contextlib.nullcontext()
    rounding = _cuda_block_rounding() if options.device == "cpu" else contextlib.nullcontext()
    dropout = (
        _cuda_fused_dropout(keep_sdpa_dropout=options.sdpa_math)
        if options.cuda_dropout
        else contextlib.nullcontext()
    )
    with collecting:
        # Built on meta outside the fake mode, then swapped for fake tensors (see _build_model).
        model = _build_model(config, settings, options.head)
        with rounding, dropout, FakeTensorMode():
            _materialize_fake(model, options.device)
            unique = {id(p): p for p in model.parameters()}
            total_params = sum(int(p.numel()) for p in unique.values())
            trainable = sum(int(p.numel()) for p in unique.values() if p.requires_grad)
            tracker = _make_tracker()
            around = options.hooks.around_run
            with around(model) if around is not None else contextlib.nullcontext():
                if settings.method == "inference" and options.head != "causal":
                    phases = _run_encoder_inference(model, settings, tracker, options)
                elif settings.method == "inference":
                    phases = _run_inference(model, settings, tracker, options)
                else:
                    phases = _run_training(model, settings, tracker, options)
    return _DepthTrace(depth, phases, total_params, trainable)


def _build_model(config: Any, settings: TraceSettings, head: str = "causal") -> Any:
    """The model (and adapters) on the meta device; fake tensors replace its storage next.

    Built on meta rather than under the fake mode because ``Module.to`` and PEFT's adapter moves
    cannot swap fake parameters in (torch 2.13).
    """
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForMaskedLM,
        AutoModelForSequenceClassification,
    )

    auto = {
        "mlm": AutoModelForMaskedLM,
        "classification": AutoModelForSequenceClassification,
    }.get(head, AutoModelForCausalLM)
    dtype = getattr(torch, settings.weight_dtype)
    with torch.device("meta"):
        model = auto.from_config(config, attn_implementation=settings.attention, dtype=dtype)
    if settings.method == "inference":
        model.eval()
        model.requires_grad_(False)
        return model
    model.train()
    if settings.grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if settings.method in ("lora", "dora"):
        from peft import LoraConfig, get_peft_model

        targets: str | list[str] = (
            "all-linear"
            if settings.lora_targets == ("all-linear",)
            else list(settings.lora_targets)
        )
        adapter = LoraConfig(
            r=settings.lora_r,
            lora_alpha=2 * settings.lora_r,
            lora_dropout=settings.lora_dropout,
            target_modules=targets,
            modules_to_save=list(settings.lora_modules_to_save) or None,
            use_dora=settings.method == "dora",
            # an encoder classifier as trainers set it up (PEFT then trains the classification
            # head in full, modules_to_save); a masked LM takes no task type
            task_type={"mlm": None, "classification": "SEQ_CLS"}.get(head, "CAUSAL_LM"),
        )
        # PEFT keeps the adapter weights in fp32 under a bf16 base (autocast_adapter_dtype), as a
        # real run does.
        model = get_peft_model(model, adapter)
    return model


def _materialize_fake(model: Any, device: str) -> None:
    """Swap every meta parameter and buffer for a fake tensor on ``device`` (tied ones stay tied)."""
    import torch

    swapped: dict[int, Any] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            if id(param) not in swapped:
                storage = torch.empty(param.shape, dtype=param.dtype, device=device)
                swapped[id(param)] = torch.nn.Parameter(storage, requires_grad=param.requires_grad)
            module._parameters[name] = swapped[id(param)]
        for name, buffer in list(module._buffers.items()):
            if buffer is None:
                continue
            if id(buffer) not in swapped:
                swapped[id(buffer)] = torch.empty(buffer.shape, dtype=buffer.dtype, device=device)
            module._buffers[name] = swapped[id(buffer)]


def _make_optimizer(settings: TraceSettings, params: list[Any]) -> Any:
    import torch

    if settings.optimizer == "adamw":
        if settings.optimizer_impl == "fused":
            return torch.optim.AdamW(params, lr=_LEARNING_RATE, weight_decay=0.0, fused=True)
        return torch.optim.AdamW(
            params,
            lr=_LEARNING_RATE,
            weight_decay=0.0,
            foreach=_FOREACH_BY_IMPL[settings.optimizer_impl],
        )
    if settings.optimizer == "sgd":
        # The Hugging Face Trainer's "sgd" is torch.optim.SGD without momentum: no state. The plan's
        # optimizer_impl is AdamW's; SGD runs as torch does by default on CUDA (foreach).
        return torch.optim.SGD(params, lr=_LEARNING_RATE, foreach=True)
    if settings.optimizer == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(
            params, lr=_LEARNING_RATE, scale_parameter=False, relative_step=False, warmup_init=False
        )
    raise TraceUnavailable(f"optimizer {settings.optimizer} cannot be traced")


def _attention_kernel(options: _RunOptions) -> Any:
    if options.sdpa_math:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([SDPBackend.MATH])
    return contextlib.nullcontext()


def _run_training(
    model: Any, settings: TraceSettings, tracker: Any, options: _RunOptions
) -> list[TracePhase]:
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    masters: list[Any] = []
    if settings.master_copy:
        # DeepSpeed-style bf16 emulated: the optimizer steps fp32 masters with fp32 gradients, and
        # the bf16 weights are copied back from them.
        masters = [p.detach().float() for p in params]
        optimizer = _make_optimizer(settings, masters)

        def gradients_to_masters(opt: Any, args: Any, kwargs: Any) -> None:
            for param, master in zip(params, masters, strict=True):
                master.grad = None if param.grad is None else param.grad.float()
                param.grad = None

        def weights_from_masters(opt: Any, args: Any, kwargs: Any) -> None:
            with torch.no_grad():
                for param, master in zip(params, masters, strict=True):
                    param.copy_(master)

        optimizer.register_step_pre_hook(gradients_to_masters)
        optimizer.register_step_post_hook(weights_from_masters)
    else:
        optimizer = _make_optimizer(settings, params)
    tracker.track_external(model, optimizer, *masters)
    vocab = int(model.config.vocab_size)
    ids = torch.randint(0, vocab, (settings.batch, settings.seq), device=options.device)
    labels = _labels(ids, options)
    autocast = (
        torch.autocast(options.device, dtype=torch.bfloat16)
        if settings.autocast
        else contextlib.nullcontext()
    )
    collect = settings.method == "dora"  # PEFT's DoRA leaves cycles holding activations
    phases: list[TracePhase] = []
    with tracker, _attention_kernel(options):
        tracker.close_phase(0, "setup", collect)
        for step in (1, 2):
            for micro in range(1, settings.micro_batches + 1):
                suffix = f" {micro}" if settings.micro_batches > 1 else ""
                # MemTracker refuses a module that runs twice unless its per-module stats are
                # cleared first.
                tracker.reset_mod_stats()
                options.hooks.phase(step, "forward" + suffix)
                with autocast:
                    loss = model(input_ids=ids, labels=labels).loss
                phases.append(tracker.close_phase(step, "forward" + suffix, collect))
                options.hooks.phase(step, "backward" + suffix)
                loss.backward()
                del loss
                phases.append(tracker.close_phase(step, "backward" + suffix, collect))
            options.hooks.phase(step, "optimizer")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            phases.append(tracker.close_phase(step, "optimizer", collect))
    return phases


def _labels(ids: Any, options: _RunOptions) -> Any:
    """The labels a trainer passes: the ids themselves (causal LM; the model shifts them), the ids
    on the masked positions and -100 elsewhere (masked LM), one class per sequence (classification)."""
    import torch

    if options.head == "classification":
        return torch.zeros(ids.shape[0], dtype=torch.long, device=ids.device)
    if options.head == "mlm":
        labels = torch.full_like(ids, -100)
        labels[:, ::MLM_MASKED_EVERY] = ids[:, ::MLM_MASKED_EVERY]
        return labels
    return ids


def _inference_inputs(
    model: Any, settings: TraceSettings, tracker: Any, options: _RunOptions
) -> Any:
    """Start tracking ``model`` (weights counted from the setup phase) and draw the batch of token
    ids an inference trace feeds it: batch x seq ids of the model's vocabulary."""
    import torch

    tracker.track_external(model)
    vocab = int(model.config.vocab_size)
    return torch.randint(0, vocab, (settings.batch, settings.seq), device=options.device)


def _run_encoder_inference(
    model: Any, settings: TraceSettings, tracker: Any, options: _RunOptions
) -> list[TracePhase]:
    """An encoder's inference: one forward pass over the batch (no generation, no cache)."""
    import torch

    ids = _inference_inputs(model, settings, tracker, options)
    phases: list[TracePhase] = []
    with torch.no_grad(), tracker, _attention_kernel(options):
        tracker.close_phase(0, "setup", False)
        options.hooks.phase(0, "forward")
        output = model(input_ids=ids)
        del output
        phases.append(tracker.close_phase(0, "forward", False))
    return phases


def _run_inference(
    model: Any, settings: TraceSettings, tracker: Any, options: _RunOptions
) -> list[TracePhase]:
    import torch

    ids = _inference_inputs(model, settings, tracker, options)
    phases: list[TracePhase] = []
    with torch.no_grad(), tracker, _attention_kernel(options):
        tracker.close_phase(0, "setup", False)
        options.hooks.phase(0, "prefill")
        output = model(input_ids=ids[:, :-1], use_cache=True, logits_to_keep=1)
        cache = output.past_key_values
        del output
        phases.append(tracker.close_phase(0, "prefill", False))
        options.hooks.phase(0, "decode")
        tracker.reset_mod_stats()
        output = model(
            input_ids=ids[:, -1:], past_key_values=cache, use_cache=True, logits_to_keep=1
        )
        del output, cache
        phases.append(tracker.close_phase(0, "decode", False))
    return phases
