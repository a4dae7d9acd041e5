"""``--max FIELD``: every answer re-planned through :func:`evaluate_plan` fits its flavor (``--check``'s
sense) and one step past it does not; the estimate's verdict is monotone, which the search needs."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hwdash.core.catalog import Catalog, load_catalog
from hwdash.core.models.config import resolve_model
from hwdash.core.plan import Method, Plan
from hwdash.core.planning.fit import check_plan_for_model, evaluate_plan
from hwdash.core.planning.max_fit import MaxField, MaxFit, find_max, with_gpu_count
from hwdash.core.results import FitVerdict
from hwdash.errors import UsageError

CATALOG = load_catalog(include_user=False)
MODELS = ["qwen2.5-0.5b", "qwen2.5-7b", "llama-3.2-1b", "gemma-3-4b", "mixtral-8x7b", "seed-70m"]
FLAVORS = ["t4-small", "l4x1", "a10g-largex2", "a100-large", "h200x4", "rtx-pro-6000", "v5e-1x1"]
METHODS = [Method.INFERENCE, Method.LORA, Method.QLORA, Method.DORA, Method.FULL, Method.GRPO]


def _verdict(plan: Plan, flavor_id: str, catalog: Catalog = CATALOG) -> FitVerdict:
    """The plan re-planned as ``hwdash plan --flavor FLAVOR`` would: its verdict there."""
    report = evaluate_plan(plan.with_changes({"flavors": (flavor_id,)}), catalog)
    return report.flavors[0].verdict


def _on_gpus(plan: Plan, flavor_id: str, gpus: int) -> FitVerdict:
    """The plan on ``gpus`` GPUs of the flavor's kind, as a catalog flavor of its own."""
    flavor = with_gpu_count(CATALOG.flavors[flavor_id], gpus)
    probe = flavor.model_copy(update={"id": "probe"})
    catalog = dataclasses.replace(CATALOG, flavors={**CATALOG.flavors, "probe": probe})
    return _verdict(plan, "probe", catalog)


def _check(plan: Plan, flavor_id: str, answer: MaxFit) -> None:
    """The answer fits when re-planned and one step past it does not (for gpus: one step fewer)."""
    field = "batch" if answer.field is MaxField.CONCURRENCY else answer.field.value
    if answer.field is MaxField.GPUS:
        if answer.value is None:
            # not even the most GPUs searched fit
            assert _on_gpus(plan, flavor_id, 100_000 // answer.step * answer.step) is not (
                FitVerdict.FITS
            )
            return
        assert _on_gpus(plan, flavor_id, answer.value) is FitVerdict.FITS
        if answer.value > answer.step:
            assert _on_gpus(plan, flavor_id, answer.value - answer.step) is not FitVerdict.FITS
        return
    if answer.value is None:
        assert _verdict(plan.with_changes({field: 1}), flavor_id) is not FitVerdict.FITS
        assert answer.headroom_bytes is None
        return
    at = plan.with_changes({field: answer.value})
    report = evaluate_plan(at.with_changes({"flavors": (flavor_id,)}), CATALOG)
    assert report.flavors[0].verdict is FitVerdict.FITS
    assert answer.headroom_bytes == report.flavors[0].headroom_bytes
    assert answer.bound is not None
    if answer.value < answer.bound:
        above = plan.with_changes({field: answer.value + 1})
        assert _verdict(above, flavor_id) is not FitVerdict.FITS
    else:
        assert answer.bounded_by is not None


@settings(max_examples=60, deadline=None)
@given(
    model_id=st.sampled_from(MODELS),
    method=st.sampled_from(METHODS),
    flavor_id=st.sampled_from(FLAVORS),
    field=st.sampled_from(list(MaxField)),
    grad_ckpt=st.booleans(),
    batch=st.integers(1, 8),
    seq=st.sampled_from([256, 1024, 4096]),
    zero=st.sampled_from([0, 3]),
    megatron=st.sampled_from([(1, 1), (2, 1), (2, 2)]),
)
def test_the_answer_fits_and_one_step_past_it_does_not(
    model_id: str,
    method: Method,
    flavor_id: str,
    field: MaxField,
    grad_ckpt: bool,
    batch: int,
    seq: int,
    zero: int,
    megatron: tuple[int, int],
) -> None:
    if method is Method.INFERENCE:
        grad_ckpt, zero = False, 0
    tp, pp = megatron if method is Method.FULL and not zero else (1, 1)
    assume(not (field is MaxField.CONCURRENCY and method is not Method.INFERENCE))
    assume(not (zero and method in (Method.QLORA, Method.GRPO)))
    plan = Plan(
        model=model_id,
        method=method,
        grad_ckpt=grad_ckpt,
        batch=batch,
        seq=seq,
        zero=zero,
        tp=tp,
        pp=pp,
        gpus=tp * pp,
    )
    model = resolve_model(model_id, CATALOG)
    try:
        check_plan_for_model(plan, model)
    except UsageError:
        assume(False)  # heads or layers not divisible by tp or pp: refused before any search
    answer = find_max(plan, model, CATALOG, flavor_id, field)
    _check(plan, flavor_id, answer)


