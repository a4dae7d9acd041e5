"""Fake-tensor calibration of hwdash's memory estimator (issue 5).

Builds Hugging Face models from catalog architectures (no weights, no network), runs training steps
and inference prefills on fake tensors under ``torch.distributed._tools.mem_tracker.MemTracker``,
and records the traced peak and its breakdown next to hwdash's estimate and the anchors' rules.
torch, transformers and peft are needed (the ``calibrate`` extra); nothing here is imported by
``hwdash`` itself.
"""
