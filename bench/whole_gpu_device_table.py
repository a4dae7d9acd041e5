"""Write issue 29's own readings tables (sets E, F and H) from bench/whole_gpu_device.py's raw output.

    python bench/whole_gpu_device_table.py e|f|h          # rewrite bench/data/whole_gpu_readings_e|f|h3.toml
    python bench/whole_gpu_device_table.py e|f|h --check  # exit 1 if the table differs from what it writes

Each run of ``bench/data/device_h100/`` becomes three readings (nvml, reserved, allocated); every field comes
from the run's setting in ``whole_gpu_device.SETTINGS`` and its measured bytes, so no reading is typed by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gpu_runs import child_result
from whole_gpu_device import SETTINGS

REPO = Path(__file__).resolve().parent.parent
RAW = REPO / "bench" / "data" / "device_h100"
GIB = 2**30
MEASURES = (
    ("nvml", "nvml_peak_over_baseline"),
    ("reserved", "max_reserved"),
    ("allocated", "max_allocated"),
)
RUNNER_NOTES = {
    "deepspeed": "DeepSpeed engine from deepspeed.initialize(model, optimizer=torch AdamW, config): bf16 enabled (16-bit model, fp32 master and Adam states in the ZeRO optimizer), every bucket and ZeRO-3 threshold at DeepSpeed's default (no key set), zero_force_ds_cpu_optimizer false so the torch AdamW runs on the fp32 partition (on the host under offload, pin_memory true). ZeRO-3 builds the model under transformers' HfDeepSpeedConfig (zero.Init), as the Trainer does; ZeRO-2 builds it in bf16 on the GPU first.",
    "fsdp2": "PyTorch FSDP2: fully_shard on every decoder layer and on the root, model built in fp32 on the host, MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16); torch AdamW over the fp32 DTensor shards.",
    "fsdp1": "PyTorch FullyShardedDataParallel (FSDP1) with transformer_auto_wrap_policy on the decoder layer class, MixedPrecision(bf16, bf16, bf16), use_orig_params=True, limit_all_gathers=True, model built in fp32 on the host; torch AdamW over the fp32 parameters.",
}
OFFLOAD_NOTES = {
    "fsdp2": " CPUOffloadPolicy(pin_memory=True): parameters, gradients and the AdamW step on the host.",
    "fsdp1": " CPUOffload(offload_params=True): parameters, gradients and the AdamW step on the host.",
}
NO_SHARD = (
    "At world size 1 FSDP1 switches FULL_SHARD to NO_SHARD (its UserWarning 'FSDP is switching to use NO_SHARD "
    "instead of ShardingStrategy.FULL_SHARD since the world size is 1', seen in the run's log); hwdash plans "
    "FULL_SHARD over one GPU."
)


def _set_h_first_call() -> list[dict[str, Any]]:
    """Set H's first call: the runs' own RESULT lines from their logs (its JSON, with the NVML peak,
    did not come back), each as a run without ``nvml_peak_over_baseline``."""
    runs = []
    for log in sorted((RAW / "set_h_call1").glob("*.log")):
        result = child_result(log.read_text().split("\n---\n")[0])
        if result is not None:
            runs.append({"name": log.stem, "returncode": 0, **result})
    return runs


def _runs(which: str) -> list[dict[str, Any]]:
    """The set's successful runs, in the order they ran. Set H: the second call's runs (nvml,
    reserved and allocated), then the first call's runs that the second lacks (reserved and
    allocated only); a run both calls finished is the second call's."""
    if which == "h":
        second = json.loads((RAW / "whole_gpu_device_set_h.json").read_text())
        second = [run for run in second if run["returncode"] == 0]
        done = {run["name"] for run in second}
        return second + [run for run in _set_h_first_call() if run["name"] not in done]
    if which == "e":
        first = [
            json.loads(line)
            for line in (RAW / "whole_gpu_device_run1.jsonl").read_text().splitlines()
        ]
        runs = first + json.loads((RAW / "whole_gpu_device_run2.json").read_text())
    else:
        runs = json.loads((RAW / "whole_gpu_device_set_f.json").read_text())
    return [run for run in runs if run["returncode"] == 0]


