"""Encoder-only models from their config.json (BERT, RoBERTa, DeBERTa-v3, ModernBERT): parameter
counts (equal to the traced models'), the native module names LoRA targets, the head, dropout, the
refusals, and the CLI estimate against the traced peaks committed in bench/data/encoder_heldout.csv.

The configs under ``tests/data/model_configs/encoders/`` are the published ones (SOURCES.md there).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from hwdash.cli import main
from hwdash.core.estimator import architecture, estimate_memory
from hwdash.core.estimator.architecture import resolve_lora_targets
from hwdash.core.estimator.encoder import cpu_trace_extra_bytes, layer_activation_bytes
from hwdash.core.models.config import model_from_config_file
from hwdash.core.plan import Attention, Method, Plan, Precision
from hwdash.core.specs import ModelSpec

ROOT = Path(__file__).resolve().parent.parent.parent
ENCODERS = ROOT / "tests" / "data" / "model_configs" / "encoders"
HELD_OUT = ROOT / "bench" / "data" / "encoder_heldout.csv"


def _path(name: str) -> Path:
    return ENCODERS / name / "config.json"


def _model(name: str) -> ModelSpec:
    return model_from_config_file(_path(name))


#: Every parameter of the model transformers 5.24 builds from the config (AutoModelForMaskedLM),
#: as the fake-tensor trace counts them (``hwdash plan --trace --json``: trace.total_params).
TRACED_PARAMS = [
    ("bert-base-uncased", 109_514_298),
    ("roberta-base", 124_697_433),
    ("deberta-v3-base", 184_551_780),
    ("modernbert-base", 149_655_232),
]


@pytest.mark.parametrize(("name", "traced"), TRACED_PARAMS)
def test_parameter_count_is_the_traced_models(name: str, traced: int) -> None:
    assert architecture(_model(name)).total_params == traced


def test_bert_reads_its_keys() -> None:
    model = _model("bert-base-uncased")
    assert model.encoder_only and model.encoder_head == "mlm" and model.encoder_family == "bert"
    assert (model.layers, model.hidden_size, model.heads, model.intermediate_size) == (
        12,
        768,
        12,
        3072,
    )
    assert (model.type_vocab_size, model.learned_positions) == (2, 512)
    assert (model.attention_dropout, model.hidden_dropout) == (0.1, 0.1)


def test_deberta_v3_has_relative_positions_and_no_absolute_ones() -> None:
    model = _model("deberta-v3-base")
    assert model.encoder_family == "deberta"
    assert model.learned_positions == 0  # position_biased_input false
    assert model.relative_position_buckets == 512  # 2 x position_buckets 256
    assert model.type_vocab_size == 0
    assert model.eager_attention_only


def test_modernbert_alternates_local_and_global_attention() -> None:
    model = _model("modernbert-base")
    assert (model.local_attention_window, model.global_attention_every) == (128, 3)
    assert model.mlp == "gated" and model.norm_bias is False and model.attention_bias is False
    assert model.attention_dropout == 0.0


@pytest.mark.parametrize(
    ("name", "names"),
    [
        (
            "bert-base-uncased",
            ["query", "key", "value", "attention.output.dense", "intermediate.dense"],
        ),
        ("deberta-v3-base", ["query_proj", "key_proj", "value_proj"]),
        ("modernbert-base", ["Wqkv", "attn.Wo", "Wi", "mlp.Wo"]),
    ],
)
def test_lora_targets_by_native_module_names(name: str, names: list[str]) -> None:
    arch = architecture(_model(name))
    chosen = resolve_lora_targets(arch, tuple(names))
    assert [linear.name for linear in chosen] == names


def test_classification_head_from_architectures(tmp_path: Path) -> None:
    config = json.loads(_path("roberta-base").read_text())
    config["architectures"] = ["RobertaForSequenceClassification"]
    config["id2label"] = {"0": "neg", "1": "neu", "2": "pos"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    model = model_from_config_file(path)
    assert (model.encoder_head, model.num_labels) == ("classification", 3)
    mlm = architecture(_model("roberta-base")).total_params
    # no MLM transform (h*h + h + 2h) nor decoder bias (V); a RobertaClassificationHead instead
    h, v = 768, 50265
    expected = mlm - (h * h + h + 2 * h + v) + (h * h + h + 3 * h + 3)
    assert architecture(model).total_params == expected


def _plan(name: str, **fields: object) -> Plan:
    return Plan(model=str(_path(name)), batch=8, seq=512, **fields)  # type: ignore[arg-type]


def test_attention_dropout_keeps_scores_in_eager_but_not_in_sdpa() -> None:
    model = _model("bert-base-uncased")
    eager = layer_activation_bytes(model, 8, 512, 2, 2, Attention.EAGER)
    sdpa = layer_activation_bytes(model, 8, 512, 2, 2, Attention.SDPA)
    scores = 8 * 12 * 512 * 512
    # eager bf16 with dropout: softmax output (2) + mask (1) + dropped probabilities (2) per score;
    # SDPA instead keeps its output and a log-sum-exp, no s^2 tensor
    assert eager - sdpa == 5 * scores - (2 * 8 * 512 * 768 + 4 * 8 * 12 * 512)
    no_dropout = model.model_copy(update={"attention_dropout": 0.0})
    assert layer_activation_bytes(no_dropout, 8, 512, 2, 2, Attention.EAGER) == eager - 3 * scores


def _held_out(model: str, plan: str) -> tuple[int, str]:
    with HELD_OUT.open(encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if (row["model"], row["plan"]) == (model, plan):
                return int(row["traced_peak"]), row["arguments"]
    raise AssertionError(f"{model} {plan} is not in {HELD_OUT}")


@pytest.mark.parametrize(
    ("plan_name", "method", "precision", "attention"),
    [
        ("full-fp32", "full", "fp32", "sdpa"),
        ("full-bf16-eager", "full", "bf16", "eager"),
        ("lora", "lora", "bf16", "sdpa"),
    ],
)
def test_cli_plan_is_near_the_traced_peak(
    capsys: pytest.CaptureFixture[str],
    plan_name: str,
    method: str,
    precision: str,
    attention: str,
) -> None:
    """The estimate without the overhead guesses, plus what a CPU trace keeps beyond CUDA (masks in
    the input's dtype, SDPA's fp32 math kernel with dropout), is within 5% of the traced peak."""
    traced, arguments = _held_out("bert-base-uncased", plan_name)
    assert (
        main(["plan", "--model", str(_path("bert-base-uncased")), "--json", *arguments.split()])
        == 0
    )
    document = json.loads(capsys.readouterr().out)
    estimate = document["memory"]["allocated"]
    plan = _plan(
        "bert-base-uncased",
        method=Method(method),
        precision=Precision(precision),
        attention=Attention(attention),
    )
    lora = plan.method is not Method.FULL
    weight_bytes = 4 if lora else (4 if precision == "fp32" else 2)
    element_bytes = 4 if precision == "fp32" else 2
    estimate += cpu_trace_extra_bytes(
        plan, _model("bert-base-uncased"), element_bytes, weight_bytes
    )
    assert estimate == pytest.approx(traced, rel=0.05)


def test_inference_is_one_forward_without_kv_cache(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(_path("modernbert-base"))
    assert main(["plan", "--model", path, "--method", "inference", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["memory"]["kv_cache"] == 0
    assert any("one forward pass" in warning for warning in document["warnings"])


@pytest.mark.parametrize("method", ["ppo", "grpo"])
def test_rl_on_an_encoder_is_refused_naming_why(
    capsys: pytest.CaptureFixture[str], method: str
) -> None:
    assert main(["plan", "--model", str(_path("bert-base-uncased")), "--method", method]) == 2
    err = capsys.readouterr().err
    assert "encoder-only" in err and "generating policy" in err
    assert "Traceback" not in err


def test_tensor_parallel_encoder_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(_path("roberta-base"))
    assert main(["plan", "--model", path, "--method", "full", "--tp", "2", "--gpus", "2"]) == 2
    assert "not modelled for encoder-only" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"embedding_size": 128}, "embedding_size"),
        ({"share_att_key": False}, "share_att_key"),
        ({"attention_probs_dropout_prob": 1.5}, "'attention_probs_dropout_prob' must be"),
    ],
)
def test_unsupported_deberta_settings_are_refused_naming_the_key(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    change: dict,
    message: str,  # type: ignore[type-arg]
) -> None:
    config = {**json.loads(_path("deberta-v3-base").read_text()), **change}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main(["plan", "--model", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_lora_trains_the_head_dense_and_the_classifier(tmp_path: Path) -> None:
    config = {**json.loads(_path("bert-base-uncased").read_text())}
    config["architectures"] = ["BertForSequenceClassification"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    model = model_from_config_file(path)
    estimate = estimate_memory(Plan(model=str(path), method=Method.LORA, seq=128), model)
    # r16 on 6 linears of 12 blocks + the pooler's dense (all-linear), and the classifier
    # (768 x 2 + 2) that PEFT's SEQ_CLS trains in full
    h, inter, r = 768, 3072, 16
    blocks = 12 * r * (4 * (h + h) + (h + inter) + (inter + h))
    assert estimate.trainable_params == blocks + r * (h + h) + (h * 2 + 2)
