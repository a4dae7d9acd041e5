"""The cluster view at scale: 100 hosts x 8 GPUs from a synthetic Prometheus answer.

    .venv/bin/python bench/cluster_bench.py [--hosts 100] [--gpus 8] [--rounds 60]

Two costs per round, medians and 95th percentiles over ``--rounds`` rounds in which every GPU's
memory, utilization and power move (a deterministic random walk):

1. the sampler: the PrometheusSampler parsing one instant-query answer holding every series of every
   GPU (dcgm-exporter's six plus hwdash's total and forecast: 8 series x 800 GPUs), served by a stub
   instead of HTTP, so the number is hwdash's own work;
2. the screen: the real dashboard (headless, 120x40) showing that round's frame, from the frame
   arriving to the screen being updated (show_frame, then Textual's refresh and render).

Goal (issue 12): under 200 ms per round for both together.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from typing import Any

from _headless import SIZE, check_cluster_shown, frame_builder, headless_dashboard, summary

from hwdash.telemetry.prometheus_source import PrometheusSampler

MIB = 2**20


def answer(hosts: int, gpus: int, round_number: int, rng: random.Random) -> bytes:
    """One instant query's JSON with every GPU series of the cluster at this round."""
    result: list[dict[str, Any]] = []
    now = 1_800_000_000 + round_number
    for host in range(hosts):
        for gpu in range(gpus):
            labels = {
                "gpu": str(gpu),
                "UUID": f"GPU-{host:04d}-{gpu:02d}",
                "modelName": "NVIDIA H100 80GB HBM3",
                "Hostname": f"node-{host:03d}",
            }
            used = 20000 + (host * 977 + gpu * 131 + round_number * rng.randint(50, 400)) % 60000
            values = {
                "DCGM_FI_DEV_FB_USED": used,
                "DCGM_FI_DEV_FB_FREE": 81559 - 570 - used,
                "DCGM_FI_DEV_FB_RESERVED": 570,
                "DCGM_FI_DEV_GPU_UTIL": rng.randint(80, 100),
                "DCGM_FI_DEV_GPU_TEMP": rng.randint(50, 70),
                "DCGM_FI_DEV_POWER_USAGE": rng.uniform(400, 700),
                "hwdash_gpu_memory_total_bytes": 81559 * MIB,
            }
            for name, value in values.items():
                result.append({"metric": {"__name__": name, **labels}, "value": [now, str(value)]})
    return json.dumps(
        {"status": "success", "data": {"resultType": "vector", "result": result}}
    ).encode()


#: The label column of the summary lines.
WIDTH = 34


async def main(hosts: int, gpus: int, rounds: int) -> None:
    rng = random.Random(7)
    bodies = [answer(hosts, gpus, number, rng) for number in range(rounds)]
    served = iter(bodies)
    sampler = PrometheusSampler(
        "http://prometheus.invalid:9090", fetch=lambda request, timeout: next(served)
    )
    builder = frame_builder()
    app = headless_dashboard()
    sample_s: list[float] = []
    screen_s: list[float] = []
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        for number in range(rounds):
            # As in the dashboard: the sampling thread's work, then the event loop's.
            started = time.perf_counter()
            frame = builder(sampler.sample(), number + 1)  # history, forecast and alert rule too
            sampled = time.perf_counter()
            app.show_frame(frame)
            await pilot.pause()  # Textual refreshes and renders what changed
            screen_s.append(time.perf_counter() - sampled)
            sample_s.append(sampled - started)
        check_cluster_shown(app, hosts * gpus)
    total = [a + b for a, b in zip(sample_s, screen_s, strict=True)]
    print(f"{hosts} hosts x {gpus} GPUs, {rounds} rounds, 120x40")
    print(summary("sampler (parse, history, alerts)", sample_s, WIDTH))
    print(summary("screen (show the frame, render)", screen_s, WIDTH))
    print(summary("a round in all (goal < 200 ms)", total, WIDTH))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=60)
    options = parser.parse_args()
    asyncio.run(main(options.hosts, options.gpus, options.rounds))
