"""Issue 29's own whole-GPU readings: offloaded and sharded training runs measured on a lent GPU.

    python bench/whole_gpu_device.py --out DIR [--only NAME,...] [--steps 4]
    python bench/whole_gpu_device.py --out DIR --device cpu --tiny      # checks the script without a GPU

Public whole-GPU (nvidia-smi) readings of offloaded and sharded runs are scarce (issue 29's sets C and D found 14,
9 of them with the measure assumed), so this script makes its own on one GPU: DeepSpeed ZeRO-2/3 with and without
CPU offload and PyTorch FSDP1/FSDP2 with and without CPU offload, each world size 1 (one process, NCCL), the
models built from their catalog config with random weights (nothing is downloaded).

It measures only: it never computes or prints an estimate, so the rows it writes can be scored once, held out,
by ``bench/whole_gpu_accuracy.py`` after they are written down. Each setting runs in a fresh Python process; the
parent reads NVML's used memory of the GPU every 0.1 s while the child runs (the whole GPU: CUDA context, NCCL,
the caching allocator's pool and every tensor), over the used memory before the child started. The child adds
torch's ``max_memory_allocated`` / ``max_memory_reserved`` and ``cudaMemGetInfo``'s used memory after each step.

Writes ``DIR/whole_gpu_device.json`` (one row per setting, with the ``hwdash plan`` flags of the same setting).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpu_runs import NvmlPeak, record_child  # issue 26's NVML sampler (every 0.1 s here) and log

ROOT = Path(__file__).resolve().parents[1]

_COMMON_DS = ["--method", "full", "--precision", "mixed", "--gpus", "1", "--framework", "deepspeed"]
_COMMON_FSDP = ["--method", "full", "--precision", "mixed", "--gpus", "1", "--framework", "fsdp"]
_OFFLOAD_NAME = {"none": "", "optimizer": "-offload-opt", "params": "-offload-params"}


def _setting(
    runner: str,
    model: str,
    batch: int,
    seq: int,
    zero: int = 0,
    offload: str = "none",
    ckpt: bool = True,
) -> tuple[str, dict[str, Any]]:
    """One run: its name, and its runner options beside the ``hwdash plan`` flags of the same setting.

    ``runner``: deepspeed (``zero`` stage; ``offload`` none|optimizer|params) or fsdp1/fsdp2 (``offload``
    none|params: CPU offload of parameters, gradients and the step). ``ckpt``: non-reentrant checkpointing of
    every decoder layer (sets E and F always checkpoint)."""
    if runner == "deepspeed":
        name = f"ds-z{zero}{_OFFLOAD_NAME[offload]}"
        flags = ["--model", model, *_COMMON_DS, "--zero", str(zero)]
        flags += ["--offload", offload] if offload != "none" else []
    else:
        name = runner + ("-offload" if offload != "none" else "")
        flags = ["--model", model, *_COMMON_FSDP, "--fsdp", "full", "--fsdp-version", runner[-1]]
        flags += ["--fsdp-offload"] if offload != "none" else []
    flags += ["--batch", str(batch), "--seq", str(seq)] + (["--grad-ckpt"] if ckpt else [])
    options = {"runner": runner, "zero": zero, "offload": offload, "ckpt": ckpt, "flags": flags}
    return f"{name}-{model}-b{batch}-s{seq}-{'ckpt' if ckpt else 'nockpt'}", options


#: Set E (bench/data/whole_gpu_readings_e.toml), measured first.
SET_E = dict(
    [
        _setting("deepspeed", "qwen2.5-3b", 2, 2048, zero=3, offload="params"),
        _setting("deepspeed", "qwen2.5-1.5b", 4, 2048, zero=2, offload="optimizer"),
        _setting("deepspeed", "qwen2.5-1.5b", 4, 2048, zero=3, offload="optimizer"),
        _setting("deepspeed", "qwen2.5-1.5b", 4, 2048, zero=3),
        _setting("deepspeed", "qwen2.5-0.5b", 4, 2048, zero=2),
        _setting("fsdp1", "qwen2.5-1.5b", 4, 2048, offload="params"),
        _setting("fsdp2", "qwen2.5-1.5b", 4, 2048, offload="params"),
        _setting("fsdp2", "qwen2.5-1.5b", 4, 2048),
        _setting("fsdp1", "qwen2.5-1.5b", 4, 2048),
    ]
)
#: Set F, measured after the formula changes that set E led to: other models, batches and lengths.
SET_F = dict(
    [
        _setting("deepspeed", "llama-3.2-1b", 4, 2048, zero=3, offload="params"),
        _setting("deepspeed", "llama-3.2-1b", 8, 1024, zero=2, offload="optimizer"),
        _setting("fsdp2", "llama-3.2-1b", 4, 2048, offload="params"),
        _setting("deepspeed", "qwen3-0.6b", 4, 2048, zero=3),
        _setting("fsdp2", "qwen3-0.6b", 8, 1024),
    ]
)
#: Set H, measured --quiet after set F was scored and kept unread until the formulas of this stop are committed:
#: ZeRO-1 and runs without checkpointing join, with other models, batches and lengths again.
SET_H = dict(
    [
        _setting("deepspeed", "qwen2.5-1.5b", 2, 4096, zero=3, offload="params"),
        _setting("deepspeed", "llama-3.2-1b", 4, 2048, zero=3, offload="optimizer"),
        _setting("deepspeed", "qwen3-1.7b", 4, 1024, zero=2),
        _setting("deepspeed", "qwen2.5-0.5b", 8, 1024, zero=1, ckpt=False),
        _setting("fsdp1", "llama-3.2-1b", 4, 1024, offload="params"),
        _setting("fsdp2", "qwen2.5-0.5b", 8, 2048, ckpt=False),
        _setting("fsdp2", "qwen3-1.7b", 2, 4096, offload="params"),
        _setting("fsdp1", "qwen3-0.6b", 8, 2048),
        _setting("deepspeed", "llama-3.2-1b", 4, 4096, zero=3, ckpt=False),
    ]
)
SETTINGS = {**SET_E, **SET_F, **SET_H}


# -- the child ---------------------------------------------------------------------------------------------------


def _hf_config(model_id: str, tiny: bool) -> Any:
    from transformers import AutoConfig

    from hwdash.core.catalog import load_catalog
    from hwdash.core.models.config import resolve_model
    from hwdash.tracing.model_config import build_hf_config_dict

    fields = build_hf_config_dict(
        resolve_model(model_id, load_catalog()), layers=2 if tiny else None
    )
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    config._attn_implementation = "sdpa"
    config.use_cache = False
    return config


def _flag(flags: list[str], name: str) -> str:
    return flags[flags.index(name) + 1]


def _init_single_process(device: str) -> None:
    import torch
    import torch.distributed as dist

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1"
    )
    if device == "cuda":
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    else:
        dist.init_process_group("gloo", rank=0, world_size=1)


def _deepspeed_engine(setting: dict[str, Any], config: Any, batch: int, device: str) -> Any:
    import deepspeed
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.integrations import HfDeepSpeedConfig

    zero: dict[str, Any] = {"stage": setting["zero"]}
    if setting["offload"] in ("optimizer", "params"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if setting["offload"] == "params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    ds_config = {
        "train_micro_batch_size_per_gpu": batch,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": zero,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 10**9,
    }
    keep = (
        HfDeepSpeedConfig(ds_config) if setting["zero"] == 3 else None
    )  # from_config under zero.Init
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    if setting["zero"] != 3 and device == "cuda":
        model = model.cuda()
    if setting["ckpt"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=1e-5, foreach=True
    )
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
    engine._hwdash_keep = keep
    return engine


def _fsdp_model(setting: dict[str, Any], config: Any, device: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if setting["ckpt"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    layers = list(model.model.layers)
    target = torch.device(device)
    if setting["runner"] == "fsdp1":
        from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

        policy = functools.partial(
            transformer_auto_wrap_policy, transformer_layer_cls={type(layers[0])}
        )
        model = FSDP(
            model,
            auto_wrap_policy=policy,
            mixed_precision=MixedPrecision(torch.bfloat16, torch.bfloat16, torch.bfloat16),
            cpu_offload=CPUOffload(offload_params=setting["offload"] != "none"),
            sharding_strategy=ShardingStrategy.FULL_SHARD,
            device_id=target if device == "cuda" else None,
            use_orig_params=True,
            limit_all_gathers=True,
        )
    else:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        options: dict[str, Any] = {
            "mp_policy": MixedPrecisionPolicy(torch.bfloat16, torch.bfloat16)
        }
        if setting["offload"] != "none":
            options["offload_policy"] = CPUOffloadPolicy(pin_memory=device == "cuda")
        elif device == "cuda":
            model = model.to(target)
        for layer in layers:
            fully_shard(layer, **options)
        fully_shard(model, **options)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    return model, optimizer


def child(name: str, steps: int, device: str, tiny: bool, baseline: int) -> None:
    import torch

    setting = SETTINGS[name]
    flags = setting["flags"]
    config = _hf_config(_flag(flags, "--model"), tiny)
    batch, seq = int(_flag(flags, "--batch")), (64 if tiny else int(_flag(flags, "--seq")))
    _init_single_process(device)
    if setting["runner"] == "deepspeed":
        engine = _deepspeed_engine(setting, config, batch, device)

        def step(ids: Any) -> None:
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
    else:
        model, optimizer = _fsdp_model(setting, config, device)

        def step(ids: Any) -> None:
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    ids = torch.randint(0, config.vocab_size, (batch, seq), device=device)
    times, used_after_step = [], []
    for _ in range(steps):
        started = time.perf_counter()
        step(ids)
        if device == "cuda":
            torch.cuda.synchronize()
            free, total = torch.cuda.mem_get_info()
            used_after_step.append(total - free - baseline)
        times.append(time.perf_counter() - started)
    result: dict[str, Any] = {"step_s": times, "used_after_step": used_after_step}
    if device == "cuda":
        result.update(
            max_allocated=torch.cuda.max_memory_allocated(),
            max_reserved=torch.cuda.max_memory_reserved(),
            gpu=torch.cuda.get_device_name(0),
            torch=torch.__version__,
        )
    print("RESULT " + json.dumps(result), flush=True)


def nccl_groups(baseline: int) -> None:
    """Device memory outside PyTorch's caching allocator (used - reserved) as a process adds NCCL communicators."""
    import torch
    import torch.distributed as dist

    def outside() -> int:
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        return total - free - baseline - torch.cuda.memory_reserved()

    stages: dict[str, int] = {}
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(4, 16, 2048, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    (out.sum() + (x @ x).sum()).backward()
    stages["context, bf16 matmul, SDPA forward and backward"] = outside()
    _init_single_process("cuda")
    t = torch.ones(1 << 22, device="cuda")
    dist.all_reduce(t)
    dist.all_gather_into_tensor(torch.empty_like(t), t)
    dist.reduce_scatter_tensor(torch.empty_like(t), t)
    stages["+ the world communicator (all-reduce, all-gather, reduce-scatter)"] = outside()
    for count in (2, 3):
        group = dist.new_group([0])
        dist.all_reduce(t, group=group)
        stages[f"+ communicator {count} (dist.new_group, all-reduce)"] = outside()
    print(
        "RESULT "
        + json.dumps(
            {
                "stages": stages,
                "torch": torch.__version__,
                "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            }
        ),
        flush=True,
    )


# -- the parent --------------------------------------------------------------------------------------------------


def run_setting(name: str, args: argparse.Namespace, meter: NvmlPeak) -> dict[str, Any]:
    meter.start()
    baseline = meter.baseline or 0
    started = time.time()
    command = [
        sys.executable,
        __file__,
        "--child",
        name,
        "--steps",
        str(args.steps),
        "--device",
        args.device,
    ]
    command += ["--baseline", str(baseline)] + (["--tiny"] if args.tiny else [])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])
        ),
    }
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, check=False, timeout=args.timeout, env=env
        )
        stdout, stderr, code = done.stdout, done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        stdout, stderr, code = str(exc.stdout or ""), str(exc.stderr or ""), "timeout"
    row: dict[str, Any] = {
        "name": name,
        "flags": " ".join(SETTINGS.get(name, {}).get("flags", [])),
        "seconds": round(time.time() - started, 1),
        "nvml_peak_over_baseline": meter.stop(),
        "nvml_baseline": baseline,
        "returncode": code,
    }
    return record_child(row, stdout, stderr, Path(args.out) / f"{name}.log")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/out/whole_gpu_device")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--only", default=None)
    parser.add_argument("--quiet", action="store_true", help="print no reading (held-out runs)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--timeout", type=float, default=150)
    parser.add_argument("--child", default=None)
    parser.add_argument("--baseline", type=int, default=0)
    parser.add_argument(
        "--budget", type=float, default=1e9, help="seconds for all settings; the rest are skipped"
    )
    args = parser.parse_args()
    if args.child == "nccl-groups":
        nccl_groups(args.baseline)
        return 0
    if args.child:
        child(args.child, args.steps, args.device, args.tiny, args.baseline)
        return 0
    Path(args.out).mkdir(parents=True, exist_ok=True)
    meter, rows, deadline = NvmlPeak(interval=0.1), [], time.monotonic() + args.budget
    for name in SETTINGS if not args.only else args.only.split(","):
        left = deadline - time.monotonic()
        if left < 20:
            rows.append(
                {
                    "name": name,
                    "flags": " ".join(SETTINGS.get(name, {}).get("flags", [])),
                    "skipped": "out of --budget",
                }
            )
            continue
        rows.append(
            run_setting(
                name,
                argparse.Namespace(**{**vars(args), "timeout": min(args.timeout, left)}),
                meter,
            )
        )
        (Path(args.out) / "whole_gpu_device.json").write_text(json.dumps(rows, indent=1))
        shown = ["name", "returncode", "seconds"]
        if not args.quiet:
            shown += ["max_allocated", "max_reserved", "nvml_peak_over_baseline"]
        print(json.dumps({k: rows[-1].get(k) for k in shown}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
