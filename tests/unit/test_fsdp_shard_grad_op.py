"""``--fsdp shard-grad-op``: PyTorch FSDP's ``ShardingStrategy.SHARD_GRAD_OP`` (FSDP2's
``reshard_after_forward=False``): sharded at rest like full shard, but each unit stays gathered
from its forward to its backward, so the start of backward holds the whole model gathered. Hand
counts on the small Llama of test_fsdp (P = 132,654,080 parameters, blocks of 16,779,264, the
embedding and output layer 32,768,000 each); accelerate's and the Trainer's configs carry it both
ways, and make-it-fit offers full shard in its place."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_fsdp import GATHERED, SMALL, P, _plan
from test_fsdp_versions import _accelerate_file, _accumulated, _line, _notes

from hwdash.core.catalog import load_catalog
from hwdash.core.estimator import estimate_memory
from hwdash.core.estimator import phases as est_phases
from hwdash.core.estimator.collectives import comm_groups
from hwdash.core.plan import FsdpMode, Plan
from hwdash.core.planning.fit_knobs import knobs_for
from hwdash.core.plans.exports import accelerate_config, trainer_fsdp
from hwdash.core.plans.imports import read_plan_file
from hwdash.errors import UsageError

KEPT = "units kept gathered after forward (shard-grad-op)"
COUNTED = "model gathered units (running + prefetched, 2-byte)"


def _kept(**changes: object) -> Plan:
    return _plan(fsdp="shard-grad-op", **changes)


@pytest.mark.parametrize("version", [1, 2])
def test_the_start_of_backward_holds_the_whole_model_gathered(version: int) -> None:
    # FSDP2's default layout gives the embedding and output layer their own units; FSDP1's keeps
    # them in the root unit (its own line): either way every parameter is gathered in bf16 once
    # forward ends, 2 P bytes in all
    notes = _notes(_kept(precision="bf16", fsdp_version=version))
    counted = notes[COUNTED]
    assert counted == 2 * GATHERED
    root = sum(value for label, value in notes.items() if "root unit" in label)
    assert (root > 0) == (version == 1)
    assert _line(notes, KEPT) == 2 * P - counted - root
    # full shard has no such line, and the same sharded states
    full = _notes(_plan(precision="bf16", fsdp_version=version))
    assert not any(KEPT in label for label in full)
    assert full[COUNTED] == counted


def test_the_kept_units_are_alive_at_the_start_of_backward_only() -> None:
    plan = _kept(precision="bf16", fsdp_version=2)
    acc = _accumulated(plan)
    full = _accumulated(_plan(precision="bf16", fsdp_version=2))
    kept = _line(_notes(plan), KEPT)
    # the start of backward: every unit; the end of backward: only the running and prefetched
    # units (backward reshards each unit after its own gradient)
    assert acc.activations == full.activations + kept
    assert acc.last_layer_activations == full.last_layer_activations
    (phases,) = [p for label, _value, p in acc.details if KEPT in label]
    assert phases == est_phases._BACKWARD_ONLY  # forward and the start of backward, not its end


def test_fsdp1_pools_every_unit_on_the_all_gather_stream() -> None:
    # FSDP1: each unit's unsharded flat parameter comes from the all-gather stream's pool; with
    # every unit kept from forward to backward the pool is the whole model, all of it allocated
    # at the start of backward
    acc = _accumulated(_kept(precision="bf16", fsdp_version=1))
    assert acc.side_stream_pool == 2 * P
    assert acc.side_stream_live == 2 * P
    full = _accumulated(_plan(precision="bf16", fsdp_version=1))
    assert full.side_stream_pool < acc.side_stream_pool


def test_it_costs_the_whole_model_beyond_full_shard_and_nothing_on_one_gpu() -> None:
    # at 2k tokens the start of backward is the peak of both: the kept units are the difference
    for version in (1, 2):
        full = estimate_memory(_plan(precision="bf16", fsdp_version=version, seq=2048), SMALL)
        plan = _kept(precision="bf16", fsdp_version=version, seq=2048)
        kept = estimate_memory(plan, SMALL)
        assert kept.allocated_bytes - full.allocated_bytes == _line(_notes(plan), KEPT) > 0
    one = estimate_memory(_kept(precision="bf16", gpus=1), SMALL)
    one_full = estimate_memory(_plan(precision="bf16", gpus=1), SMALL)
    assert one.per_gpu == one_full.per_gpu
    # the whole model already one unit (--fsdp-wrap none): nothing more to keep
    whole = _notes(_kept(precision="bf16", fsdp_wrap="none"))
    assert not any(KEPT in label for label in whole)


def test_it_shards_over_every_gpu_like_full_shard() -> None:
    kept = _kept(precision="bf16", gpus=8)
    assert [g.name for g in comm_groups(kept, 8)] == ["FSDP shard"]
    full = estimate_memory(_plan(precision="bf16", gpus=8), SMALL).per_gpu
    assert estimate_memory(kept, SMALL).per_gpu.weights == full.weights == 2 * P // 8


def test_accelerate_configs_carry_it_both_ways(tmp_path: Path) -> None:
    for strategy in ("SHARD_GRAD_OP", 2):
        path = _accelerate_file(tmp_path / "a.yaml", fsdp_sharding_strategy=strategy)
        imported = read_plan_file(path)
        assert imported.updates["fsdp"] is FsdpMode.SHARD_GRAD_OP
        assert not any("not modelled" in note for note in imported.notes)
    # FSDP2 configs say fsdp_reshard_after_forward
    for reshard, mode in ((False, FsdpMode.SHARD_GRAD_OP), (True, FsdpMode.FULL)):
        path = tmp_path / "b.yaml"
        config = {
            "distributed_type": "FSDP",
            "num_processes": 4,
            "fsdp_config": {"fsdp_version": 2, "fsdp_reshard_after_forward": reshard},
        }
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        assert read_plan_file(path).updates["fsdp"] is mode
    # FSDP2 reads the resharding, not the strategy: FULL_SHARD beside false is shard-grad-op;
    # FSDP1 reads the strategy
    for version, mode in ((2, FsdpMode.SHARD_GRAD_OP), (1, FsdpMode.FULL)):
        path = _accelerate_file(
            tmp_path / "c.yaml", fsdp_version=version, fsdp_reshard_after_forward=False
        )
        assert read_plan_file(path).updates["fsdp"] is mode, version
    written = accelerate_config(_kept(precision="bf16"), 4)
    assert written["fsdp_config"]["fsdp_sharding_strategy"] == "SHARD_GRAD_OP"
    assert written["fsdp_config"]["fsdp_reshard_after_forward"] is False
    back = tmp_path / "back.yaml"
    back.write_text(yaml.safe_dump(written), encoding="utf-8")
    assert read_plan_file(back).updates["fsdp"] is FsdpMode.SHARD_GRAD_OP


def test_trainer_arguments_carry_it_both_ways(tmp_path: Path) -> None:
    assert trainer_fsdp(_kept(precision="bf16")) == "shard_grad_op auto_wrap"
    assert trainer_fsdp(_kept(precision="bf16", fsdp_offload=True)) == (
        "shard_grad_op offload auto_wrap"
    )
    for fields in (
        {"fsdp": "shard_grad_op auto_wrap"},
        {"fsdp": "full_shard auto_wrap", "fsdp_config": {"reshard_after_forward": False}},
    ):
        path = tmp_path / "args.yaml"
        path.write_text(yaml.safe_dump({"per_device_train_batch_size": 1, **fields}))
        imported = read_plan_file(path)
        assert imported.updates["fsdp"] is FsdpMode.SHARD_GRAD_OP, fields


def test_make_it_fit_offers_full_shard_in_its_place() -> None:
    catalog = load_catalog(include_user=False)
    plan = Plan(model="llama-3.1-8b", method="full", fsdp="shard-grad-op", gpus=8)
    model = catalog.models["llama-3.1-8b"]
    settings = [
        s.updates for k in knobs_for(plan, model, 8) if k.name == "fsdp" for s in k.settings
    ]
    assert settings == [{"fsdp": FsdpMode.FULL}]
    full = Plan(model="llama-3.1-8b", method="full", fsdp="full", gpus=8)
    assert not [k for k in knobs_for(full, model, 8) if k.name == "fsdp"]


def test_a_reshard_setting_that_is_not_true_or_false_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    fsdp = {"fsdp_version": 2, "fsdp_reshard_after_forward": "maybe"}
    config = {"distributed_type": "FSDP", "fsdp_config": fsdp}
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    with pytest.raises(UsageError, match="fsdp_reshard_after_forward"):
        read_plan_file(path)


def test_fsdp1_under_no_sync_keeps_the_units_to_the_end_of_backward() -> None:
    # _runtime_utils.py _should_free_in_backward: without gradient sync, a strategy that does not
    # reshard after forward does not free in the post-backward either (FSDP1 only)
    end = est_phases._BACKWARD_END_ONLY
    for version, kept_at_end in ((1, True), (2, False)):
        plan = _kept(precision="bf16", fsdp_version=version, sync_each_batch=False, grad_accum=4)
        acc = _accumulated(plan)
        (phases,) = [p for label, _value, p in acc.details if KEPT in label]
        assert bool(phases & end) is kept_at_end, version
        full = _accumulated(plan.model_copy(update={"fsdp": FsdpMode.FULL}))
        extra = acc.last_layer_activations - full.last_layer_activations
        assert extra == (_line(_notes(plan), KEPT) if kept_at_end else 0), version


def test_no_shard_is_plain_data_parallelism_without_the_bucket_copy(tmp_path: Path) -> None:
    # NO_SHARD (accelerate's name or number 3, the Trainer's no_shard): nothing sharded, each
    # unit's flat gradient all-reduced in place, no DDP bucket copy; before, planned as full shard
    files = [
        _accelerate_file(tmp_path / "a.yaml", fsdp_sharding_strategy="NO_SHARD"),
        _accelerate_file(tmp_path / "b.yaml", fsdp_sharding_strategy=3),
    ]
    trainer = tmp_path / "args.yaml"
    trainer.write_text(yaml.safe_dump({"per_device_train_batch_size": 1, "fsdp": "no_shard"}))
    for path in [*files, trainer]:
        imported = read_plan_file(path)
        assert imported.updates["fsdp"] is FsdpMode.NONE, path.name
        assert imported.updates["ddp_bucket_view"] is True
        assert "fsdp_offload" not in imported.updates
        assert any("NO_SHARD" in note for note in imported.notes)
