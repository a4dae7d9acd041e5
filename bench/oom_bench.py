"""How long ``hwdash oom`` takes on a 200 MB memory snapshot (the goal: under 2 s).

Writes a snapshot in the format ``torch.cuda.memory._snapshot()`` returns (torch/cuda/memory.py's
TypedDicts; the C++ side's keys) shaped like a long training run's: Python-only stacks 50 frames
deep drawn from a few thousand distinct frames (PyTorch shares a frame's dict between stacks, and
gives each allocation its own list of them), 2,000 segments of 25 blocks, and a device trace of
``alloc``/``free_requested``/``free_completed`` entries grown until the file is 200 MB, ending in
an ``oom``. Then times, best of ``--repeat``:

* the whole ``hwdash oom FILE`` (and ``--json``) in a new process (``python -m hwdash``);
* in process: the guarded load, the conversion into checked dataclasses, the analysis.

    PYTHONPATH=src .venv/bin/python bench/oom_bench.py [--mb 200] [--repeat 3] [--keep FILE]

Prints numbers; asserts nothing (the tests check behaviour, not time).
"""

from __future__ import annotations

import argparse
import os
import pickle
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hwdash.runs import oom_snapshot
from hwdash.runs.oom_analysis import analyse

MIB = 1 << 20
SITE = "/venv/lib/python3.11/site-packages"
DEPTH = 50


def _frame_pool(rng: random.Random, count: int) -> list[dict[str, Any]]:
    pool = []
    for i in range(count):
        if i % 5 == 0:
            filename = f"/home/ada/proj/module_{i % 40}.py"
        else:
            filename = f"{SITE}/pkg_{i % 17}/sub_{i % 23}/file_{i % 211}.py"
        name = rng.choice(["forward", "_call_impl", "step", "backward", "linear", "f"]) + str(i)
        pool.append({"filename": filename, "line": rng.randrange(1, 5000), "name": name})
    return pool


def _stack(rng: random.Random, pool: list[dict[str, Any]], stacks: list[list[int]]) -> list:
    return [pool[i] for i in rng.choice(stacks)]  # a list of its own, shared frame dicts


def _segments(rng: random.Random, pool: list, stacks: list[list[int]]) -> list[dict[str, Any]]:
    segments = []
    address = 0x7F0000000000
    for _ in range(2000):
        blocks = []
        offset = address
        for j in range(25):
            size = rng.choice([2, 4, 8, 16]) * MIB
            state = "inactive" if j % 7 == 3 else "active_allocated"
            frames = [] if state == "inactive" else _stack(rng, pool, stacks)
            blocks.append(
                {
                    "address": offset,
                    "size": size,
                    "requested_size": size - 256,
                    "state": state,
                    "frames": frames,
                }
            )
            offset += size
        total = offset - address
        segments.append(
            {
                "device": 0,
                "address": address,
                "total_size": total,
                "allocated_size": total,
                "active_size": total,
                "requested_size": total,
                "stream": 0,
                "segment_type": "large",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": [],
                "blocks": blocks,
            }
        )
        address = offset + 2 * MIB
    return segments


def _entries(rng: random.Random, pool: list, stacks: list[list[int]], count: int) -> list:
    entries = []
    for i in range(count):
        action = ("alloc", "free_requested", "free_completed")[i % 3]
        entries.append(
            {
                "action": action,
                "addr": 0x7F0000000000 + 512 * rng.randrange(1 << 24),
                "size": 512 * rng.randrange(1, 1 << 16),
                "stream": 0,
                "time_us": 10**15 + i,
                "frames": _stack(rng, pool, stacks) if action != "free_completed" else [],
            }
        )
    return entries


def write_snapshot(path: Path, megabytes: int) -> int:
    """A snapshot of about ``megabytes`` MB at ``path``; returns its size in bytes."""
    rng = random.Random(27)
    pool = _frame_pool(rng, 4000)
    stacks = [[rng.randrange(len(pool)) for _ in range(DEPTH)] for _ in range(3000)]
    document: dict[str, Any] = {
        "segments": _segments(rng, pool, stacks),
        "device_traces": [[]],
        "allocator_settings": {"PYTORCH_ALLOC_CONF": "", "expandable_segments": False},
    }
    base = len(pickle.dumps(document, protocol=pickle.HIGHEST_PROTOCOL))
    sample = _entries(rng, pool, stacks, 3000)
    per_entry = (len(pickle.dumps({**document, "device_traces": [sample]})) - base) / len(sample)
    count = max(0, int((megabytes * 1_000_000 - base) / per_entry))
    trace = _entries(rng, pool, stacks, count)
    trace.append(
        {
            "action": "oom",
            "device_free": 300 * MIB,
            "size": 1024 * MIB,
            "stream": 0,
            "time_us": 10**15 + count,
            "frames": _stack(rng, pool, stacks),
        }
    )
    document["device_traces"] = [trace]
    with open(path, "wb") as handle:
        pickle.dump(document, handle, protocol=pickle.HIGHEST_PROTOCOL)
    return path.stat().st_size


def _best(repeat: int, work: Any) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200, help="snapshot size in MB (default 200)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per timing (best is shown)")
    parser.add_argument("--keep", type=Path, default=None, help="write the snapshot here")
    args = parser.parse_args()
    folder = tempfile.TemporaryDirectory()
    path = args.keep or Path(folder.name) / "bench-oom.pickle"
    started = time.perf_counter()
    size = write_snapshot(path, args.mb)
    print(f"snapshot: {path} {size / 1e6:.1f} MB ({time.perf_counter() - started:.1f} s to write)")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    for extra in ([], ["--json"]):
        command = [sys.executable, "-m", "hwdash", "oom", str(path), *extra]
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
            return 1
        took = _best(args.repeat, lambda c=command: subprocess.run(c, env=env, capture_output=True))
        print(f"hwdash oom {' '.join(extra) or '(text)':<8} new process: {took:.2f} s (goal < 2 s)")
    raw: list[Any] = []
    load = _best(args.repeat, lambda: raw.append(oom_snapshot.load_pickle(path)))
    convert = _best(args.repeat, lambda: oom_snapshot.to_snapshot(raw[-1]))
    snapshot = oom_snapshot.to_snapshot(raw[-1])
    analysis = _best(args.repeat, lambda: analyse(snapshot))
    blocks = sum(len(segment.blocks) for segment in snapshot.segments)
    print(f"in process: load {load:.2f} s, convert {convert:.2f} s, analyse {analysis:.3f} s")
    print(
        f"  {len(snapshot.segments):,} segments, {blocks:,} blocks, "
        f"{sum(snapshot.trace_lengths):,} trace entries"
    )
    folder.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
