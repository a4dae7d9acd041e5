"""The probe's out-of-memory recording (hwdash.probe.oom) with the stand-in torch, the probe file's
``"oom"`` object and how the monitor's reader believes it."""

from __future__ import annotations

import json
import os
import pickle
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from stand_in_torch import SNAPSHOT, AllocatorHistory, Device, StandInCuda, StandInTorch

import hwdash.probe as probe
from hwdash.probe import Probe, oom
from hwdash.telemetry.probe_files import MAX_OOM_SNAPSHOTS
from hwdash.telemetry.probes import ProbeDirectory, ProbeOom, parse_oom, parse_reading

UUID0 = "5a1c2e0b-7d3f-4c21-9a6e-000000000000"
HERE = Path(__file__).resolve().parent
SRC = str(HERE.parents[1] / "src")
MIB = 2**20
GIB_16 = 16 * 2**30


@pytest.fixture(autouse=True)
def _no_oom_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (oom.RECORD_ENV, oom.ENTRIES_ENV, oom.KEEP_ENV):
        monkeypatch.delenv(name, raising=False)


def gpu(initialized: bool = True) -> StandInCuda:
    return StandInCuda(
        devices=[Device(UUID0, allocated=GIB_16, reserved=GIB_16, max_reserved=GIB_16)],
        initialized=initialized,
    )


def probed(
    tmp_path: Path, cuda: StandInCuda, history: AllocatorHistory | None
) -> tuple[Probe, StandInTorch]:
    torch = StandInTorch(cuda, history)
    return Probe(30.0, tmp_path, torch_module=lambda: torch, record_oom=True), torch


def written(writer: Probe) -> dict[str, Any]:
    return json.loads(writer.path.read_bytes())


def snapshot_files(folder: Path) -> list[Path]:
    return sorted(folder.glob(f"{os.getpid()}-oom-*.pickle"), key=lambda path: path.stat().st_mtime)


# -- starting to record --------------------------------------------------------------------------


def test_recording_waits_for_cuda_then_turns_the_history_on_and_attaches_the_observer(
    tmp_path: Path,
) -> None:
    cuda, history = gpu(initialized=False), AllocatorHistory()
    writer, _torch = probed(tmp_path, cuda, history)
    try:
        writer.publish()
        assert history.calls == []  # nothing before the script initialised CUDA
        assert written(writer)["oom"] == {"recording": False, "snapshots": [], "error": None}
        cuda.initialized = True
        writer.publish()
        assert [name for name, _args, _kwargs in history.calls] == [
            "_cuda_isHistoryEnabled",
            "_record_memory_history",
            "_cuda_attach_out_of_memory_observer",
        ]
        assert history.called("_record_memory_history") == [
            ((), {"enabled": "all", "context": "alloc", "stacks": "python", "max_entries": 100_000})
        ]
        assert written(writer)["oom"]["recording"] is True
        writer.publish()
        assert len(history.calls) == 3  # started once
    finally:
        writer.stop()
    # Stopping turns off the history it turned on; the observer then reports to nobody.
    assert history.calls[-1] == ("_record_memory_history", (), {"enabled": None})
    history.out_of_memory(0, MIB, 0, 0)
    assert snapshot_files(tmp_path) == [] and "_snapshot" not in str(history.calls)


def test_the_ring_size_comes_from_the_environment_and_a_history_the_script_set_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(oom.ENTRIES_ENV, "5000")
    history = AllocatorHistory()
    writer, _torch = probed(tmp_path, gpu(), history)
    writer.publish()
    assert history.called("_record_memory_history")[0][1]["max_entries"] == 5000
    writer.stop()

    mine = AllocatorHistory(enabled=True)  # the script called _record_memory_history itself
    writer, _torch = probed(tmp_path, gpu(), mine)
    writer.publish()
    writer.stop()
    assert mine.called("_record_memory_history") == []  # neither changed nor turned off
    assert len(mine.called("_cuda_attach_out_of_memory_observer")) == 1


def test_a_bad_setting_is_said_once_and_the_default_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(oom.KEEP_ENV, "100")
    history = AllocatorHistory()
    writer, _torch = probed(tmp_path, gpu(), history)
    writer.publish()
    writer.stop()
    assert writer.oom is not None and writer.oom.settings == oom.OomSettings()
    (line,) = capsys.readouterr().err.splitlines()
    assert oom.KEEP_ENV in line and "16" in line


