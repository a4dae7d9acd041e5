"""A Hugging Face ``TrainerCallback`` that starts the probe and publishes the global step.

``trainer = Trainer(..., callbacks=[HwdashProbeCallback()])``; needs transformers (imported here only).
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from hwdash.probe import DEFAULT_INTERVAL_S, Probe, set_step, start


class HwdashProbeCallback(TrainerCallback):  # type: ignore[misc]
    """Starts the probe when built; records ``state.global_step`` after every step."""

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        super().__init__()
        self.probe: Probe = start(interval_s)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        set_step(state.global_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        set_step(state.global_step)
