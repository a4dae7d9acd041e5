"""``python -m hwdash.probe [--interval S] [--plan NAME|PATH] [--record-oom] (SCRIPT | -m MODULE)
ARGS...``: run a training script with the probe started, as if it had ``import hwdash.probe;
hwdash.probe.start()``.

``--plan`` names the plan the run is measured against (a saved plan's name, or a plan file, which
must exist); without it ``$HWDASH_PLAN`` is used. ``--record-oom`` (or ``HWDASH_RECORD_OOM=1``)
records the allocator's history and dumps a snapshot on an out-of-memory error and on ``SIGUSR2``
(:mod:`hwdash.probe.oom`); a bad ``HWDASH_OOM_ENTRIES`` or ``HWDASH_OOM_KEEP`` is refused here. The
script's ``sys.argv`` is set before the probe starts, so the run's command line is the script's."""

from __future__ import annotations

import os
import runpy
import sys

from hwdash.probe import DEFAULT_INTERVAL_S, looks_like_path, start
from hwdash.probe.oom import OomSettingError, requested, settings_from_env

USAGE = (
    "usage: python -m hwdash.probe [--interval S] [--plan NAME|PATH] [--record-oom]"
    " (SCRIPT | -m MODULE) [ARGS...]"
)
OPTIONS = ("--interval", "--plan", "--record-oom")


class _Usage(Exception):
    """A bad option: the message is printed, the exit status is 2."""


def _option(args: list[str], name: str) -> str:
    """Pop ``--name VALUE`` or ``--name=VALUE`` off the front of ``args``."""
    option = args.pop(0)
    if "=" in option:
        return option.partition("=")[2]
    if not args:
        raise _Usage(f"{name}: a value is needed")
    return args.pop(0)


def _interval(value: str) -> float:
    try:
        interval = float(value)
    except ValueError:
        interval = -1.0
    if not (interval > 0 and interval != float("inf")):
        raise _Usage(f"--interval: {value!r} is not a positive number of seconds")
    return interval


def _plan(value: str) -> str:
    text = value.strip()
    if not text or text.startswith("-") or any(ord(char) < 32 for char in text):
        raise _Usage(f"--plan: {value!r} is neither a saved plan's name nor a plan file")
    if looks_like_path(text) and not os.path.isfile(os.path.expanduser(text)):
        raise _Usage(f"--plan: no such plan file: {text}")
    return text


def _options(args: list[str]) -> tuple[float, str | None, bool]:
    interval, plan, record_oom = DEFAULT_INTERVAL_S, None, requested()
    while args and args[0].split("=")[0] in OPTIONS:
        if args[0].startswith("--interval"):
            interval = _interval(_option(args, "--interval"))
        elif args[0].startswith("--plan"):
            plan = _plan(_option(args, "--plan"))
        elif args.pop(0) != "--record-oom":
            raise _Usage("--record-oom takes no value")
        else:
            record_oom = True
    if record_oom:
        try:
            settings_from_env()
        except OomSettingError as problem:
            raise _Usage(str(problem)) from None
    return interval, plan, record_oom


def main(argv: list[str]) -> int:
    """Parse the probe's own options, start it, run the target in this process."""
    args = list(argv)
    try:
        interval, plan, record_oom = _options(args)
    except _Usage as problem:
        print(f"hwdash.probe: error: {problem}", file=sys.stderr)
        return 2
    if args[:1] in (["-h"], ["--help"]) or not args:
        print(USAGE, file=sys.stderr if not args else sys.stdout)
        return 0 if args else 2
    if args[0] == "-m":
        if len(args) < 2:
            print(USAGE, file=sys.stderr)
            return 2
        sys.argv = [args[1], *args[2:]]
        start(interval, plan=plan, record_oom=record_oom)
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        return 0
    script = args[0]
    if not os.path.isfile(script):
        print(f"hwdash.probe: error: no such script: {script}", file=sys.stderr)
        return 2
    sys.argv = [script, *args[1:]]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python script.py` would
    start(interval, plan=plan, record_oom=record_oom)
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
