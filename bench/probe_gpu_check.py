"""The probe on a real GPU: a small training loop (a 4-layer Llama built from its config, bf16,
AdamW) with ``hwdash.probe.step(tokens=...)`` after every optimizer step, then what the probe file
and the end-of-run record say, next to what NVML and torch say directly.

    PYTHONPATH=src python bench/probe_gpu_check.py [--steps 300]

Checks: the probe leaves CUDA alone until the script initialises it; torch's device UUID matches
NVML's once ``GPU-`` is added; the energy counter moves; the record's peak is the allocator's.
Prints one JSON object. Needs torch, transformers and nvidia-ml-py on a machine with a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import types
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=1024)
    args = parser.parse_args()
    folder = tempfile.mkdtemp()
    records: list[dict[str, Any]] = []
    recorder = types.ModuleType("hwdash.runs.recorder")  # keep the record here, not in a ledger
    recorder.record_run = records.append  # type: ignore[attr-defined]
    sys.modules["hwdash.runs.recorder"] = recorder

    import torch
    import transformers

    import hwdash.probe as probe
    from hwdash.telemetry.nvml_energy import nvml_uuid

    running = probe.start(0.5, folder, plan="gpu-check", max_steps=args.steps)
    time.sleep(1.2)
    before = json.loads(running.path.read_bytes())
    seen: dict[str, Any] = {"cuda_initialised_by_probe": torch.cuda.is_initialized()}
    seen["before_cuda"] = {"cuda": before["cuda"], "run": before["run"]}

    config = transformers.LlamaConfig(
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=4,
        num_attention_heads=16,
        num_key_value_heads=16,
        vocab_size=32000,
        max_position_embeddings=args.length,
    )
    model = transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = args.batch * args.length
    started = time.monotonic()
    for _ in range(args.steps):
        ids = torch.randint(0, config.vocab_size, (args.batch, args.length), device="cuda")
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()  # the loop's usual sync (logging the loss)
        probe.step(tokens=tokens, samples=args.batch)
    elapsed = time.monotonic() - started
    time.sleep(1.2)
    after = json.loads(running.path.read_bytes())
    seen["run"] = after["run"]
    seen["devices"] = after["devices"]
    seen["direct"] = {
        "tokens_per_s_whole_loop": args.steps * tokens / elapsed,
        "max_memory_reserved": torch.cuda.max_memory_reserved(0),
        "max_memory_allocated": torch.cuda.max_memory_allocated(0),
        "torch_uuid": str(torch.cuda.get_device_properties(0).uuid),
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByUUID(nvml_uuid(seen["direct"]["torch_uuid"]))
        seen["direct"]["nvml_uuid"] = pynvml.nvmlDeviceGetUUID(handle)
        seen["direct"]["nvml_energy_mj"] = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    except Exception as exc:
        seen["direct"]["nvml_error"] = repr(exc)
    probe.stop()
    seen["records"] = records
    print(json.dumps(seen, indent=1, default=str))


if __name__ == "__main__":
    main()
