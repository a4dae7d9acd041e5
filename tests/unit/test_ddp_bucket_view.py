"""``--ddp-bucket-view``: PyTorch DDP's ``gradient_as_bucket_view=True`` (or a script that all-reduces
its gradients itself) keeps no second copy of the gradients in DDP's buckets.

torch/nn/parallel/distributed.py: without it the Reducer's buckets together span every trained
parameter in the gradients' dtype; with it the gradients are views of the buckets ("the saved
memory size will be equal to the total gradients size").
"""

from __future__ import annotations

import pytest
from test_cli_plan import _json
from test_fit_options import _only_change, all_options, knob_names, recheck

from hwdash.core.catalog import Catalog, load_catalog
from hwdash.core.estimator import estimate_memory
from hwdash.core.estimator.savers import packaged_frameworks, resolve_savers
from hwdash.core.plan import FsdpMode, Method, Plan
from hwdash.core.plan_unused import unused_settings
from hwdash.core.plans.exports import uncarried_settings
from hwdash.core.results import FitVerdict, MemoryEstimate


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(include_user=False)


def _estimate(catalog: Catalog, **fields: object) -> MemoryEstimate:
    plan = Plan(**{"model": "qwen2.5-0.5b", "method": Method.FULL, "gpus": 2, **fields})  # type: ignore[arg-type]
    return estimate_memory(plan, catalog.models["qwen2.5-0.5b"], software=catalog.software)


def _buckets(estimate: MemoryEstimate) -> list[int]:
    return [value for label, value in estimate.details if label.startswith("DDP gradient buckets")]


def test_bucket_views_drop_exactly_the_bucket_copy(catalog: Catalog) -> None:
    copied = _estimate(catalog, precision="bf16")
    viewed = _estimate(catalog, precision="bf16", ddp_bucket_view=True)
    # the copy: every trained parameter's bf16 gradient once more, alive in every phase
    assert _buckets(copied) == [2 * copied.trainable_params]
    assert _buckets(viewed) == []
    assert copied.per_gpu.gradients - viewed.per_gpu.gradients == 2 * copied.trainable_params
    for name in ("weights", "optimizer", "activations", "kv_cache"):
        assert getattr(copied.per_gpu, name) == getattr(viewed.per_gpu, name), name
    assert viewed.per_gpu.total < copied.per_gpu.total
    # off is PyTorch's default: the same plan as no flag
    off = _estimate(catalog, precision="bf16", ddp_bucket_view=False)
    assert off.per_gpu == copied.per_gpu and _buckets(off) == _buckets(copied)
    # LoRA: PEFT's fp32 adapters' gradients, 4 bytes each
    lora = _estimate(catalog, method=Method.LORA)
    lora_viewed = _estimate(catalog, method=Method.LORA, ddp_bucket_view=True)
    assert lora.per_gpu.gradients - lora_viewed.per_gpu.gradients == 4 * lora.trainable_params


def test_only_plain_data_parallelism_has_buckets_to_view(catalog: Catalog) -> None:
    for fields in (
        {"gpus": 1},
        {"zero": 2},
        {"fsdp": FsdpMode.FULL},
        {"method": Method.INFERENCE},
    ):
        copied = _estimate(catalog, **fields)
        viewed = _estimate(catalog, ddp_bucket_view=True, **fields)
        assert copied.per_gpu == viewed.per_gpu, fields
        plan = Plan(model="qwen2.5-0.5b", method=Method.FULL, gpus=2, ddp_bucket_view=True)
        plan = plan.with_changes(fields)
        (warned,) = unused_settings(plan, ["ddp_bucket_view"])
        training = fields.get("method") is not Method.INFERENCE
        why = "plain data parallelism" if training else "inference does not train"
        assert warned[0] == "ddp_bucket_view" and why in warned[1]
    ddp = Plan(model="qwen2.5-0.5b", method=Method.FULL, gpus=2, ddp_bucket_view=True)
    assert unused_settings(ddp, ["ddp_bucket_view"]) == []


