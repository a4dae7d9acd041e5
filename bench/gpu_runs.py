"""Real training steps on a real GPU with the probe: measured peak memory, tokens/s and MFU beside
hwdash's plan for the same setting (issue 26's device check, and rows the estimator never saw).

    python bench/gpu_runs.py --out DIR [--steps 12] [--only NAME,...] [--device cpu --tiny]

Each setting runs in a fresh Python process (its own allocator peaks): the model is built from its
catalog config (random weights; nothing is downloaded) in bf16 on the GPU, LoRA through PEFT where
the plan says so, AdamW (foreach), ``model(input_ids, labels=input_ids)``, backward, step,
``zero_grad(set_to_none=True)`` - the loop the Hugging Face Trainer runs. The probe is started with
the plan's file (``hwdash plan --json`` output) and each step calls ``hwdash.probe.step(tokens=...)``;
at the end ``hwdash.probe.stop()`` writes the run to the ledger (``HWDASH_RUNS``). The parent reads
NVML's used memory of the GPU every 0.2 s while a child runs (the whole GPU, context included).

Writes ``DIR/gpu_runs.json`` (one row per setting) and prints a table. ``--device cpu --tiny`` checks
the script itself on a machine without a GPU (two layers, a short sequence; numbers meaningless).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: name -> hwdash plan flags. Every one is trained for real; none was used to tune a formula.
SETTINGS: dict[str, list[str]] = {
    "qwen2.5-0.5b-full-b4-s1024": [
        "--model",
        "qwen2.5-0.5b",
        "--method",
        "full",
        "--batch",
        "4",
        "--seq",
        "1024",
    ],
    "qwen2.5-0.5b-lora-b4-s1024": [
        "--model",
        "qwen2.5-0.5b",
        "--method",
        "lora",
        "--batch",
        "4",
        "--seq",
        "1024",
    ],
    "qwen3-0.6b-full-b4-s2048": [
        "--model",
        "qwen3-0.6b",
        "--method",
        "full",
        "--batch",
        "4",
        "--seq",
        "2048",
    ],
    "llama-3.2-1b-lora-b8-s1024": [
        "--model",
        "llama-3.2-1b",
        "--method",
        "lora",
        "--batch",
        "8",
        "--seq",
        "1024",
    ],
    "qwen2.5-1.5b-full-ckpt-b4-s2048": [
        "--model",
        "qwen2.5-1.5b",
        "--method",
        "full",
        "--batch",
        "4",
        "--seq",
        "2048",
        "--grad-ckpt",
    ],
    "llama-3.2-3b-lora-ckpt-b4-s2048": [
        "--model",
        "llama-3.2-3b",
        "--method",
        "lora",
        "--batch",
        "4",
        "--seq",
        "2048",
        "--grad-ckpt",
    ],
    "qwen2.5-7b-lora-ckpt-b2-s2048": [
        "--model",
        "qwen2.5-7b",
        "--method",
        "lora",
        "--batch",
        "2",
        "--seq",
        "2048",
        "--grad-ckpt",
    ],
    "llama-3.1-8b-full-ckpt-b1-s2048": [
        "--model",
        "llama-3.1-8b",
        "--method",
        "full",
        "--batch",
        "1",
        "--seq",
        "2048",
        "--grad-ckpt",
    ],
}


def plan_json(flags: list[str], steps: int) -> dict[str, Any]:
    """``hwdash plan --json`` for the setting, with the tokens of ``steps`` steps."""
    batch = int(flags[flags.index("--batch") + 1])
    seq = int(flags[flags.index("--seq") + 1])
    command = [
        sys.executable,
        "-m",
        "hwdash",
        "plan",
        *flags,
        "--tokens",
        str(batch * seq * steps),
        "--json",
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"hwdash plan failed: {done.stderr.strip()}")
    return json.loads(done.stdout)


# -- the child: one setting's training steps -----------------------------------------------------


def child(plan_file: str, steps: int, device: str, tiny: bool) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    import hwdash.probe as probe
    from hwdash.core.catalog import load_catalog
    from hwdash.core.models.config import resolve_model
    from hwdash.tracing.model_config import build_hf_config_dict

    plan = json.loads(Path(plan_file).read_text())["plan"]
    model_spec = resolve_model(plan["model"], load_catalog())
    fields = build_hf_config_dict(model_spec, layers=2 if tiny else None)
    model_type = fields.pop("model_type")
    config = AutoConfig.for_model(model_type, **fields)
    config._attn_implementation = (
        plan.get("attention", "sdpa") if plan.get("attention") != "eager" else "eager"
    )
    batch, seq = plan["batch"], (64 if tiny else plan["seq"])
    probe.start(0.5, plan=plan_file)
    dtype = torch.bfloat16
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.config.use_cache = False
    if plan["grad_ckpt"]:
        model.gradient_checkpointing_enable()
    if plan["method"] == "lora":
        from peft import LoraConfig, get_peft_model

        if plan["grad_ckpt"]:
            model.enable_input_require_grads()
        model = get_peft_model(
            model,
            LoraConfig(
                r=plan["lora_r"],
                lora_alpha=2 * plan["lora_r"],
                lora_dropout=plan["lora_dropout"],
                target_modules="all-linear",
                task_type="CAUSAL_LM",
            ),
        )
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5, foreach=True)
    vocab = config.vocab_size
    ids = torch.randint(0, vocab, (batch, seq), device=device)
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
        probe.step(tokens=batch * seq, sequences=batch)
    result: dict[str, Any] = {"step_s": times, "tokens_per_step": batch * seq}
    if device == "cuda":
        result.update(
            max_allocated=torch.cuda.max_memory_allocated(),
            max_reserved=torch.cuda.max_memory_reserved(),
            gpu=torch.cuda.get_device_name(0),
        )
    probe.stop()
    print("RESULT " + json.dumps(result), flush=True)


# -- the parent ------------------------------------------------------------------------------------


class NvmlPeak:
    """The GPU's used memory (NVML) every ``interval`` s while a child runs: its maximum over the
    baseline (the used memory when it started)."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval = interval
        self.baseline: int | None = None
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._nvml = pynvml
        except Exception:
            self._nvml = None

    def used(self) -> int | None:
        if self._nvml is None:
            return None
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)

    def start(self) -> None:
        self.baseline, self.peak = self.used(), 0
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            used = self.used()
            if used is not None and self.baseline is not None:
                self.peak = max(self.peak, used - self.baseline)

    def stop(self) -> int | None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return None if self.baseline is None else self.peak


