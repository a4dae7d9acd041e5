"""Benchmark the dashboard the way a user runs it: start-up time, idle CPU and memory, terminal bytes.

    .venv/bin/python bench/ui_bench.py [--scenario h100x8] [--interval 1] [--seconds 60]
                                       [--size 120x36] [--tab monitor]

It starts ``hwdash --fake-nvml SCENARIO --interval S --no-bell`` on a pseudo-terminal of the given
size (the child sees a real TTY, as under ``script`` or tmux) and measures:

* **first frame**: seconds from spawning the process until the first complete screen has been written
  (the footer's "Quit" is the last thing Textual draws in the first frame);
* after switching to the requested tab (``m`` for the monitor) and letting it settle for ``--settle``
  seconds, over ``--seconds`` of idling:
  * **CPU**: user+system CPU time of the process (psutil) divided by wall time, in % of one core;
  * **RSS**: resident memory at the end, and the peak seen once a second (psutil), in MiB;
  * **bytes/s**: bytes the app wrote to the terminal (read from the pty master) divided by wall time.

Nothing here is a test: the numbers depend on the machine. Report them with the machine's name.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
FIRST_FRAME_MARKER = b"Quit"


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


def run(args: argparse.Namespace) -> dict[str, object]:
    columns, rows = (int(part) for part in args.size.lower().split("x"))
    hwdash = Path(sys.executable).parent / "hwdash"
    command = [
        str(hwdash),
        "--fake-nvml",
        args.scenario,
        "--interval",
        str(args.interval),
        "--no-bell",
    ]
    master, slave = pty.openpty()
    set_size(slave, columns, rows)
    env = dict(os.environ, TERM=args.term)
    env.pop("HWDASH_FAKE_NVML", None)
    if args.truecolor:
        env["COLORTERM"] = "truecolor"
    else:
        env.pop("COLORTERM", None)
    env["XDG_DATA_HOME"] = str(Path(args.data_dir).resolve())  # saved plans go here, not to ~
    env["XDG_STATE_HOME"] = str(Path(args.data_dir).resolve())

    started = time.monotonic()
    child = subprocess.Popen(
        command, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True
    )
    os.close(slave)
    process = psutil.Process(child.pid)

    seen = b""
    first_frame_s: float | None = None
    first_byte_s: float | None = None
    while time.monotonic() - started < 30:
        chunk = read_available(master, 0.05)
        if chunk and first_byte_s is None:
            first_byte_s = time.monotonic() - started
        seen += chunk
        if FIRST_FRAME_MARKER in seen:
            first_frame_s = time.monotonic() - started
            break
    if first_frame_s is None:
        child.kill()
        raise SystemExit(f"no first frame within 30 s; output so far: {seen[-500:]!r}")

    if args.tab != "planner":
        os.write(master, args.tab[0].encode())
    drain(master, args.settle)

    cpu_before = process.cpu_times()
    wall_before = time.monotonic()
    written = 0
    peak_rss = 0
    window_end = wall_before + args.seconds
    while (left := window_end - time.monotonic()) > 0:
        written += drain(master, min(1.0, left))
        peak_rss = max(peak_rss, process.memory_info().rss)
    wall = time.monotonic() - wall_before
    cpu_after = process.cpu_times()
    rss = process.memory_info().rss
    threads = process.num_threads()

    os.write(master, b"q")
    try:
        child.wait(10)
    except subprocess.TimeoutExpired:
        child.kill()
    os.close(master)

    cpu = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
    return {
        "command": " ".join(command),
        "terminal": f"{columns}x{rows} TERM={args.term}" + (" truecolor" if args.truecolor else ""),
        "tab": args.tab,
        "window": f"{args.settle:g}-{args.settle + args.seconds:g} s after the tab switch",
        "first_byte_s": round(first_byte_s or 0.0, 3),
        "first_frame_s": round(first_frame_s, 3),
        "idle_seconds": round(wall, 1),
        "cpu_percent_of_one_core": round(100 * cpu / wall, 2),
        "rss_mib_end": round(rss / 2**20, 1),
        "rss_mib_peak": round(peak_rss / 2**20, 1),
        "terminal_bytes_per_s": round(written / wall, 1),
        "threads": threads,
        "exit_status": child.returncode,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="h100x8")
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the idle window")
    parser.add_argument(
        "--settle",
        type=float,
        default=5.0,
        help="seconds between switching tabs and the idle window (h100x8 stops climbing at 90 s)",
    )
    parser.add_argument("--size", default="120x36")
    parser.add_argument("--tab", choices=("planner", "compare", "monitor"), default="monitor")
    parser.add_argument("--term", default="xterm-256color")
    parser.add_argument("--truecolor", action="store_true", help="also set COLORTERM=truecolor")
    parser.add_argument("--data-dir", default=str(ROOT / "bench" / "out" / "ui_bench_data"))
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    Path(args.data_dir).mkdir(parents=True, exist_ok=True)
    result = run(args)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:26} {value}")


if __name__ == "__main__":
    main()
