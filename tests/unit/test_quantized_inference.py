"""``--quant`` for inference plans: weight bytes per mode against a hand count, the dequantisation
workspace, what stays 16-bit, and the refusals."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from hwdash.cli import main
from hwdash.core.estimator import architecture, estimate_memory
from hwdash.core.estimator.quantization import (
    dequantization_workspace_bytes,
    quantized_linear_bytes,
    quantized_weight_bytes,
)
from hwdash.core.plan import Method, Plan, Quant
from hwdash.core.specs import ModelSpec

#: A small Llama-style model whose bytes are easy to count by hand.
SMALL = ModelSpec(
    id="small",
    name="small",
    layers=2,
    hidden_size=256,
    heads=4,
    kv_heads=4,
    head_dim=64,
    intermediate_size=512,
    vocab_size=1000,
    max_context=4096,
    source="test",
)
# Per layer: q, k, v, o 4 x 256 x 256 = 262,144; gate, up, down 3 x 256 x 512 = 393,216;
# 655,360 per layer, 1,310,720 over both layers (the quantized block linears).
LINEARS = 1_310_720
# Embedding and LM head 2 x 1000 x 256 = 512,000; RMSNorm weights (2 per layer + final) 5 x 256.
UNQUANTIZED = 512_000 + 1_280
# Output rows per layer: q, k, v, o 4 x 256, gate and up 2 x 512, down 256 = 2,304.
ROWS = 2 * 2_304
# Input features per layer: q, k, v, o 4 x 256, gate, up 2 x 256, down 512 = 2,048.
INPUTS = 2 * 2_048


def test_the_hand_counted_split_is_the_architectures() -> None:
    arch = architecture(SMALL)
    assert arch.quantizable_params == LINEARS
    assert arch.unquantized_params == UNQUANTIZED


@pytest.mark.parametrize(
    ("quant", "linear_bytes"),
    [
        # QLoRA section 3: 4 bits + 0.127 bits of double-quantized constants per weight.
        (Quant.NF4, LINEARS * (4 + 0.127) / 8),
        # LLM.int8(): 1 byte per weight + one fp32 absmax per output row.
        (Quant.INT8, LINEARS * 1 + ROWS * 4),
        # AWQ group 128: 4 bits + an fp16 scale and a 4-bit zero per 128 weights.
        (Quant.AWQ_4, LINEARS * (0.5 + 2.5 / 128)),
        # GPTQ: as AWQ plus an int32 g_idx per input feature of every matrix.
        (Quant.GPTQ_4, LINEARS * (0.5 + 2.5 / 128) + INPUTS * 4),
    ],
)
def test_weight_bytes_per_mode_match_the_hand_count(quant: Quant, linear_bytes: float) -> None:
    arch = architecture(SMALL)
    assert quantized_linear_bytes(arch, quant) == pytest.approx(linear_bytes)
    expected = linear_bytes + 2 * UNQUANTIZED
    assert quantized_weight_bytes(arch, quant, 2) == pytest.approx(expected)
    estimate = estimate_memory(Plan(model="small", method=Method.INFERENCE, quant=quant), SMALL)
    assert estimate.per_gpu.weights == pytest.approx(expected, abs=1)


def test_embeddings_and_head_stay_16_bit() -> None:
    # Tying the head removes 256,000 16-bit parameters, whatever the quantization.
    tied = SMALL.model_copy(update={"tied_embeddings": True})
    for quant in (Quant.NF4, Quant.INT8, Quant.GPTQ_4, Quant.AWQ_4):
        untied_bytes = quantized_weight_bytes(architecture(SMALL), quant, 2)
        tied_bytes = quantized_weight_bytes(architecture(tied), quant, 2)
        assert untied_bytes - tied_bytes == pytest.approx(2 * 256_000)


def test_quantized_checkpoint_and_quant_flag_agree() -> None:
    # --quant awq-4 / int8 on a 16-bit model and a checkpoint whose config.json says 4 or 8 bits
    # go through the same count.
    for bits, quant in ((4, Quant.AWQ_4), (8, Quant.INT8)):
        checkpoint = SMALL.model_copy(update={"checkpoint_bits": bits})
        plain = estimate_memory(Plan(model="s", method=Method.INFERENCE, quant=quant), SMALL)
        stored = estimate_memory(Plan(model="s", method=Method.INFERENCE), checkpoint)
        assert plain.per_gpu.weights == stored.per_gpu.weights


def test_quant_on_a_quantized_checkpoint_is_ignored_with_a_warning() -> None:
    checkpoint = SMALL.model_copy(update={"checkpoint_bits": 4})
    plain = estimate_memory(Plan(model="s", method=Method.INFERENCE), checkpoint)
    asked = estimate_memory(Plan(model="s", method=Method.INFERENCE, quant=Quant.INT8), checkpoint)
    assert asked.per_gpu.weights == plain.per_gpu.weights
    assert any("already quantized to 4 bits" in warning for warning in asked.warnings)


def test_dequantisation_workspace() -> None:
    arch = architecture(SMALL)
    largest = 256 * 512  # gate/up/down are the largest matrices
    tokens = 3 * 100
    for quant in (Quant.NF4, Quant.GPTQ_4, Quant.AWQ_4):
        assert dequantization_workspace_bytes(arch, quant, tokens, 2) == 2 * largest
    # int8: the int8 input of the largest matrix plus its int32 result (gate: 256 in, 512 out)
    assert dequantization_workspace_bytes(arch, Quant.INT8, tokens, 2) == tokens * 256 + (
        4 * tokens * 512
    )
    plan = Plan(model="s", method=Method.INFERENCE, batch=3, seq=100)
    base = estimate_memory(plan, SMALL)
    nf4 = estimate_memory(plan.with_changes({"quant": Quant.NF4}), SMALL)
    assert nf4.per_gpu.activations - base.per_gpu.activations == 2 * largest
    assert any("dequantisation workspace" in label for label, _ in nf4.details)


def test_quant_splits_over_gpus_like_the_16_bit_weights() -> None:
    one = estimate_memory(Plan(model="s", method=Method.INFERENCE, quant=Quant.NF4), SMALL)
    two = estimate_memory(Plan(model="s", method=Method.INFERENCE, quant=Quant.NF4, gpus=2), SMALL)
    assert two.per_gpu.weights == pytest.approx(one.per_gpu.weights / 2, abs=1)


def test_a_7b_model_in_nf4_is_about_a_third_of_bf16() -> None:
    # Llama-2-7B shape (arXiv:2307.09288): 6.74B parameters, of which 0.26B embedding + head.
    llama = SMALL.model_copy(
        update={
            "layers": 32,
            "hidden_size": 4096,
            "heads": 32,
            "kv_heads": 32,
            "head_dim": 128,
            "intermediate_size": 11008,
            "vocab_size": 32000,
        }
    )
    bf16 = estimate_memory(Plan(model="l", method=Method.INFERENCE), llama).per_gpu.weights
    nf4 = estimate_memory(Plan(model="l", method=Method.INFERENCE, quant=Quant.NF4), llama)
    # 6.48B linears x 0.516 bytes + 0.26B x 2 bytes = 3.87 GB, against 13.5 GB in bf16.
    assert nf4.per_gpu.weights / 1e9 == pytest.approx(3.87, abs=0.02)
    assert bf16 / 1e9 == pytest.approx(13.48, abs=0.02)


def test_quant_needs_an_inference_plan() -> None:
    with pytest.raises(ValidationError, match="qlora"):
        Plan(model="s", method=Method.LORA, quant=Quant.NF4)


def test_cli_refuses_quant_with_training(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["plan", "--model", "qwen2.5-7b", "--method", "lora", "--quant", "nf4"])
    err = capsys.readouterr().err
    assert status == 2
    assert "--quant" in err and "qlora" in err
    assert "Traceback" not in err


def test_cli_refuses_an_unknown_quant(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["plan", "--model", "qwen2.5-7b", "--method", "inference", "--quant", "int3"])
    assert info.value.code == 2
    assert "--quant" in capsys.readouterr().err


def test_cli_shows_quant_in_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--model", "qwen2.5-7b", "--method", "inference", "--quant", "gptq-4"]
    assert main(argv) == 0
    assert "gptq-4 weights" in capsys.readouterr().out
    assert main([*argv, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["plan"]["quant"] == "gptq-4"
    assert main(["plan", "--model", "qwen2.5-7b", "--method", "inference", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert document["memory"]["weights"] < plain["memory"]["weights"] / 2


def test_fit_offers_int8_then_nf4_for_inference_only() -> None:
    from hwdash.core.planning.fit_options import knobs_for
    from hwdash.core.planning.run_time import slowdown_ids

    inference = Plan(model="s", method=Method.INFERENCE)
    knob = next(k for k in knobs_for(inference, SMALL, 1) if k.name == "quant")
    assert [setting.updates["quant"] for setting in knob.settings] == [Quant.INT8, Quant.NF4]
    assert not knob.keeps_experiment
    assert knob.settings[0].slowdown_keys == ("int8-inference",)
    assert slowdown_ids(inference.with_changes({"quant": Quant.INT8})) == {"int8-inference"}
    # not for training, nor when already quantized, nor on a quantized checkpoint
    assert all(k.name != "quant" for k in knobs_for(Plan(model="s"), SMALL, 1))
    quantized = inference.with_changes({"quant": Quant.NF4})
    assert all(k.name != "quant" for k in knobs_for(quantized, SMALL, 1))
    checkpoint = SMALL.model_copy(update={"checkpoint_bits": 4})
    assert all(k.name != "quant" for k in knobs_for(inference, checkpoint, 1))


def test_catalog_has_the_int8_inference_slowdown() -> None:
    from hwdash.core.catalog import load_catalog

    entry = load_catalog(include_user=False).slowdowns["int8-inference"]
    assert entry.factor > 1 and "arXiv:2208.07339" in entry.source
