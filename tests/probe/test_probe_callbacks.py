"""The Trainer callbacks report steps and tokens (issue 26): the real Hugging Face Trainer on a tiny
CPU model, and Lightning's callback with a stand-in trainer (Lightning is not installed here)."""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import hwdash.probe as probe


def _train(tmp_path: Path, **arguments: Any) -> Any:
    """Train a 1-layer GPT-2 built from its config for 3 optimizer steps on CPU; the callback."""
    torch = pytest.importorskip("torch", reason="torch is in the validate extra")
    transformers = pytest.importorskip("transformers", reason="in the validate extra")
    # Another test imports hwdash.probe.hf over a stand-in transformers: import it afresh here.
    HwdashProbeCallback = importlib.reload(
        importlib.import_module("hwdash.probe.hf")
    ).HwdashProbeCallback

    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=32)
    model = transformers.GPT2LMHeadModel(config)
    generator = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, 64, (12,), generator=generator) for _ in range(24)]
    dataset = [{"input_ids": row, "labels": row} for row in rows]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=3,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        **arguments,
    )
    callback = HwdashProbeCallback(interval_s=30, plan="tiny-gpt2")
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=dataset, callbacks=[callback]
    )
    trainer.train()
    return callback


@pytest.mark.validate
def test_the_trainer_callback_counts_the_trainers_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    try:
        callback = _train(tmp_path, include_num_input_tokens_seen="all")
        run = callback.probe.run_object()
        # 3 steps x 2 micro-batches x 2 rows x 12 tokens, counted by the Trainer.
        assert (run["step"], run["tokens"], run["tokens_estimated"]) == (3, 144, False)
        assert run["samples"] == 12 and run["max_steps"] == 3 and run["plan"] == "tiny-gpt2"
        assert run["tokens_per_s"] is not None and run["tokens_per_s"] > 0
    finally:
        probe.stop()


@pytest.mark.validate
def test_the_trainer_callback_estimates_tokens_from_the_sequence_length(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    try:
        callback = _train(tmp_path)
        run = callback.probe.run_object()
        assert (run["step"], run["tokens"], run["samples"]) == (3, None, 12)  # no length known
        callback.sequence_length = 12
        state = types.SimpleNamespace(global_step=4, num_input_tokens_seen=0)
        args = types.SimpleNamespace(
            per_device_train_batch_size=2, gradient_accumulation_steps=2, world_size=2
        )
        callback.on_step_end(args, state, None)
        run = callback.probe.run_object()
        assert (run["step"], run["tokens"], run["tokens_estimated"]) == (4, 96, True)
    finally:
        probe.stop()


class _Trainer:
    def __init__(self) -> None:
        self.global_step = 0
        self.world_size = 1
        self.max_steps = 10


class _Ids:
    """A tensor's shape and numel, enough for the callback."""

    def __init__(self, rows: int, length: int) -> None:
        self.shape = (rows, length)

    def numel(self) -> int:
        return self.shape[0] * self.shape[1]


def test_the_lightning_callback_steps_at_optimizer_boundaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytorch = types.ModuleType("lightning.pytorch")
    pytorch.Callback = type("Callback", (), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lightning", types.ModuleType("lightning"))
    monkeypatch.setitem(sys.modules, "lightning.pytorch", pytorch)
    monkeypatch.delitem(sys.modules, "hwdash.probe.lightning", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    from hwdash.probe.lightning import HwdashProbeCallback

    try:
        callback = HwdashProbeCallback(interval_s=30)
        trainer = _Trainer()
        callback.on_train_start(trainer, None)
        for batch_index in range(6):  # gradient accumulation over 2 batches: 3 optimizer steps
            if batch_index % 2 == 1:
                trainer.global_step += 1
            batch = {"input_ids": _Ids(4, 16)}
            callback.on_train_batch_end(trainer, None, None, batch, batch_index)
        run = callback.probe.run_object()
        assert (run["step"], run["tokens"], run["samples"]) == (3, 384, 24)
        assert run["max_steps"] == 10 and run["tokens_estimated"] is False
    finally:
        probe.stop()


def test_the_lightning_callback_without_lightning_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "lightning", None)
    monkeypatch.setitem(sys.modules, "lightning.pytorch", None)
    monkeypatch.setitem(sys.modules, "pytorch_lightning", None)
    monkeypatch.delitem(sys.modules, "hwdash.probe.lightning", raising=False)
    with pytest.raises(ImportError, match="needs Lightning: pip install lightning"):
        importlib.import_module("hwdash.probe.lightning")