def test_a_frameworks_stated_default_applies_and_the_plan_wins() -> None:
    hf = packaged_frameworks()["hf"]
    viewing = hf.model_copy(
        update={
            "ddp_bucket_view": True,
            "sources": {**hf.sources, "ddp_bucket_view": "a test entry"},
        }
    )
    plan = Plan(model="qwen2.5-0.5b", method=Method.FULL, gpus=2)
    assert resolve_savers(plan).ddp_bucket_view is False  # no packaged framework states it
    assert resolve_savers(plan, viewing).ddp_bucket_view is True
    typed_off = plan.with_changes({"ddp_bucket_view": False})
    assert resolve_savers(typed_off, viewing).ddp_bucket_view is False


def test_the_flag_reaches_the_json_and_no_flag_is_the_copy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ("--model", "qwen2.5-0.5b", "--method", "full", "--gpus", "2", "--precision", "bf16")
    plain = _json(capsys, *argv)
    viewed = _json(capsys, *argv, "--ddp-bucket-view")
    off = _json(capsys, *argv, "--no-ddp-bucket-view")
    assert viewed["plan"]["ddp_bucket_view"] is True
    assert off["memory"] == plain["memory"]
    saved = plain["memory"]["gradients"] - viewed["memory"]["gradients"]
    assert saved > 0 and saved % 2 == 0  # one bf16 gradient per trained parameter
    assert viewed["memory"]["total"] < plain["memory"]["total"]


def test_make_it_fit_offers_the_bucket_view_where_the_copy_is_what_does_not_fit(
    catalog: Catalog,
) -> None:
    # Qwen2.5-3B full with 8-bit AdamW and checkpointing on two 24 GB RTX 3090s: with DDP's
    # bucket copy (6 GB of bf16 gradients) it does not fit; without it, it does
    plan = Plan(
        model="qwen2.5-3b",
        method=Method.FULL,
        gpus=2,
        seq=1024,
        grad_ckpt=True,
        optimizer="adamw-8bit",
    )
    alone = _only_change(all_options(catalog, plan, "local-2x-rtx-3090"), "ddp_bucket_view")
    assert len(alone) == 1
    option = alone[0]
    assert option.plan.ddp_bucket_view is True and option.keeps_experiment
    assert option.fit.verdict is not FitVerdict.NO
    assert recheck(catalog, option) is option.fit.verdict
    assert option.slowdown == pytest.approx(1.0) and option.slowdown_sources == ()
    # not where it changes nothing: one GPU, a sharded plan, a plan already viewing
    assert "ddp_bucket_view" in knob_names(catalog, plan, 2)
    assert "ddp_bucket_view" not in knob_names(catalog, plan, 1)
    assert "ddp_bucket_view" not in knob_names(catalog, plan.with_changes({"zero": 2}), 2)
    fsdp = plan.with_changes({"fsdp": FsdpMode.FULL})
    assert "ddp_bucket_view" not in knob_names(catalog, fsdp, 2)
    viewing = plan.with_changes({"ddp_bucket_view": True})
    assert "ddp_bucket_view" not in knob_names(catalog, viewing, 2)


def test_the_exports_say_they_do_not_carry_it() -> None:
    plan = Plan(model="qwen2.5-0.5b", method=Method.FULL, gpus=2, ddp_bucket_view=True)
    for kind in ("accelerate", "trainer"):
        assert "--ddp-bucket-view" in uncarried_settings(plan, kind)
        assert "--ddp-bucket-view" not in uncarried_settings(
            plan.with_changes({"ddp_bucket_view": None}), kind
        )
    # where it does nothing, the plan's warning says so; the exports do not repeat it
    sharded = plan.with_changes({"fsdp": FsdpMode.FULL})
    assert "--ddp-bucket-view" not in uncarried_settings(sharded, "accelerate")