def run_setting(
    name: str, flags: list[str], args: argparse.Namespace, meter: NvmlPeak
) -> dict[str, Any]:
    out = Path(args.out)
    report = plan_json(flags, args.steps)
    plan_file = out / f"{name}.plan.json"
    plan_file.write_text(json.dumps({"plan": report["plan"]}))
    meter.start()
    started = time.time()
    command = [
        sys.executable,
        __file__,
        "--child",
        str(plan_file),
        "--steps",
        str(args.steps),
        "--device",
        args.device,
    ]
    if args.tiny:
        command.append("--tiny")
    done = subprocess.run(
        command, capture_output=True, text=True, check=False, timeout=args.timeout
    )
    nvml_peak = meter.stop()
    row: dict[str, Any] = {
        "name": name,
        "flags": " ".join(flags),
        "seconds": round(time.time() - started, 1),
        "estimate_total": report["memory"]["total"],
        "estimate_details": report["details"],
        "nvml_peak_over_baseline": nvml_peak,
        "returncode": done.returncode,
    }
    return record_child(row, done.stdout, done.stderr, out / f"{name}.log")


def child_result(stdout: str) -> dict[str, Any] | None:
    """The child's last ``RESULT {json}`` line, or None when it printed none."""
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(lines[-1][len("RESULT ") :]) if lines else None


def record_child(row: dict[str, Any], stdout: str, stderr: str, log: Path) -> dict[str, Any]:
    """``row`` with the child's result (or its stderr's tail), its output kept in ``log`` (stdout,
    a ``---`` line, stderr)."""
    result = child_result(stdout)
    if result is not None:
        row.update(result)
    else:
        row["stderr_tail"] = stderr[-3000:]
    log.write_text(stdout + "\n---\n" + stderr)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/out/gpu_runs")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--only", default=None)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--timeout", type=float, default=240)
    parser.add_argument("--child", default=None)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps, args.device, args.tiny)
        return 0
    Path(args.out).mkdir(parents=True, exist_ok=True)
    names = list(SETTINGS) if not args.only else args.only.split(",")
    meter = NvmlPeak()
    rows = []
    for name in names:
        try:
            row = run_setting(name, SETTINGS[name], args, meter)
        except Exception as exc:  # one setting failing must not lose the others
            row = {"name": name, "error": f"{type(exc).__name__}: {exc}"}
        rows.append(row)
        (Path(args.out) / "gpu_runs.json").write_text(json.dumps(rows, indent=1))
        summary = {
            k: row.get(k)
            for k in (
                "name",
                "returncode",
                "estimate_total",
                "max_allocated",
                "max_reserved",
                "nvml_peak_over_baseline",
                "error",
            )
        }
        print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
