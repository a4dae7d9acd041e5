"""A Lightning callback that starts the probe and reports the run's progress.

``trainer = lightning.Trainer(..., callbacks=[HwdashProbeCallback(plan="my-plan")])``; needs
Lightning (``lightning`` or the older ``pytorch_lightning`` package).

``on_train_batch_end`` runs after every batch; an optimizer step has happened when the trainer's
``global_step`` (the number of optimizer steps, in Lightning's ``Trainer``) has grown, so the
batches since the last step (gradient accumulation) make one :func:`hwdash.probe.step`. Tokens are
counted from the batches' ``input_ids`` (a mapping with that key, or a tensor as the batch's first
item), times the trainer's ``world_size`` (an estimate when it is above 1: other ranks' batches are
taken to be as long); ``trainer.max_steps`` (when not -1) is the run's ``max_steps``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hwdash.probe import DEFAULT_INTERVAL_S, Probe, set_step, set_total, start, step

try:
    from lightning.pytorch import Callback
except ImportError:
    try:
        from pytorch_lightning import Callback
    except ImportError:
        raise ImportError(
            "hwdash.probe.lightning needs Lightning: pip install lightning "
            "(or use hwdash.probe.step() in your training loop)"
        ) from None


def _numel(value: Any) -> int | None:
    count = getattr(value, "numel", None)
    return int(count()) if callable(count) else None


def batch_tokens(batch: Any) -> int | None:
    """Tokens in one batch: ``input_ids`` of a mapping, else the first tensor of a sequence."""
    if isinstance(batch, Mapping):
        return _numel(batch.get("input_ids"))
    if isinstance(batch, (list, tuple)) and batch:
        return _numel(batch[0])
    return _numel(batch)


def _samples(batch: Any) -> int | None:
    first = batch.get("input_ids") if isinstance(batch, Mapping) else batch
    if isinstance(first, (list, tuple)) and first:
        first = first[0]
    shape = getattr(first, "shape", None)
    return int(shape[0]) if shape else None


class HwdashProbeCallback(Callback):  # type: ignore[misc]
    """Starts the probe when built; reports every optimizer step (see the module)."""

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, *, plan: str | None = None) -> None:
        super().__init__()
        self.probe: Probe = start(interval_s, plan=plan)
        self._last_step = 0
        self._tokens: int | None = None
        self._samples: int | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._last_step = int(trainer.global_step)
        set_step(self._last_step)
        max_steps = getattr(trainer, "max_steps", -1)
        set_total(max_steps=max_steps if isinstance(max_steps, int) and max_steps > 0 else None)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        world = max(1, int(getattr(trainer, "world_size", 1) or 1))
        tokens, samples = batch_tokens(batch), _samples(batch)
        if tokens is not None:
            self._tokens = (self._tokens or 0) + tokens * world
        if samples is not None:
            self._samples = (self._samples or 0) + samples * world
        global_step = int(trainer.global_step)
        if global_step <= self._last_step:
            return  # accumulating gradients: no optimizer step yet
        self._last_step = global_step
        step(self._tokens, samples=self._samples, estimated=world > 1, step=global_step)
        self._tokens = self._samples = None
