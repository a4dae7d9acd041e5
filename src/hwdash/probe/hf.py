"""A Hugging Face ``TrainerCallback`` that starts the probe and reports the run's progress.

``trainer = Trainer(..., callbacks=[HwdashProbeCallback(plan="my-plan")])``; needs transformers
(imported here only).

After every optimizer step (``on_step_end``, which the Trainer calls once per optimizer step, after
gradient accumulation) it calls :func:`hwdash.probe.step` with the Trainer's ``global_step`` and the
step's tokens:

* counted, when the Trainer counts them (``TrainingArguments.include_num_input_tokens_seen`` is
  ``"all"``/``"non_padding"``/True): the rise of ``TrainerState.num_input_tokens_seen``, which the
  Trainer sums over every process (transformers' ``trainer.py``, ``_track_num_input_tokens``);
* else estimated (``estimated=True``): per-device batch x sequence length x gradient accumulation
  steps x world size. A callback never sees the batches, so the sequence length is the
  ``sequence_length`` given to the callback, else the arguments' ``max_length`` (TRL's
  ``SFTConfig``) or ``max_seq_length`` (older TRL); with none of them the tokens stay unknown and
  only steps and samples are reported.

``state.max_steps`` becomes the run's ``max_steps`` when the training begins.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from hwdash.probe import DEFAULT_INTERVAL_S, Probe, set_step, set_total, start, step

SEQUENCE_LENGTH_ARGS = ("max_length", "max_seq_length")
"""Training-argument fields that hold the padded sequence length (TRL's SFTConfig: max_length;
TRL before 0.20: max_seq_length)."""


def _counts_tokens(args: Any) -> bool:
    setting = getattr(args, "include_num_input_tokens_seen", "no")
    return setting not in ("no", False, None)


def _positive(value: Any) -> int | None:
    return (
        int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
    )


class HwdashProbeCallback(TrainerCallback):  # type: ignore[misc]
    """Starts the probe when built; reports every optimizer step (see the module)."""

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        *,
        plan: str | None = None,
        sequence_length: int | None = None,
    ) -> None:
        super().__init__()
        self.probe: Probe = start(interval_s, plan=plan)
        self.sequence_length = sequence_length
        self._tokens_seen: int | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        set_step(state.global_step)
        set_total(max_steps=_positive(getattr(state, "max_steps", None)))
        self._tokens_seen = getattr(state, "num_input_tokens_seen", None)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        samples = self._samples_per_step(args)
        if _counts_tokens(args) and isinstance(state.num_input_tokens_seen, int):
            seen = int(state.num_input_tokens_seen)
            tokens = seen - (self._tokens_seen or 0)
            self._tokens_seen = seen
            step(tokens, samples=samples, step=state.global_step)
            return
        length = self.sequence_length or next(
            (
                length
                for name in SEQUENCE_LENGTH_ARGS
                if (length := _positive(getattr(args, name, None))) is not None
            ),
            None,
        )
        tokens_estimate = None if length is None or samples is None else samples * length
        step(
            tokens_estimate,
            samples=samples,
            estimated=tokens_estimate is not None,
            step=state.global_step,
        )

    @staticmethod
    def _samples_per_step(args: Any) -> int | None:
        """Per-device batch x gradient accumulation x world size (``TrainingArguments``)."""
        batch = _positive(getattr(args, "per_device_train_batch_size", None))
        if batch is None:
            return None
        accumulation = _positive(getattr(args, "gradient_accumulation_steps", 1)) or 1
        world = _positive(getattr(args, "world_size", 1)) or 1
        return batch * accumulation * world
