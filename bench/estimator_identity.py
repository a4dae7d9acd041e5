"""Dump ``estimate_memory`` over a broad grid of plans, to prove a refactor changes no estimate.

Every catalog model and every model config under ``tests/data/model_configs`` (plus quantized
checkpoint variants) x every method x precisions, batches, sequence lengths, attention kinds and
checkpointing; then, on a handful of representative models, the settings that branch the
estimator: ZeRO stages and offload, optimizers and their implementations, gradient accumulation,
LoRA targets, ranks and dropout, FSDP (and with gradient accumulation, ``sync_each_batch``;
``shard-grad-op``), DDP's ``ddp_bucket_view``,
Megatron TP/PP, quantized inference, framework presets and memory savers, RL (PPO/GRPO, reference,
reward model, vLLM share) and accelerators.

Each plan's whole :class:`~hwdash.core.results.MemoryEstimate` (breakdown, host and managed bytes,
parameters, phase, details, warnings), or the error it raised, is written as JSON keyed by the
plan. Run before and after a change and compare::

    .venv/bin/python bench/estimator_identity.py /tmp/before.json
    .venv/bin/python bench/estimator_identity.py /tmp/after.json --compare /tmp/before.json

``--compare`` prints the number of plans compared and every key whose result differs (exit 1).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hwdash.core.catalog import Catalog, load_catalog
from hwdash.core.estimator import estimate_memory
from hwdash.core.models.config import model_from_config_file
from hwdash.core.plan import (
    Attention,
    Framework,
    FsdpMode,
    Loss,
    Method,
    Offload,
    Optimizer,
    OptimizerImpl,
    Plan,
    Precision,
    Quant,
    StoreDtype,
    ValueHead,
)
from hwdash.core.specs import Accelerator, ModelSpec
from hwdash.errors import UsageError

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "tests" / "data" / "model_configs"
#: Models the setting sweeps run on: dense Llama-style, MoE, Gemma 2 (soft-caps, fp32 norm scale),
#: Gemma 3 (qk norm), Phi-2 (parallel block, biases), GPT-2 (LayerNorm input), T5 (encoder-decoder),
#: a 70B model (ZeRO-3 live-parameter cap) and a 4-bit quantized checkpoint.
SWEEP_MODELS = (
    "qwen2.5-7b",
    "mixtral-8x7b",
    "gemma-2-2b",
    "gemma-3-1b",
    "phi-2",
    "gpt2",
    "flan-t5-large",
    "llama-3-70b",
    "qwen3-0.6b",
    "qwen2.5-7b-gptq4",
)


def _models(catalog: Catalog) -> dict[str, ModelSpec]:
    models = dict(catalog.models)
    for config in sorted(CONFIGS.glob("*/config.json")) + sorted(CONFIGS.glob("*/*/config.json")):
        # bad: broken on purpose; catalog: the catalog models' own config.json, which give their
        # catalog ids' estimates (tests/unit/test_catalog_configs.py)
        if config.parent.parent.name in ("bad", "catalog"):
            continue
        try:
            spec = model_from_config_file(config)
        except UsageError:
            # a family hwdash refuses (tests/data/model_configs/heldout/DeepSeek-V2-Lite): no plans
            # to compare; one that becomes readable (or refused) shows as plans added (or removed)
            continue
        models[f"config:{config.parent.name}"] = spec
    base = catalog.models["qwen2.5-7b"]
    models["qwen2.5-7b-gptq4"] = base.model_copy(update={"checkpoint_bits": 4})
    models["qwen2.5-7b-int8"] = base.model_copy(update={"checkpoint_bits": 8})
    return models


def _grid() -> Iterator[dict[str, Any]]:
    """The base grid, run on every model."""
    for method, precision, (batch, seq), attention, grad_ckpt in itertools.product(
        list(Method),
        list(Precision),
        ((1, 512), (4, 2048), (2, 8192)),
        list(Attention),
        (False, True),
    ):
        if method is Method.INFERENCE and grad_ckpt:
            continue
        yield {
            "method": method,
            "precision": precision,
            "batch": batch,
            "seq": seq,
            "attention": attention,
            "grad_ckpt": grad_ckpt,
        }


def _sweeps() -> Iterator[dict[str, Any]]:
    """Settings that branch the estimator, run on :data:`SWEEP_MODELS`."""
    trained = (Method.FULL, Method.LORA, Method.QLORA, Method.DORA)
    for method, zero, offload, gpus, precision in itertools.product(
        trained, (1, 2, 3), list(Offload), (1, 8), (Precision.BF16, Precision.AMP, Precision.MIXED)
    ):
        if offload is Offload.PARAMS and zero != 3:
            continue
        yield {
            "method": method,
            "zero": zero,
            "offload": offload,
            "gpus": gpus,
            "precision": precision,
        }
    for method, optimizer, impl, accum, precision in itertools.product(
        trained, list(Optimizer), list(OptimizerImpl), (1, 4), (Precision.BF16, Precision.MIXED)
    ):
        yield {
            "method": method,
            "optimizer": optimizer,
            "optimizer_impl": impl,
            "grad_accum": accum,
            "precision": precision,
        }
    targets_list = (("all-linear",), ("q_proj", "v_proj"), ("o_proj", "down_proj"), ("w1", "dense"))
    for method, targets, rank, dropout, precision in itertools.product(
        (Method.LORA, Method.DORA, Method.QLORA, Method.LORA_8BIT),
        targets_list,
        (8, 64),
        (0.0, 0.05),
        (Precision.BF16, Precision.AMP, Precision.FP32),
    ):
        yield {
            "method": method,
            "lora_targets": targets,
            "lora_r": rank,
            "lora_dropout": dropout,
            "precision": precision,
            "grad_ckpt": True,
        }
    for method, fsdp, gpus, per_node, offload, precision, ckpt in itertools.product(
        trained,
        (FsdpMode.FULL, FsdpMode.HYBRID),
        (2, 16),
        (None, 8),
        (False, True),
        (Precision.BF16, Precision.MIXED, Precision.AMP),
        (False, True),
    ):
        yield {
            "method": method,
            "fsdp": fsdp,
            "gpus": gpus,
            "gpus_per_node": per_node,
            "fsdp_offload": offload,
            "precision": precision,
            "grad_ckpt": ckpt,
        }
    for tp, pp, gpus, sp, selective, dropout, zero, precision, ckpt in itertools.product(
        (1, 2, 8),
        (1, 4),
        (8, 64),
        (True, False),
        (False, True),
        (0.0, 0.1),
        (0, 1),
        (Precision.MIXED, Precision.BF16),
        (False, True),
    ):
        if tp == pp == 1:
            continue
        yield {
            "method": Method.FULL,
            "tp": tp,
            "pp": pp,
            "gpus": gpus,
            "sequence_parallel": sp,
            "selective_recompute": selective,
            "hidden_dropout": dropout,
            "zero": zero,
            "precision": precision,
            "grad_ckpt": ckpt,
            "batch": 2,
        }
    for quant, gpus, precision, seq in itertools.product(
        list(Quant), (1, 4), (Precision.BF16, Precision.FP32), (512, 32768)
    ):
        yield {
            "method": Method.INFERENCE,
            "quant": quant,
            "gpus": gpus,
            "precision": precision,
            "seq": seq,
        }
    for method, framework, loss, compile_, act_off, in_bwd, precision, ckpt in itertools.product(
        (Method.FULL, Method.LORA, Method.QLORA, Method.DORA),
        list(Framework),
        (None, *Loss),
        (None, True),
        (None, True),
        (None, True),
        (Precision.BF16, Precision.AMP),
        (False, True),
    ):
        yield {
            "method": method,
            "framework": framework,
            "loss": loss,
            "compile": compile_,
            "activation_offload": act_off,
            "optimizer_in_backward": in_bwd,
            "precision": precision,
            "grad_ckpt": ckpt,
        }
    for method, frozen, adapter, optimizer, zero in itertools.product(
        (Method.QLORA, Method.LORA_8BIT, Method.LORA, Method.DORA),
        (None, *StoreDtype),
        (None, *StoreDtype),
        (Optimizer.ADAMW, Optimizer.ADAMW_8BIT_PAGED),
        (0, 2),
    ):
        yield {
            "method": method,
            "qlora_frozen_dtype": frozen,
            "adapter_dtype": adapter,
            "optimizer": optimizer,
            "zero": zero,
            "gpus": 2,
        }
    for method, rl_method, reference, reward, vllm, head, zero, gpus in itertools.product(
        (Method.PPO, Method.GRPO),
        (Method.FULL, Method.LORA, Method.QLORA, Method.DORA),
        (True, False),
        (None, True, False),
        (0.0, 0.3, 0.9),
        (None, *ValueHead),
        (0, 3),
        (1, 8),
    ):
        plan: dict[str, Any] = {
            "method": method,
            "rl_method": rl_method,
            "rl_reference": reference,
            "vllm_memory_utilization": vllm,
            "value_head": head,
            "zero": zero,
            "gpus": gpus,
        }
        if reward is not None:
            plan["rl_reward_model"] = reward
        yield plan
    # FSDP with gradient accumulation: no_sync's unsharded gradients, sync_each_batch, and the
    # frameworks whose default differs (hf: no_sync; torchtune: a reduce-scatter per micro-batch)
    for method, fsdp, gpus, accum, sync, framework, precision in itertools.product(
        trained,
        (FsdpMode.FULL, FsdpMode.HYBRID),
        (2, 16),
        (1, 4),
        (None, False, True),
        (Framework.HF, Framework.TORCHTUNE),
        (Precision.BF16, Precision.MIXED),
    ):
        fields: dict[str, Any] = {
            "method": method,
            "fsdp": fsdp,
            "gpus": gpus,
            "gpus_per_node": 8,
            "grad_accum": accum,
            "framework": framework,
            "precision": precision,
        }
        if sync is not None:
            fields["sync_each_batch"] = sync
        yield fields
    # FSDP's shard-grad-op (every unit kept gathered from forward to backward), both versions,
    # with and without no_sync; plain DDP with its gradients as bucket views
    for method, version, accum, sync in itertools.product(trained, (1, 2), (1, 4), (None, True)):
        fields = {"method": method, "fsdp": FsdpMode.SHARD_GRAD_OP, "gpus": 8}
        fields.update({"fsdp_version": version, "grad_accum": accum})
        if sync is not None:
            fields["sync_each_batch"] = sync
        yield fields
    for method, gpus, view in itertools.product(trained, (2, 8), (None, True)):
        yield {"method": method, "gpus": gpus, "ddp_bucket_view": view}


#: Accelerators the sweeps run under in turn (None: hardware-neutral; t4: no bf16; cpu: not a GPU),
#: and the one the ``gpus``-argument plans use.
ACCELERATORS = (None, "a100-80gb", "t4", "cpu", "h100-sxm")


def _result(plan: Plan, model: ModelSpec, **kwargs: Any) -> Any:
    try:
        estimate = estimate_memory(plan, model, **kwargs)
    except ValueError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return dataclasses.asdict(estimate)


def _key(name: str, fields: dict[str, Any], accelerator: str | None, gpus: int | None) -> str:
    shown = {k: (v.value if hasattr(v, "value") else v) for k, v in fields.items()}
    return json.dumps([name, shown, accelerator, gpus], sort_keys=True)


def run(catalog: Catalog) -> dict[str, Any]:
    """Every plan's result, keyed by model, fields, accelerator and the ``gpus`` argument."""
    models = _models(catalog)
    accelerators: dict[str | None, Accelerator | None] = {
        name: (None if name is None else catalog.accelerators[name]) for name in ACCELERATORS
    }
    results: dict[str, Any] = {}

    def add(name: str, fields: dict[str, Any], accel: str | None, gpus: int | None) -> None:
        try:
            plan = Plan(model=name, **fields)
        except ValidationError:
            return
        kwargs: dict[str, Any] = {"accelerator": accelerators[accel]}
        if gpus is not None:
            kwargs["gpus"] = gpus
        framework = catalog.frameworks.get(plan.framework.value)
        if framework is not None and plan.framework is not Framework.HF:
            kwargs["framework"] = framework
        results[_key(name, fields, accel, gpus)] = _result(plan, models[name], **kwargs)

    for name in models:
        for fields in _grid():
            add(name, fields, None, None)
    sweeps = list(_sweeps())
    for name in SWEEP_MODELS:
        for index, fields in enumerate(sweeps):
            accel = ACCELERATORS[index % 4]
            add(name, fields, accel, None)
    # the ``gpus`` argument overriding plan.gpus (what --fit's GPU-count search passes)
    for name, gpus, zero in itertools.product(SWEEP_MODELS, (1, 4, 16), (0, 3)):
        add(name, {"method": Method.FULL, "zero": zero, "gpus": 2}, "h100-sxm", gpus)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, help="where to write the JSON")
    parser.add_argument("--compare", type=Path, help="an earlier output to compare with")
    args = parser.parse_args()
    results = run(load_catalog(include_user=False))
    args.output.write_text(json.dumps(results, sort_keys=True, indent=0), encoding="utf-8")
    errors = sum(1 for value in results.values() if "error" in value)
    print(f"{len(results)} plans ({errors} raised a ValueError) written to {args.output}")
    if args.compare is None:
        return 0
    before = json.loads(args.compare.read_text(encoding="utf-8"))
    after = json.loads(json.dumps(results, sort_keys=True))
    differing = sorted(
        key for key in before.keys() | after.keys() if before.get(key) != after.get(key)
    )
    for key in differing[:20]:
        print(f"differs: {key}")
    print(f"compared {len(before.keys() | after.keys())} plans: {len(differing)} differ")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