def test_without_record_oom_the_probe_file_has_no_oom_object_and_the_history_is_untouched(
    tmp_path: Path,
) -> None:
    history = AllocatorHistory()
    torch = StandInTorch(gpu(), history)
    writer = Probe(30.0, tmp_path, torch_module=lambda: torch)
    writer.publish()
    assert "oom" not in written(writer) and writer.oom is None
    assert history.calls == []
    assert parse_reading(written(writer), tmp_path).oom is None  # type: ignore[union-attr]


def test_a_torch_without_cuda_is_refused_with_one_line_and_the_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cuda = gpu()
    writer, _torch = probed(tmp_path, cuda, None)  # no torch._C: a CPU-only build
    try:
        for _round in range(3):
            writer.publish()
        state = written(writer)["oom"]
    finally:
        writer.stop()
    assert state["recording"] is False and state["snapshots"] == []
    assert "2.13.0+stand-in has no CUDA caching allocator" in state["error"]
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("hwdash.probe: out-of-memory recording refused: torch 2.13.0+stand-in")


# -- the dump on an out-of-memory error -----------------------------------------------------------


def test_the_observer_dumps_the_snapshot_before_the_error_and_the_file_lists_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    history = AllocatorHistory()
    writer, _torch = probed(tmp_path, gpu(), history)
    try:
        writer.publish()
        history.out_of_memory(0, 64 * MIB, 80 * 2**30, MIB)  # what the allocator does first
        (path,) = snapshot_files(tmp_path)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        with path.open("rb") as handle:
            dumped = pickle.load(handle)
        # PyTorch's snapshot, plus what the observer was told and the snapshot does not hold.
        assert dumped == {
            **SNAPSHOT,
            "hwdash": {
                "device": 0,
                "device_limit_bytes": 80 * 2**30,
                "device_free_bytes": MIB,
            },
        }
        assert [name for name, _a, _k in history.calls][-1] == "_snapshot"
        err = capsys.readouterr().err
        assert (
            "CUDA out of memory on device 0 (64.0 MiB requested, 1.0 MiB free of 81,920.0 MiB)"
            in err
        )
        assert f"hwdash oom {path}" in err
        writer.publish()
        listed = written(writer)["oom"]
        assert listed["recording"] is True and listed["error"] is None
        (entry,) = listed["snapshots"]
        assert entry["path"] == str(path) and entry["reason"] == "oom"
        assert entry["bytes"] == path.stat().st_size and entry["at"] > 1e9
        # The monitor's reader believes it.
        reading = ProbeDirectory(tmp_path).read()[os.getpid()]
        assert reading.oom is not None and reading.oom.recording
        (seen,) = reading.oom.snapshots
        assert (seen.path, seen.reason, seen.bytes) == (path, "oom", path.stat().st_size)
    finally:
        writer.stop()
    assert path.exists()  # the snapshot outlives the probe file: it is what the user reads next


def test_only_the_newest_snapshots_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(oom.KEEP_ENV, "2")
    history = AllocatorHistory()
    writer, _torch = probed(tmp_path, gpu(), history)
    try:
        writer.publish()
        paths = []
        for size in (1, 2, 3, 4):
            history.snapshot = {
                "segments": [],
                "device_traces": [[{"action": "oom", "size": size}]],
            }
            history.out_of_memory(0, size, 0, 0)
            paths.append(writer.oom.snapshots[-1]["path"])  # type: ignore[union-attr]
        kept = snapshot_files(tmp_path)
        assert [str(path) for path in kept] == paths[2:]
        with kept[-1].open("rb") as handle:
            assert pickle.load(handle)["device_traces"][0][0]["size"] == 4
        writer.publish()
        assert [entry["path"] for entry in written(writer)["oom"]["snapshots"]] == paths[2:]
    finally:
        writer.stop()


