"""hwdash.probe in a training process: what it reads, what it writes, and how the monitor reads it."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import ModuleType

import pytest
from stand_in_torch import GIB, Device, StandInCuda, StandInTorch

import hwdash.probe as probe
from hwdash.probe import Probe, ProbeDirError, private_dir, probe_dir, read_torch
from hwdash.telemetry.probes import ProbeDirectory, ProbeJoiner, parse_reading, uuid_key

UUID0 = "5a1c2e0b-7d3f-4c21-9a6e-000000000000"
UUID1 = "5a1c2e0b-7d3f-4c21-9a6e-000000000001"
SRC = str(Path(__file__).resolve().parents[2] / "src")


def two_gpus(initialized: bool = True) -> StandInCuda:
    return StandInCuda(
        devices=[
            Device(
                UUID0,
                allocated=30 * GIB,
                reserved=34 * GIB,
                max_allocated=33 * GIB,
                max_reserved=35 * GIB,
                retries=2,
                ooms=1,
                inactive_split=GIB,
            ),
            Device(UUID1),  # visible to the process, never used by it
        ],
        initialized=initialized,
    )


# -- what the probe reads ------------------------------------------------------------------------


def test_before_cuda_is_initialised_the_probe_waits_and_touches_nothing() -> None:
    cuda = two_gpus(initialized=False)
    assert read_torch(StandInTorch(cuda)) == ("waiting", [])
    assert [name for name, _args in cuda.calls] == ["is_initialized"]


def test_a_used_device_is_read_and_an_unused_one_is_left_alone() -> None:
    cuda = two_gpus()
    state, devices = read_torch(StandInTorch(cuda))
    assert state == "ready"
    assert [device["uuid"] for device in devices] == [UUID0]
    (device,) = devices
    assert device["allocated_bytes"] == 30 * GIB
    assert device["reserved_bytes"] == 34 * GIB
    assert device["max_allocated_bytes"] == 33 * GIB
    assert device["max_reserved_bytes"] == 35 * GIB
    assert (device["alloc_retries"], device["ooms"]) == (2, 1)
    assert device["inactive_split_bytes"] == GIB
    assert device["free_bytes"] == 70 * GIB
    # mem_get_info would create a CUDA context on device 1: only asked where memory is held.
    assert cuda.called("mem_get_info") == [(0,)]
    assert (1,) not in cuda.called("get_device_properties")


def test_the_current_device_is_listed_even_before_it_holds_memory() -> None:
    cuda = two_gpus()
    cuda.devices[0].reserved = cuda.devices[0].max_reserved = 0
    cuda.devices[0].allocated = cuda.devices[0].max_allocated = 0
    _state, devices = read_torch(StandInTorch(cuda))
    assert [device["index"] for device in devices] == [0]
    assert devices[0]["free_bytes"] is None
    assert cuda.called("mem_get_info") == []


def test_a_failing_torch_call_is_published_not_raised(tmp_path: Path) -> None:
    cuda = two_gpus()
    cuda.devices = []  # is_available says False
    cuda.initialized = True
    reading = Probe(directory=tmp_path, torch_module=lambda: StandInTorch(cuda)).reading()
    assert reading["cuda"] == "waiting"

    broken = two_gpus()
    broken.failing = "memory_stats"
    reading = Probe(directory=tmp_path, torch_module=lambda: StandInTorch(broken)).reading()
    assert reading["error"] == "RuntimeError: CUDA error: unspecified launch failure"
    assert reading["devices"] == [] and reading["cuda"] == "waiting"


# -- what it writes ------------------------------------------------------------------------------


def test_publish_writes_one_private_file_that_the_monitor_parses(tmp_path: Path) -> None:
    folder = tmp_path / "run" / "probes"
    cuda = two_gpus()
    writer = Probe(directory=folder, torch_module=lambda: StandInTorch(cuda))
    writer.step = 41
    writer.publish()
    path = folder / f"{os.getpid()}.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert [p.name for p in folder.iterdir()] == [path.name]  # no temporary file left behind
    reading = parse_reading(json.loads(path.read_bytes()))
    assert reading is not None and reading.cuda_ready and reading.step == 41
    device = reading.device("GPU-" + UUID0.upper())  # NVML's spelling
    assert device is not None and device.reserved_bytes == 34 * GIB
    assert reading.device("GPU-" + UUID1) is None
    writer.stop()
    assert not path.exists()


def test_publishing_from_two_threads_at_once_never_fails(tmp_path: Path) -> None:
    # The probe's own thread publishes every interval; a caller may publish at the same moment
    # (the Trainer callback's test did, and a shared temporary file made one os.replace fail).
    import threading

    folder = tmp_path / "probes"
    writer = Probe(directory=folder, torch_module=lambda: StandInTorch(two_gpus()))
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def hammer() -> None:
        start.wait()
        for _ in range(300):
            try:
                writer.publish()
            except BaseException as exc:  # collected and asserted below
                errors.append(exc)

    threads = [threading.Thread(target=hammer) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert writer.writes == 600
    path = folder / f"{os.getpid()}.json"
    assert [p.name for p in folder.iterdir()] == [path.name]
    assert parse_reading(json.loads(path.read_bytes())) is not None
    writer.stop()


def test_the_probe_folder_is_refused_when_it_is_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "hwdash").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ProbeDirError, match="not a folder"):
        private_dir(tmp_path / "hwdash" / "probes")


def test_an_open_probe_folder_of_ours_is_closed(tmp_path: Path) -> None:
    folder = tmp_path / "hwdash"
    folder.mkdir(mode=0o777)
    os.chmod(folder, 0o777)
    private_dir(folder / "probes")
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700


def test_probe_dir_prefers_the_runtime_dir(tmp_path: Path) -> None:
    assert probe_dir({"XDG_RUNTIME_DIR": str(tmp_path)}) == tmp_path / "hwdash" / "probes"
    fallback = probe_dir({"XDG_RUNTIME_DIR": str(tmp_path / "missing")})
    assert fallback.parent.name == f"hwdash-{os.getuid()}" and fallback.name == "probes"
    assert probe_dir({}) == fallback


def test_the_thread_publishes_every_interval_and_cleans_up(tmp_path: Path) -> None:
    cuda = two_gpus()
    writer = Probe(0.05, tmp_path, torch_module=lambda: StandInTorch(cuda)).start()
    path = tmp_path / f"{os.getpid()}.json"
    deadline = time.monotonic() + 5
    while writer.rounds < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert writer.rounds >= 3 and path.exists()
    cuda.devices[0].allocated = 31 * GIB
    rounds = writer.rounds
    while writer.rounds < rounds + 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert json.loads(path.read_bytes())["devices"][0]["allocated_bytes"] == 31 * GIB
    writer.stop()
    assert not writer.alive and not path.exists()


def test_start_returns_the_running_probe_and_set_step_reaches_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    first = probe.start(interval_s=30)
    try:
        assert probe.start() is first
        probe.set_step(12)
        assert first.step == 12
        assert first.directory == tmp_path / "hwdash" / "probes"
    finally:
        probe.stop()
    assert not first.alive


@pytest.mark.parametrize("interval", [0.0, -1.0, float("nan"), float("inf")])
def test_a_bad_interval_is_refused(interval: float, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="positive number of seconds"):
        Probe(interval, tmp_path)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_remove_the_parents_file(tmp_path: Path) -> None:
    writer = Probe(30, tmp_path, torch_module=lambda: None)
    writer.publish()
    pid = os.fork()
    if pid == 0:  # a DataLoader worker that exits normally
        writer.stop(timeout=0)
        os._exit(0)
    os.waitpid(pid, 0)
    assert (tmp_path / f"{os.getpid()}.json").exists()
    writer.stop()


# -- the monitor's side ----------------------------------------------------------------------------


def _write(folder: Path, pid: int, **fields: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = {
        "format": 1,
        "pid": pid,
        "written_at": time.time(),
        "interval_s": 1.0,
        "cuda": "ready",
        "step": None,
        "devices": [{"uuid": UUID0, "allocated_bytes": GIB, "reserved_bytes": 2 * GIB}],
    }
    data.update(fields)
    path = folder / f"{pid}.json"
    path.write_text(json.dumps(data))
    return path


def test_files_of_exited_processes_are_removed_and_stale_ones_skipped(tmp_path: Path) -> None:
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead_pid = int(finished.stdout)
    dead = _write(tmp_path, dead_pid)
    alive = _write(tmp_path, os.getpid())
    stale = _write(tmp_path, os.getppid(), written_at=time.time() - 60)
    (tmp_path / "notes.txt").write_text("not a probe")
    (tmp_path / "123.json").write_text("{half a fil")
    readings = ProbeDirectory(tmp_path).read()
    assert set(readings) == {os.getpid()}
    assert not dead.exists()  # cleaned up: its process is gone
    assert alive.exists() and stale.exists()  # a live process's file is not ours to remove


def test_a_reused_pid_is_not_taken_for_the_probed_process(tmp_path: Path) -> None:
    path = _write(tmp_path, os.getpid(), start_ticks=1)  # this PID started at another time
    assert ProbeDirectory(tmp_path).read() == {}
    assert not path.exists()


def test_uuids_match_with_or_without_nvml_prefix() -> None:
    assert uuid_key("GPU-ABC-1") == uuid_key("abc-1") == "abc-1"
    assert uuid_key("MIG-xyz") == "xyz"
    assert uuid_key(None) is None and uuid_key("GPU-") is None


def test_rising_retries_are_flagged_for_a_minute(tmp_path: Path) -> None:
    now = [0.0]
    joiner = ProbeJoiner(ProbeDirectory(tmp_path), clock=lambda: now[0])

    def sample(retries: int) -> object:
        reading = parse_reading(
            {
                "format": 1,
                "pid": 7,
                "written_at": 0.0,
                "devices": [{"uuid": UUID0, "alloc_retries": retries, "reserved_bytes": GIB}],
            }
        )
        return joiner.sample_for(reading, 7, "GPU-" + UUID0)

    first = sample(3)
    assert first is not None and not first.retries_rising  # the count, but no rise seen yet
    now[0] = 1
    assert sample(5).retries_rising  # type: ignore[attr-defined]
    now[0] = 50
    assert sample(5).retries_rising  # type: ignore[attr-defined]
    now[0] = 62
    assert not sample(5).retries_rising  # type: ignore[attr-defined]
    assert joiner.sample_for(None, 7, "GPU-" + UUID0) is None


# -- the probe as users start it -------------------------------------------------------------------


def _run(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))
    environ = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path), PYTHONPATH=path, **env)
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=environ, timeout=60
    )


def test_python_m_hwdash_probe_runs_the_script_with_the_probe(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, sys, threading, time, json
            import helper  # from the script's folder, as `python train.py` finds it
            names = [thread.name for thread in threading.enumerate()]
            folder = os.path.join(os.environ["XDG_RUNTIME_DIR"], "hwdash", "probes")
            path = os.path.join(folder, f"{os.getpid()}.json")
            for _ in range(100):
                if os.path.exists(path):
                    break
                time.sleep(0.05)
            print(json.dumps({"argv": sys.argv, "threads": names, "file": os.path.exists(path),
                              "main": __name__, "modules": sorted(sys.modules)}))
            """
        )
    )
    (tmp_path / "helper.py").write_text("")
    done = _run(["-m", "hwdash.probe", "--interval", "0.1", str(script), "--lr", "1e-4"], tmp_path)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["argv"] == [str(script), "--lr", "1e-4"]
    assert seen["main"] == "__main__"
    assert "hwdash-probe" in seen["threads"] and seen["file"]
    # Neither the dashboard's nor the catalog's libraries are loaded into a training process.
    assert not {"textual", "pydantic", "rich"} & {m.split(".")[0] for m in seen["modules"]}
    assert list((tmp_path / "hwdash" / "probes").iterdir()) == []  # removed at exit


