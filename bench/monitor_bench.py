"""Benchmark `hwdash monitor`: CPU time and peak memory of a streaming run, and the cost of one sample.

Usage: .venv/bin/python bench/monitor_bench.py [--scenario h100x8] [--samples 200] [--real]

1. Runs ``hwdash monitor --count 60 --interval 0.5 --fake-nvml SCENARIO`` under GNU ``/usr/bin/time -v``
   (``apt-get install -y time`` if missing) and reports user+system CPU seconds, wall time and peak RSS.
2. Times ``SystemSampler.sample()`` (NVML worker round + host + process join) in this process over N
   samples on the same scenario (and, with ``--real``, on the real NVML if a driver is present).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hwdash.telemetry.source import make_sampler

TIME_FIELDS = {
    "user_s": r"User time \(seconds\): ([0-9.]+)",
    "system_s": r"System time \(seconds\): ([0-9.]+)",
    "peak_rss_kib": r"Maximum resident set size \(kbytes\): ([0-9]+)",
    "wall": r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([0-9:.]+)",
}


def run_under_gnu_time(scenario: str, count: int, interval: float) -> dict[str, str]:
    gnu_time = "/usr/bin/time"
    if not Path(gnu_time).exists():
        sys.exit("GNU time not found: apt-get install -y time")
    hwdash = shutil.which("hwdash", path=str(Path(sys.executable).parent)) or "hwdash"
    command = [
        gnu_time,
        "-v",
        hwdash,
        "monitor",
        "--count",
        str(count),
        "--interval",
        str(interval),
        "--fake-nvml",
        scenario,
    ]
    with tempfile.TemporaryDirectory() as state:
        env = {**os.environ, "XDG_STATE_HOME": state}
        result = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    values = {}
    for key, pattern in TIME_FIELDS.items():
        match = re.search(pattern, result.stderr)
        values[key] = match.group(1) if match else "?"
    values["lines"] = str(len(result.stdout.splitlines()))
    return values


def time_samples(scenario: str | None, samples: int) -> tuple[list[float], list[float]]:
    """Wall seconds per ``sample()`` call, and the snapshot's own ``sample_seconds``."""
    sampler = make_sampler(scenario) if scenario else make_sampler(None, environ={})
    try:
        sampler.sample()  # warm up: NVML init, static fields, psutil priming
        walls, reported = [], []
        for _ in range(samples):
            started = time.perf_counter()
            snapshot = sampler.sample()
            walls.append(time.perf_counter() - started)
            reported.append(snapshot.sample_seconds)
        gpus = len(snapshot.gpus)
    finally:
        sampler.close()
    print(f"  GPUs in snapshot: {gpus}; NVML available: {snapshot.nvml.available}")
    return walls, reported


def describe(label: str, values: list[float]) -> None:
    ordered = sorted(values)
    p95 = ordered[max(0, int(len(ordered) * 0.95) - 1)]
    print(
        f"  {label}: mean {statistics.mean(values) * 1e3:.3f} ms, median "
        f"{statistics.median(values) * 1e3:.3f} ms, p95 {p95 * 1e3:.3f} ms, n={len(values)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="h100x8")
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--count", type=int, default=60)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--real", action="store_true", help="also time the real NVML")
    args = parser.parse_args()

    print(
        f"hwdash monitor --count {args.count} --interval {args.interval} --fake-nvml {args.scenario}"
    )
    values = run_under_gnu_time(args.scenario, args.count, args.interval)
    cpu = float(values["user_s"]) + float(values["system_s"])
    print(
        f"  CPU {cpu:.2f} s (user {values['user_s']} s, system {values['system_s']} s), wall "
        f"{values['wall']}, peak RSS {int(values['peak_rss_kib']) / 1024:.1f} MiB, "
        f"{values['lines']} output lines"
    )
    print(f"one full sample (SystemSampler.sample) on {args.scenario}:")
    walls, reported = time_samples(args.scenario, args.samples)
    describe("wall per sample()", walls)
    describe("snapshot.sample_seconds", reported)
    if args.real:
        print("one full sample on the real NVML:")
        walls, reported = time_samples(None, args.samples)
        describe("wall per sample()", walls)


if __name__ == "__main__":
    main()