def test_a_failed_dump_never_reaches_the_training_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    history = AllocatorHistory(failing="_snapshot")
    writer, _torch = probed(tmp_path, gpu(), history)
    try:
        writer.publish()
        history.out_of_memory(0, MIB, 0, 0)  # the observer returns; the allocator raises its own
        history.out_of_memory(0, MIB, 0, 0)
        assert snapshot_files(tmp_path) == []
        message = "oom snapshot not written: RuntimeError: CUDA error: an illegal memory access"
        assert writer.oom is not None and (writer.oom.error or "").startswith(message)
        assert capsys.readouterr().err.count("snapshot not written") == 1  # said once
        writer.publish()
        assert written(writer)["oom"]["error"].startswith(message)
    finally:
        writer.stop()


def test_a_planted_link_at_the_temporary_name_is_not_followed(tmp_path: Path) -> None:
    history = AllocatorHistory()
    writer, _torch = probed(tmp_path, gpu(), history)
    target = tmp_path / "elsewhere"
    target.write_text("untouched")
    following = oom._numbers._last + 1 if oom._numbers._pid == os.getpid() else 1
    name = f"{os.getpid()}-oom-{following}.pickle"
    (tmp_path / f".{name}.tmp").symlink_to(target)
    try:
        writer.publish()
        history.out_of_memory(0, MIB, 0, 0)
    finally:
        writer.stop()
    assert target.read_text() == "untouched"
    assert not (tmp_path / name).exists()
    assert writer.oom is not None
    assert "oom snapshot not written: OSError" in (writer.oom.error or "")


# -- SIGUSR2 -------------------------------------------------------------------------------------


LOOP = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from stand_in_torch import AllocatorHistory, Device, StandInCuda, StandInTorch

    history = AllocatorHistory()
    cuda = StandInCuda(devices=[Device("u0", reserved=1, max_reserved=1)], initialized=True)
    sys.modules["torch"] = StandInTorch(cuda, history)
    chained = []
    def mine(signum, frame):
        chained.append(signum)
    signal.signal(signal.SIGUSR2, mine)

    import hwdash.probe
    running = hwdash.probe.start(0.05, record_oom=True)
    while not running.oom.recording:
        time.sleep(0.01)
    print("ready", flush=True)
    deadline = time.monotonic() + 20
    while not running.oom.snapshots and time.monotonic() < deadline:
        time.sleep(0.01)  # the training loop
    running.publish()
    listed = json.loads(running.path.read_bytes())["oom"]
    hwdash.probe.stop()
    print(json.dumps({
        "listed": listed,
        "chained": chained,
        "restored": signal.getsignal(signal.SIGUSR2) is mine,
        "calls": [[name, kwargs] for name, _args, kwargs in history.calls],
    }))
    """
)


@pytest.mark.skipif(not hasattr(signal, "SIGUSR2"), reason="needs SIGUSR2")
def test_sigusr2_dumps_a_snapshot_on_the_probe_thread_chaining_the_previous_handler(
    tmp_path: Path,
) -> None:
    path = os.pathsep.join([SRC, str(HERE), os.environ.get("PYTHONPATH", "")])
    environ = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path), PYTHONPATH=path)
    process = subprocess.Popen(
        [sys.executable, "-c", LOOP],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environ,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready"
        os.kill(process.pid, signal.SIGUSR2)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, err
    seen = json.loads(out)
    folder = tmp_path / "hwdash" / "probes"
    (entry,) = seen["listed"]["snapshots"]
    assert entry["reason"] == "signal" and entry["path"] == str(
        folder / f"{process.pid}-oom-1.pickle"
    )
    snapshot = Path(entry["path"])
    assert (
        stat.S_IMODE(snapshot.stat().st_mode) == 0o600 and entry["bytes"] == snapshot.stat().st_size
    )
    with snapshot.open("rb") as handle:
        assert pickle.load(handle) == SNAPSHOT
    assert seen["chained"] == [signal.SIGUSR2]  # the script's own handler still ran
    assert seen["restored"]  # and has SIGUSR2 back after stop
    assert [name for name, _kwargs in seen["calls"]][-2:] == ["_snapshot", "_record_memory_history"]
    assert f"allocator snapshot in {snapshot}" in err
    assert sorted(path.name for path in folder.iterdir()) == [snapshot.name]  # probe file removed


def test_sigusr2_before_cuda_is_used_dumps_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recorder = oom.OomRecorder(tmp_path)
    history = AllocatorHistory()
    torch = StandInTorch(gpu(initialized=False), history)
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        assert recorder.install_signal()
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.01)  # the handler runs between two bytecodes of the main thread
        recorder.poll(torch)
    finally:
        recorder.close()
        assert signal.getsignal(signal.SIGUSR2) == previous
    assert history.called("_snapshot") == [] and snapshot_files(tmp_path) == []
    assert "SIGUSR2: no allocator snapshot: recording has not started" in capsys.readouterr().err


# -- how users ask for it --------------------------------------------------------------------------


def test_hwdash_record_oom_in_the_environment_turns_it_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(oom.RECORD_ENV, "1")
    try:
        running = probe.start(30.0, tmp_path)
        assert running.oom is not None
    finally:
        probe.stop()
    monkeypatch.setenv(oom.RECORD_ENV, "0")
    try:
        assert probe.start(30.0, tmp_path).oom is None
        assert probe.start(30.0, tmp_path, record_oom=True).oom is not None  # asked again
    finally:
        probe.stop()


def _run(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([SRC, str(HERE), os.environ.get("PYTHONPATH", "")])
    environ = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path), PYTHONPATH=path, **env)
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=environ, timeout=60
    )


def test_python_m_hwdash_probe_record_oom(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, time, json
            from stand_in_torch import AllocatorHistory, Device, StandInCuda, StandInTorch
            import hwdash.probe
            history = AllocatorHistory()
            cuda = StandInCuda(devices=[Device("u0")], initialized=True)
            sys.modules["torch"] = StandInTorch(cuda, history)
            deadline = time.monotonic() + 20
            while not history.calls and time.monotonic() < deadline:
                time.sleep(0.01)
            print(json.dumps([name for name, _args, _kwargs in history.calls]))
            """
        )
    )
    done = _run(["-m", "hwdash.probe", "--interval", "0.05", "--record-oom", str(script)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)[:2] == ["_cuda_isHistoryEnabled", "_record_memory_history"]


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["--record-oom=yes"], {}, "--record-oom takes no value"),
        (["--record-oom"], {oom.KEEP_ENV: "0"}, "HWDASH_OOM_KEEP: '0' is not a whole number"),
        ([], {oom.RECORD_ENV: "1", oom.ENTRIES_ENV: "lots"}, "HWDASH_OOM_ENTRIES: 'lots'"),
    ],
)
def test_python_m_hwdash_probe_refuses_bad_oom_settings(
    args: list[str], env: dict[str, str], message: str, tmp_path: Path
) -> None:
    (tmp_path / "x.py").write_text("")
    done = _run(["-m", "hwdash.probe", *args, str(tmp_path / "x.py")], tmp_path, **env)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr


