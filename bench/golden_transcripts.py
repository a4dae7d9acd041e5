"""Golden transcripts of the ``hwdash`` command line: record them, or check the code still prints them.

Issue 25 restructures the code without changing what a user sees. This script runs every command of
``bench/golden/commands.txt`` (plan, fit, export, --from, catalog, compare, monitor --once on fake
scenarios, help text and bad input) and keeps, per command, ``bench/golden/<nn>-<slug>.txt``: the
command, its exit status, its standard output and error, and any file it was asked to write.

    python bench/golden_transcripts.py record            # (re)write the transcripts
    python bench/golden_transcripts.py check             # exit 1 and a unified diff on any difference
    python bench/golden_transcripts.py check --subprocess  # each command as `python -m hwdash`

Commands run in-process through :func:`hwdash.cli.main` (stdout and stderr captured, ``SystemExit``
turned into its status as ``python -m hwdash`` would), in the repository root, in order, with a fixed
environment: HOME, XDG_CONFIG_HOME/DATA_HOME/STATE_HOME/CACHE_HOME and the Hugging Face cache in a
fresh temporary folder, no GPU on "this machine" (HWDASH_FAKE_NVML=no-driver), no user catalog,
Hugging Face offline, COLUMNS=100, TZ=UTC. What still differs between runs is normalised (see
:func:`normalise`): the temporary folder's path, wall-clock timestamps, the sampling time and the real
host's RAM/CPU/load readings (the fake NVML fakes the GPUs, not the host).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "bench" / "golden"
COMMANDS = GOLDEN / "commands.txt"
PYTHON_FILE = GOLDEN / "python-version.txt"
"""The Python (major.minor) the transcripts were recorded with: argparse's help layout and error
wording change between Python versions (3.13 reworded both), hwdash's own output does not."""

#: Environment variables removed for the run: they would change what hwdash reads or prints.
CLEARED_ENV = (
    "HWDASH_CATALOG",
    "HWDASH_RUNS",  # the runs ledger: XDG_STATE_HOME's (empty) one
    "HWDASH_HISTORY_DIR",  # the history ring: XDG_STATE_HOME's (empty) one
    "HWDASH_PLAN",
    "HWDASH_PRICE",
    "HWDASH_FAKE_NVML",
    "HWDASH_PROMETHEUS_TOKEN",
    "HWDASH_PROMETHEUS_USER",
    "HWDASH_PROMETHEUS_PASSWORD",
    "CUDA_VISIBLE_DEVICES",
    "HF_TOKEN",
    "LINES",
    "FORCE_COLOR",
    "NO_COLOR",
    "TERM",
    "PYTHONWARNINGS",
)


@dataclass(frozen=True)
class Command:
    """One line of commands.txt."""

    number: int
    slug: str
    args: str
    """The words after ``hwdash`` as written ({tmp} not yet filled in)."""
    capture: str | None
    """A file the command writes, whose content goes into the transcript."""

    @property
    def path(self) -> Path:
        return GOLDEN / f"{self.number:02d}-{self.slug}.txt"


def read_commands(path: Path = COMMANDS) -> list[Command]:
    """The commands of ``path``, numbered from 1 in file order."""
    commands: list[Command] = []
    seen: set[str] = set()
    for lineno, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        slug, sep, rest = line.partition(":")
        slug = slug.strip()
        if not sep or not re.fullmatch(r"[a-z0-9][a-z0-9-]*", slug):
            raise SystemExit(f"{path}:{lineno}: expected 'slug: args', got {raw!r}")
        if slug in seen:
            raise SystemExit(f"{path}:{lineno}: slug {slug!r} is used twice")
        seen.add(slug)
        args, arrow, capture = rest.partition("=>")
        commands.append(
            Command(len(commands) + 1, slug, args.strip(), capture.strip() if arrow else None)
        )
    return commands


def golden_environment(tmp: Path) -> dict[str, str]:
    """The variables set for the run (on top of the current environment less CLEARED_ENV)."""
    return {
        "HOME": str(tmp / "home"),
        "XDG_CONFIG_HOME": str(tmp / "config"),
        "XDG_DATA_HOME": str(tmp / "data"),
        "XDG_STATE_HOME": str(tmp / "state"),
        "XDG_CACHE_HOME": str(tmp / "cache"),
        "HF_HOME": str(tmp / "hf"),
        "HF_HUB_CACHE": str(tmp / "hf" / "hub"),
        "HF_HUB_OFFLINE": "1",
        "HWDASH_FAKE_NVML": "no-driver",
        "COLUMNS": "100",
        "TZ": "UTC",
        "LC_ALL": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
    }


