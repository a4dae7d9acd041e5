"""Reading a snapshot file safely: hostile pickles are refused (exit 2) without running anything."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest
from oom_fixtures import EXPECTED, MIB, training_oom, write

from hwdash.cli import main
from hwdash.runs import oom_snapshot
from hwdash.runs.oom_snapshot import SnapshotError, read_snapshot

REPO = Path(__file__).resolve().parents[2]


class _Marker:
    """A pickle whose load would call ``os.system`` (touching the marker file)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def _refused(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["oom", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"hwdash oom: error: {path}")
    return lines[0]


def test_the_scripted_run_reads_back_as_typed_dataclasses(tmp_path: Path) -> None:
    path = write(tmp_path / "s.pickle", training_oom().snapshot())
    snapshot = oom_snapshot.to_snapshot(oom_snapshot.load_pickle(path), actions=None)
    assert len(snapshot.segments) == 5
    assert sum(s.total_size for s in snapshot.segments if s.device == 0) == EXPECTED["reserved"]
    states = {block.state for segment in snapshot.segments for block in segment.blocks}
    # the C++ side's "active_pending_free" is read as the documented "active_awaiting_free"
    assert states == {"active_allocated", "active_awaiting_free", "inactive"}
    oom = [entry for entry in snapshot.device_traces[0] if entry.action == "oom"]
    assert [(e.size, e.device_free, e.addr) for e in oom] == [(300 * MIB, 200 * MIB, None)]
    actions = {entry.action for entry in snapshot.device_traces[0]}
    assert actions == {"segment_alloc", "alloc", "free_requested", "free_completed", "oom"}
    # by default only the entries the analysis reads are converted; all are counted
    assert [e.action for e in read_snapshot(path).device_traces[0]] == ["oom"]
    assert read_snapshot(path).trace_lengths == snapshot.trace_lengths == (27, 2)
    # a stack that PyTorch shares between blocks is one tuple of frames here too
    blocks = [b for b in snapshot.segments[0].blocks]
    assert blocks[0].frames is blocks[1].frames
    assert blocks[0].frames[1].name == "from_pretrained"


def test_a_reduce_that_would_run_code_is_refused_and_runs_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "ran"
    document = training_oom().snapshot()
    document["segments"][0]["blocks"][0]["frames"] = [_Marker(marker)]
    path = write(tmp_path / "evil.pickle", document)
    # the standard unpickler would run it: the fixture really is hostile
    probe = write(tmp_path / "probe.pickle", _Marker(tmp_path / "probe-ran"))
    pickle.loads(probe.read_bytes())
    assert (tmp_path / "probe-ran").exists()

    line = _refused(path, capsys)
    assert "refused" in line and "system" in line and "nothing was run" in line
    assert not marker.exists()


def test_a_ten_million_deep_nest_is_refused_quickly_without_a_recursion_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    depth = 10**7
    path = tmp_path / "nest.pickle"
    path.write_bytes(b"\x80\x04" + b"]" * depth + b"a" * (depth - 1) + b".")
    started = time.perf_counter()
    line = _refused(path, capsys)
    assert time.perf_counter() - started < 2.0  # the standard unpickler takes seconds and ~1 GB
    assert "containers" in line and "deep nest" in line
    assert "RecursionError" not in line


def test_a_padded_deep_nest_under_an_unknown_key_is_refused_by_the_depth_walk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # each level padded with a pushed-and-popped number: past the per-byte rule, caught after
    nest = b"]" + b"K\x00" + b"0"
    depth = 200
    document = {"segments": [], "device_traces": [], "extra": "SENTINEL"}
    body = pickle.dumps(document, protocol=2)
    sentinel = b"X\x08\x00\x00\x00SENTINEL"
    assert body.count(sentinel) == 1
    path = tmp_path / "padded.pickle"
    path.write_bytes(body.replace(sentinel, nest * depth + b"a" * (depth - 1)))
    assert isinstance(pickle.loads(path.read_bytes())["extra"], list)  # a well-formed pickle
    line = _refused(path, capsys)
    assert f"deeper than {oom_snapshot.MAX_DEPTH} levels" in line


def test_a_file_over_the_bound_is_refused_before_reading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "huge.pickle"
    with open(path, "wb") as handle:
        handle.truncate(oom_snapshot.MAX_SNAPSHOT_BYTES + 1)  # sparse: no disk used
    started = time.perf_counter()
    line = _refused(path, capsys)
    assert time.perf_counter() - started < 1.0
    assert f"{oom_snapshot.MAX_SNAPSHOT_BYTES + 1:,} bytes" in line


def test_a_two_gigabyte_claim_in_a_small_file_is_refused_before_allocating(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # BINUNICODE8 (protocol 4) says a 2 GB string follows; the file has 15 bytes left
    claim = 2 * 1024**3
    path = tmp_path / "claim.pickle"
    path.write_bytes(b"\x80\x04\x8d" + claim.to_bytes(8, "little") + b"short string.")
    line = _refused(path, capsys)
    assert f"claims {claim:,} bytes" in line


@pytest.mark.parametrize(
    ("document", "said"),
    [
        ([1, 2, 3], "the snapshot is list, expected a dict"),
        ({"segments": []}, "no 'device_traces'"),
        ({"segments": {}, "device_traces": []}, "segments is dict, expected a list"),
        (
            {"segments": [{"address": 0, "total_size": "big", "blocks": []}], "device_traces": []},
            "segments[0].total_size is str, expected a whole number",
        ),
        (
            {
                "segments": [
                    {"address": 0, "total_size": 8, "blocks": [{"size": 8, "state": "lost"}]}
                ],
                "device_traces": [],
            },
            "segments[0].blocks[0].state: unknown block state 'lost'",
        ),
        (
            {"segments": [], "device_traces": [[{"action": "oom", "size": True}]]},
            "device_traces[0][0].size is bool, expected a whole number",
        ),
        (
            {"segments": [], "device_traces": [[{"action": "oom", "frames": [{"line": 1}]}]]},
            "device_traces[0][0].frames[0] has no 'filename'",
        ),
        (
            {"segments": [], "device_traces": [[{"action": "alloc"}, ["alloc"]]]},
            "device_traces[0][1] is list, expected a dict",
        ),
    ],
)
def test_wrong_types_are_refused_naming_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], document: object, said: str
) -> None:
    path = write(tmp_path / "bad.pickle", document)
    assert said in _refused(path, capsys)