# -- the reader ------------------------------------------------------------------------------------


def oom_object(folder: Path, pid: int, **entry: Any) -> dict[str, Any]:
    listed = {"path": str(folder / f"{pid}-oom-3.pickle"), "at": 1.7e9, "reason": "oom"}
    listed.update({"bytes": 4096, **entry})
    return {"recording": True, "snapshots": [listed], "error": None}


def oom_of(data: dict[str, Any], folder: Path, pid: int = 42) -> ProbeOom:
    result = parse_oom(data, pid, folder)
    assert result is not None
    return result


def test_the_reader_parses_the_oom_object(tmp_path: Path) -> None:
    data = {"format": 1, "pid": 42, "written_at": 1.7e9, "oom": oom_object(tmp_path, 42)}
    reading = parse_reading(data, tmp_path)
    assert reading is not None and reading.oom is not None
    (snapshot,) = reading.oom.snapshots
    assert snapshot.path == tmp_path / "42-oom-3.pickle"
    assert (snapshot.at, snapshot.reason, snapshot.bytes) == (1.7e9, "oom", 4096)
    assert reading.oom.recording and reading.oom.error is None
    refused = {"recording": False, "snapshots": [], "error": "torch 2.13.0+cpu has no CUDA"}
    assert oom_of(refused, tmp_path).error == "torch 2.13.0+cpu has no CUDA"


