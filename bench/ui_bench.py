"""hwdash against nvitop, side by side on the same fake GPUs, as a user on a training box sees them.

    .venv/bin/python bench/ui_bench.py [--runs 3] [--seconds 60] [--size 120x40] [--only hwdash]

Both tools run on the packaged ``a100x8-sawtooth`` scenario (8 A100s whose memory ramps for a
minute, then saw-tooths; every reading moves each second): hwdash directly, nvitop through
``bench/pynvml_shim`` (a ``pynvml`` serving the same fake). The scenario is validated here, with
hwdash's venv, and *compiled* to JSON (``bench/out/ui_bench_data/``) before the runs: both tools'
fakes run from that plain data with the standard library, so neither process loads pydantic or
the scenario models, as neither would on a real box (nvitop's venv does not even have pydantic).
nvitop 1.7.2 is installed, pinned, in its own venv under ``bench/out/nvitop-venv`` the first time;
it finds hwdash's fake through ``PYTHONPATH`` (this checkout's ``src``). Runs alternate between the
tools. Each run:

* **full frame**: seconds from spawning the process on a pseudo-terminal until a complete monitor
  has been written (GPU readings and below them, hwdash's process table, marked by its first
  ``torchrun`` row; nvitop's host panel, marked by ``Load Average``: at 40 rows nvitop's process
  panel does not fit; both drawn only once a sample is in), the median of five starts per run;
* over the second half of ``--seconds``: **CPU** of one core (psutil user+system time / wall) and
  **bytes/s** written to the terminal; **peak RSS** over the whole run;
* **one-shot**: wall time of ``hwdash monitor --once`` and ``nvitop -1``.

It prints the medians and the ratios hwdash/nvitop. Timings depend on the machine: report ratios.
The latest results, and where hwdash's start goes, are in ``bench/data/ui_bench.md``.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import select
import statistics
import struct
import subprocess
import sys
import termios
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = "a100x8-sawtooth"
NVITOP_VERSION = "1.7.2"
VENV = ROOT / "bench" / "out" / "nvitop-venv"
SHIM = ROOT / "bench" / "pynvml_shim"


def set_size(fd: int, columns: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))


def read_available(fd: int, timeout: float) -> bytes:
    ready, _, _ = select.select([fd], [], [], timeout)
    if not ready:
        return b""
    try:
        return os.read(fd, 65536)
    except OSError:  # the child closed the terminal
        return b""


def drain(fd: int, seconds: float) -> int:
    """Read everything the app writes for ``seconds``; return the byte count."""
    total = 0
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        total += len(read_available(fd, min(left, 0.1)))
    return total


@dataclass
class Tool:
    name: str
    monitor: list[str]
    once: list[str]
    marker: bytes
    """Text drawn once the full monitor is on screen."""
    env: dict[str, str]


def nvitop_python() -> Path:
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, f"nvitop=={NVITOP_VERSION}"], check=True)
    return python


def compiled_scenario(folder: Path) -> Path:
    """The scenario validated by hwdash's models and dumped as plain data for both tools' fakes."""
    from hwdash.telemetry.fake_scenario import compile_scenario, load_scenario

    path = folder / f"{SCENARIO}.json"
    path.write_text(json.dumps(compile_scenario(load_scenario(SCENARIO))), encoding="utf-8")
    return path


def tools(interval: float) -> list[Tool]:
    data = ROOT / "bench" / "out" / "ui_bench_data"
    data.mkdir(parents=True, exist_ok=True)
    scenario = compiled_scenario(data)
    base = dict(os.environ, HWDASH_FAKE_NVML=str(scenario), TERM="xterm-256color")
    base.pop("COLORTERM", None)
    # Both tools start from compiled bytecode, as after `pip install` (which compiles nvitop's
    # modules; hwdash here is an editable install, compiled below). Some sandboxes set
    # PYTHONDONTWRITEBYTECODE, which would make hwdash compile its sources on every start.
    base.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "src")], check=True)
    hwdash_env = dict(base, XDG_DATA_HOME=str(data), XDG_STATE_HOME=str(data))
    nvitop_env = dict(base, PYTHONPATH=os.pathsep.join([str(SHIM), str(ROOT / "src")]))
    hwdash = str(Path(sys.executable).parent / "hwdash")
    python = str(nvitop_python())
    return [
        Tool(
            "hwdash",
            [hwdash, "--interval", f"{interval:g}", "--no-bell"],
            [hwdash, "monitor", "--once"],
            b"torchrun",
            hwdash_env,
        ),
        Tool(
            "nvitop",
            [python, "-m", "nvitop", "--monitor", "full", "--interval", f"{interval:g}"],
            [python, "-m", "nvitop", "-1"],
            # The host panel, drawn after the GPUs in the same write (at 40 rows nvitop's process
            # panel does not fit). Not "Processes": nvitop's start-up warning about the shim
            # ("...RunningProcesses") holds that word and is written before any frame.
            b"Load Average",
            nvitop_env,
        ),
    ]


def run_monitor(tool: Tool, seconds: float, size: tuple[int, int]) -> dict[str, float]:
    master, slave = pty.openpty()
    set_size(slave, *size)
    started = time.monotonic()
    child = subprocess.Popen(
        tool.monitor,
        stdin=slave,
        stdout=slave,
        stderr=slave,  # Textual draws on it; nvitop logs its shim warnings there once at start
        env=tool.env,
        start_new_session=True,
    )
    os.close(slave)
    process = psutil.Process(child.pid)
    seen = b""
    frame_s = float("nan")
    peak = 0
    while time.monotonic() - started < 30:
        seen += read_available(master, 0.02)
        if tool.marker in seen:
            frame_s = time.monotonic() - started
            break
    half = started + seconds / 2
    while time.monotonic() < half:
        drain(master, 0.5)
        peak = max(peak, process.memory_info().rss)
    cpu_before = process.cpu_times()
    wall_before = time.monotonic()
    written = 0
    while time.monotonic() < started + seconds:
        written += drain(master, 0.5)
        peak = max(peak, process.memory_info().rss)
    wall = time.monotonic() - wall_before
    cpu_after = process.cpu_times()
    child.terminate()
    try:
        child.wait(10)
    except subprocess.TimeoutExpired:
        child.kill()
    os.close(master)
    cpu = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
    return {
        "frame_s": frame_s,
        "cpu_percent": 100 * cpu / wall,
        "bytes_per_s": written / wall,
        "rss_mib": peak / 2**20,
    }


def first_frame(tool: Tool, size: tuple[int, int]) -> float:
    """Seconds from spawning the monitor until its full frame is written (then it is stopped)."""
    master, slave = pty.openpty()
    set_size(slave, *size)
    started = time.monotonic()
    child = subprocess.Popen(
        tool.monitor, stdin=slave, stdout=slave, stderr=slave, env=tool.env, start_new_session=True
    )
    os.close(slave)
    seen = b""
    frame_s = float("nan")
    while time.monotonic() - started < 30:
        seen += read_available(master, 0.005)
        if tool.marker in seen:
            frame_s = time.monotonic() - started
            break
    child.terminate()
    try:
        child.wait(10)
    except subprocess.TimeoutExpired:
        child.kill()
    os.close(master)
    return frame_s


def run_once(tool: Tool) -> float:
    started = time.monotonic()
    subprocess.run(tool.once, env=tool.env, capture_output=True, check=False)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--size", default="120x40")
    parser.add_argument("--only", choices=("hwdash", "nvitop"), help="run one tool (no ratios)")
    args = parser.parse_args()
    size = tuple(int(part) for part in args.size.lower().split("x"))
    assert len(size) == 2
    pair = [tool for tool in tools(args.interval) if args.only in (None, tool.name)]
    results: dict[str, list[dict[str, float]]] = {tool.name: [] for tool in pair}
    for run in range(args.runs):
        for tool in pair if run % 2 == 0 else reversed(pair):
            measured = run_monitor(tool, args.seconds, (size[0], size[1]))
            # A start lasts a fifth of a second: on a shared machine one is noisy, so the full
            # frame is the median of this run's and four more starts.
            starts = [measured["frame_s"], *(first_frame(tool, size) for _ in range(4))]
            measured["frame_s"] = statistics.median(starts)
            measured["once_s"] = statistics.median(run_once(tool) for _ in range(3))
            results[tool.name].append(measured)
            print(tool.name, {k: round(v, 3) for k, v in measured.items()}, flush=True)
    keys = ("cpu_percent", "bytes_per_s", "frame_s", "rss_mib", "once_s")
    print(f"\n{'median of ' + str(args.runs):16}" + "".join(f"{k:>13}" for k in keys))
    medians = {
        name: {k: statistics.median(r[k] for r in runs) for k in keys}
        for name, runs in results.items()
    }
    for name, values in medians.items():
        print(f"{name:16}" + "".join(f"{values[k]:13.3f}" for k in keys))
    if len(medians) < 2:
        return
    print(
        f"{'hwdash/nvitop':16}"
        + "".join(f"{medians['hwdash'][k] / medians['nvitop'][k]:13.2f}" for k in keys)
    )


if __name__ == "__main__":
    main()
