"""Fuzz the files hwdash reads but did not write itself: probe files (the probe folder may have been
made by another user) and replay lines (a recording may have been edited or corrupted).

The documented outcomes are the only ones allowed. A probe file: read as a reading, skipped with one
warning naming it, or (a stale file, a reused PID) skipped as the probe's docs say; the folder's other
files are read whatever this one holds. A replay line: a snapshot, a line skipped with a warning, or a
:class:`ReplayError` naming the line; whatever is read writes back as strict JSON.

Examples per test come from the ``hwdash-untrusted`` hypothesis profile: ``HWDASH_FUZZ_EXAMPLES``
(default 200, sized for CI); ``HWDASH_FUZZ_EXAMPLES=10000`` is the full run.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from hwdash.cli import main
from hwdash.core import strict_json
from hwdash.telemetry.probes import MAX_PID, ProbeDirectory, parse_reading
from hwdash.telemetry.replay import MAX_WAIT_S, ReplayError, ReplaySampler, read_replay
from hwdash.telemetry.snapshot_json import snapshot_to_dict

settings.register_profile(
    "hwdash-untrusted",
    max_examples=int(os.environ.get("HWDASH_FUZZ_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
FUZZ = settings.get_profile("hwdash-untrusted")
#: The whole command (`hwdash monitor --replay`) is slower: a tenth of the examples.
FUZZ_CLI = settings(FUZZ, max_examples=max(20, FUZZ.max_examples // 10))

#: Numbers no hwdash writer produces, and a few it does.
odd_numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2**31 - 1, 2**31, 2**63, 2**64, 10**20, 10**21]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -1e308, 5e-324, -0.0]),
)
scalars = st.one_of(odd_numbers, st.booleans(), st.none(), st.text(max_size=8))
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
#: Raw number texts json.dumps cannot make: far past any bound, or overflowing a float.
number_texts = st.sampled_from(
    ["1" + "0" * 5000, "-" + "9" * 4400, "1" + "0" * 400, "1e999", "-1e999", "NaN", "Infinity"]
)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def render(document: Any, raw: str | None, deep: int | None, cut: int | None) -> bytes:
    """``document`` as JSON text (``NaN`` and huge integers as Python writes them), with ``raw``
    number text or a ``deep`` array put in place of the marker, then maybe cut short."""
    text = json.dumps(document, allow_nan=True)
    if raw is not None:
        text = text.replace('"@raw@"', raw, 1)
    if deep is not None:
        text = text.replace('"@deep@"', nested(deep), 1)
    data = text.encode()
    return data if cut is None else data[:cut]


@st.composite
def probe_documents(draw: st.DrawFn, pid: int) -> dict[str, Any]:
    """A good probe file's object with up to three fields (of it or of its device) replaced,
    dropped or added."""
    device: dict[str, Any] = {
        "uuid": "5a1c2e0b-7d3f-4c21-9a6e-000000000000",
        "allocated_bytes": 1 << 30,
        "reserved_bytes": 2 << 30,
        "alloc_retries": 0,
    }
    document: dict[str, Any] = {
        "format": 1,
        "pid": pid,
        "start_ticks": None,
        "written_at": time.time(),
        "interval_s": 1.0,
        "cuda": "ready",
        "step": 7,
        "devices": [device],
        "error": None,
    }
    for _change in range(draw(st.integers(min_value=0, max_value=3))):
        target = draw(st.sampled_from([document, device]))
        key = draw(st.one_of(st.sampled_from(sorted(target)), st.text(max_size=5)))
        if draw(st.integers(min_value=0, max_value=4)) == 0:
            target.pop(key, None)
        else:
            target[key] = draw(st.one_of(odd_numbers, values, st.sampled_from(["@raw@", "@deep@"])))
    return document


def documented_skip(data: bytes, still_there: bool) -> bool:
    """Whether the probe's docs skip this (well-formed) file quietly: its start time says its PID now
    belongs to another process (the file is then removed), or it was not rewritten for too long."""
    try:
        reading = parse_reading(json.loads(data))
    except (ValueError, RecursionError):
        return False
    if reading is None:
        return False
    if not still_there:
        return True  # removed as a reused PID's
    return time.time() - reading.written_at > 5 * reading.interval_s + 5


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    path = tmp_path / "hwdash" / "probes"
    path.mkdir(parents=True)
    path.chmod(0o700)
    path.parent.chmod(0o700)
    return path


@FUZZ
@given(
    kind=st.sampled_from(["json"] * 7 + ["bytes", "fifo", "symlink", "folder"]),
    document=probe_documents(os.getppid()),
    raw=st.one_of(st.none(), number_texts),
    deep=st.one_of(st.none(), st.integers(min_value=1, max_value=3000)),
    cut=st.one_of(st.none(), st.none(), st.integers(min_value=0, max_value=400)),
    noise=st.binary(max_size=200),
)
def test_any_probe_file_is_read_or_skipped_and_never_stops_the_others(
    folder: Path,
    caplog: pytest.LogCaptureFixture,
    kind: str,
    document: dict[str, Any],
    raw: str | None,
    deep: int | None,
    cut: int | None,
    noise: bytes,
) -> None:
    caplog.clear()
    for leftover in folder.iterdir():
        if leftover.is_dir() and not leftover.is_symlink():
            leftover.rmdir()
        else:
            leftover.unlink()
    pid = os.getppid()  # alive, and not this process
    good = folder / f"{os.getpid()}.json"
    good.write_text(
        json.dumps({"format": 1, "pid": os.getpid(), "written_at": time.time(), "devices": []})
    )
    path = folder / f"{pid}.json"
    data = noise if kind == "bytes" else render(document, raw, deep, cut)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        (folder.parent / "target.json").write_bytes(data)
        path.symlink_to(folder.parent / "target.json")
    elif kind == "folder":
        path.mkdir()
    else:
        path.write_bytes(data)

    with caplog.at_level(logging.WARNING, logger="hwdash.telemetry.probes"):
        readings = ProbeDirectory(folder).read()

    assert os.getpid() in readings  # the good file is read whatever the other holds
    warned = [r.getMessage() for r in caplog.records if f"{pid}.json" in r.getMessage()]
    if pid in readings:
        reading = readings[pid]
        assert kind in ("json", "bytes") and not warned
        event("probe file: read")
        assert reading.pid == pid and 0 < reading.pid <= MAX_PID
        assert math.isfinite(reading.written_at) and math.isfinite(reading.interval_s)
        assert reading.interval_s > 0
        for device in reading.devices:
            assert all(
                isinstance(getattr(device, name), int)
                and not isinstance(getattr(device, name), bool)
                for name in ("allocated_bytes", "reserved_bytes", "alloc_retries", "ooms")
            )
    elif kind in ("fifo", "symlink", "folder"):
        assert len(warned) == 1
        event("probe file: not a regular file, warned")
    else:
        quiet = not warned and documented_skip(data, path.exists())
        assert len(warned) == 1 or quiet, (data[:300], warned)
        event("probe file: " + ("skipped as documented" if quiet else "skipped with a warning"))
    assert set(readings) <= {os.getpid(), pid}


SNAPSHOT = {
    "timestamp": 1_000_000.0,
    "nvml": {"available": True, "driver_version": "550.54.15"},
    "gpus": [
        {
            "index": 0,
            "name": "NVIDIA A100-SXM4-80GB",
            "uuid": "GPU-0",
            "state": "ok",
            "memory_total_bytes": 85899345920,
            "memory_used_bytes": 42949672960,
            "memory_free_bytes": 42949672960,
            "utilization_gpu": 90.0,
            "processes": [
                {"pid": 4242, "used_bytes": 1 << 30, "verifiable": False, "torch": {"step": 3}}
            ],
            "errors": {},
        }
    ],
    "host": {"cpu_percent": 12.5, "load_average": [1.0, 0.5, 0.25], "per_cpu_percent": [1.0]},
    "errors": [],
}


@st.composite
def replay_documents(draw: st.DrawFn) -> Any:
    """A snapshot with one field (at the top, in the GPU, in its process or host) replaced."""
    document = json.loads(json.dumps(SNAPSHOT))
    target = draw(
        st.sampled_from(
            [document, document["gpus"][0], document["gpus"][0]["processes"][0], document["host"]]
        )
    )
    key = draw(st.one_of(st.sampled_from(sorted(target)), st.text(max_size=5)))
    target[key] = draw(st.one_of(values, st.sampled_from(["@raw@", "@deep@"])))
    if draw(st.booleans()):
        return draw(values)  # not a snapshot at all
    return document


REPLAY_LINES = {
    "document": replay_documents(),
    "raw": st.one_of(st.none(), number_texts),
    "deep": st.one_of(st.none(), st.integers(min_value=1, max_value=3000)),
    "cut": st.one_of(st.none(), st.none(), st.integers(min_value=0, max_value=600)),
    "last": st.booleans(),
}


def write_recording(
    tmp_path: Path, document: Any, raw: str | None, deep: int | None, cut: int | None, last: bool
) -> tuple[Path, list[str]]:
    """A recording of two or three lines: good, the fuzzed one, (good)."""
    good = json.dumps(SNAPSHOT)
    line = render(document, raw, deep, cut).decode("utf-8", "replace").replace("\n", " ")
    lines = [good, line] if last else [good, line, good]
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path, lines


@FUZZ
@given(**REPLAY_LINES)
def test_any_replay_line_is_a_snapshot_a_warning_or_an_error_naming_it(
    tmp_path: Path, document: Any, raw: str | None, deep: int | None, cut: int | None, last: bool
) -> None:
    path, lines = write_recording(tmp_path, document, raw, deep, cut, last)
    line = lines[1]
    try:
        snapshots, warnings = read_replay(path)
    except ReplayError as exc:
        assert f"{path}:2: " in str(exc)
        event("replay line: error naming it")
        return
    assert 1 <= len(snapshots) <= len(lines)
    if len(snapshots) < len(lines) and line.strip():
        assert len(warnings) == 1 and f"{path}:2: " in warnings[0]
        event("replay line: skipped with a warning")
    else:
        event("replay line: a snapshot")
    for snapshot in snapshots:
        strict_json.dumps(snapshot_to_dict(snapshot))  # what the monitor writes: never NaN
    replay = ReplaySampler(snapshots)
    for _snapshot in replay:
        assert 0.0 <= replay.wait_s() <= MAX_WAIT_S  # time.sleep() takes it


@FUZZ_CLI
@given(**REPLAY_LINES, as_json=st.booleans())
def test_monitor_replay_of_any_line_ends_cleanly(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    document: Any,
    raw: str | None,
    deep: int | None,
    cut: int | None,
    last: bool,
    as_json: bool,
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    path, _lines = write_recording(tmp_path, document, raw, deep, cut, last)
    status = main(
        ["monitor", "--replay", str(path), "--speed", "0", *(["--json"] if as_json else [])]
    )
    out, err = capsys.readouterr()
    assert status in (0, 2), err
    assert "Traceback" not in err
    if status == 2:
        assert f"{path}:2: " in err
    elif as_json:
        for printed in out.splitlines():
            json.loads(printed, parse_constant=lambda name: pytest.fail(f"{name} in the output"))


def test_a_replayed_time_past_what_the_c_library_holds_prints_as_unknown() -> None:
    # Found by the replay fuzz above in CI: 2**63-ish timestamps raised OverflowError/EOVERFLOW.
    from hwdash.commands.monitor_print import _clock_text

    assert _clock_text(9_223_372_036_854_775_296) == "??:??:??"
    assert _clock_text(-1e300) == "??:??:??"
    assert len(_clock_text(1_795_668_792.0)) == 8
