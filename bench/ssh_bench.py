"""The dashboard over SSH hosts: 20 stand-in hosts x 8 GPUs at 1 s, its CPU and frame time.

    .venv/bin/python bench/ssh_bench.py [--hosts 20] [--gpus 8] [--rounds 30] [--remote hwdash]

The hosts are stand-ins, no sshd: a stand-in ``ssh`` (a shell script written to a temporary folder)
takes the argv hwdash builds, drops the options and runs the remote command locally with a folder on
its PATH that holds a stand-in ``nvidia-smi`` (awk: ``--gpus`` lines every ``-l`` seconds, memory and
utilization moving each round, and one process per GPU for ``--query-compute-apps``); with
``--remote hwdash`` a stand-in ``hwdash`` instead, repeating one ``hwdash monitor --json`` line of the
packaged ``h100x8`` scenario (8 GPUs, ~14 KB) every second (its values do not move). Everything
of hwdash is real: one ``ssh`` process and its pipes per host, a reader thread per host parsing the
lines, :class:`~hwdash.telemetry.ssh_source.SshSampler`, the alert rule and history, and the
dashboard (headless, 120x40) showing each round's frame.

Measured over ``--rounds`` rounds, one a second:

* frame time: from ``sample()`` to the screen updated (sample, history, alerts, show_frame, render),
  median and 95th percentile;
* the dashboard process's CPU (every thread, the readers included: ``time.process_time``) over the
  wall time, in percent of one core. The stand-ins' own CPU (sh, awk, sleep) is not hwdash's and is not
  counted.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

from _headless import (
    ROOT,
    SIZE,
    check_cluster_shown,
    frame_builder,
    headless_dashboard,
    summary,
)

from hwdash.telemetry.ssh_source import SshSampler

STAND_IN_SSH = """#!/bin/sh
# Stand-in ssh: skip the options up to "--", then run the remote command here.
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  if [ "$1" = "-O" ]; then exit 0; fi  # ssh -O exit: no master to stop
  shift
done
shift  # --
host=$1
shift
PATH="{bin}:/usr/bin:/bin" HOST_SEED=$(printf %s "$host" | cksum | cut -d' ' -f1) exec sh -c "$1"
"""

STAND_IN_NVIDIA_SMI = """#!/bin/sh
# Stand-in nvidia-smi: {gpus} GPUs whose memory and utilization move each round.
apps=0
loop=0
for arg in "$@"; do
  case $arg in --query-compute-apps=*) apps=1 ;; esac
done
while [ $# -gt 0 ]; do
  if [ "$1" = "-l" ]; then loop=$2; fi
  shift
done
exec awk -v gpus={gpus} -v apps=$apps -v loop=$loop -v seed="$HOST_SEED" 'BEGIN {{
  srand(seed)
  while (1) {{
    for (i = 0; i < gpus; i++) {{
      if (apps) printf "GPU-%s-%d, %d, %d, python train.py --rank %d\\n", seed, i, 1000 + i, 20000 + int(rand() * 40000), i
      else printf "%d, GPU-%s-%d, NVIDIA H100 80GB HBM3, %d, 81559, %d, %d, %.2f\\n", i, seed, i, 20000 + int(rand() * 60000), int(rand() * 100), 50 + int(rand() * 20), 400 + rand() * 300
    }}
    fflush()
    if (loop == 0) exit
    system("sleep " loop)
  }}
}}'
"""


STAND_IN_HWDASH = """#!/bin/sh
# Stand-in hwdash: `hwdash monitor --json` repeating one recorded line every second.
while :; do cat "{line}" || exit 1; sleep 1; done
"""


def stand_ins(folder: Path, gpus: int, remote: str) -> Path:
    """The stand-in ssh (returned) and nvidia-smi (or hwdash) under ``folder``."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    if remote == "hwdash":
        import subprocess

        line = folder / "snapshot.json"
        recorded = subprocess.run(
            [
                sys.executable,
                "-m",
                "hwdash",
                "monitor",
                "--json",
                "--once",
                "--fake-nvml",
                "h100x8",
            ],
            capture_output=True,
            check=True,
            env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
        )
        line.write_bytes(recorded.stdout)
        stand_in = bin_dir / "hwdash"
        stand_in.write_text(STAND_IN_HWDASH.format(line=line))
        stand_in.chmod(0o755)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(STAND_IN_NVIDIA_SMI.format(gpus=gpus))
    smi.chmod(0o755)
    ssh = folder / "ssh"
    ssh.write_text(STAND_IN_SSH.format(bin=bin_dir))
    ssh.chmod(0o755)
    return ssh


#: The label column of the summary lines.
WIDTH = 38


async def main(hosts: int, gpus: int, rounds: int, remote: str) -> None:
    folder = Path(tempfile.mkdtemp(prefix="hwdash-ssh-bench-"))
    ssh = stand_ins(folder, gpus, remote)
    names = [f"node-{number:02d}" for number in range(hosts)]
    sampler = SshSampler(names, interval_s=1.0, ssh=(str(ssh),))
    builder = frame_builder()
    app = headless_dashboard()
    frame_s: list[float] = []
    sample_s: list[float] = []
    try:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            first = sampler.sample()  # waits for every host's first lines
            assert len(first.gpus) == hosts * gpus, (len(first.gpus), first.errors)
            cpu_start, wall_start = time.process_time(), time.perf_counter()
            next_at = time.perf_counter()
            for number in range(rounds):
                next_at += 1.0
                await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
                started = time.perf_counter()
                frame = builder(sampler.sample(), number + 1)
                sampled = time.perf_counter()
                app.show_frame(frame)
                await pilot.pause()
                frame_s.append(time.perf_counter() - started)
                sample_s.append(sampled - started)
            cpu = time.process_time() - cpu_start
            wall = time.perf_counter() - wall_start
            last = frame.snapshot
            check_cluster_shown(app, hosts * gpus)
            fresh = sum(gpu.host_stale is None for gpu in last.gpus)
    finally:
        sampler.close()
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{hosts} stand-in SSH hosts ({remote}) x {gpus} GPUs at 1 s, {rounds} rounds, 120x40")
    print(summary("sample (newest per host, history, alerts)", sample_s, WIDTH))
    print(summary("frame (sample to screen updated)", frame_s, WIDTH))
    print(
        f"{'dashboard CPU (all threads, readers too)':<{WIDTH}} {100 * cpu / wall:5.1f}% of one core"
    )
    print(f"fresh GPUs in the last round: {fresh} of {len(last.gpus)}; errors: {list(last.errors)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=20)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--remote", choices=("nvidia-smi", "hwdash"), default="nvidia-smi")
    options = parser.parse_args()
    if options.remote == "hwdash" and options.gpus != 8:
        parser.error("--remote hwdash replays the 8-GPU h100x8 scenario: --gpus 8 only")
    asyncio.run(main(options.hosts, options.gpus, options.rounds, options.remote))
