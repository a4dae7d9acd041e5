"""What hwdash.probe costs a training process: CPU per publish and share of a core at 1 Hz.

    .venv/bin/python bench/probe_bench.py [--seconds 30]

Two measurements, both with the stand-in torch of the tests (tests/probe/stand_in_torch.py: the
same calls, a memory_stats dict as long as a real one, two devices of which one is used):

1. the CPU time of 2000 publishes in a row (read the allocator, write the JSON, rename it), per
   publish, and what that is at one publish a second;
2. a child process that only sleeps, with and without the probe thread at 1 Hz, for ``--seconds``
   each: its whole CPU time (all threads, user + system) per second of wall time, so the wake-ups,
   the interpreter's switching and the file system are all counted.

Real torch builds its memory_stats dict in C++ (a few tens of microseconds more per call on a GPU
box); this machine has no GPU, so that part is not measured here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "probe"))

CHILD = """
import json, sys, time
sys.path.insert(0, {tests!r})
from stand_in_torch import GIB, Device, StandInCuda, StandInTorch
from hwdash.probe import Probe
cuda = StandInCuda(devices=[Device("a", allocated=30 * GIB, reserved=34 * GIB, max_reserved=35 * GIB),
                            Device("b")], initialized=True)
if {with_probe}:
    Probe(1.0, __import__("pathlib").Path({folder!r}), torch_module=lambda: StandInTorch(cuda)).start()
time.sleep(0.5)
before, wall = time.process_time(), time.monotonic()
time.sleep({seconds})
cpu = time.process_time() - before  # CLOCK_PROCESS_CPUTIME_ID: every thread, in nanoseconds
print(json.dumps({{"cpu_s": cpu, "wall_s": time.monotonic() - wall}}))
"""


def per_publish(count: int = 2000) -> float:
    from stand_in_torch import GIB, Device, StandInCuda, StandInTorch

    from hwdash.probe import Probe

    cuda = StandInCuda(
        devices=[Device("a", allocated=30 * GIB, reserved=34 * GIB), Device("b")], initialized=True
    )
    with tempfile.TemporaryDirectory() as folder:
        probe = Probe(1.0, Path(folder), torch_module=lambda: StandInTorch(cuda))
        probe.publish()
        cuda.calls.clear()
        started = time.process_time()
        for _ in range(count):
            probe.publish()
            cuda.calls.clear()
        return (time.process_time() - started) / count


def child(with_probe: bool, seconds: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        code = CHILD.format(
            tests=str(ROOT / "tests" / "probe"),
            with_probe=with_probe,
            folder=folder,
            seconds=seconds,
        )
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
        )
        return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    cost = per_publish()
    print(f"one publish: {cost * 1e6:.0f} us of CPU -> {cost * 100:.3f}% of a core at 1 Hz")
    idle = child(False, args.seconds)
    probed = child(True, args.seconds)
    for name, result in (("sleeping process", idle), ("with the probe at 1 Hz", probed)):
        share = 100 * result["cpu_s"] / result["wall_s"]
        print(
            f"{name:>24}: {result['cpu_s'] * 1000:.1f} ms CPU in {result['wall_s']:.1f} s "
            f"= {share:.3f}% of a core"
        )
    extra = (probed["cpu_s"] / probed["wall_s"]) - (idle["cpu_s"] / idle["wall_s"])
    print(f"{'the probe':>24}: {100 * extra:.3f}% of a core (goal < 0.1%)")


if __name__ == "__main__":
    main()
