"""Selective activation checkpointing (``--selective-ac op|N|K/N``), by hand for a
Llama-3.1-8B block (32 layers, hidden 4096, 32 heads, 8 KV heads of 128, MLP 14336) in bf16.

The op policy (``torchtitan/distributed/activation_checkpoint.py``) saves the odd ``aten.mm``
outputs of a block (q, v, gate, down of q, k, v, o, gate, up, down) and SDPA's output and
log-sum-exp; the layer policy checkpoints blocks N, 2N... in full.
"""

from __future__ import annotations

import pytest
from monitor_cli import run_plan

from hwdash.core.catalog import load_catalog
from hwdash.core.estimator.activations import layer_activation_bytes, training_activation_bytes
from hwdash.core.estimator.architecture import architecture
from hwdash.core.estimator.selective_ac import SelectiveAcError, op_saved_tensors
from hwdash.core.plan import Attention, Plan

B, S, E = 1, 4096, 2
T = B * S
#: One block's input, kept by every checkpointed block: 2 bytes x 4096 tokens x 4096.
INPUT = 33_554_432


@pytest.fixture(scope="module")
def llama():  # type: ignore[no-untyped-def]
    return architecture(load_catalog().models["llama-3.1-8b"])


def test_the_op_policy_saves_every_odd_matmul_and_sdpa_by_hand(llama) -> None:  # type: ignore[no-untyped-def]
    saved = op_saved_tensors(llama, B, S, E, Attention.SDPA)
    assert saved == [
        ("q_proj", 2 * T * 4096),  # mm 1
        ("v_proj", 2 * T * 1024),  # mm 3 (k_proj, mm 2, recomputed)
        ("gate_proj", 2 * T * 14336),  # mm 5 (o_proj, mm 4, recomputed)
        ("down_proj", 2 * T * 4096),  # mm 7 (up_proj, mm 6, recomputed)
        ("sdpa output", 2 * T * 4096),
        ("sdpa log-sum-exp", 4 * B * 32 * S),  # fp32, one per head and row
    ]
    assert sum(size for _, size in saved) == 227_016_704


def test_eager_attention_saves_only_the_matmuls(llama) -> None:  # type: ignore[no-untyped-def]
    names = [name for name, _ in op_saved_tensors(llama, B, S, E, Attention.EAGER)]
    assert names == ["q_proj", "v_proj", "gate_proj", "down_proj"]


def test_biased_projections_are_addmm_and_shift_the_count() -> None:
    # Qwen2.5's q/k/v have biases: aten.addmm, neither saved nor counted, so o_proj is mm 1
    qwen = architecture(load_catalog().models["qwen2.5-7b"])
    saved = op_saved_tensors(qwen, B, S, E, Attention.FLASH)
    assert saved == [("o_proj", 2 * T * 3584), ("up_proj", 2 * T * 18944)]


def _total(arch, selective_ac, grad_ckpt=False):  # type: ignore[no-untyped-def]
    return training_activation_bytes(
        arch, B, S, E, Attention.SDPA, grad_ckpt, selective_ac=selective_ac
    )


def test_op_keeps_each_blocks_input_and_saved_outputs_plus_one_recomputed(llama) -> None:  # type: ignore[no-untyped-def]
    one = layer_activation_bytes(llama, B, S, E, Attention.SDPA)
    assert _total(llama, "op") == 32 * (INPUT + 227_016_704) + one
    # between full checkpointing and none
    assert _total(llama, None, grad_ckpt=True) < _total(llama, "op") < _total(llama, None)


def test_every_nth_block_keeps_its_input_the_others_everything(llama) -> None:  # type: ignore[no-untyped-def]
    one = layer_activation_bytes(llama, B, S, E, Attention.SDPA)
    # N 4: blocks 4, 8... 32 checkpointed (8), 24 whole; block 32 is recomputed in backward
    assert _total(llama, "4") == 24 * one + 8 * INPUT + one
    # N 5: blocks 5... 30 (6), 26 whole; the last block is not checkpointed: nothing on top
    assert _total(llama, "5") == 26 * one + 6 * INPUT
    # N 1 is full checkpointing, N past the stack none
    assert _total(llama, "1") == _total(llama, None, grad_ckpt=True)
    assert _total(llama, "33") == _total(llama, None)


def test_a_ratio_checkpoints_k_of_every_n_blocks_evenly_spaced(llama) -> None:  # type: ignore[no-untyped-def]
    from hwdash.core.estimator.selective_ac import checkpointed_flags

    # fms-fsdp's ac_handler docstring: 1/2 [ac, no-ac, ...], 1/3 [no-ac, ac, no-ac, ...],
    # 2/3 [ac, no-ac, ac, ac, no-ac, ac, ...]
    assert checkpointed_flags("1/2", 4) == [True, False, True, False]
    assert checkpointed_flags("1/3", 6) == [False, True, False, False, True, False]
    assert checkpointed_flags("2/3", 6) == [True, False, True, True, False, True]
    one = layer_activation_bytes(llama, B, S, E, Attention.SDPA)
    # 3/4 of 32 blocks: 24 checkpointed (blocks 1, 2, 4, 5, 6, 8...: block 32 among them, so one
    # block is recomputed on top), 8 whole
    assert _total(llama, "3/4") == 8 * one + 24 * INPUT + one
    # 1/2: 16 checkpointed, block 32 is not: nothing on top
    assert _total(llama, "1/2") == 16 * one + 16 * INPUT
    assert _total(llama, "4/4") == _total(llama, None, grad_ckpt=True)


