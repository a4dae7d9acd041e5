"""Context, Ulysses sequence and expert parallelism (issue 30) against hand computations.

Two models with their config.json dimensions: Llama-3.1-8B (dense) with ``--cp 4`` at 128k tokens,
and Mixtral-8x7B (8 experts, top-2) with ``--ep 8``. Each number below is written out from the
papers (Korthikanti et al. 2022 Table 2 for one layer; Liu et al. 2023 ring attention; GShard /
Switch for the expert split), not from the estimator's helpers.
"""

from __future__ import annotations

import pytest

from hwdash.commands.plan_inputs import _usage_error
from hwdash.core.estimator import architecture
from hwdash.core.estimator.parallelism import megatron_stage
from hwdash.core.plan import Plan
from hwdash.core.planning.fit import check_plan_for_model
from hwdash.core.specs import ModelSpec
from hwdash.errors import UsageError

LLAMA_8B = ModelSpec(
    id="llama-3.1-8b-test",
    name="Llama-3.1-8B",
    layers=32,
    hidden_size=4096,
    heads=32,
    kv_heads=8,
    head_dim=128,
    intermediate_size=14336,
    vocab_size=128256,
    max_context=131072,
    source="meta-llama/Llama-3.1-8B config.json",
)
MIXTRAL = ModelSpec(
    id="mixtral-8x7b-test",
    name="Mixtral-8x7B",
    layers=32,
    hidden_size=4096,
    heads=32,
    kv_heads=8,
    head_dim=128,
    intermediate_size=14336,
    vocab_size=32000,
    experts=8,
    experts_per_token=2,
    max_context=32768,
    source="mistralai/Mixtral-8x7B-v0.1 config.json",
)
H, INTER, Q, KV = 4096, 14336, 32 * 128, 8 * 128


def _plan(**fields: object) -> Plan:
    base: dict[str, object] = {
        "model": "x",
        "method": "full",
        "precision": "mixed",
        "batch": 1,
        "zero": 1,
        "grad_accum": 1,
        "attention": "sdpa",
    }
    return Plan.model_validate({**base, **fields})


def _layer_bytes(tokens: float, experts_per_token: int = 1) -> float:
    """Korthikanti et al. Table 2 with e = 2 bytes, no dropout, a fused attention kernel (tp 1):
    the norm/QKV/MLP inputs 4 e t h; Q and K, V, the output projection's input; SwiGLU's gate-up
    output and product 3 e t i (per routed expert copy); the kernel's fp32 log-sum-exp 4 a t."""
    return (
        8 * tokens * H
        + 2 * tokens * (Q + KV)
        + 2 * tokens * KV
        + 2 * tokens * Q
        + 6 * tokens * INTER * experts_per_token
        + 4 * 32 * tokens
    )


def test_llama_8b_cp4_at_128k_activations_by_hand() -> None:
    plan = _plan(seq=131072, cp=4, gpus=4)
    stage = megatron_stage(plan, architecture(LLAMA_8B), 4, 0)
    tokens = 131072 / 4  # each CP rank holds s/cp = 32,768 tokens (Liu et al. section 3)
    layers = 32 * _layer_bytes(tokens)
    # ring: the next K/V block and the dK/dV block in flight: 2 x (K + V) x e x s/cp x kv_dim
    ring = 2 * 2 * 2 * tokens * KV
    # last stage: the final norm's and the output layer's inputs (2 e s h), fp32 logits (4 s v) and
    # beside them the bf16 logits or their gradient (2 s v, Megatron's cross_entropy.py)
    head = 2 * 2 * tokens * H + (4 + 2) * tokens * 128256
    assert stage.activations == pytest.approx(layers + ring + head, rel=1e-12)
    # 32 layers x 32,768 tokens without recomputation: 160.4 GiB per GPU (a quarter of the 128k
    # sequence's, plus the ring's blocks)
    assert stage.activations / 2**30 == pytest.approx(160.36, abs=0.01)
    # context parallelism keeps every weight on every rank; the distributed optimizer shards the
    # master copy and Adam states (12 bytes/param) over data x context parallel ranks (4)
    params = LLAMA_8B_PARAMS
    assert stage.params == pytest.approx(params, rel=1e-12)
    assert stage.optimizer == pytest.approx(params * 12 / 4, rel=1e-12)


# embeddings and head 2 x 128256 x 4096, 32 blocks of (q, k, v, o: 2 x 4096^2 + 2 x 4096 x 1024;
# MLP 3 x 4096 x 14336; 2 norms), the final norm
LLAMA_8B_PARAMS = 2 * 128256 * H + 32 * (2 * H * Q + 2 * H * KV + 3 * H * INTER + 2 * H) + H


