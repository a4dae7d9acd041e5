"""What hwdash.probe costs a training process: CPU per publish and share of a core at 1 Hz.

    .venv/bin/python bench/probe_bench.py [--seconds 30]

Two measurements, both with the stand-in torch of the tests (tests/probe/stand_in_torch.py: the
same calls, a memory_stats dict as long as a real one, two devices of which one is used):

1. the CPU time of 2000 publishes in a row (read the allocator, write the JSON, rename it), per
   publish, and what that is at one publish a second;
2. a child process that only sleeps, with and without the probe thread at 1 Hz, for ``--seconds``
   each: its whole CPU time (all threads, user + system) per second of wall time, so the wake-ups,
   the interpreter's switching and the file system are all counted;
3. issue 26's case: a child that calls ``hwdash.probe.step(tokens=...)`` 20 times a second with the
   probe at 1 Hz (so every publish carries a moving ``"run"`` object and is written), for
   ``--seconds``: the probe thread's own CPU time (its POSIX thread CPU clock,
   ``time.pthread_getcpuclockid``) plus the CPU time of the step calls (``time.thread_time`` around
   each call in the stepping thread), as a share of one core; and, as a cross-check, the whole
   process's CPU against the same stepping loop without a probe (``step()`` is then a no-op).
   Each step call is timed right after the loop's sleep, with cold caches: an upper bound (the
   same call in a tight loop costs about half a microsecond).

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


STEPPING = """
import json, sys, tempfile, threading, time
sys.path.insert(0, {tests!r})
from stand_in_torch import GIB, Device, StandInCuda, StandInTorch
import hwdash.probe as probe
from hwdash.probe import Probe
cuda = StandInCuda(devices=[Device("a", allocated=30 * GIB, reserved=34 * GIB, max_reserved=35 * GIB),
                            Device("b")], initialized=True)
thread_clock = None
if {with_probe}:
    probe._probe = Probe(1.0, __import__("pathlib").Path({folder!r}),
                         torch_module=lambda: StandInTorch(cuda)).start()
    thread_clock = time.pthread_getcpuclockid(probe._probe._thread.ident)
time.sleep(0.5)
steps, step_cpu = 0, 0.0
probe_before = time.clock_gettime(thread_clock) if thread_clock is not None else 0.0
before, wall = time.process_time(), time.monotonic()
deadline = wall + {seconds}
next_step = wall
while True:
    next_step += 1 / {rate}
    pause = next_step - time.monotonic()
    if pause > 0:
        time.sleep(pause)
    if time.monotonic() >= deadline:
        break
    started = time.thread_time()
    probe.step(tokens=4096, samples=2)
    step_cpu += time.thread_time() - started
    steps += 1
cpu = time.process_time() - before
probe_cpu = (time.clock_gettime(thread_clock) - probe_before) if thread_clock is not None else 0.0
print(json.dumps({{"cpu_s": cpu, "wall_s": time.monotonic() - wall, "steps": steps,
                  "step_cpu_s": step_cpu, "probe_thread_cpu_s": probe_cpu}}))
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


def child(
    with_probe: bool, seconds: float, template: str = CHILD, rate: float = 20.0
) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        code = template.format(
            tests=str(ROOT / "tests" / "probe"),
            with_probe=with_probe,
            folder=folder,
            seconds=seconds,
            rate=rate,
        )
        # The probe records its run at exit: into a throw-away ledger, never the user's.
        env = dict(
            os.environ,
            PYTHONPATH=str(ROOT / "src"),
            HWDASH_RUNS=os.path.join(folder, "runs.jsonl"),
        )
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
    stepping(args.seconds)


def stepping(seconds: float, rate: float = 20.0) -> None:
    """Issue 26's case: the probe at 1 Hz with ``step()`` at ``rate`` steps a second."""
    print(f"\nstep() at {rate:g} steps/s with the probe at 1 Hz, {seconds:g} s:")
    plain = child(False, seconds, STEPPING, rate)
    probed = child(True, seconds, STEPPING, rate)
    per_step = probed["step_cpu_s"] / max(1, probed["steps"])
    thread = probed["probe_thread_cpu_s"] / probed["wall_s"]
    calls = probed["step_cpu_s"] / probed["wall_s"]
    print(f"{'one step() call':>24}: {per_step * 1e6:.2f} us of CPU ({probed['steps']} calls)")
    print(f"{'probe thread':>24}: {100 * thread:.4f}% of a core")
    print(f"{'step() calls':>24}: {100 * calls:.4f}% of a core")
    print(f"{'probe + steps':>24}: {100 * (thread + calls):.4f}% of a core (goal < 0.1%)")
    extra = probed["cpu_s"] / probed["wall_s"] - plain["cpu_s"] / plain["wall_s"]
    print(f"{'whole process, extra':>24}: {100 * extra:.4f}% of a core (noisier cross-check)")


if __name__ == "__main__":
    main()