@pytest.mark.parametrize(
    "path",
    [
        "../x.pickle",
        "/etc/passwd",
        "42-oom-3.pickle",  # relative
        "{folder}/../42-oom-3.pickle",
        "{folder}/../probes2/42-oom-3.pickle",
        "{folder}/sub/42-oom-3.pickle",
        "{folder}//42-oom-3.pickle",
        "{folder}/./42-oom-3.pickle",
        "{folder}/43-oom-3.pickle",  # another process's
        "{folder}/42.json",
        "{folder}/42-oom-3.pkl",
        "{folder}/42-oom-03.pickle",
        "{folder}/42-oom-٣.pickle",  # a digit, but not ASCII
        "{folder}/42-oom-3.pickle/",
        "{folder}/42-oom-3.pickle\0",
        "{folder}/x.pickle",
        "{folder}",
        "",
    ],
)
def test_the_reader_refuses_a_snapshot_path_outside_the_probe_folder(
    path: str, tmp_path: Path
) -> None:
    data = oom_object(tmp_path, 42, path=path.replace("{folder}", str(tmp_path)))
    parsed = parse_oom(data, 42, tmp_path)
    assert parsed is not None and parsed.snapshots == ()


@pytest.mark.parametrize(
    "entry",
    [
        {"reason": "boom"},
        {"reason": None},
        {"bytes": -1},
        {"bytes": 1.5},
        {"bytes": True},
        {"at": "now"},
        {"at": float("nan")},
        {"at": 0},
        {"path": 7},
        {"path": "x" * 5000},
    ],
)
def test_the_reader_drops_an_entry_with_a_bad_member(entry: dict[str, Any], tmp_path: Path) -> None:
    parsed = parse_oom(oom_object(tmp_path, 42, **entry), 42, tmp_path)
    assert parsed is not None and parsed.snapshots == ()
    assert len(oom_of(oom_object(tmp_path, 42), tmp_path).snapshots) == 1


@pytest.mark.parametrize(
    "change",
    [
        {"recording": "yes"},
        {"recording": None},
        {"error": 5},
        {"snapshots": "all"},
        {"snapshots": None},
        {"snapshots": [{}] * (MAX_OOM_SNAPSHOTS + 1)},
    ],
)
def test_a_bad_oom_object_reads_as_none_and_the_rest_of_the_file_still_reads(
    change: dict[str, Any], tmp_path: Path
) -> None:
    data = {
        "format": 1,
        "pid": 42,
        "written_at": 1.7e9,
        "devices": [{"uuid": UUID0, "reserved_bytes": 7}],
        "oom": dict(oom_object(tmp_path, 42), **change),
    }
    reading = parse_reading(data, tmp_path)
    assert reading is not None and reading.oom is None
    assert reading.devices[0].reserved_bytes == 7
    assert parse_reading(dict(data, oom=[1, 2]), tmp_path).oom is None  # type: ignore[union-attr]


def test_sixteen_snapshots_are_believed(tmp_path: Path) -> None:
    entry = oom_object(tmp_path, 42)["snapshots"][0]
    data = {"recording": True, "snapshots": [entry] * MAX_OOM_SNAPSHOTS, "error": None}
    assert len(oom_of(data, tmp_path).snapshots) == MAX_OOM_SNAPSHOTS


# -- the real, CPU-only torch ----------------------------------------------------------------------


@pytest.mark.validate
def test_with_real_cpu_only_torch_recording_is_refused_cleanly(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch is in the calibrate extra")
    code = textwrap.dedent(
        """
        import json, time, torch
        import hwdash.probe
        running = hwdash.probe.start(0.05, record_oom=True)
        deadline = time.monotonic() + 20
        while running.oom.error is None and time.monotonic() < deadline:
            time.sleep(0.01)
        x = torch.ones(1000) * 2  # training on the CPU goes on
        running.publish()
        print(json.dumps({"cuda_initialized": torch.cuda.is_initialized(),
                          "oom": json.loads(running.path.read_bytes())["oom"],
                          "sum": float(x.sum())}))
        """
    )
    done = _run(["-c", code], tmp_path, CUDA_VISIBLE_DEVICES="")
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["cuda_initialized"] is False and seen["sum"] == 2000.0
    assert seen["oom"]["recording"] is False and seen["oom"]["snapshots"] == []
    assert "has no CUDA caching allocator (a CPU-only build)" in seen["oom"]["error"]
    (line,) = done.stderr.splitlines()
    assert line.startswith("hwdash.probe: out-of-memory recording refused: torch ")
