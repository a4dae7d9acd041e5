"""Fit verdicts, time, cost, sorting and recommendation on a fixture catalog (and the real one)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hwdash.core.catalog import Catalog, load_catalog, load_catalog_from
from hwdash.core.estimator import architecture, estimate_memory, kv_cache_bytes
from hwdash.core.plan import Method, Offload, Plan, Precision
from hwdash.core.planning.fit import (
    CPU_ONLY_REASON,
    evaluate_flavor,
    evaluate_plan,
    fit_verdict,
    training_tokens,
)
from hwdash.core.planning.run_time import flops_per_token
from hwdash.core.results import FitVerdict
from hwdash.core.units import GB
from hwdash.errors import UsageError

FIXTURE_DIR = Path(__file__).resolve().parent.parent / "data" / "catalog_estimator"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog_from([FIXTURE_DIR])


def _fit(catalog: Catalog, plan: Plan, flavor_id: str):  # type: ignore[no-untyped-def]
    flavor = catalog.flavors[flavor_id]
    model = catalog.models[plan.model]
    return evaluate_flavor(
        plan, model, flavor, catalog.accelerator_for(flavor), training_tokens(plan)
    )[0]


def test_verdicts_follow_headroom(catalog: Catalog) -> None:
    report = evaluate_plan(Plan(model="fx-1b", method=Method.LORA, batch=2, seq=1024), catalog)
    seen = set()
    for fit in report.flavors:
        if fit.usable_bytes == 0 or "not on" in fit.reason:
            continue
        headroom = fit.usable_bytes - fit.need_bytes
        if headroom < 0:
            expected = FitVerdict.NO
        elif headroom < 0.1 * fit.usable_bytes:
            expected = FitVerdict.TIGHT
        else:
            expected = FitVerdict.FITS
        assert fit.verdict is expected, fit.flavor.id
        seen.add(fit.verdict)
    assert FitVerdict.FITS in seen


def test_tight_between_zero_and_ten_percent(catalog: Catalog) -> None:
    # Find a sequence length whose need lands within 10% below the 24 GiB of small-24.
    usable = catalog.accelerators["gpu-24"].usable_bytes
    verdicts = {}
    for seq in range(256, 16384, 256):
        fit = _fit(catalog, Plan(model="fx-1b", method=Method.FULL, seq=seq), "small-24")
        verdicts[seq] = (fit.verdict, fit.need_bytes)
    tight = [seq for seq, (verdict, _) in verdicts.items() if verdict is FitVerdict.TIGHT]
    assert tight, "some sequence length should be tight"
    for seq in tight:
        need = verdicts[seq][1]
        assert 0.9 * usable < need <= usable


def test_multi_gpu_flavor_shards_zero_state(catalog: Catalog) -> None:
    plan = Plan(model="fx-8b-gqa", method=Method.FULL, zero=3, grad_ckpt=True, seq=1024)
    one = _fit(catalog, plan, "small-24")
    four = _fit(catalog, plan, "quad-24")
    assert four.need_bytes < one.need_bytes
    assert (
        four.need_bytes
        == estimate_memory(
            plan, catalog.models["fx-8b-gqa"], gpus=4, accelerator=catalog.accelerators["gpu-24"]
        ).per_gpu.total
    )


def test_plan_breakdown_uses_plan_gpus(catalog: Catalog) -> None:
    plan = Plan(model="fx-8b-gqa", method=Method.FULL, zero=3, gpus=8)
    report = evaluate_plan(plan, catalog)
    assert report.estimate.gpus == 8


def test_cpu_only_flavor_is_an_honest_no(catalog: Catalog) -> None:
    fit = _fit(catalog, Plan(model="fx-1b"), "cpu-box")
    assert fit.verdict is FitVerdict.NO
    assert fit.usable_bytes == 0
    assert fit.reason == CPU_ONLY_REASON
    assert fit.hours is None


def test_tpu_gets_a_verdict_and_a_caveat(catalog: Catalog) -> None:
    small = _fit(catalog, Plan(model="fx-1b", seq=256), "tpu-1")
    assert small.verdict in (FitVerdict.FITS, FitVerdict.TIGHT)
    assert "XLA" in small.reason
    big = _fit(catalog, Plan(model="fx-8b-gqa", method=Method.FULL), "tpu-1")
    assert big.verdict is FitVerdict.NO
    assert "XLA" in big.reason


def test_apple_unified_memory(catalog: Catalog) -> None:
    lora = _fit(catalog, Plan(model="fx-1b", seq=512), "mac-32")
    assert lora.usable_bytes == int(32 * GB * 0.75)
    assert lora.verdict is FitVerdict.FITS
    assert "MPS" in lora.reason
    qlora = _fit(catalog, Plan(model="fx-1b", method=Method.QLORA, seq=512), "mac-32")
    assert qlora.verdict is FitVerdict.NO
    assert "bitsandbytes" in qlora.reason


def test_offload_beyond_host_ram_does_not_fit(catalog: Catalog) -> None:
    plan = Plan(
        model="fx-8b-gqa",
        method=Method.FULL,
        precision=Precision.MIXED,
        zero=3,
        offload=Offload.PARAMS,
        grad_ckpt=True,
        seq=512,
    )
    fit = _fit(catalog, plan, "small-24")  # 30 GB of host RAM; offload needs ~14 B/param x 8B
    assert fit.verdict is FitVerdict.NO
    assert "host RAM" in fit.reason


def test_training_time_is_6nd_over_rate(catalog: Catalog) -> None:
    plan = Plan(model="fx-1b", method=Method.FULL, tokens=10**9, seq=512)
    fit = _fit(catalog, plan, "small-24")
    n = architecture(catalog.models["fx-1b"]).matmul_params_per_token
    expected_hours = 6 * n * 1e9 / (100e12 * 1 * 0.5) / 3600
    assert fit.hours == pytest.approx(expected_hours, rel=1e-9)
    assert fit.cost == pytest.approx(expected_hours * 1.0, rel=1e-9)
    assert fit.tokens_per_second == pytest.approx(100e12 * 0.5 / (6 * n), rel=1e-9)


def test_lora_is_4n_and_checkpointing_adds_2n(catalog: Catalog) -> None:
    model = catalog.models["fx-1b"]
    n = architecture(model).matmul_params_per_token
    assert flops_per_token(Plan(model="fx-1b", method=Method.LORA), model) == 4 * n
    assert flops_per_token(Plan(model="fx-1b", method=Method.QLORA, grad_ckpt=True), model) == 6 * n
    assert flops_per_token(Plan(model="fx-1b", method=Method.FULL, grad_ckpt=True), model) == 8 * n


def test_moe_flops_use_routed_experts_only(catalog: Catalog) -> None:
    model = catalog.models["fx-moe"]
    arch = architecture(model)
    expert_mlp = 3 * 1024 * 2048
    norms = arch.layers * arch.norm_params_per_layer + arch.final_norm_params
    # 8 layers x 6 unrouted experts each, plus the embedding lookup and the norms (no matmul).
    assert arch.total_params - arch.matmul_params_per_token == (
        8 * 6 * expert_mlp + arch.embedding_params + norms
    )


def test_mfu_override_scales_time(catalog: Catalog) -> None:
    base = _fit(catalog, Plan(model="fx-1b", method=Method.FULL, tokens=10**8, seq=512), "small-24")
    slower = _fit(
        catalog,
        Plan(model="fx-1b", method=Method.FULL, tokens=10**8, seq=512, mfu=0.25),
        "small-24",
    )
    assert slower.hours == pytest.approx(2 * base.hours)  # catalog MFU 0.5 -> 0.25


def test_gpu_without_bf16_uses_its_fp16_rate(catalog: Catalog) -> None:
    plan = Plan(model="fx-1b", method=Method.LORA, tokens=10**8, seq=256)
    fit = _fit(catalog, plan, "old-16")
    n = architecture(catalog.models["fx-1b"]).matmul_params_per_token
    assert fit.tokens_per_second == pytest.approx(65e12 * 0.2 / (4 * n))


def test_inference_decode_is_bandwidth_bound(catalog: Catalog) -> None:
    plan = Plan(model="fx-1b", method=Method.INFERENCE, batch=1, seq=1024, tokens=36_000)
    fit = _fit(catalog, plan, "small-24")
    arch = architecture(catalog.models["fx-1b"])
    bytes_per_token = 2 * arch.total_params + kv_cache_bytes(arch, 1, 1024, 2)
    per_second = 1000 * GB / bytes_per_token
    assert fit.tokens_per_second == pytest.approx(per_second)
    assert fit.hours == pytest.approx(36_000 / per_second / 3600)


def test_tokens_from_examples_epochs_and_seq() -> None:
    assert training_tokens(Plan(model="x", examples=1000, epochs=3, seq=512)) == 1_536_000
    assert training_tokens(Plan(model="x", tokens=42, examples=1000)) == 42
    assert training_tokens(Plan(model="x")) is None


def test_sorted_cheapest_first_and_locals_last(catalog: Catalog) -> None:
    report = evaluate_plan(Plan(model="fx-1b", seq=512), catalog)
    prices = [fit.flavor.price_per_hour for fit in report.flavors]
    priced = [p for p in prices if p is not None]
    assert priced == sorted(priced)
    first_unpriced = prices.index(None)
    assert all(p is None for p in prices[first_unpriced:])


def test_recommendation_by_hourly_price_without_data_size(catalog: Catalog) -> None:
    report = evaluate_plan(Plan(model="fx-1b", seq=256), catalog)
    # old-16 ($0.40/h) is the cheapest GPU flavor and the plan fits it.
    assert report.recommended == "old-16"
    assert report.fastest == "big-80" or report.fastest == "quad-24"
    assert any("hours and cost are not estimated" in w for w in report.warnings)


def test_recommendation_by_total_cost_with_data_size(catalog: Catalog) -> None:
    report = evaluate_plan(Plan(model="fx-1b", seq=256, tokens=10**9), catalog)
    # Per token, small-24 costs $1 / (100 TF x 0.5) and old-16 $0.4 / (65 TF x 0.2): small-24 wins.
    assert report.recommended == "small-24"
    costs = {fit.flavor.id: fit.cost for fit in report.flavors}
    assert costs["small-24"] < costs["old-16"]


def test_local_flavor_recommended_only_when_nothing_priced_fits(catalog: Catalog) -> None:
    plan = Plan(
        model="fx-1b", method=Method.FULL, batch=2, seq=8192, flavors=("small-24", "home-80")
    )
    report = evaluate_plan(plan, catalog)
    verdicts = {fit.flavor.id: fit.verdict for fit in report.flavors}
    assert verdicts["small-24"] is FitVerdict.NO
    assert report.recommended == "home-80"
    both_fit = evaluate_plan(plan.model_copy(update={"flavors": ("big-80", "home-80")}), catalog)
    assert both_fit.recommended == "big-80"


def test_nothing_fits(catalog: Catalog) -> None:
    plan = Plan(model="fx-8b-gqa", method=Method.FULL, seq=8192, batch=8, flavors=("small-24",))
    report = evaluate_plan(plan, catalog)
    assert report.recommended is None
    assert any("no flavor fits" in w for w in report.warnings)


def test_unknown_flavor_names_the_flag(catalog: Catalog) -> None:
    with pytest.raises(UsageError) as info:
        evaluate_plan(Plan(model="fx-1b", flavors=("nope",)), catalog)
    assert info.value.flag == "--flavor"
    assert "'nope'" in str(info.value)


def test_report_json_shape(catalog: Catalog) -> None:
    report = evaluate_plan(Plan(model="fx-1b", examples=100, seq=512), catalog)
    document = report.to_json()
    assert set(document) >= {"plan", "memory", "host_memory", "flavors", "recommended", "warnings"}
    assert set(document["memory"]) == {
        "weights",
        "gradients",
        "optimizer",
        "activations",
        "kv_cache",
        "overhead",
        "total",
        "allocated",
        "reserved",
        "whole_gpu",
    }
    assert all(isinstance(v, int) for v in document["memory"].values())
    assert document["memory"]["whole_gpu"] == document["memory"]["total"]
    assert document["plan"]["tokens"] == 51_200
    entry = document["flavors"][0]
    assert {"id", "fit", "headroom_bytes", "price_per_hour", "hours", "cost"} <= set(entry)
    assert entry["fit"] in ("fits", "tight", "no")


def test_real_catalog_seed_flavors_get_verdicts() -> None:
    real = load_catalog(include_user=False)
    report = evaluate_plan(
        Plan(model="qwen2.5-0.5b", method=Method.FULL, seq=512, examples=1000), real
    )
    by_id = {fit.flavor.id: fit for fit in report.flavors}
    assert by_id["t4-small"].verdict is not FitVerdict.NO
    assert by_id["cpu-basic"].verdict is FitVerdict.NO
    assert "XLA" in by_id["v5e-1x1"].reason
    assert by_id["t4-small"].hours is not None
    assert report.recommended is not None


def test_sorted_by_total_cost_when_hours_are_known(catalog: Catalog) -> None:
    report = evaluate_plan(Plan(model="fx-1b", seq=256, tokens=10**9), catalog)
    costed = [fit.cost for fit in report.flavors if fit.cost is not None]
    assert costed == sorted(costed)
    order = [fit.flavor.id for fit in report.flavors]
    # The CPU flavor has a price but no hours: after every flavor with a cost.
    assert order.index("cpu-box") > max(
        order.index(fit.flavor.id) for fit in report.flavors if fit.cost is not None
    )
    # quad-24 costs the same as small-24 (4x the speed at 4x the price): fewer GPUs first.
    assert order.index("small-24") < order.index("quad-24")


def test_evaluate_plan_rejects_what_the_model_cannot_do(catalog: Catalog) -> None:
    with pytest.raises(UsageError) as info:
        evaluate_plan(Plan(model="fx-1b", lora_targets=("fc1",)), catalog)
    assert info.value.flag == "--lora-targets"
    with pytest.raises(UsageError) as info:
        evaluate_plan(
            Plan(model="fx-1b", method=Method.PPO, rl_method=Method.DORA, lora_r=4096), catalog
        )
    assert info.value.flag == "--lora-r"
    # Full training has no adapters to check.
    evaluate_plan(Plan(model="fx-1b", method=Method.FULL, lora_targets=("fc1",)), catalog)


def test_vllm_share_too_small_for_its_weights_is_a_no(catalog: Catalog) -> None:
    # fx-8b-gqa in bf16 is ~16 GB: 10% of a 24 GB GPU cannot hold it.
    plan = Plan(
        model="fx-8b-gqa",
        method=Method.GRPO,
        rl_method=Method.QLORA,
        vllm_memory_utilization=0.1,
        seq=256,
        grad_ckpt=True,
    )
    fit = _fit(catalog, plan, "big-80")
    assert fit.verdict is FitVerdict.NO
    assert "vLLM share" in fit.reason
    roomy = _fit(catalog, plan.model_copy(update={"vllm_memory_utilization": 0.4}), "big-80")
    assert "vLLM share" not in roomy.reason


def test_only_tight_fits_are_not_recommended(catalog: Catalog) -> None:
    usable = catalog.accelerators["gpu-24"].usable_bytes
    for seq in range(256, 16384, 256):
        plan = Plan(model="fx-1b", method=Method.FULL, seq=seq, flavors=("small-24",))
        report = evaluate_plan(plan, catalog)
        if report.flavors[0].verdict is FitVerdict.TIGHT:
            assert 0.9 * usable < report.flavors[0].need_bytes <= usable
            assert report.recommended is None
            assert any("only tight fits" in w for w in report.warnings)
            return
    pytest.fail("no sequence length gave a tight fit")


# -- the verdict's bands, pinned at their edges -----------------------------------------------------


@pytest.mark.parametrize(
    ("need", "usable", "verdict"),
    [
        (100_000, 100_000, FitVerdict.TIGHT),  # exactly full: fits, with no headroom (not "no")
        (100_001, 100_000, FitVerdict.NO),
        (90_001, 100_000, FitVerdict.TIGHT),  # 9.999% headroom
        (90_000, 100_000, FitVerdict.FITS),  # exactly 10%: fits
        (94_000, 100_000, FitVerdict.TIGHT),  # 6%: tight under a 10% band, not under a 5% one
        (90_500, 100_000, FitVerdict.TIGHT),  # 9.5% of usable, but over 10% of the need
        (0, 100_000, FitVerdict.FITS),
    ],
)
def test_the_tight_band_is_ten_percent_of_usable_memory(
    need: int, usable: int, verdict: FitVerdict
) -> None:
    assert fit_verdict(need, usable) is verdict


def test_evaluate_flavor_uses_the_verdict_rule_on_usable_memory(catalog: Catalog) -> None:
    plan = Plan(model="fx-1b", method=Method.LORA, batch=2, seq=1024)
    model = catalog.models[plan.model]
    flavor = catalog.flavors["small-24"]
    accelerator = catalog.accelerator_for(flavor)
    assert accelerator is not None
    need = evaluate_flavor(plan, model, flavor, accelerator, None)[0].need_bytes
    # The same plan on cards sized around its need, to the MiB.
    for usable_mib, expected in (
        (need // 2**20, FitVerdict.NO),  # a few bytes short
        (-(-need // 2**20) + 1, FitVerdict.TIGHT),
        (int(need / 0.905 / 2**20), FitVerdict.TIGHT),  # 9.5% of usable free
        (int(need / 0.89 / 2**20) + 1, FitVerdict.FITS),
    ):
        sized = accelerator.model_copy(update={"nvml_total_mib": usable_mib})
        fit = evaluate_flavor(plan, model, flavor, sized, None)[0]
        assert fit.verdict is expected, (usable_mib, need)


def test_a_card_exactly_as_large_as_the_need_is_tight_not_no(catalog: Catalog) -> None:
    # Zero headroom, through evaluate_flavor (not only the rule): the plan fits, barely.
    plan = Plan(model="fx-1b", method=Method.LORA, batch=2, seq=1024)
    model = catalog.models[plan.model]
    flavor = catalog.flavors["small-24"]
    accelerator = catalog.accelerator_for(flavor)
    assert accelerator is not None
    need = evaluate_flavor(plan, model, flavor, accelerator, None)[0].need_bytes
    memory_gb = need / 1e9
    while int(memory_gb * 1e9) < need:  # the float nearest need/1e9 may land a byte short
        memory_gb = math.nextafter(memory_gb, math.inf)
    while int(memory_gb * 1e9) > need:
        memory_gb = math.nextafter(memory_gb, 0.0)
    exact = accelerator.model_copy(
        update={"memory_gb": memory_gb, "nvml_total_mib": None, "usable_memory_fraction": 1.0}
    )
    assert exact.usable_bytes == need
    fit = evaluate_flavor(plan, model, flavor, exact, None)[0]
    assert (fit.headroom_bytes, fit.verdict) == (0, FitVerdict.TIGHT)
