"""``python -m hwdash.probe [--interval S] train.py ARGS...`` (or ``-m module ARGS...``): run a
training script with the probe started, as if it had ``import hwdash.probe; hwdash.probe.start()``."""

from __future__ import annotations

import os
import runpy
import sys

from hwdash.probe import DEFAULT_INTERVAL_S, start

USAGE = "usage: python -m hwdash.probe [--interval S] (SCRIPT | -m MODULE) [ARGS...]"


def main(argv: list[str]) -> int:
    """Parse the probe's own options, start it, run the target in this process."""
    interval = DEFAULT_INTERVAL_S
    args = list(argv)
    while args and args[0].startswith("--interval"):
        option = args.pop(0)
        value = option.partition("=")[2] if "=" in option else (args.pop(0) if args else "")
        try:
            interval = float(value)
        except ValueError:
            interval = -1.0
        if not (interval > 0 and interval != float("inf")):
            print(
                f"hwdash.probe: error: --interval: {value!r} is not a positive number of seconds",
                file=sys.stderr,
            )
            return 2
    if args[:1] in (["-h"], ["--help"]) or not args:
        print(USAGE, file=sys.stderr if not args else sys.stdout)
        return 0 if args else 2
    start(interval)
    if args[0] == "-m":
        if len(args) < 2:
            print(USAGE, file=sys.stderr)
            return 2
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        return 0
    script = args[0]
    if not os.path.isfile(script):
        print(f"hwdash.probe: error: no such script: {script}", file=sys.stderr)
        return 2
    sys.argv = [script, *args[1:]]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python script.py` would
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