@settings(max_examples=60, deadline=None)
@given(
    model_id=st.sampled_from(MODELS),
    method=st.sampled_from(METHODS),
    flavor_id=st.sampled_from(FLAVORS),
    batch=st.integers(1, 32),
    seq=st.integers(1, 32768),
    more_batch=st.integers(0, 32),
    more_seq=st.integers(0, 32768),
)
def test_a_plan_that_fits_still_fits_with_a_smaller_batch_or_sequence(
    model_id: str,
    method: Method,
    flavor_id: str,
    batch: int,
    seq: int,
    more_batch: int,
    more_seq: int,
) -> None:
    # The binary search needs the verdict (the whole GPU, refusals and all) to be monotone.
    plan = Plan(model=model_id, method=method, batch=batch, seq=seq)
    larger = plan.with_changes({"batch": batch + more_batch, "seq": seq + more_seq})
    if _verdict(larger, flavor_id) is FitVerdict.FITS:
        assert _verdict(plan, flavor_id) is FitVerdict.FITS


def test_a_small_model_runs_into_its_context_not_the_memory() -> None:
    plan = Plan(model="qwen2.5-0.5b", method=Method.INFERENCE)
    model = resolve_model(plan.model, CATALOG)
    answer = find_max(plan, model, CATALOG, "h200", MaxField.SEQ)
    assert answer.value == model.max_context == 32768
    assert answer.bounded_by == "the model's context (32768)"
    assert "the model's context" in answer.sentence()


def test_fewest_gpus_shards_a_full_fine_tune_under_zero_3() -> None:
    # 7.6B parameters in full with AdamW: 16 bytes each, about 113 GiB unsharded; ZeRO-3 over
    # enough 80 GiB A100s fits it, and the answer is the fewest of them.
    plan = Plan(model="qwen2.5-7b", method=Method.FULL, zero=3, grad_ckpt=True)
    model = resolve_model(plan.model, CATALOG)
    answer = find_max(plan, model, CATALOG, "a100-large", MaxField.GPUS)
    assert answer.value is not None and answer.value > 1
    _check(plan, "a100-large", answer)
    assert "the flavor has 1" in answer.sentence()


def test_more_gpus_do_not_help_a_plan_that_replicates_the_model() -> None:
    plan = Plan(model="qwen2.5-72b", method=Method.LORA)  # DDP: every GPU holds all 72B weights
    model = resolve_model(plan.model, CATALOG)
    answer = find_max(plan, model, CATALOG, "l4x1", MaxField.GPUS)
    assert answer.value is None and answer.headroom_bytes is None
    assert "more GPUs do not bring this plan under the memory" in answer.sentence()


def test_concurrency_is_the_generate_batch_and_is_refused_for_training() -> None:
    plan = Plan(model="qwen2.5-7b", method=Method.INFERENCE, seq=4096)
    model = resolve_model(plan.model, CATALOG)
    concurrency = find_max(plan, model, CATALOG, "l4x1", MaxField.CONCURRENCY)
    batch = find_max(plan, model, CATALOG, "l4x1", MaxField.BATCH)
    assert concurrency.value == batch.value and concurrency.value is not None
    assert concurrency.to_json()["field"] == "concurrency"
    assert "sequences of 4096 tokens" in concurrency.sentence()
    with pytest.raises(UsageError, match=r"--max concurrency .* needs --method inference"):
        find_max(Plan(model="qwen2.5-7b"), model, CATALOG, "l4x1", MaxField.CONCURRENCY)


def test_gpus_step_in_tensor_times_pipeline_parallel_groups() -> None:
    # Megatron needs the GPU count a multiple of tp x pp (megatron/training/arguments.py): the
    # answer is counted in groups of 4 here, and one group fewer does not fit.
    plan = Plan(
        model="qwen2.5-72b",
        method=Method.FULL,
        tp=2,
        pp=2,
        gpus=4,
        zero=1,
        grad_ckpt=True,
        seq=1024,
    )
    model = resolve_model(plan.model, CATALOG)
    answer = find_max(plan, model, CATALOG, "h200", MaxField.GPUS)
    assert answer.step == 4
    assert answer.value is not None and answer.value % 4 == 0 and answer.value > 4
    assert f"; {answer.value - 4} do not; the flavor has 1)" in answer.sentence()
    _check(plan, "h200", answer)
