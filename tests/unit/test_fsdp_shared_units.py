"""FSDP1 with the adapters inside their blocks' units (``--framework litgpt``): each block's flat
parameter takes a whole gradient, frozen weights included (PyTorch's ``FullyShardedDataParallel``
docs, ``use_orig_params``); and the end of a ``no_sync`` backward holds the sums or the shards."""

from __future__ import annotations

from test_fsdp import BLOCK, SMALL

from hwdash.core.estimator import estimate_memory
from hwdash.core.estimator.phases import _Accumulator
from hwdash.core.plan import Plan

LAYERS = 4
UNSYNCED = "model unsharded gradients (no_sync between micro-batches)"


def _lora(**changes: object) -> Plan:
    fields: dict[str, object] = {
        "model": "small-llama",
        "method": "lora",
        "lora_targets": ("q_proj", "v_proj"),
        "fsdp": "full",
        "fsdp_version": 1,
        "gpus": 4,
        "grad_accum": 4,
        "seq": 256,
        "framework": "litgpt",
    }
    fields.update(changes)
    return Plan.model_validate(fields)


def _line(plan: Plan, start: str) -> int:
    found = [v for k, v in estimate_memory(plan, SMALL).details if k.startswith(start)]
    assert len(found) == 1, start
    return int(found[0])


def test_no_sync_keeps_the_whole_blocks_gradients_unsharded() -> None:
    shared = estimate_memory(_lora(), SMALL)
    trainable = shared.trainable_params
    # bf16 sums (LitGPT trains in bf16-true) of every block parameter, beside the adapters' own
    # (the FSDP path keeps adapters in fp32, as without sharing)
    assert dict(shared.details)[UNSYNCED] == 2 * LAYERS * BLOCK + 4 * trainable
    assert any("takes a whole gradient" in w for w in shared.warnings)
    # PEFT's wrap policy (hf): the adapters' own units, their gradients only (fp32 adapters)
    own = estimate_memory(_lora(framework="hf"), SMALL)
    assert dict(own.details)[UNSYNCED] == 4 * trainable
    assert not any("takes a whole gradient" in w for w in own.warnings)


def test_synced_each_micro_batch_the_block_gradients_are_sharded() -> None:
    # a reduce-scatter per micro-batch: the accumulated shards of the whole blocks
    plan = _lora(sync_each_batch=True)
    trainable = estimate_memory(plan, SMALL).trainable_params
    shard = _line(plan, "model gradients (1/4 shard)")
    assert shard == (2 * LAYERS * BLOCK + 4 * trainable) / 4
    own = _line(_lora(sync_each_batch=True, framework="hf"), "model gradients (1/4 shard)")
    assert own == 4 * trainable / 4


def test_fsdp2_and_quantized_bases_are_not_affected() -> None:
    # FSDP2 shards each parameter on its own (no flat parameter); a quantized base is not modelled
    for changes in ({"fsdp_version": 2}, {"method": "qlora"}):
        shared = estimate_memory(_lora(**changes), SMALL)
        own = estimate_memory(_lora(framework="hf", adapter_dtype="bf16", **changes), SMALL)
        assert dict(shared.details)[UNSYNCED] == dict(own.details)[UNSYNCED]


def test_the_end_of_a_no_sync_backward_holds_the_sums_or_the_shards() -> None:
    acc = _Accumulator()
    acc.unsynced_gradients, acc.produced_gradients = 10.0, 4.0
    assert acc.backward_end_gradients() == 10.0
    assert acc.phase_total("end of backward") == 10.0
    assert acc.phase_total("optimizer step") == 4.0
    assert acc.phase_total("start of backward") == 10.0
    # without no_sync: what backward produced
    acc.unsynced_gradients = 0.0
    assert acc.backward_end_gradients() == 4.0
