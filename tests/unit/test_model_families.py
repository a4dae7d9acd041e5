"""Model families read from their config.json: parameter counts against the published ones, the
config keys each family maps, and where their activations and KV cache differ (hand counts).

The config files under ``tests/data/model_configs/families/`` reproduce each model's
``config.json`` on the Hugging Face Hub (https://huggingface.co/<id>/blob/main/config.json):
EleutherAI/pythia-1.4b, EleutherAI/gpt-neox-20b, bigscience/bloom-560m, bigscience/bloom-7b1,
bigcode/starcoderbase-1b, bigcode/gpt_bigcode-santacoder, openai-community/gpt2 and gpt2-xl,
tiiuae/falcon-7b and falcon-40b, allenai/OLMo-1B-hf, allenai/OLMo-2-1124-7B, google-t5/t5-base and
google/flan-t5-large. Where each value was checked (and what could not be) is in SOURCES.md there.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hwdash.cli import main
from hwdash.core.estimator import (
    architecture,
    estimate_memory,
    kv_cache_bytes,
    layer_activation_bytes,
    training_activation_bytes,
)
from hwdash.core.models.config import model_from_config, model_from_config_file
from hwdash.core.models.params import count_parameters
from hwdash.core.plan import Attention, Method, Plan, Quant
from hwdash.core.specs import ModelSpec
from hwdash.errors import UsageError

FAMILIES = Path(__file__).resolve().parent.parent / "data" / "model_configs" / "families"


def _model(name: str) -> ModelSpec:
    return model_from_config_file(FAMILIES / name / "config.json")


def _config(name: str) -> dict:  # type: ignore[type-arg]
    config: dict = json.loads((FAMILIES / name / "config.json").read_text())  # type: ignore[type-arg]
    return config


#: (config folder, published count, where it is published). Exact counts must match within 1.5%.
PUBLISHED_EXACT = [
    # model card, Model details table: "n_parameters 20554567680"
    ("gpt-neox-20b", 20_554_567_680, "https://huggingface.co/EleutherAI/gpt-neox-20b"),
    # model cards, Technical Specifications: "559,214,592 parameters" / "7,069,016,064 parameters"
    ("bloom-560m", 559_214_592, "https://huggingface.co/bigscience/bloom-560m"),
    ("bloom-7b1", 7_069_016_064, "https://huggingface.co/bigscience/bloom-7b1"),
    # model card: "This is the smallest version of GPT-2, with 124M parameters."
    ("gpt2", 124_000_000, "https://huggingface.co/openai-community/gpt2"),
    # Radford et al. 2019, "Language Models are Unsupervised Multitask Learners": the four sizes
    # 117M, 345M, 762M and 1542M (48 layers, d_model 1600). The Hub checkpoint counts 1,557,611,200
    # with the same shapes, so the paper's figure is 1% lower; the 1.5% tolerance covers it.
    ("gpt2-xl", 1_542_000_000, "GPT-2 paper, model sizes table"),
    # Raffel et al. 2020 (arXiv:1910.10683) section 3.1.1: "a model with about 220 million parameters"
    ("t5-base", 220_000_000, "arXiv:1910.10683 section 3.1.1"),
    # Chung et al. 2022 (arXiv:2210.11416) Table 2: Flan-T5-Large, 780M params
    ("flan-t5-large", 780_000_000, "arXiv:2210.11416 Table 2"),
]

#: Published only as a rounded size: our count must round to it.
PUBLISHED_ROUNDED = [
    # "Falcon-7B is a 7B parameters causal decoder-only model" (model card)
    ("falcon-7b", 7.0, 0, "https://huggingface.co/tiiuae/falcon-7b"),
    # Allal et al. 2023 (arXiv:2301.03988), abstract: "We train 1.1B parameter models"
    ("gpt_bigcode-santacoder", 1.1, 1, "arXiv:2301.03988"),
    # model card, Model Details table: "OLMo 1B" (16 layers, hidden 2048, 16 heads)
    ("OLMo-1B-hf", 1.0, 0, "https://huggingface.co/allenai/OLMo-1B-hf"),
    # model card, "Model Card for OLMo 2 7B" (32 layers, hidden 4096, 32 heads). A finer published
    # figure was not found (the Hub page's "7.3B params" is its safetensors widget, not a
    # publication), so the exact count is checked by hand in test_olmo2_7b_by_hand below.
    ("OLMo-2-1124-7B", 7.0, 0, "https://huggingface.co/allenai/OLMo-2-1124-7B"),
]


@pytest.mark.parametrize(("name", "published", "source"), PUBLISHED_EXACT)
def test_parameter_count_matches_the_published_one(name: str, published: int, source: str) -> None:
    model = _model(name)
    counted = architecture(model).total_params
    assert abs(counted - published) / published < 0.015, (name, counted, published, source)
    # the catalog listing's counter agrees with the estimator's
    assert count_parameters(model) == counted


@pytest.mark.parametrize(("name", "billions", "digits", "source"), PUBLISHED_ROUNDED)
def test_parameter_count_rounds_to_the_published_size(
    name: str, billions: float, digits: int, source: str
) -> None:
    counted = architecture(_model(name)).total_params
    assert round(counted / 1e9, digits) == billions, (name, counted, source)


def test_pythia_non_embedding_parameters_match_the_model_card() -> None:
    # EleutherAI/pythia-1.4b model card, naming table: 1,414,647,808 total and 1,208,602,624
    # non-embedding parameters (embed_in and embed_out excluded: 2 x 50304 x 2048).
    arch = architecture(_model("pythia-1.4b"))
    assert arch.total_params == 1_414_647_808
    assert arch.total_params - arch.embedding_params - arch.lm_head_params == 1_208_602_624


def test_olmo_1b_by_hand() -> None:
    # allenai/OLMo configs/official/OLMo-1B.yaml: no biases and LayerNorms without weights, so 16
    # blocks of q, k, v, o (4 x 2048^2) and a SwiGLU of 3 x 2048 x 8192; one tied 50304 x 2048 table.
    expected = 16 * (4 * 2048**2 + 3 * 2048 * 8192) + 50304 * 2048
    assert architecture(_model("OLMo-1B-hf")).total_params == expected


def test_olmo2_7b_by_hand() -> None:
    # allenai/OLMo configs/official-1124/OLMo2-7B-stage1.yaml: 32 blocks of q, k, v, o (4 x 4096^2),
    # a SwiGLU of 3 x 4096 x 11008, the post-attention and post-feedforward RMSNorms (2 x 4096);
    # untied 100352 x 4096 embedding and head; the final RMSNorm. Olmo2Attention also holds q_norm
    # and k_norm weights (2 x 4096 per block), which the estimator leaves out (families.py, _olmo2).
    h, ffn, layers, vocab = 4096, 11008, 32, 100352
    qk_norm_weights = layers * 2 * h
    full = layers * (4 * h * h + 3 * h * ffn + 2 * h) + qk_norm_weights + 2 * vocab * h + h
    assert architecture(_model("OLMo-2-1124-7B")).total_params == full - qk_norm_weights


def test_falcon_40b_by_hand() -> None:
    # 60 blocks of: fused qkv 8192 x (128 + 2 x 8) x 64, dense 8192^2, MLP 2 x 8192 x 32768 (no
    # biases), ln_attn + ln_mlp (weight + bias); tied embedding 65024 x 8192; ln_f.
    block = 8192 * (128 + 16) * 64 + 8192**2 + 2 * 8192 * 32768 + 2 * 2 * 8192
    expected = 60 * block + 65024 * 8192 + 2 * 8192
    assert architecture(_model("falcon-40b")).total_params == expected


def test_starcoderbase_1b_by_hand() -> None:
    # A hand count of the config only: no copy of bigcode/starcoderbase-1b's config.json was found
    # to check n_inner 8192 and vocab_size 49152 against (see SOURCES.md); the model card gives
    # multi-query attention and the 8192-token context, and no exact parameter count.
    # 24 blocks of: c_attn 2048 -> 2048 + 2 x 128 (MQA) with bias, c_proj with bias, c_fc
    # 2048 -> 8192 and back with biases, two LayerNorms; tied wte 49152 x 2048, wpe 8192 x 2048, ln_f.
    block = (2048 * 2304 + 2304) + (2048 * 2048 + 2048) + (2048 * 8192 + 8192) + (8192 * 2048)
    block += 2048 + 2 * 2 * 2048
    expected = 24 * block + 49152 * 2048 + 8192 * 2048 + 2 * 2048
    assert architecture(_model("starcoderbase-1b")).total_params == expected


def test_each_family_maps_its_keys() -> None:
    neox = _model("pythia-1.4b")
    assert (neox.layers, neox.hidden_size, neox.heads, neox.intermediate_size) == (
        24,
        2048,
        16,
        8192,
    )
    assert neox.parallel_block and not neox.tied_embeddings and neox.attention_bias
    bloom = _model("bloom-7b1")
    assert (bloom.layers, bloom.hidden_size, bloom.heads) == (30, 4096, 32)
    assert bloom.intermediate_size == 4 * 4096 and bloom.embedding_norm
    assert bloom.position_encoding == "alibi" and bloom.eager_attention_only
    bigcode = _model("starcoderbase-1b")
    assert (bigcode.kv_heads, bigcode.heads, bigcode.learned_positions) == (1, 16, 8192)
    gpt2 = _model("gpt2")
    assert (gpt2.kv_heads, gpt2.learned_positions, gpt2.intermediate_size) == (12, 1024, 3072)
    assert gpt2.tied_embeddings
    falcon7 = _model("falcon-7b")
    assert (falcon7.kv_heads, falcon7.norms_per_layer, falcon7.head_dim) == (1, 1, 64)
    assert falcon7.parallel_block and falcon7.mlp_bias is False
    falcon40 = _model("falcon-40b")
    # the Hub config also says multi_query true: the new decoder architecture ignores it
    assert _config("falcon-40b")["multi_query"] is True
    assert (falcon40.kv_heads, falcon40.norms_per_layer) == (8, 2)
    olmo2 = _model("OLMo-2-1124-7B")
    assert olmo2.qk_norm and olmo2.mlp == "gated"
    assert _model("OLMo-1B-hf").norm_weights_per_layer == 0
    flan = _model("flan-t5-large")
    assert (flan.layers, flan.decoder_layers, flan.head_dim, flan.mlp) == (24, 24, 64, "gated")
    t5 = _model("t5-base")
    assert (t5.mlp, t5.mlp_activation, t5.tied_embeddings) == ("standard", "relu", True)


def test_gpt_bigcode_without_multi_query_is_multi_query() -> None:
    # transformers' GPTBigCodeConfig(multi_query=True): a config.json without the key has one
    # key/value head (the Hub configs all state it, so only a config without it tests the default)
    config = _config("starcoderbase-1b")
    assert config["multi_query"] is True
    unstated = {key: value for key, value in config.items() if key != "multi_query"}
    model = model_from_config(unstated, name="bigcode", source="bigcode.json")
    assert (model.kv_heads, model.heads) == (1, 16)
    assert architecture(model).total_params == architecture(_model("starcoderbase-1b")).total_params
    # multi-head when a config says so: c_attn 2048 -> 3 x 2048, 2 x 15 x 128 more outputs a block
    multi_head = model_from_config({**config, "multi_query": False}, name="mha", source="mha.json")
    assert multi_head.kv_heads == 16
    extra = 24 * (2 * 15 * 128) * (2048 + 1)  # weights and biases of the 30 more k/v heads' outputs
    assert architecture(multi_head).total_params - architecture(model).total_params == extra


def test_t5_gated_gelu_is_a_gated_ffn() -> None:
    # feed_forward_proj gated-gelu (T5 v1.1, Flan-T5): T5DenseGatedActDense's wi_0 and wi_1 (each
    # d_model x d_ff) and wo; relu (T5 v1): T5DenseActDense's wi and wo. One more d_model x d_ff
    # matrix (no biases) in each of the 24 encoder and 24 decoder blocks.
    config = _config("flan-t5-large")
    assert config["feed_forward_proj"] == "gated-gelu"
    gated = architecture(_model("flan-t5-large"))
    relu_config = {**config, "feed_forward_proj": "relu"}
    relu = architecture(model_from_config(relu_config, name="relu", source="relu.json"))
    assert gated.total_params - relu.total_params == (24 + 24) * 1024 * 2816
    # Activations kept for backward, per layer, bf16, t tokens, i = d_ff. relu: wi's output and
    # wo's input (2 e t i). gated-gelu: wi_0's and wi_1's outputs, the GELU's output and wo's input
    # (the product), plus what T5Config's "gelu_new" (tanh GELU, NewGELUActivation) keeps written
    # out: tanh's output, 0.5 x and 1 + tanh (7 e t i). The same attention and norms otherwise.
    t, i = 256, 2816
    per_layer = {
        name: layer_activation_bytes(arch, 1, t, 2, Attention.EAGER)
        for name, arch in (("gated", gated), ("relu", relu))
    }
    assert per_layer["gated"] - per_layer["relu"] == (7 - 2) * 2 * t * i


def test_old_key_spellings_read_the_same() -> None:
    # Falcon's RefinedWebModel configs (n_head, n_layer) and BLOOM's n_embed.
    new = _config("falcon-7b")
    old = {
        key: value
        for key, value in new.items()
        if key not in ("num_attention_heads", "num_hidden_layers", "model_type")
    }
    old.update({"model_type": "RefinedWebModel", "n_head": 71, "n_layer": 32})
    assert (
        architecture(model_from_config(old, name="rw", source="t")).total_params
        == architecture(_model("falcon-7b")).total_params
    )
    bloom = {k: v for k, v in _config("bloom-560m").items() if k != "hidden_size"}
    bloom["n_embed"] = 1024
    assert model_from_config(bloom, name="b", source="t").hidden_size == 1024


# -- activations and KV cache ----------------------------------------------------------------------


def test_mqa_caches_one_key_value_head() -> None:
    model = _model("starcoderbase-1b")
    arch = architecture(model)
    # 2 (K and V) x 24 layers x 1 head x 128 x seq x batch x 2 bytes
    assert kv_cache_bytes(arch, 3, 1000, 2) == 2 * 24 * 128 * 1000 * 3 * 2
    multi_head = architecture(
        model_from_config(
            {**_config("starcoderbase-1b"), "multi_query": False}, name="m", source="t"
        )
    )
    assert kv_cache_bytes(multi_head, 3, 1000, 2) == 16 * kv_cache_bytes(arch, 3, 1000, 2)


def test_encoder_decoder_caches_decoder_self_and_cross_attention() -> None:
    arch = architecture(_model("flan-t5-large"))
    # 24 decoder blocks, each a self- and a cross-attention cache of K and V, 16 heads x 64
    assert kv_cache_bytes(arch, 2, 512, 2) == 2 * (2 * 24) * 16 * 64 * 512 * 2 * 2
    inference = estimate_memory(
        Plan(model="t5", method=Method.INFERENCE, batch=2, seq=512), _model("flan-t5-large")
    )
    assert inference.per_gpu.kv_cache == kv_cache_bytes(arch, 2, 512, 2)


def test_gpt2_layer_is_korthikantis_count_with_its_dropout_masks() -> None:
    # Korthikanti et al. 2022 (arXiv:2205.05198) section 4.1 count 34 s b h for a GPT layer with a
    # fused attention kernel, 2 s b h of which are the two dropout masks. A GPT-2 layer in bf16
    # with SDPA, counted tensor by tensor:
    #   two LayerNorms: their inputs (2 x 2 t h) + fp32 mean and rstd (2 x 8 t)
    #   Q, K, V (3 x 2 t h) + the kernel's fp32 log-sum-exp (4 b a s)
    #   the inputs of c_attn (2 t h), attn c_proj (2 t h) and c_fc (2 t h)
    #   the c_fc output kept by GELU (2 t i) and the GELU output kept by c_proj (2 t i), i = 4 h
    b, s, h, a = 2, 256, 768, 12
    t = b * s
    expected = 2 * 2 * t * h + 2 * 8 * t + 3 * 2 * t * h + 4 * b * a * s + 3 * 2 * t * h
    expected += 2 * 2 * t * 4 * h
    assert expected == 32 * t * h + 16 * t + 4 * b * a * s
    # GPT-2's gelu_new is written elementwise: tanh's output, 0.5 x and 1 + tanh are kept as well
    # (3 x 2 t i; issue 14, traced on Phi-2's gelu_new MLP with bench/probe_gaps.py)
    expected += 3 * 2 * t * 4 * h
    # and the two residual-dropout masks Korthikanti count too (resid_pdrop 0.1 in GPT-2's
    # config): a bool mask each, 2 t h (issue 24; before, this layer was counted without them)
    expected += 2 * t * h
    arch = architecture(_model("gpt2"))
    assert layer_activation_bytes(arch, b, s, 2, Attention.SDPA) == expected


def test_parallel_block_keeps_the_shared_norm_input_once() -> None:
    parallel = _model("pythia-1.4b")
    sequential = model_from_config(
        {**_config("pythia-1.4b"), "use_parallel_residual": False}, name="seq", source="t"
    )
    b, s = 1, 512
    difference = layer_activation_bytes(
        architecture(sequential), b, s, 2, Attention.SDPA
    ) - layer_activation_bytes(architecture(parallel), b, s, 2, Attention.SDPA)
    # the second LayerNorm's own input: 2 bytes x t x hidden
    assert difference == 2 * b * s * 2048


def test_falcon_7b_single_norm() -> None:
    arch = architecture(_model("falcon-7b"))
    gpt_like = layer_activation_bytes(arch, 1, 128, 2, Attention.SDPA)
    # one LayerNorm: its input (2 t h) and its statistics (8 t); the rest as any layer
    t, h = 128, 4544
    norms = 2 * t * h + 8 * t
    attention = 2 * t * (h + 2 * 64) + 4 * 71 * 128
    # qkv and h_to_4h read the one LayerNorm's output, kept once (issue 14: traced on Phi-2's
    # parallel block, whose q/k/v and fc1 likewise share one input_layernorm); dense; 4h_to_h
    inputs = 2 * t * h + 2 * t * h + 2 * t * 4 * h
    mlp = 2 * t * 4 * h  # GELU's input
    assert gpt_like == norms + attention + inputs + mlp


def test_t5_training_counts_the_cross_attention() -> None:
    model = _model("flan-t5-large")
    arch = architecture(model)
    b, s = 1, 256
    t, h, inner, heads = b * s, 1024, 16 * 64, 16
    one_layer = layer_activation_bytes(arch, b, s, 2, Attention.EAGER)
    # per decoder block: its norm (fp32 copy 4 t h, fp32 variance 4 t, output 2 t h), Q, K, V and
    # the o projection's input (4 x 2 t inner), the eager scores (fp32 softmax + bf16 probs)
    cross = 4 * t * h + 4 * t + 2 * t * h + 4 * 2 * t * inner + (4 + 2) * b * heads * s * s
    encoder_output = 2 * t * h
    expected = 48 * one_layer + 24 * cross + encoder_output
    assert training_activation_bytes(arch, b, s, 2, Attention.EAGER, False) == expected


def test_attention_without_sdpa_is_counted_eager() -> None:
    model = _model("bloom-560m")
    sdpa = estimate_memory(Plan(model="b", method=Method.FULL, attention=Attention.SDPA), model)
    eager = estimate_memory(Plan(model="b", method=Method.FULL, attention=Attention.EAGER), model)
    assert sdpa.per_gpu == eager.per_gpu
    assert any("counted as eager" in warning for warning in sdpa.warnings)
    gpt2 = _model("gpt2")
    plan = Plan(model="g", method=Method.FULL)
    assert estimate_memory(plan.with_changes({"attention": Attention.EAGER}), gpt2).per_gpu != (
        estimate_memory(plan, gpt2).per_gpu
    )


def test_quantization_leaves_position_tables_in_16_bit() -> None:
    arch = architecture(_model("gpt2"))
    # wte 50257 x 768 (tied head) + wpe 1024 x 768 + 25 LayerNorms of 2 x 768
    assert arch.unquantized_params == 50257 * 768 + 1024 * 768 + 25 * 2 * 768
    plan = Plan(model="g", method=Method.INFERENCE, quant=Quant.INT8)
    weights = estimate_memory(plan, _model("gpt2")).per_gpu.weights
    # int8 blocks: 1 byte per weight and bias + an fp32 scale per output row (c_attn 3 x 768,
    # attn c_proj 768, c_fc 3072, mlp c_proj 768 per block)
    rows = 12 * (3 * 768 + 768 + 3072 + 768)
    assert weights == 2 * arch.unquantized_params + arch.quantizable_params + 4 * rows


# -- refusals ----------------------------------------------------------------------------------------


def test_unknown_family_is_refused_naming_it_and_the_supported_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "mpt", "d_model": 4096}))
    assert main(["plan", "--model", str(config)]) == 2
    err = capsys.readouterr().err
    assert "model_type 'mpt' is not supported" in err
    for family in ("gpt_neox", "bloom", "gpt_bigcode", "gpt2", "falcon", "olmo2", "t5", "llama"):
        assert family in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"n_layer": None}, "'n_layer'"),
        ({"n_head": 0}, "'n_head' must be a whole number"),
        ({"multi_query": "yes"}, "'multi_query' must be true or false"),
    ],
)
def test_bad_family_configs_name_the_key(change: dict, message: str) -> None:  # type: ignore[type-arg]
    config = {**_config("starcoderbase-1b"), **change}
    with pytest.raises(UsageError, match=message):
        model_from_config(config, name="bad", source="bad.json")


def test_bad_t5_projection_is_refused() -> None:
    with pytest.raises(UsageError, match="feed_forward_proj"):
        model_from_config(
            {**_config("t5-base"), "feed_forward_proj": "gated-nonsense"}, name="t", source="t"
        )


def test_falcon_with_alibi_runs_sdpa_and_refuses_flash() -> None:
    # transformers 5.24's FalconAttention adds ALiBi to the mask and calls SDPA: no s^2 scores
    # kept unless --attn eager (it was counted as eager-only, +68..+117% on falcon-rw-1b); its
    # flash-attention class raises on ALiBi, so --attn flash is counted as sdpa, with a warning.
    fields = {**_config("falcon-7b"), "alibi": True, "multi_query": False}
    model = model_from_config(fields, name="falcon-alibi", source="test")
    assert model.position_encoding == "alibi" and not model.eager_attention_only
    base = Plan(model="falcon-alibi", method=Method.FULL, seq=2048, grad_ckpt=False)
    sdpa = estimate_memory(base.model_copy(update={"attention": Attention.SDPA}), model)
    eager = estimate_memory(base.model_copy(update={"attention": Attention.EAGER}), model)
    flash = estimate_memory(base.model_copy(update={"attention": Attention.FLASH}), model)
    # eager keeps each layer's scores and probabilities: heads x s^2 per layer at least
    scores = model.layers * model.heads * 2048 * 2048 * 2
    assert eager.per_gpu.activations - sdpa.per_gpu.activations >= scores
    assert flash.per_gpu.activations == sdpa.per_gpu.activations
    assert any("refuses ALiBi" in warning for warning in flash.warnings)
    assert not any("ALiBi" in warning for warning in sdpa.warnings)


def test_gpt2_residual_dropout_keeps_two_one_byte_masks_per_block() -> None:
    # resid_pdrop (GPT2Config default 0.1) drops attention's and the MLP's c_proj outputs in
    # training: CUDA's fused dropout keeps a bool mask of each, t x h bytes, for backward.
    # Traced (families/gpt2, b4 s1024, --no-grad-ckpt): full -3.0% with and without dropout, LoRA
    # -2.7% / -2.8%: the masks are what the two configs' traces differ by.
    fields = _config("gpt2")
    dropped = model_from_config(fields, name="gpt2", source="test")
    plain = model_from_config({**fields, "resid_pdrop": 0.0}, name="gpt2", source="test")
    assert dropped.hidden_dropout == 0.1 and plain.hidden_dropout == 0.0
    tokens = 4 * 1024
    for method in (Method.FULL, Method.LORA):
        plan = Plan(model="gpt2", method=method, batch=4, seq=1024, grad_ckpt=False)
        extra = (
            estimate_memory(plan, dropped).per_gpu.activations
            - estimate_memory(plan, plain).per_gpu.activations
        )
        assert extra == dropped.layers * 2 * tokens * dropped.hidden_size
    with pytest.raises(UsageError, match="resid_pdrop"):
        model_from_config({**fields, "resid_pdrop": 1.5}, name="gpt2", source="test")
    # inference runs in eval mode: no masks
    inference = Plan(model="gpt2", method=Method.INFERENCE, batch=4, seq=1024)
    assert estimate_memory(inference, dropped).per_gpu.total == (
        estimate_memory(inference, plain).per_gpu.total
    )


def test_falcon_new_architecture_caches_every_query_head() -> None:
    # FalconAttention._split_heads broadcasts the 8 K/V heads of falcon-40b to its 128 query heads
    # and the reshape copies them: the cache (and the kept K, V) holds 128 heads, the weights 8.
    # Traced (families/falcon-40b, b2 s1024 inference; b1 s1024 LoRA): -0.1% each, where the cache
    # at 8 heads left the held-out falcon-11B inference row at -6.4%.
    model = _model("falcon-40b")
    arch = architecture(model)
    assert model.kv_expanded and model.kv_heads == 8 and model.heads == 128
    assert kv_cache_bytes(arch, 2, 1024, 2) == 2 * 60 * 128 * 64 * 1024 * 2 * 2
    assert not _model("falcon-7b").kv_expanded  # multi-query, old architecture: one K/V head
    plain = model.model_copy(update={"kv_expanded": False})
    t = 1024
    assert (
        layer_activation_bytes(arch, 1, t, 2, Attention.SDPA)
        - layer_activation_bytes(architecture(plain), 1, t, 2, Attention.SDPA)
        == 2 * 2 * t * (128 - 8) * 64
    )