@contextlib.contextmanager
def patched_environment(values: dict[str, str]) -> Iterator[None]:
    """os.environ with CLEARED_ENV removed and ``values`` set; restored afterwards."""
    saved = dict(os.environ)
    try:
        for name in CLEARED_ENV:
            os.environ.pop(name, None)
        os.environ.update(values)
        if hasattr(time, "tzset"):
            time.tzset()
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
        if hasattr(time, "tzset"):
            time.tzset()


def run_in_process(argv: list[str]) -> tuple[int, str, str]:
    """``hwdash ARGV`` through hwdash.cli.main: exit status, stdout, stderr."""
    from hwdash.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exc:  # argparse's --help and errors; python -m hwdash does the same
            if exc.code is None:
                status = 0
            elif isinstance(exc.code, int):
                status = exc.code
            else:
                print(exc.code, file=sys.stderr)
                status = 1
    return status, out.getvalue(), err.getvalue()


def run_subprocess(argv: list[str]) -> tuple[int, str, str]:
    """``python -m hwdash ARGV`` with this interpreter: exit status, stdout, stderr."""
    done = subprocess.run(
        [sys.executable, "-m", "hwdash", *argv],
        capture_output=True,
        text=True,
        encoding="utf-8",
        cwd=ROOT,
        env=dict(os.environ),
        timeout=120,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr


# What differs from run to run, replaced by markers in normalise(); each comment says why.
_TIMESTAMP_ISO = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)?")
"""A saved plan's saved_at and other wall-clock dates and times."""
_JSON_TIME = re.compile(r'"(timestamp|sample_seconds)": -?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?')
"""monitor --json: when a sample (or an alert) was taken and how long the sampling took."""
_JSON_HOST = re.compile(r'"host": \{[^{}]*"ram_total_bytes"[^{}]*\}')
"""monitor --json: the real host's CPU, RAM, load and swap (the fake NVML fakes only the GPUs)."""
_HOST_LINE = re.compile(r"^host cpu .*$", re.MULTILINE)
"""monitor's text: the same host readings on one line."""


def normalise(text: str, tmp: Path) -> str:
    """``text`` with what differs from run to run replaced by markers: the temporary folder's path
    (<TMP>), ISO dates and times (<DATETIME>), monitor JSON's timestamp and sample_seconds (<TIME>)
    and host object (<HOST>), and monitor text's host line (host <HOST>)."""
    for path in {str(tmp), str(tmp.resolve())}:
        text = text.replace(path, "<TMP>")
    text = _TIMESTAMP_ISO.sub("<DATETIME>", text)
    text = _JSON_TIME.sub(r'"\1": "<TIME>"', text)
    text = _JSON_HOST.sub('"host": "<HOST>"', text)
    return _HOST_LINE.sub("host <HOST>", text)


def transcript(command: Command, status: int, out: str, err: str, captured: str | None) -> str:
    """The text kept in the command's golden file."""
    parts = [
        f"$ hwdash {command.args}\n",
        f"exit: {status}\n",
        "--- stdout\n",
        out if out.endswith("\n") or not out else out + "\n<no newline at end>\n",
        "--- stderr\n",
        err if err.endswith("\n") or not err else err + "\n<no newline at end>\n",
    ]
    if command.capture is not None:
        parts.append(f"--- file {command.capture}\n")
        if captured is None:
            parts.append("<not written>\n")
        else:
            parts.append(captured if captured.endswith("\n") or not captured else captured + "\n")
    return "".join(parts)