def _reading(run: dict[str, Any], measure: str, key: str, source: str) -> str:
    setting = SETTINGS[run["name"]]
    flags = setting["flags"]
    value = lambda flag: flags[flags.index(flag) + 1]  # noqa: E731
    runner, offload = setting["runner"], setting["offload"]
    if runner == "deepspeed":
        parallel = f"zero{setting['zero']}"
        kept = {"none": "none", "optimizer": "optimizer", "params": "optimizer+params"}[offload]
    else:
        parallel, kept = runner, ("none" if offload == "none" else "optimizer+params")
    notes = RUNNER_NOTES[runner] + (OFFLOAD_NOTES.get(runner, "") if offload != "none" else "")
    lines = [
        "",
        "[[reading]]",
        f'id = "h100-{run["name"]}-{measure}"',
        f'source = "{source}"',
        f'where = "setting {run["name"]}, field {key}"',
        f'model = "{value("--model")}"',
        f'hf_id = "{value("--model")} (catalog config, random weights)"',
        'method = "full"',
        'precision = "mixed"',
        "gpus = 1",
        'gpu = "h100-sxm"',
        f'parallel = "{parallel}"',
        f'offload = "{kept}"',
        f"micro_batch = {value('--batch')}",
        f"seq_len = {value('--seq')}",
        f"grad_checkpointing = {'true' if setting.get('ckpt', True) else 'false'}",
        f'measure = "{measure}"',
        f"per_gpu_gib = {run[key] / GIB:.3f}",
        f'source_value = "{run[key]} bytes"',
        'conversion = "bytes / 2**30"',
        f'notes = "{notes}"',
    ]
    if runner == "fsdp1":
        lines.append(f'unmodelled = "{NO_SHARD}"')
    args = (
        " ".join(flags) + " --attn sdpa --optimizer adamw --optimizer-impl foreach --loss standard"
    )
    lines.append(f'hwdash_args = "{args}"')
    return "\n".join(lines) + "\n"


SOURCES = {
    "e": "bench/whole_gpu_device.py on the lent H100 (bench/data/device_h100/)",
    "f": "bench/whole_gpu_device.py --quiet on the lent H100 (bench/data/device_h100/whole_gpu_device_set_f.json)",
    "h": "bench/whole_gpu_device.py --quiet on the lent H100 of stop 39 (bench/data/device_h100/whole_gpu_device_set_h.json, set_h_call1/)",
}
FILES = {"e": "e", "f": "f", "h": "h3"}


def table(which: str) -> str:
    header = {"e": HEADER_E, "f": HEADER_F, "h": HEADER_H}[which]
    body = "".join(
        _reading(run, m, k, SOURCES[which]) for run in _runs(which) for m, k in MEASURES if k in run
    )
    return header + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", choices=["e", "f", "h"])
    parser.add_argument("--check", action="store_true", help="exit 1 if the table differs")
    args = parser.parse_args(argv)
    path = REPO / "bench" / "data" / f"whole_gpu_readings_{FILES[args.which]}.toml"
    text = table(args.which)
    if args.check:
        if path.read_text() != text:
            print(
                f"{path} differs from what bench/whole_gpu_device_table.py writes", file=sys.stderr
            )
            return 1
        return 0
    path.write_text(text)
    return 0


