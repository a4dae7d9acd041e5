"""``hwdash plan --fit TARGET`` for a serving plan: the engine's knobs, each option re-planned
through the engine model (core/planning/serving_fit.py)."""

from __future__ import annotations

import json

import pytest
from monitor_cli import run_plan

from hwdash.core.catalog import Catalog, load_catalog
from hwdash.core.models.config import resolve_model
from hwdash.core.plan import Engine, Method, Plan
from hwdash.core.planning.fit_options import FitSearch
from hwdash.core.planning.serving_fit import (
    UTILIZATION_CAP,
    find_serving_fit_options,
    fit_options_for,
    replan,
)

LONG_LLAMA = ("--model", "llama-3.1-8b", "--method", "inference", "--engine", "vllm")
LONG_LLAMA_ARGS = (*LONG_LLAMA, "--max-model-len", "131072")
QWEN_14B = ("--model", "qwen2.5-14b", "--method", "inference", "--engine", "sglang")


@pytest.fixture(autouse=True)
def no_real_gpus(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    monkeypatch.setenv("HWDASH_FAKE_NVML", "no-driver")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(include_user=False)


def fit_document(capsys: pytest.CaptureFixture[str], *args: str) -> dict:  # type: ignore[type-arg]
    status, out, err = run_plan(capsys, *args, "--json")
    assert status == 0, err
    return json.loads(out)["fit"]  # type: ignore[no-any-return]


def starts_on(capsys: pytest.CaptureFixture[str], args: list[str], flavor: str) -> bool:
    """Whether ``hwdash plan ARGS --flavor FLAVOR --check`` says the plan fits (exit 0)."""
    if "--flavor" not in args:
        args = [*args, "--flavor", flavor]
    status, out, _err = run_plan(capsys, *args, "--check")
    assert status in (0, 1), out
    return status == 0


@pytest.mark.parametrize("args", [LONG_LLAMA_ARGS, QWEN_14B])
def test_a_serving_plan_that_does_not_start_on_l4_gets_options_that_each_start(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...]
) -> None:
    assert not starts_on(capsys, list(args), "l4x1")
    fit = fit_document(capsys, *args, "--fit", "l4x1")
    assert not fit["fits_already"] and fit["options"]
    for option in fit["options"]:
        # re-planned with its own flags, the engine starts there (its KV pool holds one request)
        assert starts_on(capsys, option["args"], option["flavor"]), option["words"]
        assert option["verdict"] == "fits"
    counts = [len(option["words"]) for option in fit["options"]]
    assert counts == sorted(counts)  # the smallest change first


def test_the_options_turn_the_engine_knobs_and_say_what_each_costs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fit = fit_document(capsys, *LONG_LLAMA_ARGS, "--fit", "l4x1")
    changed = {change["field"] for option in fit["options"] for change in option["changes"]}
    # no training knob (grad-ckpt, batch, seq...) and no generate-call knob: the engine's only
    assert changed <= {
        "gpus",
        "flavors",
        "max_model_len",
        "kv_dtype",
        "quant",
        "gpu_memory_utilization",
        "max_num_seqs",
    }, changed
    words = [word for option in fit["options"] for word in option["words"]]
    tp = next(word for word in words if word.startswith("TP 2"))
    assert "l4x4" in tp and "$" in tp  # more GPUs of the target's kind, and their price
    assert any("quality caveat" in word for word in words if "--kv-dtype fp8" in word)
    int8 = [o for o in fit["options"] if any("--quant int8" in w for w in o["words"])]
    assert all(option["slowdown"] == 2.5 for option in int8)  # catalog/slowdowns.toml


def test_the_shorter_max_model_len_is_the_longest_that_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fit = fit_document(capsys, *LONG_LLAMA_ARGS, "--fit", "l4x1")
    alone = next(
        option
        for option in fit["options"]
        if [change["field"] for change in option["changes"]] == ["max_model_len"]
    )
    length = alone["changes"][0]["to"]
    assert 0 < length < 131072
    longer = [*LONG_LLAMA, "--max-model-len", str(length + 1)]
    assert starts_on(capsys, [*LONG_LLAMA, "--max-model-len", str(length)], "l4x1")
    assert not starts_on(capsys, longer, "l4x1")


def test_a_serving_plan_that_already_starts_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    args = (*LONG_LLAMA, "--max-model-len", "8192")
    fit = fit_document(capsys, *args, "--fit", "l4x1")
    assert fit["fits_already"] and fit["options"] == []
    status, out, _err = run_plan(capsys, *args, "--fit", "l4x1")
    assert status == 0 and "fits l4x1 as it is: nothing to change" in out


def test_the_fit_object_has_the_training_fits_keys(capsys: pytest.CaptureFixture[str]) -> None:
    serving = fit_document(capsys, *LONG_LLAMA_ARGS, "--fit", "l4x1")
    training = fit_document(
        capsys, "--model", "mistral-7b", "--method", "full", "--seq", "1024", "--fit", "l4x1"
    )
    assert set(serving) == set(training)
    assert set(serving["options"][0]) == set(training["options"][0])