def test_a_truncated_file_and_a_non_pickle_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    whole = pickle.dumps(training_oom().snapshot(), protocol=4)
    truncated = tmp_path / "cut.pickle"
    truncated.write_bytes(whole[: len(whole) // 2])
    line = _refused(truncated, capsys)
    assert "truncated" in line or "ends early" in line
    text = tmp_path / "notes.pickle"
    text.write_text("hello, not a pickle\n")
    assert "not a memory snapshot pickle" in _refused(text, capsys)


def test_missing_folder_and_unreadable_files_say_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "no such file" in _refused(tmp_path / "absent.pickle", capsys)
    assert "is a folder" in _refused(tmp_path, capsys)
    if os.geteuid() != 0:
        locked = write(tmp_path / "locked.pickle", training_oom().snapshot())
        locked.chmod(0)
        assert "not readable" in _refused(locked, capsys)


def test_the_refusal_in_a_new_process_has_no_traceback(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = write(tmp_path / "evil.pickle", _Marker(marker))
    done = subprocess.run(
        [sys.executable, "-m", "hwdash", "oom", str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        check=False,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("hwdash oom: error:") and "refused" in done.stderr
    assert not marker.exists()


def test_gc_is_left_as_it_was(tmp_path: Path) -> None:
    import gc

    path = write(tmp_path / "s.pickle", training_oom().snapshot())
    assert gc.isenabled()
    read_snapshot(path)
    assert gc.isenabled()
    with pytest.raises(SnapshotError):
        read_snapshot(tmp_path / "absent")
    assert gc.isenabled()