HEADER_E = """# Set E: issue 29's own whole-GPU readings, measured 2026-11-26 on the GPU machine lent to this task (one
# NVIDIA H100 80GB HBM3, driver 580.159.04, CUDA 13.0; torch 2.11.0+cu130, transformers 5.17.0, DeepSpeed 0.19.8)
# by bench/whole_gpu_device.py, which measures and never computes an estimate. The raw output is in
# bench/data/device_h100/ (run 1: the summary lines of the first call, whose per-file output did not come back;
# run 2: the two settings the first call ran out of time for, with their JSON).
#
# Held out as a whole: the rows were written here from the raw files before any hwdash estimate for them was
# computed or looked at, and are scored ONCE with the formulas as they stood (commit 53cd019):
#
#     PYTHONPATH=src .venv/bin/python bench/whole_gpu_accuracy.py --file bench/data/whole_gpu_readings_e.toml --rows
#
# Each setting gives three readings of one run: nvml (NVML's used memory of the GPU, sampled every 0.1 s, highest
# value over the idle GPU's 480 MiB that the driver reserves and NVML counts as used), reserved
# (torch.cuda.max_memory_reserved) and allocated (torch.cuda.max_memory_allocated). Every run is one process
# (world size 1, NCCL), 3 optimizer steps of random token ids (no padding), the model built from the catalog's
# config with random weights, SDPA attention, non-reentrant gradient checkpointing of every decoder layer, the loss
# from model(input_ids, labels=input_ids) (transformers' ForCausalLMLoss), torch.optim.AdamW(foreach=True).
#
# Fields: as bench/data/whole_gpu_readings.toml's header, less `split`; per_gpu_gib = bytes / 2**30.

split = "held_out"
"""
HEADER_F = """# Set F: issue 29's held-out whole-GPU readings, measured 2026-11-26 on the same lent H100 as set E (NVIDIA H100 80GB
# HBM3, driver 580.159.04; torch 2.11.0+cu130 with NCCL 2.28.9, transformers 5.17.0, DeepSpeed 0.19.8) by
# bench/whole_gpu_device.py --quiet, after set E was scored: other models, batches and lengths than set E. The run
# printed no reading; its JSON (bench/data/device_h100/whole_gpu_device_set_f.json) was turned into this table by a
# script, unread, after the formula changes set E led to (the NCCL communicators' own memory, the distributed pool
# for ZeRO and FSDP on any GPU count and its refit on sets A, B and E) were committed, and scored ONCE:
#
#     PYTHONPATH=src .venv/bin/python bench/whole_gpu_accuracy.py --file bench/data/whole_gpu_readings_f.toml --rows
#
# The fifth setting (DeepSpeed ZeRO-2 with optimizer offload, Llama 3.2 1B) ran out of the device time and has no row.
# Each setting gives three readings of one run, measured as set E's header says (nvml over the idle GPU's 480 MiB,
# reserved, allocated; one process, world size 1, 3 steps of random ids, SDPA, non-reentrant checkpointing of every
# layer, the model's own loss, torch AdamW foreach).
#
# Fields: as bench/data/whole_gpu_readings.toml's header, less `split`; per_gpu_gib = bytes / 2**30.

split = "held_out"
"""
HEADER_H = """# Set H3: issue 29's held-out whole-GPU readings of hwdash's own runs, measured 2026-11-26 on the GPU machine lent
# to stop 39 (NVIDIA H100 80GB HBM3, driver 580.159.04, CUDA 13.0; torch 2.11.0+cu130 with NCCL 2.28.9,
# transformers 5.17.0, DeepSpeed 0.19.8) by bench/whole_gpu_device.py --quiet (it printed no reading), after sets E and
# F were scored: nine settings (SET_H) with ZeRO-1 and runs without checkpointing beside ZeRO-2/3 and FSDP1/2 with
# and without CPU offload, other models, batches and lengths. The raw output was stored unread and turned into this
# table by this script only after this stop's formula change (the allocator pool refit with its own fraction for
# parameters on the host) was committed; scored ONCE:
#
#     PYTHONPATH=src .venv/bin/python bench/whole_gpu_accuracy.py --file bench/data/whole_gpu_readings_h3.toml --rows
#
# Two calls: the first ran eight of the nine settings, but its JSON (with the NVML peaks) did not come back past the
# device's file-count limit, only six runs' logs with torch's own peaks; the second ran six settings again and
# returned its JSON (five finished; the sixth, FSDP1 with CPU offload, ran out of its time). So five runs give three
# readings each (nvml, reserved, allocated) and three runs of the first call that the second lacks give two
# (reserved, allocated); the ninth setting (ZeRO-3 of Llama 3.2 1B at 4096 without checkpointing) never ran. The
# rule was fixed before any file was read. Measured as set E's header says (nvml over the idle GPU's used memory,
# sampled every 0.1 s; one process, world size 1, 3 steps of random ids, SDPA, the model's own loss, torch AdamW
# foreach); grad_checkpointing says whether every decoder layer was checkpointed.
#
# Fields: as bench/data/whole_gpu_readings.toml's header, less `split`; per_gpu_gib = bytes / 2**30.

split = "held_out"
"""


if __name__ == "__main__":
    raise SystemExit(main())
