"""Issue 29: FSDP with no auto-wrap policy (``--fsdp-wrap none``): the whole model is the root
unit, gathered from the first forward to the end of backward, its whole unsharded gradient waiting
for one reduce-scatter (torch/distributed/fsdp/_fully_shard/_fsdp_state.py ``_lazy_init``;
_runtime_utils.py ``_post_forward_reshard``), against hand computations on the small Llama of
test_fsdp (P = 132,654,080 parameters); accelerate's and the Trainer's configs carry the policy
both ways, and make-it-fit offers wrapping the blocks."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_fsdp import BLOCK, GATHERED, SMALL, P, _plan
from test_fsdp_versions import (
    ARCH,
    TOP,
    _accelerate_file,
    _accumulated,
    _line,
    _notes,
    offered_by_fit,
)

from hwdash.core.estimator import estimate_memory
from hwdash.core.estimator.fsdp_versions import flat_padding_elements
from hwdash.core.plan import FsdpWrap, Plan
from hwdash.core.plan_unused import unused_settings
from hwdash.core.plans.exports import accelerate_config, trainer_snippet, uncarried_settings
from hwdash.core.plans.imports import read_plan_file
from hwdash.errors import UsageError

N = 4
WHOLE = "model gathered model (one FSDP unit, 2-byte)"
WHOLE_GRADIENT = "model unsharded gradient of the one unit, the whole model (before reduce-scatter)"


def _whole(**changes: object) -> Plan:
    return _plan(fsdp_wrap="none", **changes)


def test_the_whole_model_stays_gathered_with_its_whole_gradient() -> None:
    notes = _notes(_whole(precision="bf16", fsdp_version=1))
    # every parameter gathered in bf16, and every parameter's bf16 gradient before the one
    # reduce-scatter, in place of one block + the largest unit
    assert notes[WHOLE] == 2 * P
    assert notes[WHOLE_GRADIENT] == 2 * P
    blocks = _notes(_plan(precision="bf16", fsdp_version=1))
    assert blocks["model gathered units (running + prefetched, 2-byte)"] == 2 * GATHERED
    # FSDP1: the root unit adds nothing beyond the whole model; the flat gradient concatenated
    # from its views' gradients is a second copy of it, more than the reduce-scatter's new 1/N
    # shard (bf16 reduce: no cast copy)
    assert not any("root unit" in label for label in notes)
    assert _line(notes, "FSDP1 flat gradient's assembly or reduce-scatter staging") == 2 * P


def test_fsdp1_pads_the_one_flat_parameter_and_pools_it_on_the_all_gather_stream() -> None:
    # one flat parameter of P elements over 7 ranks: ceil(P / 7) - P / 7 elements per rank
    assert flat_padding_elements(ARCH, 7, one_unit=True) == pytest.approx(-(-P // 7) - P / 7)
    acc = _accumulated(_whole(precision="bf16", fsdp_version=1))
    # the all-gather stream's pool is the one gathered model, allocated throughout
    assert acc.side_stream_pool == 2 * P
    assert acc.side_stream_live == 2 * P


def test_fsdp2_stages_the_whole_model_through_its_collectives() -> None:
    notes = _notes(_whole(precision="bf16", fsdp_version=2))
    # the reduce-scatter input (every unsharded gradient copied in) and its 1/N output
    assert _line(notes, "FSDP2 reduce-scatter staging (2-byte)") == 2 * P + 2 * P // N
    # the all-gather output of the one unit exists once, at the first forward, before any
    # activation: counted beyond the activations at the start of backward
    acc = _accumulated(_whole(precision="bf16", fsdp_version=2))
    beyond = _line(notes, "FSDP2 all-gather output of the one unit")
    activations = acc.activations - 2 * P - beyond
    assert beyond == max(0, round(2 * P - activations))
    assert not any("all-gather output (one unit, copied out)" in label for label in notes)


def test_fsdp1_lora_without_wrapping_takes_the_whole_flat_gradient() -> None:
    plan = _whole(method="lora", precision="bf16", fsdp_version=1, lora_r=8)
    estimate = estimate_memory(plan, SMALL)
    notes = dict(estimate.details)
    trainable = estimate_memory(plan.model_copy(update={"fsdp_wrap": None}), SMALL)
    adapters = trainable.trainable_params
    # the one flat parameter holds the frozen base and the adapters: its whole gradient, in the
    # gathered dtype, waits for the reduce-scatter
    assert notes[WHOLE_GRADIENT] == 2 * (P + adapters)
    assert any("one flat parameter" in warning for warning in estimate.warnings)


def test_fsdp1_lora_without_wrapping_stages_its_reduce_scatter_under_no_sync() -> None:
    # no_sync keeps the one flat parameter's gradient unsharded between micro-batches; the last
    # micro-batch still reduce-scatters it, through the same staging as without accumulation
    staging = "FSDP1 flat gradient's assembly or reduce-scatter staging"
    synced = _whole(method="lora", precision="bf16", fsdp_version=1, lora_r=8)
    unsynced = synced.model_copy(update={"sync_each_batch": False, "grad_accum": 4})
    assert _line(_notes(synced), staging) > 0
    assert _line(_notes(unsynced), staging) == _line(_notes(synced), staging)


def test_no_wrap_costs_more_than_wrapping_the_blocks() -> None:
    for version in (1, 2):
        plan = _plan(precision="bf16", fsdp_version=version, grad_accum=1)
        blocks = estimate_memory(plan, SMALL)
        whole = estimate_memory(plan.model_copy(update={"fsdp_wrap": FsdpWrap.NONE}), SMALL)
        assert whole.allocated_bytes > blocks.allocated_bytes + 2 * (P - GATHERED)
        assert any("--fsdp-wrap transformer" in warning for warning in whole.warnings)


def test_the_transformer_wrap_is_the_default_to_the_byte() -> None:
    plan = _plan(precision="mixed", fsdp_version=1)
    told = plan.model_copy(update={"fsdp_wrap": FsdpWrap.TRANSFORMER})
    assert estimate_memory(told, SMALL) == estimate_memory(plan, SMALL)


def test_the_wrap_means_nothing_without_fsdp() -> None:
    plan = _plan(fsdp="none", gpus=1, fsdp_wrap="none")
    assert [name for name, _ in unused_settings(plan, ["fsdp_wrap"])] == ["fsdp_wrap"]


def test_accelerate_configs_carry_the_policy(tmp_path: Path) -> None:
    # no policy in the config: accelerate's NO_WRAP (FullyShardedDataParallelPlugin), said in a note
    imported = read_plan_file(_accelerate_file(tmp_path / "a.yaml"))
    assert imported.updates["fsdp_wrap"] is FsdpWrap.NONE
    assert any("NO_WRAP" in note for note in imported.notes)
    named = read_plan_file(
        _accelerate_file(tmp_path / "b.yaml", fsdp_auto_wrap_policy="TRANSFORMER_BASED_WRAP")
    )
    assert "fsdp_wrap" not in named.updates
    size = read_plan_file(
        _accelerate_file(tmp_path / "c.yaml", fsdp_auto_wrap_policy="SIZE_BASED_WRAP")
    )
    assert "fsdp_wrap" not in size.updates
    assert any("SIZE_BASED_WRAP" in note for note in size.notes)
    with pytest.raises(UsageError, match="fsdp_auto_wrap_policy"):
        read_plan_file(_accelerate_file(tmp_path / "d.yaml", fsdp_auto_wrap_policy="EVERY_LAYER"))
    # written back as it was read
    for wrap, written in ((None, "TRANSFORMER_BASED_WRAP"), ("none", "NO_WRAP")):
        config = accelerate_config(_plan(fsdp_wrap=wrap), 4)
        assert config["fsdp_config"]["fsdp_auto_wrap_policy"] == written
        path = tmp_path / f"{written}.yaml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        assert read_plan_file(path).updates.get("fsdp_wrap") == (wrap and FsdpWrap(wrap))


def test_the_trainer_snippet_says_no_wrap_and_reads_back(tmp_path: Path) -> None:
    snippet = trainer_snippet(_whole(fsdp_version=1), "small-llama")
    assert "'auto_wrap_policy': 'NO_WRAP'" in snippet.replace('"', "'")
    path = tmp_path / "train.py"
    path.write_text(snippet, encoding="utf-8")
    updates = read_plan_file(path).updates
    assert updates["fsdp_wrap"] is FsdpWrap.NONE
    assert updates["fsdp_version"] == 1
    # the Trainer's default policy (no fsdp_config) leaves the plan's default
    default = tmp_path / "default.py"
    default.write_text(trainer_snippet(_plan(), "small-llama"), encoding="utf-8")
    assert "fsdp_wrap" not in read_plan_file(default).updates
    assert "--fsdp-wrap none" not in uncarried_settings(_whole(), "trainer")
    assert "--fsdp-wrap none" in uncarried_settings(_whole(), "hf-jobs")


def test_make_it_fit_offers_wrapping_the_blocks() -> None:
    assert offered_by_fit(_whole(), "fsdp_wrap") == [{"fsdp_wrap": FsdpWrap.TRANSFORMER}]
    assert offered_by_fit(_plan(), "fsdp_wrap") == []
    # FSDP2 with the embedding and output layer in the root: their own units (accelerate 1.14)
    root = _plan(fsdp_version=2, fsdp_wrap="transformer")
    assert offered_by_fit(root, "fsdp_wrap") == [{"fsdp_wrap": FsdpWrap.TRANSFORMER_ENDS}]
    assert offered_by_fit(_plan(fsdp_version=1), "fsdp_wrap") == []


def test_fsdp2_with_its_ends_in_the_root_keeps_them_gathered_like_fsdp1() -> None:
    # accelerate before 1.14 wraps the blocks, then the model (fsdp2_prepare_model at v1.13.0):
    # the root unit holds the embedding, output layer and final norm from the first forward to
    # the end of backward beside the running and prefetched blocks, (TOP + TOP + 1024) + 2 BLOCK
    # parameters gathered against the neutral count's TOP + BLOCK + 1024
    for precision, gathered in (("bf16", 2), ("mixed", 2), ("fp32", 4)):
        root = _plan(precision=precision, fsdp_version=2, fsdp_wrap="transformer")
        assert _line(_notes(root), "FSDP2 root unit") == gathered * (TOP + BLOCK)
        default = _plan(precision=precision, fsdp_version=2)
        assert not any("root unit" in label for label in _notes(default))
        # FSDP2's default is transformer-ends, to the byte
        ends = default.model_copy(update={"fsdp_wrap": FsdpWrap.TRANSFORMER_ENDS})
        assert estimate_memory(ends, SMALL) == estimate_memory(default, SMALL)
        # the same root term FSDP1 counts
        fsdp1 = _plan(precision=precision, fsdp_version=1)
        assert _line(_notes(fsdp1), "FSDP1 root unit") == gathered * (TOP + BLOCK)
    # FSDP1 with the ends in their own units: no root unit, none in the all-gather stream's pool
    ends1 = _plan(precision="bf16", fsdp_version=1, fsdp_wrap="transformer-ends")
    assert not any("root unit" in label for label in _notes(ends1))
    assert _accumulated(ends1).side_stream_pool == 3 * 2 * BLOCK
    # the warning names the root layout only where the ends are counted in their own units
    warned = estimate_memory(_plan(fsdp_version=2), SMALL).warnings
    assert any("--fsdp-wrap transformer:" in warning for warning in warned)
    kept = estimate_memory(_plan(fsdp_version=2, fsdp_wrap="transformer"), SMALL).warnings
    assert not any("--fsdp-wrap transformer:" in warning for warning in kept)


HEAD_GRADIENT = "model output layer's gradient (kept for the FSDP root unit's reduce-scatter)"


def test_the_root_unit_keeps_the_output_layers_gradient_beside_the_recomputed_block() -> None:
    # with checkpointing and a fused loss the recomputed last block outweighs the loss; where the
    # root unit holds the output layer, its bf16 gradient (TOP parameters, made as backward
    # starts) waits for the root's reduce-scatter at the end of backward, beside that block
    fields = {
        "precision": "bf16",
        "grad_ckpt": True,
        "loss": "fused-linear",
        "grad_accum": 1,
        "seq": 4096,
    }
    for version, wrap in ((1, None), (2, "transformer")):
        notes = _notes(_plan(fsdp_version=version, fsdp_wrap=wrap, **fields))
        assert notes[HEAD_GRADIENT] == 2 * TOP
        assert "model recomputed layer" in notes
        ends = _notes(_plan(fsdp_version=version, fsdp_wrap="transformer-ends", **fields))
        assert HEAD_GRADIENT not in ends
        # the start of backward grows by exactly the kept gradient beside the recomputed block (at
        # 4096 tokens the block outweighs the fused loss, its hidden-state gradient and the
        # output layer's fp32 gradient, either way)
        kept = _accumulated(_plan(fsdp_version=version, fsdp_wrap=wrap, **fields))
        own = _accumulated(_plan(fsdp_version=version, fsdp_wrap="transformer-ends", **fields))
        root = _line(notes, "root unit (embedding")
        assert kept.activations - own.activations == 2 * TOP + root
    # LoRA trains no output layer: nothing kept
    lora = _notes(_plan(fsdp_version=1, method="lora", lora_r=8, **fields))
    assert HEAD_GRADIENT not in lora


def test_exports_say_when_the_written_policy_gives_the_other_layout() -> None:
    # accelerate's TRANSFORMER_BASED_WRAP gives FSDP1 the root layout and FSDP2 (accelerate 1.14+)
    # the embedding and output layer as their own units: the other layout is not carried
    for kind in ("accelerate", "trainer"):
        root2 = uncarried_settings(_plan(fsdp_version=2, fsdp_wrap="transformer"), kind)
        assert any(words.startswith("--fsdp-wrap transformer (") for words in root2)
        ends1 = uncarried_settings(_plan(fsdp_version=1, fsdp_wrap="transformer-ends"), kind)
        assert any(words.startswith("--fsdp-wrap transformer-ends (") for words in ends1)
        for version, wrap in ((1, None), (1, "transformer"), (2, None), (2, "transformer-ends")):
            carried = uncarried_settings(_plan(fsdp_version=version, fsdp_wrap=wrap), kind)
            assert not any("--fsdp-wrap" in words for words in carried)


def test_the_root_units_gradient_is_reduced_whole_at_the_end_of_backward() -> None:
    # the root unit's post-backward reduce-scatters its embedding, output layer and final norm
    # together (one flat parameter in FSDP1, one parameter group in FSDP2): 2 TOP + 1024
    # parameters of bf16 gradient wait, against the larger of the two alone as their own units
    unit = "model unsharded gradient of one unit (before reduce-scatter)"
    for version, root in ((1, None), (2, "transformer")):
        kept = _notes(_plan(precision="bf16", fsdp_version=version, fsdp_wrap=root, grad_accum=1))
        assert kept[unit] == 2 * (2 * TOP + 1024)
        own = _plan(precision="bf16", fsdp_version=version, fsdp_wrap="transformer-ends")
        assert _notes(own.model_copy(update={"grad_accum": 1}))[unit] == 2 * TOP