def test_the_text_table_says_what_an_option_changes_in_serving_terms(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, _err = run_plan(capsys, *LONG_LLAMA_ARGS, "--fit", "l4x1")
    assert status == 0
    assert "to fit l4x1:" in out and "what is served changes" in out
    assert "try: hwdash plan" in out and "--engine vllm" in out.split("try: hwdash plan")[1]


def test_a_higher_memory_utilization_stops_at_the_cap_and_ranks_first(catalog: Catalog) -> None:
    # a little short on l4x1: a larger engine budget is the smallest change (same GPU, same
    # thing served), before more GPUs and before what changes the numerics or the longest request
    plan = Plan(
        model="llama-3.1-8b", method=Method.INFERENCE, engine=Engine.VLLM, max_model_len=45000
    )
    model = resolve_model(plan.model, catalog)
    search = find_serving_fit_options(
        plan, model, catalog, "l4x1", [catalog.flavors["l4x1"]], limit=50
    )
    first, second = search.options[0], search.options[1]
    assert [change.field for change in first.changes] == ["gpu_memory_utilization"]
    assert first.plan.gpu_memory_utilization is not None
    assert 0.9 < first.plan.gpu_memory_utilization < UTILIZATION_CAP  # minimal: not the cap
    assert second.plan.gpus == 2 and second.keeps_experiment
    assert [o.keeps_experiment for o in search.options] == sorted(
        (o.keeps_experiment for o in search.options), reverse=True
    )
    shares = [
        option.plan.gpu_memory_utilization
        for option in search.options
        if option.plan.gpu_memory_utilization is not None
    ]
    assert shares and max(shares) <= UTILIZATION_CAP
    assert any(f"not above {UTILIZATION_CAP:g}" in w for o in search.options for w in o.words)
    for option in search.options:  # each re-planned through the engine starts
        flavor = catalog.flavors[option.fit.flavor.id]
        assert replan(option.plan, model, catalog, flavor).memory.fits  # type: ignore[union-attr]


def test_fit_any_ranks_the_flavors_where_it_starts_as_it_is(catalog: Catalog) -> None:
    plan = Plan(model="qwen2.5-14b", method=Method.INFERENCE, engine=Engine.SGLANG)
    model = resolve_model(plan.model, catalog)
    flavors = [catalog.flavors[ident] for ident in ("l4x1", "h200")]
    search: FitSearch = fit_options_for(plan, model, catalog, "any", flavors)
    assert search.fits_already
    assert [o.fit.flavor.id for o in search.options if o.words == ("as it is",)] == ["h200"]


@pytest.mark.parametrize(
    ("extra", "flag"), [(("--fit", "l4x9"), "--fit"), (("--fit", "local"), "--fit")]
)
def test_a_bad_target_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], extra: tuple[str, ...], flag: str
) -> None:
    status, out, err = run_plan(capsys, *LONG_LLAMA_ARGS, *extra)
    assert status == 2 and flag in err and "Traceback" not in err + out


def test_fit_any_offers_each_plan_on_each_flavor_once(catalog: Catalog) -> None:
    # TP 2 on h200x2 is reached from h200 and from h200x2 itself: one option, said from the
    # smaller target ("was 1 GPUs")
    plan = Plan(
        model="llama-3.1-70b", method=Method.INFERENCE, engine=Engine.VLLM, max_model_len=131072
    )
    model = resolve_model(plan.model, catalog)
    flavors = [catalog.flavors[ident] for ident in ("h200", "h200x2")]
    search = fit_options_for(plan, model, catalog, "any", flavors)
    keys = [(option.plan, option.fit.flavor.id) for option in search.options]
    assert keys and len(keys) == len(set(keys))
    tp2 = next(option for option in search.options if option.plan.gpus == 2)
    assert tp2.fit.flavor.id == "h200x2" and "(was 1 GPUs" in tp2.words[0]


def test_fewer_sequences_shrink_the_sampler_profile_enough_just_past_the_longest(
    catalog: Catalog,
) -> None:
    # 41072 is the longest --max-model-len that starts on l4x1 (README, --max seq); one block
    # past it, halving the sampler's dummy rows (256 -> 128) frees enough for the pool
    plan = Plan(
        model="llama-3.1-8b", method=Method.INFERENCE, engine=Engine.VLLM, max_model_len=41088
    )
    model = resolve_model(plan.model, catalog)
    flavor = catalog.flavors["l4x1"]
    search = fit_options_for(plan, model, catalog, "l4x1", [flavor])
    fields = [[change.field for change in option.changes] for option in search.options]
    assert fields[:2] == [["gpu_memory_utilization"], ["max_num_seqs"]]
    fewer = search.options[1]
    assert fewer.plan.max_num_seqs == 128 and fewer.keeps_experiment
    assert replan(fewer.plan, model, catalog, flavor).memory.fits  # type: ignore[union-attr]
    assert not replan(plan, model, catalog, flavor).memory.fits  # type: ignore[union-attr]