@pytest.mark.parametrize(
    "args, message",
    [
        (["--interval", "0", "x.py"], "--interval"),
        (["--interval", "soon", "x.py"], "--interval"),
        (["missing.py"], "no such script"),
        ([], "usage"),
    ],
)
def test_python_m_hwdash_probe_refuses_bad_input(
    args: list[str], message: str, tmp_path: Path
) -> None:
    done = _run(["-m", "hwdash.probe", *args], tmp_path)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr


def test_the_trainer_callback_publishes_the_global_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in = ModuleType("transformers")

    class TrainerCallback:  # transformers' base class has no required arguments either
        pass

    stand_in.TrainerCallback = TrainerCallback  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformers", stand_in)
    monkeypatch.delitem(sys.modules, "hwdash.probe.hf", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    from hwdash.probe.hf import HwdashProbeCallback

    try:
        callback = HwdashProbeCallback(interval_s=30)
        state = type("State", (), {"global_step": 0})()
        callback.on_train_begin(None, state, None)
        state.global_step = 250
        callback.on_step_end(None, state, None)
        assert callback.probe.step == 250
        callback.probe.publish()
        written = json.loads((tmp_path / "hwdash" / "probes" / f"{os.getpid()}.json").read_bytes())
        assert written["step"] == 250
    finally:
        probe.stop()


@pytest.mark.validate
def test_with_real_cpu_only_torch_the_probe_waits_without_initialising_cuda(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch", reason="torch is in the calibrate extra")
    code = textwrap.dedent(
        """
        import json, os, time, torch
        import hwdash.probe
        running = hwdash.probe.start(0.05)
        time.sleep(0.3)
        path = running.path
        print(json.dumps({"cuda_initialized": torch.cuda.is_initialized(),
                          "reading": json.loads(path.read_bytes())}))
        """
    )
    done = _run(["-c", code], tmp_path, CUDA_VISIBLE_DEVICES="")
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["cuda_initialized"] is False
    assert seen["reading"]["cuda"] == "waiting" and seen["reading"]["devices"] == []


def test_an_unchanged_reading_is_rewritten_only_every_few_seconds(tmp_path: Path) -> None:
    cuda = two_gpus()
    writer = Probe(1.0, tmp_path, torch_module=lambda: StandInTorch(cuda))
    writer.publish(force=False)
    writer.publish(force=False)  # same numbers a second later: no file system call
    assert (writer.rounds, writer.writes) == (2, 1)
    cuda.devices[0].allocated += GIB
    writer.publish(force=False)
    assert writer.writes == 2  # a change is written at once
    writer._last_write -= probe.REWRITE_S  # ...and an unchanged one after REWRITE_S
    writer.publish(force=False)
    assert writer.writes == 3