def test_the_op_policy_refuses_a_mixture_of_experts() -> None:
    mixtral = architecture(load_catalog().models["mixtral-8x7b"])
    with pytest.raises(SelectiveAcError, match=r"--selective-ac op .* mixture of experts"):
        _total(mixtral, "op")
    assert _total(mixtral, "2") > 0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"selective_ac": "0"}, "N of at least 1"),
        ({"selective_ac": "every"}, "neither op, a whole number"),
        ({"selective_ac": "5/4"}, "K from 1 to N"),
        ({"selective_ac": "0/4"}, "K from 1 to N"),
        ({"selective_ac": "1/2/3"}, "neither op, a whole number"),
        ({"selective_ac": "op", "grad_ckpt": True}, "exclude each other"),
        ({"selective_ac": "op", "tp": 2, "gpus": 2}, "--selective-recompute"),
        ({"selective_ac": "op", "method": "lora"}, "full training"),
        ({"selective_ac": "2", "method": "inference"}, "inference does not train"),
        ({"selective_ac": "2", "activation_offload": True}, "not modelled"),
    ],
)
def test_the_plan_refuses(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Plan.model_validate({"model": "llama-3.1-8b", "method": "full", **fields})


def test_lora_takes_the_layer_policy() -> None:
    assert Plan(model="llama-3.1-8b", method="lora", selective_ac="3").selective_ac == "3"  # type: ignore[arg-type]


def test_the_command_line_estimates_op_and_names_the_flag_on_bad_input(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ("--model", "llama-3.1-8b", "--method", "full", "--seq", "4096")
    status, out, _ = run_plan(capsys, *args, "--selective-ac", "op", "--json")
    assert status == 0, out
    status, _, err = run_plan(capsys, *args, "--selective-ac", "0")
    assert status == 2
    assert "--selective-ac" in err and "Traceback" not in err


def _checkpointing_words(plan: Plan, model: str) -> list[str]:
    from hwdash.core.planning.fit_knobs import knobs_for

    spec = load_catalog().models[model]
    knob = next(k for k in knobs_for(plan, spec, 8) if k.name == "grad_ckpt")
    return [setting.words for setting in knob.settings]


def test_make_it_fit_offers_the_op_policy_to_fsdp_full_training_first() -> None:
    fsdp = Plan(model="llama-3.1-8b", method="full", fsdp="full", gpus=8)  # type: ignore[arg-type]
    words = _checkpointing_words(fsdp, "llama-3.1-8b")
    assert words[0] == "selective activation checkpointing (torchtitan's op)"
    assert words[1] == "gradient checkpointing"
    # not without FSDP, not for LoRA, not for a MoE
    assert "torchtitan" not in " ".join(
        _checkpointing_words(Plan(model="llama-3.1-8b", method="full"), "llama-3.1-8b")  # type: ignore[arg-type]
    )
    lora = fsdp.with_changes({"method": "lora"})
    assert "torchtitan" not in " ".join(_checkpointing_words(lora, "llama-3.1-8b"))
    moe = fsdp.with_changes({"model": "mixtral-8x7b"})
    assert "torchtitan" not in " ".join(_checkpointing_words(moe, "mixtral-8x7b"))
    # from the op policy, full checkpointing turns it off
    op = fsdp.with_changes({"selective_ac": "op"})
    knob_words = _checkpointing_words(op, "llama-3.1-8b")
    assert knob_words[0] == "gradient checkpointing"
    assert op.with_changes({"grad_ckpt": True, "selective_ac": None}).grad_ckpt


@pytest.mark.parametrize("kind", ["trainer", "accelerate", "deepspeed", "hf-jobs"])
def test_every_export_says_it_does_not_carry_the_selective_policy(kind: str) -> None:
    from hwdash.core.plans.exports import uncarried_settings

    plan = Plan(model="llama-3.1-8b", method="full", fsdp="full", gpus=8, selective_ac="op")  # type: ignore[arg-type]
    assert "--selective-ac op" in uncarried_settings(plan, kind)
    assert not any(
        "selective" in w
        for w in uncarried_settings(plan.with_changes({"selective_ac": None}), kind)
    )


def test_an_encoder_refuses_the_selective_policy(capsys: pytest.CaptureFixture[str]) -> None:
    encoder = "tests/data/model_configs/encoders/deberta-v3-base"
    status, _, err = run_plan(capsys, "--model", encoder, "--method", "full", "--selective-ac", "2")
    assert status == 2
    assert "--selective-ac: torchtitan's selective checkpointing is counted for decoder" in err


def test_the_recomputed_flops_by_hand(llama) -> None:  # type: ignore[no-untyped-def]
    from hwdash.core.estimator.selective_ac import recompute_flops_per_token
    from hwdash.core.planning.run_time import flops_per_token

    n = llama.trained_matmul_params_per_token
    # op: k_proj, o_proj and up_proj (mm 2, 4, 6) again in each of 32 blocks, 2 FLOPs a weight
    per_block = 4096 * 1024 + 4096 * 4096 + 4096 * 14336
    assert per_block == 79_691_776
    assert recompute_flops_per_token("op", llama, n) == 2 * 32 * per_block
    # N 4: 8 of 32 blocks' forward again, a quarter of --grad-ckpt's extra forward (2 n)
    assert recompute_flops_per_token("4", llama, n) == 2 * n / 4
    assert recompute_flops_per_token(None, llama, n) == 0
    model = load_catalog().models["llama-3.1-8b"]
    plain = Plan(model="llama-3.1-8b", method="full")  # type: ignore[arg-type]
    op = plain.with_changes({"selective_ac": "op"})
    assert flops_per_token(op, model) == flops_per_token(plain, model) + 2 * 32 * per_block
    assert flops_per_token(plain, model) < flops_per_token(op, model)
    assert flops_per_token(op, model) < flops_per_token(
        plain.with_changes({"grad_ckpt": True}), model
    )