def test_mixtral_ep8_expert_states_and_activations_by_hand() -> None:
    plan = _plan(seq=4096, ep=8, gpus=8)
    stage = megatron_stage(plan, architecture(MIXTRAL), 8, 0)
    expert = 3 * H * INTER  # one expert's w1, w3, w2 (SwiGLU)
    dense = 2 * 32000 * H + 32 * (2 * H * Q + 2 * H * KV + 2 * H + 8 * H) + H  # + router h x 8
    # GShard / Switch: each of the 8 EP ranks holds 8/8 = 1 expert of every layer
    assert stage.params == pytest.approx(dense + 32 * expert, rel=1e-12)
    # the distributed optimizer: dense states over the 8 data-parallel ranks, each expert's over
    # its own data-parallel group, 8 / (tp 1 x pp 1 x ep 8) = 1 rank
    assert stage.optimizer == pytest.approx(dense * 12 / 8 + 32 * expert * 12, rel=1e-12)
    assert stage.weights / 2**30 == pytest.approx((dense + 32 * expert) * 2 / 2**30, rel=1e-12)
    tokens = 4096
    # all-to-all dispatch (Megatron's alltoall dispatcher): each layer keeps the t x k received
    # token copies (e t k h) as its experts' input; the send copy of the running layer on top
    dispatched = 2 * tokens * 2 * H
    layers = 32 * (_layer_bytes(tokens, experts_per_token=2) + dispatched)
    head = 2 * 2 * tokens * H + (4 + 2) * tokens * 32000  # fp32 and bf16 logits
    assert stage.activations == pytest.approx(layers + dispatched + head, rel=1e-12)


def test_ep1_and_cp1_are_the_plain_megatron_stage() -> None:
    arch = architecture(MIXTRAL)
    plain = megatron_stage(_plan(seq=4096, tp=2, gpus=8), arch, 8, 0)
    same = megatron_stage(_plan(seq=4096, tp=2, gpus=8, ep=1, cp=1), arch, 8, 0)
    assert plain == same
    split = megatron_stage(_plan(seq=4096, tp=2, gpus=8, ep=4), arch, 8, 0)
    assert split.params < plain.params


