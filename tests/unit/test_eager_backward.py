"""Issue 29 (found by set N's hamelsmu/deepspeed-lora rows, then traced): eager attention's
backward holds score-sized gradients on top of the layer's saved tensors, 6 bytes per score (the
probabilities' 16-bit gradient and its fp32 copy through the softmax's upcast) less the MLP's
tensors its backward has already freed. By hand on Llama-2-7B's shape (32 heads, hidden 4096, MLP
11008), bf16."""

from __future__ import annotations

from pathlib import Path

from hwdash.core.estimator import estimate_memory
from hwdash.core.estimator.activations import (
    EAGER_BACKWARD_SCORE_BYTES,
    eager_backward_transient_bytes,
    layer_activation_bytes,
)
from hwdash.core.estimator.architecture import architecture
from hwdash.core.models.config import model_from_config_file
from hwdash.core.plan import Attention, Plan

CONFIG = Path(__file__).resolve().parents[2] / "bench/data/whole_gpu_configs/llama-2-7b/config.json"
MODEL = model_from_config_file(CONFIG)
ARCH = architecture(MODEL)
E, I = 2, 11008  # noqa: E741 - the MLP's width, as the papers write it


def test_the_transient_by_hand() -> None:
    b, s = 4, 2048
    scores = b * 32 * s * s
    # gate, up and SiLU(gate) (3 e t i) and down_proj's input (e t i), freed by the MLP's backward
    freed = 4 * E * b * s * I
    assert EAGER_BACKWARD_SCORE_BYTES == 6
    assert eager_backward_transient_bytes(ARCH, b, s, E, Attention.EAGER) == 6 * scores - freed
    # short sequences: the freed MLP tensors outweigh the scores' gradients
    assert eager_backward_transient_bytes(ARCH, 4, 256, E, Attention.EAGER) == 0
    for fused in (Attention.SDPA, Attention.FLASH):
        assert eager_backward_transient_bytes(ARCH, b, s, E, fused) == 0


def _plan(**changes: object) -> Plan:
    fields: dict[str, object] = {
        "model": str(CONFIG),
        "method": "full",
        "precision": "bf16",
        "batch": 2,
        "seq": 4096,
        "attention": "eager",
        "grad_ckpt": True,
    }
    fields.update(changes)
    return Plan(**fields)  # type: ignore[arg-type]


def test_the_first_layers_backward_and_the_recomputed_layer_hold_it() -> None:
    # full training peaks at the end of backward: the first layer's backward, every gradient alive
    one = layer_activation_bytes(ARCH, 2, 4096, E, Attention.EAGER, weight_bytes=E)
    transient = eager_backward_transient_bytes(ARCH, 2, 4096, E, Attention.EAGER)
    assert transient > 0
    full = estimate_memory(_plan(), MODEL)
    assert full.peak_phase == "end of backward"
    assert dict(full.details)["model first layer's backward"] == one + transient
    # LoRA peaks at the start of backward, where the recomputed layer's backward holds it too
    lora = estimate_memory(
        _plan(method="lora", lora_targets=("q_proj", "v_proj"), lora_r=16, lora_dropout=0.0),
        MODEL,
    )
    targets = tuple(linear for linear in ARCH.linears if linear.name in ("q_proj", "v_proj"))
    one_lora = layer_activation_bytes(
        ARCH, 2, 4096, E, Attention.EAGER, weight_bytes=E, lora_targets=targets, lora_rank=16
    )
    assert dict(lora.details)["model recomputed layer"] == one_lora + transient
