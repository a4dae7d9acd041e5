"""PyTorch FSDP against hand-computed numbers (issue 13): states in the plan's dtype, the mixed
precision policy, full vs hybrid shard, CPU offload and the gathered units.

A small Llama-style model with round numbers: hidden 1024, 4 layers, 8 heads (MHA, head_dim 128),
SwiGLU width 4096, vocabulary 32000, untied. One block: q, k, v, o 4 x 1024^2 = 4,194,304; gate,
up, down 3 x 1024 x 4096 = 12,582,912; two RMSNorms 2 x 1024: 16,779,264. Embedding and LM head
32,768,000 each, final norm 1024: P = 4 x 16,779,264 + 2 x 32,768,000 + 1024 = 132,654,080.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hwdash.commands.plan_args import plan_arguments
from hwdash.core.estimator import estimate_memory
from hwdash.core.estimator.parallelism import fsdp_shard_size
from hwdash.core.estimator.software import packaged_software
from hwdash.core.plan import FsdpMode, Plan
from hwdash.core.results import MemoryBreakdown
from hwdash.core.specs import ModelSpec

SMALL = ModelSpec(
    id="small-llama",
    name="Small Llama",
    layers=4,
    hidden_size=1024,
    heads=8,
    kv_heads=8,
    head_dim=128,
    intermediate_size=4096,
    vocab_size=32000,
    max_context=4096,
    source="test model",
)
P = 132_654_080
BLOCK = 16_779_264
# running unit (the largest: embedding or LM head) + one prefetched block + the root's final norm
GATHERED = 32_768_000 + BLOCK + 1024


def _plan(**changes: object) -> Plan:
    # fused AdamW (no step temporaries) and gradient accumulation (gradients alive in every phase)
    # keep each component independent of the phase the peak falls in; sync_each_batch keeps the
    # accumulated gradients sharded (no no_sync: see the tests at the end)
    fields: dict[str, object] = {
        "model": "small-llama",
        "method": "full",
        "fsdp": "full",
        "gpus": 4,
        "optimizer_impl": "fused",
        "grad_accum": 2,
        "sync_each_batch": True,
        "seq": 256,
    }
    fields.update(changes)
    return Plan.model_validate(fields)


def test_pure_bf16_keeps_every_state_bf16() -> None:
    memory = estimate_memory(_plan(precision="bf16"), SMALL).per_gpu
    # weights: the 1/4 shard, 2 P / 4 = 66,327,040
    assert memory.weights == 2 * P // 4 == 66_327_040
    # bf16 gradients and two bf16 AdamW states, sharded: no fp32 master copy
    assert memory.gradients == 2 * P // 4
    assert memory.optimizer == 4 * P // 4
    # DeepSpeed ZeRO-3 on the same plan turns bf16 into an fp32 master copy + fp32 states
    zero3 = estimate_memory(_plan(fsdp="none", zero=3, precision="bf16"), SMALL).per_gpu
    assert zero3.optimizer == 12 * P // 4


def test_mixed_precision_policy_shards_fp32_and_gathers_bf16() -> None:
    memory = estimate_memory(_plan(precision="mixed"), SMALL).per_gpu
    # fp32 sharded parameters (4 P / 4); the bf16 gathered copies: see below
    assert memory.weights == 4 * P // 4
    # fp32 gradient shard (the sharded parameter's dtype) and fp32 Adam states: 16 bytes / N in all
    assert memory.gradients == 4 * P // 4
    assert memory.optimizer == 8 * P // 4


def test_mixed_policy_activations_are_those_of_a_bf16_model() -> None:
    # the layers compute on bf16 weights: no autocast copies, unlike amp's fp32 model
    # (a long batch, so both peak at the start of backward)
    mixed = estimate_memory(_plan(precision="mixed", grad_accum=1, batch=16, seq=2048), SMALL)
    plain_bf16 = estimate_memory(Plan(model="small-llama", method="full", batch=16), SMALL)
    assert mixed.peak_phase == plain_bf16.peak_phase == "start of backward"
    # ... plus the gathered units in bf16 (2 x 49,548,288 = 99,096,576 bytes) and FSDP2's
    # all-gather output of the prefetched block being copied out (2 x 16,779,264), alive only
    # while forward and backward run
    assert mixed.per_gpu.activations == plain_bf16.per_gpu.activations + 2 * GATHERED + 2 * BLOCK
    assert dict(mixed.details)["model gathered units (running + prefetched, 2-byte)"] == 99_096_576
    # amp gathers the fp32 parameters themselves: 4 bytes each
    amp = estimate_memory(_plan(precision="amp", grad_accum=1, batch=8, seq=2048), SMALL)
    assert dict(amp.details)["model gathered units (running + prefetched, 4-byte)"] == 4 * GATHERED


def test_hybrid_shards_within_a_node() -> None:
    assert fsdp_shard_size(16, FsdpMode.HYBRID, 8) == 8
    assert fsdp_shard_size(16, FsdpMode.FULL, 8) == 16
    assert fsdp_shard_size(4, FsdpMode.HYBRID, None) == 4
    hybrid = estimate_memory(_plan(fsdp="hybrid", gpus=16, gpus_per_node=8), SMALL).per_gpu
    assert hybrid.weights == 2 * P // 8
    assert hybrid.optimizer == 4 * P // 8
    full = estimate_memory(_plan(fsdp="full", gpus=16), SMALL).per_gpu
    assert full.optimizer == 4 * P // 16


def test_cpu_offload_moves_the_shards_to_the_host() -> None:
    estimate = estimate_memory(_plan(fsdp_offload=True, precision="bf16"), SMALL)
    memory = estimate.per_gpu
    # the GPU keeps only the gathered units (with the activations); parameters, gradients and
    # AdamW states (2 + 2 + 4 bytes per parameter) are in host RAM, all four shards together
    assert memory.weights == 0
    assert dict(estimate.details)["model gathered units (running + prefetched, 2-byte)"] == (
        2 * GATHERED
    )
    assert memory.optimizer == 0
    assert memory.gradients == 0
    assert estimate.host_bytes == 8 * P


def test_end_of_backward_holds_one_unsharded_unit_gradient() -> None:
    # a short sequence: the peak is the end of backward, every gradient shard there
    estimate = estimate_memory(_plan(grad_accum=1, optimizer_impl="foreach", seq=64), SMALL)
    assert estimate.peak_phase == "end of backward"
    details = dict(estimate.details)
    # the largest unit (the LM head, 32,768,000 parameters) waits for its reduce-scatter in bf16
    label = "model unsharded gradient of one unit (before reduce-scatter)"
    assert details[label] == 2 * 32_768_000
    assert details["model gathered units (running + prefetched, 2-byte)"] == 2 * GATHERED
    assert estimate.per_gpu.gradients == 2 * P // 4
    # foreach AdamW's temporary (one bf16 state per parameter) over the local shard, at the step
    step_only = [label for label, _ in estimate.details if "temporaries" in label]
    assert step_only == []


def test_lora_under_fsdp_shards_the_frozen_base() -> None:
    memory = estimate_memory(_plan(method="lora", precision="bf16"), SMALL).per_gpu
    unsharded = estimate_memory(
        Plan(model="small-llama", method="lora", seq=256, grad_accum=2), SMALL
    ).per_gpu
    assert memory.weights < unsharded.weights
    assert memory.optimizer == pytest.approx(unsharded.optimizer / 4, abs=1)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"fsdp": "full", "zero": 3}, "--fsdp and --zero"),
        ({"fsdp_offload": True}, "--fsdp-offload needs --fsdp"),
        ({"fsdp": "full", "method": "inference"}, "--fsdp is modelled"),
        ({"fsdp": "full", "tp": 2, "gpus": 2}, "--fsdp with --tp "),
        ({"tp": 2, "gpus": 3}, "--gpus 3 is not a multiple"),
        ({"tp": 2, "gpus": 2, "zero": 3}, "--zero with --tp:"),
        ({"pp": 2, "gpus": 2, "grad_ckpt": True, "selective_recompute": True}, "exclude"),
    ],
)
def test_refused_combinations(fields: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"model": "small-llama", "method": "full", **fields}
    if "method" in fields:
        base["method"] = fields["method"]
    with pytest.raises(ValueError, match=message):
        Plan.model_validate(base)


def test_plan_arguments_round_trip_the_new_flags() -> None:
    plan = Plan(
        model="llama-3.1-8b",
        method="full",
        fsdp=FsdpMode.HYBRID,
        fsdp_offload=True,
        gpus=16,
        gpus_per_node=8,
    )
    args = plan_arguments(plan)
    assert args[args.index("--fsdp") + 1] == "hybrid"
    assert "--fsdp-offload" in args and args[args.index("--gpus-per-node") + 1] == "8"
    megatron = Plan(
        model="llama-3.1-8b",
        method="full",
        tp=2,
        pp=2,
        gpus=8,
        sequence_parallel=False,
        selective_recompute=True,
        hidden_dropout=0.1,
    )
    args = plan_arguments(megatron)
    for flag in ("--no-sequence-parallel", "--selective-recompute"):
        assert flag in args
    assert args[args.index("--hidden-dropout") + 1] == "0.1"
    assert args[args.index("--tp") + 1] == "2" and args[args.index("--pp") + 1] == "2"


def _hwdash(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hwdash", "plan", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--tp", "3", "--gpus", "6"], "--tp"),  # 32 heads not divisible by 3
        (["--pp", "3", "--gpus", "3"], "--pp"),  # 32 layers not divisible by 3
        (["--tp", "2", "--gpus", "3"], "--gpus"),
        (["--fsdp", "full", "--zero", "3", "--gpus", "4"], "--fsdp"),
        (["--fsdp", "sideways"], "--fsdp"),
    ],
)
def test_cli_refuses_naming_the_flag(args: list[str], flag: str) -> None:
    result = _hwdash("--model", "llama-3.1-8b", "--method", "full", *args)
    assert result.returncode == 2
    assert flag in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2


def test_cli_json_and_title_carry_the_parallel_layout() -> None:
    result = _hwdash(
        "--model", "llama-3.1-8b", "--method", "full", "--tp", "2", "--pp", "2", "--gpus", "8",
        "--zero", "1", "--json", "--flavor", "a100x8",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert (document["plan"]["tp"], document["plan"]["pp"]) == (2, 2)
    assert document["plan"]["sequence_parallel"] is True
    assert any("tp 2 x pp 2 x dp 2" in label for label, _ in document["details"])
    text = _hwdash(
        "--model", "llama-3.1-8b", "--method", "full", "--fsdp", "full", "--gpus", "4",
        "--flavor", "a100x4",
    )  # fmt: skip
    assert text.returncode == 0, text.stderr
    assert "FSDP full shard over 4" in text.stdout


# -- gradient accumulation under no_sync (issue 22) ------------------------------------------------

#: Llama 3.1 8B's parameter count (the model card's 8.03B; 32 blocks of 218,112,000, embedding and
#: LM head 525,336,576 each, final norm 4096).
LLAMA_8B = 32 * 218_112_000 + 2 * 525_336_576 + 4096
GIB = 1024**3


def _llama(**changes: object) -> Plan:
    fields: dict[str, object] = {
        "model": "llama-3.1-8b",
        "method": "full",
        "precision": "bf16",
        "fsdp": "full",
        "gpus": 8,
        "grad_accum": 4,
    }
    fields.update(changes)
    return Plan.model_validate(fields)


def _counted(memory: MemoryBreakdown) -> int:
    """The components without the overhead guess (a share of them)."""
    return memory.total - memory.overhead


def _llama_spec() -> ModelSpec:
    from hwdash.core.catalog import load_catalog

    return load_catalog().models["llama-3.1-8b"]


def test_no_sync_keeps_the_whole_unsharded_gradient_between_micro_batches() -> None:
    # the Hugging Face Trainer (framework hf) runs micro-batches 1-3 of 4 under no_sync: FSDP
    # keeps every parameter's bf16 gradient unsharded, 2 x 8.03e9 bytes = 14.96 GiB per GPU
    model = _llama_spec()
    no_sync = estimate_memory(_llama(), model)
    synced = estimate_memory(_llama(sync_each_batch=True), model)
    assert no_sync.peak_phase == synced.peak_phase == "start of backward"
    assert no_sync.per_gpu.gradients == 2 * LLAMA_8B
    assert synced.per_gpu.gradients == 2 * LLAMA_8B // 8
    # the 1/8 shard counted before, the whole gradient now: about 13 GiB more per GPU, and the
    # distributed allocator pool's share of it on top
    grown = _counted(no_sync.per_gpu) - _counted(synced.per_gpu)
    assert grown == 2 * LLAMA_8B - 2 * LLAMA_8B // 8
    share = 1 + packaged_software().pool.distributed
    assert no_sync.per_gpu.total - synced.per_gpu.total == pytest.approx(grown * share, abs=2)
    assert any("--sync-each-batch" in warning for warning in no_sync.warnings)
    assert not any("--sync-each-batch" in warning for warning in synced.warnings)


def test_sync_each_batch_adds_only_the_gradient_shard_to_one_micro_batch() -> None:
    model = _llama_spec()
    one = estimate_memory(_llama(grad_accum=1), model).per_gpu
    synced = estimate_memory(_llama(sync_each_batch=True), model).per_gpu
    # one micro-batch: the gradients appear as backward frees the activations; accumulating with
    # a reduce-scatter per micro-batch keeps the 1/8 shard across backward, nothing more
    assert _counted(synced) - _counted(one) == 2 * LLAMA_8B // 8


def test_the_unsharded_gradient_is_in_the_gathered_dtype_and_gone_at_the_step() -> None:
    # mixed: fp32 shards gathered in bf16; autograd accumulates into the bf16 unsharded
    # parameters' gradients (accelerate's policy reduces in bf16 too), 2 bytes per parameter
    estimate = estimate_memory(_plan(precision="mixed", sync_each_batch=False), SMALL)
    # (the peak is the start of backward: the sums and the saved activations; at the end of a
    # backward the sums or the shards are there, not both)
    assert estimate.peak_phase == "start of backward"
    assert dict(estimate.details)["model unsharded gradients (no_sync between micro-batches)"] == (
        2 * P
    )
    # the unit waiting for its reduce-scatter is one of the accumulated gradients, not one more
    label = "model unsharded gradient of one unit (before reduce-scatter)"
    assert dict(estimate.details).get(label, 0) == 0
    # at the optimizer step the last micro-batch has reduce-scattered them: the fp32 shards only,
    # as with a reduce-scatter after every micro-batch (the phase is never the peak here, so the
    # phases' totals are compared)
    no_sync, synced = (
        _phases(_plan(precision="mixed", sync_each_batch=False)),
        _phases(_plan(precision="mixed")),
    )
    assert no_sync["optimizer step"] == synced["optimizer step"]
    # during backward: the 2-byte unsharded sums instead of the 4-byte quarter shard
    assert no_sync["start of backward"] - synced["start of backward"] == 2 * P - 4 * P // 4


def _phases(plan: Plan) -> dict[str, float]:
    """Bytes alive in each training phase of ``plan`` on SMALL (before the overhead guesses)."""
    from hwdash.core import estimator as est
    from hwdash.core.estimator.parallelism import add_fsdp_training

    acc = est._Accumulator()
    add_fsdp_training(
        plan,
        est.architecture(SMALL),
        plan.method,
        plan.gpus,
        acc,
        "model",
        with_logits=True,
        train_one=est._train_one_model,  # the unsharded count, handed in (no import circle)
    )
    phases = (est.PHASE_BACKWARD, est.PHASE_BACKWARD_END, est.PHASE_OPTIMIZER_STEP)
    return {phase: acc.phase_total(phase) for phase in phases}


def test_no_sync_needs_accumulation_and_more_than_one_gpu() -> None:
    one_batch = estimate_memory(_plan(grad_accum=1, sync_each_batch=False), SMALL)
    assert one_batch.per_gpu.gradients <= 2 * P // 4
    one_gpu = estimate_memory(_plan(gpus=1, sync_each_batch=False), SMALL).per_gpu
    assert one_gpu.gradients == 2 * P  # the whole gradient either way


def test_torchtune_syncs_every_micro_batch_by_default() -> None:
    model = _llama_spec()
    torchtune = estimate_memory(_llama(framework="torchtune"), model).per_gpu
    assert torchtune.gradients == 2 * LLAMA_8B // 8
    told = estimate_memory(_llama(framework="torchtune", sync_each_batch=False), model).per_gpu
    assert told.gradients == 2 * LLAMA_8B


def test_sync_each_batch_flag_round_trips_and_warns_without_fsdp() -> None:
    plan = _llama(sync_each_batch=True)
    args = plan_arguments(plan)
    assert "--sync-each-batch" in args
    assert "--no-sync-each-batch" in plan_arguments(_llama(sync_each_batch=False))
    result = _hwdash("--model", "llama-3.1-8b", "--method", "full", "--sync-each-batch", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["plan"]["sync_each_batch"] is True
    assert any(w.startswith("--sync-each-batch does nothing here") for w in document["warnings"])