@pytest.mark.parametrize(
    ("fields", "flag"),
    [
        ({"seq": 1000, "cp": 3, "gpus": 6}, "--cp"),
        ({"seq": 4096, "cp": 2, "sp_ulysses": 2, "gpus": 4}, "--cp"),
        ({"seq": 4096, "cp": 4, "gpus": 6}, "--gpus"),
        ({"seq": 4096, "ep": 3, "gpus": 8}, "--gpus"),
        ({"seq": 4096, "sp_ulysses": 2, "gpus": 4, "fsdp": "full", "zero": 0}, "--sp-ulysses"),
        ({"seq": 4096, "cp": 2, "gpus": 4, "method": "lora", "zero": 0}, "--cp"),
        ({"seq": 4096, "cp": 2, "gpus": 4, "attention": "eager"}, "--cp"),
        ({"seq": 4096, "sp_ulysses": 2, "gpus": 4, "zero": 0, "method": "lora"}, "--sp-ulysses"),
    ],
)
def test_refusals_name_the_flag(fields: dict[str, object], flag: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as caught:
        _plan(**fields)
    assert _usage_error(caught.value).flag == flag


def test_model_refusals_name_the_flag() -> None:
    with pytest.raises(UsageError) as caught:
        check_plan_for_model(_plan(seq=4096, ep=2, gpus=2), LLAMA_8B)
    assert caught.value.flag == "--ep"
    with pytest.raises(UsageError) as caught:
        check_plan_for_model(_plan(seq=4096, ep=16, gpus=16), MIXTRAL)
    assert caught.value.flag == "--ep" and "8 experts" in str(caught.value)
    ulysses = _plan(seq=4096, sp_ulysses=16, gpus=16, zero=3)
    with pytest.raises(UsageError) as caught:
        check_plan_for_model(ulysses, LLAMA_8B)
    assert caught.value.flag == "--sp-ulysses"


def test_make_it_fit_offers_context_parallel_for_a_long_sequence() -> None:
    from hwdash.core.planning.fit_knobs import knobs_for

    def offered(plan: Plan, model: ModelSpec) -> dict[str, list[dict[str, object]]]:
        knobs = knobs_for(plan, model, 8)
        return {k.name: [dict(s.updates) for s in k.settings] for k in knobs}

    long = offered(_plan(seq=131072, tp=2, gpus=8), LLAMA_8B)
    assert [u["cp"] for u in long["cp"]] == [2, 4]  # 8 GPUs / tp 2 leaves 4 for context
    assert "cp" not in offered(_plan(seq=4096, tp=2, gpus=8), LLAMA_8B)
    # DeepSpeed plans split by Ulysses (heads and KV heads divisible: 8 KV heads)
    ulysses = offered(_plan(seq=131072, gpus=8, zero=3), LLAMA_8B)
    assert [u["sp_ulysses"] for u in ulysses["sp_ulysses"]] == [2, 4, 8]
    assert [u["ep"] for u in offered(_plan(seq=4096, tp=1, pp=2, gpus=8), MIXTRAL)["ep"]] == [2, 4]
    # a cp setting is a valid plan that needs less per GPU than the plan without it
    arch = architecture(LLAMA_8B)
    base = _plan(seq=131072, tp=2, gpus=8)
    split = base.with_changes(long["cp"][-1])
    assert megatron_stage(split, arch, 8, 0).total < megatron_stage(base, arch, 8, 0).total


def test_accelerate_export_carries_parallelism_config() -> None:
    from hwdash.core.plans.exports import accelerate_config

    cp = _plan(seq=131072, cp=4, gpus=8, fsdp="full", zero=0, method="lora")
    block = accelerate_config(cp, 8)["parallelism_config"]
    assert block["parallelism_config_cp_size"] == 4
    assert block["parallelism_config_dp_shard_size"] == 2  # 8 processes = 1 x 2 x 1 x 4
    sp = _plan(seq=131072, sp_ulysses=8, gpus=8, zero=3, method="lora")
    block = accelerate_config(sp, 8)["parallelism_config"]
    assert block["parallelism_config_sp_size"] == 8
    assert block["parallelism_config_sp_backend"] == "deepspeed"
    assert "parallelism_config" not in accelerate_config(_plan(seq=4096, gpus=8), 8)


def test_nccl_groups_of_cp_ep_and_ulysses() -> None:
    from hwdash.core.estimator.collectives import comm_groups

    def groups(plan: Plan, gpus: int) -> dict[str, tuple[int, str]]:
        return {g.name: (g.ranks, g.pattern) for g in comm_groups(plan, gpus)}

    megatron = groups(_plan(seq=8192, tp=2, cp=2, ep=2, gpus=16), 16)
    assert megatron["context-parallel"] == (2, "p2p")
    assert megatron["data-parallel"] == (8, "ring")  # data x context: 16 / (tp 2 x pp 1)
    assert megatron["expert-parallel"] == (2, "alltoall")
    assert megatron["expert data-parallel"] == (4, "ring")  # 16 / (tp 2 x ep 2 x pp 1)
    ulysses = groups(_plan(seq=8192, sp_ulysses=4, gpus=8, zero=3), 8)
    assert ulysses["Ulysses sequence-parallel"] == (4, "alltoall")
    fsdp = groups(_plan(seq=8192, cp=4, gpus=8, fsdp="full", zero=0), 8)
    assert fsdp["context-parallel"] == (4, "ring")


def test_fsdp_cp_and_ulysses_count_one_ranks_tokens() -> None:
    from hwdash.core.estimator import estimate_memory

    arch_model = LLAMA_8B
    for split, fields in (
        ("cp", {"fsdp": "full", "zero": 0}),
        ("sp_ulysses", {"zero": 3}),
    ):
        whole = estimate_memory(_plan(seq=65536, gpus=8, method="lora", **fields), arch_model)
        local = estimate_memory(_plan(seq=16384, gpus=8, method="lora", **fields), arch_model)
        shard = estimate_memory(
            _plan(seq=65536, gpus=8, method="lora", **{split: 4}, **fields), arch_model
        )
        # the same states as the unsplit plan; the activations of 65536 / 4 tokens plus buffers:
        # the ring's next K/V and dK/dV blocks, 2 x 2 x e x 16384 x kv_dim (Liu et al.); Ulysses'
        # sent and received Q, K, V, 2 x e x 16384 x (q_dim + 2 kv_dim) (Jacobs et al.)
        buffers = {"cp": 2 * 2 * 2 * 16384 * KV, "sp_ulysses": 2 * 2 * 16384 * (Q + 2 * KV)}
        assert shard.per_gpu.weights == whole.per_gpu.weights
        assert shard.per_gpu.activations - local.per_gpu.activations == buffers[split]
        assert shard.per_gpu.activations < whole.per_gpu.activations / 3


def test_accelerate_parallelism_config_reads_back(tmp_path: object) -> None:
    from pathlib import Path

    import yaml

    from hwdash.core.plans.exports import accelerate_config
    from hwdash.core.plans.imports import read_plan_file

    plan = _plan(seq=131072, cp=4, gpus=8, fsdp="full", zero=0, method="lora")
    path = Path(str(tmp_path)) / "accelerate.yaml"
    path.write_text(yaml.safe_dump(accelerate_config(plan, 8)), encoding="utf-8")
    assert read_plan_file(path).updates["cp"] == 4


def test_make_it_fit_proposes_cp_first_for_128k_on_a100x8() -> None:
    from hwdash.core.catalog import load_catalog
    from hwdash.core.models.config import resolve_model
    from hwdash.core.planning.fit_options import find_fit_options
    from hwdash.core.results import FitVerdict

    catalog = load_catalog(include_user=False)
    plan = _plan(model="llama-3.1-8b", seq=131072, tp=2, gpus=8, grad_ckpt=True)
    model = resolve_model(plan.model, catalog)
    search = find_fit_options(plan, model, catalog, "a100x8", [catalog.flavors["a100x8"]])
    first = search.options[0]
    # tp 2 x dp 4 needs about 121 GiB per GPU and cp 2 about 80.4 (the fp32 and bf16 logits of
    # 65,536 tokens alone are 11.7 GiB), just over the card; splitting the sequence in 4 fits and
    # keeps the experiment
    assert first.plan.cp == 4 and first.keeps_experiment
    assert first.fit.verdict is FitVerdict.FITS
