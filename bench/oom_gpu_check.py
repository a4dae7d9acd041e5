"""A real out-of-memory error on a real GPU with ``record_oom``: what the step costs with the
allocator's history on, the snapshot the probe leaves, and ``hwdash oom`` on it beside PyTorch's own
``torch.cuda._memory_viz stats`` for the same file (issue 27's device check).

    PYTHONPATH=src python bench/oom_gpu_check.py --out DIR

A Llama built from a small config (random weights, bf16, AdamW) trains under a memory fraction
(``torch.cuda.set_per_process_memory_fraction``), 20 steps with the history off and 20 with it on,
then doubles the batch until the allocator refuses. Writes ``DIR/oom_gpu_check.json`` and the files
beside it; prints a summary.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def _steps(model: Any, optimizer: Any, ids: Any, count: int) -> float:
    import torch

    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(count):
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/out/oom_gpu")
    parser.add_argument("--fraction", type=float, default=0.08)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import hwdash.probe as probe

    probe.start(0.5, directory=out / "probes")
    torch.cuda.set_per_process_memory_fraction(args.fraction, 0)
    config = LlamaConfig(
        hidden_size=1024, intermediate_size=4096, num_hidden_layers=8, num_attention_heads=16,
        num_key_value_heads=4, vocab_size=32000,
    )  # fmt: skip
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    ids = torch.randint(0, config.vocab_size, (4, 1024), device="cuda")
    _steps(model, optimizer, ids, 3)
    plain = _steps(model, optimizer, ids, 20)
    probe.start(0.5, directory=out / "probes", record_oom=True)
    time.sleep(1.5)  # the probe's next rounds turn the history on
    recording = _steps(model, optimizer, ids, 20)
    result: dict[str, Any] = {
        "step_s_history_off": plain,
        "step_s_history_on": recording,
        "history_cost": recording / plain - 1,
        "gpu": torch.cuda.get_device_name(0),
        "fraction": args.fraction,
    }
    batch = 4
    try:
        while batch <= 4096:
            batch *= 2
            big = torch.randint(0, config.vocab_size, (batch, 1024), device="cuda")
            _steps(model, optimizer, big, 1)
    except torch.OutOfMemoryError as exc:
        result["oom_at_batch"] = batch
        result["oom_message"] = str(exc).splitlines()[0][:300]
    time.sleep(1.5)  # the probe lists the snapshot on its next round
    recorder = probe._probe.oom if probe._probe is not None else None
    snapshots = [] if recorder is None else [dict(s) for s in recorder.snapshots]
    result["snapshots"] = snapshots
    result["probe_oom_state"] = None if recorder is None else recorder.state()
    if snapshots:
        path = snapshots[-1]["path"]
        started = time.perf_counter()
        ours = subprocess.run(
            [sys.executable, "-m", "hwdash", "oom", path, "--json"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        result["hwdash_oom_seconds"] = time.perf_counter() - started
        result["hwdash_oom_rc"] = ours.returncode
        (out / "hwdash_oom.json").write_text(ours.stdout + ours.stderr)
        text = subprocess.run(
            [sys.executable, "-m", "hwdash", "oom", path],
            capture_output=True,
            text=True,
            check=False,
        )
        (out / "hwdash_oom.txt").write_text(text.stdout + text.stderr)
        viz = subprocess.run(
            [sys.executable, "-m", "torch.cuda._memory_viz", "stats", path],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        (out / "memory_viz_stats.txt").write_text(viz.stdout + viz.stderr)
    probe.stop()
    (out / "oom_gpu_check.json").write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps({k: v for k, v in result.items() if k != "probe_oom_state"}, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