def run_all(commands: Sequence[Command], *, subprocess_mode: bool = False) -> dict[Command, str]:
    """Every command's normalised transcript, run in order in one fresh temporary folder."""
    results: dict[Command, str] = {}
    runner = run_subprocess if subprocess_mode else run_in_process
    with tempfile.TemporaryDirectory(prefix="hwdash-golden-") as name:
        tmp = Path(name)
        for sub in ("home", "config", "data", "state", "cache", "hf"):
            (tmp / sub).mkdir()
        previous = Path.cwd()
        with patched_environment(golden_environment(tmp)):
            os.chdir(ROOT)
            try:
                for command in commands:
                    argv = shlex.split(command.args.replace("{tmp}", str(tmp)))
                    status, out, err = runner(argv)
                    captured = None
                    if command.capture is not None:
                        target = Path(command.capture.replace("{tmp}", str(tmp)))
                        if target.is_file():
                            captured = target.read_text(encoding="utf-8")
                    text = transcript(command, status, out, err, captured)
                    results[command] = normalise(text, tmp)
            finally:
                os.chdir(previous)
    return results


def python_version() -> str:
    """This interpreter's major.minor, as PYTHON_FILE keeps it."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def recorded_python() -> str | None:
    """The major.minor the transcripts were recorded with (None if not said)."""
    return PYTHON_FILE.read_text(encoding="utf-8").strip() if PYTHON_FILE.is_file() else None


def formatted_by_argparse(text: str) -> bool:
    """Whether a transcript holds text that argparse wrote (help, usage, its own errors)."""
    return "usage: hwdash" in text or "lists the options)" in text


def skipped_here(golden: str) -> bool:
    """A golden transcript argparse wrote, checked under a Python other than the one that recorded
    it: its layout may differ for reasons outside hwdash, so it is not compared."""
    return recorded_python() != python_version() and formatted_by_argparse(golden)


def differences(results: dict[Command, str]) -> list[str]:
    """A unified diff per command whose transcript differs from its golden file (or has none);
    argparse-written transcripts are left out under another Python version (see skipped_here)."""
    diffs = []
    for command, text in results.items():
        if not command.path.is_file():
            diffs.append(f"{command.path.relative_to(ROOT)}: no golden file (run `record`)\n")
            continue
        golden = command.path.read_text(encoding="utf-8")
        if golden != text and not skipped_here(golden):
            diffs.append(
                "".join(
                    difflib.unified_diff(
                        golden.splitlines(keepends=True),
                        text.splitlines(keepends=True),
                        fromfile=f"{command.path.relative_to(ROOT)} (golden)",
                        tofile=f"{command.path.relative_to(ROOT)} (now)",
                    )
                )
            )
    return diffs


def record(results: dict[Command, str]) -> None:
    """Write the transcripts and remove golden files of commands no longer listed."""
    kept = {command.path for command in results}
    for stale in GOLDEN.glob("[0-9][0-9]*-*.txt"):
        if stale not in kept:
            stale.unlink()
    for command, text in results.items():
        command.path.write_text(text, encoding="utf-8")
    PYTHON_FILE.write_text(python_version() + "\n", encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("action", choices=("record", "check"))
    parser.add_argument(
        "--subprocess",
        action="store_true",
        help="run each command as `python -m hwdash` instead of in-process (slower)",
    )
    parser.add_argument(
        "--only",
        metavar="SLUG",
        action="append",
        default=[],
        help="record or check only this command (repeatable); all still run, in order, since "
        "later commands read what earlier ones wrote",
    )
    args = parser.parse_args(argv)
    commands = read_commands()
    unknown = set(args.only) - {command.slug for command in commands}
    if unknown:
        parser.error(f"--only: no command {', '.join(sorted(unknown))} in {COMMANDS}")
    started = time.perf_counter()
    results = run_all(commands, subprocess_mode=args.subprocess)
    seconds = time.perf_counter() - started
    if args.only:
        results = {command: text for command, text in results.items() if command.slug in args.only}
    if args.action == "record":
        if args.only:
            for command, text in results.items():
                command.path.write_text(text, encoding="utf-8")
        else:
            record(results)
        print(f"recorded {len(results)} transcripts in {seconds:.1f} s")
        return 0
    diffs = differences(results)
    for diff in diffs:
        sys.stdout.write(diff)
    if recorded_python() != python_version():
        skipped = sum(
            command.path.is_file() and skipped_here(command.path.read_text(encoding="utf-8"))
            for command in results
        )
        print(
            f"note: recorded with Python {recorded_python()}, checked with {python_version()}: "
            f"{skipped} transcripts written by argparse not compared"
        )
    print(f"{len(results) - len(diffs)} of {len(results)} transcripts identical ({seconds:.1f} s)")
    return 1 if diffs else 0


if __name__ == "__main__":
    raise SystemExit(main())
