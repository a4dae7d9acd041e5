"""The probe's view of the run (issue 26): progress and tokens/s, energy, plan, the end-of-run record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import types
from pathlib import Path
from typing import Any

import pytest
from stand_in_torch import GIB, Device, StandInCuda, StandInTorch

import hwdash.probe as probe
from hwdash.probe import Probe
from hwdash.probe.progress import Progress, window_rate
from hwdash.probe.record import RECORD_KEYS, exit_kind
from hwdash.telemetry.fake_nvml import ENERGY_START_MJ, ManualClock, make_fake_pynvml
from hwdash.telemetry.fake_scenario import Scenario
from hwdash.telemetry.nvml_energy import EnergyMeter, nvml_uuid
from hwdash.telemetry.probes import parse_reading

UUID0 = "5a1c2e0b-7d3f-4c21-9a6e-000000000000"
UUID1 = "5a1c2e0b-7d3f-4c21-9a6e-000000000001"
SRC = str(Path(__file__).resolve().parents[2] / "src")


class Clock:
    """A monotonic clock that moves only when told."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def gpu_torch(ooms: int = 0) -> StandInCuda:
    return StandInCuda(
        devices=[
            Device(UUID0, allocated=30 * GIB, reserved=34 * GIB, max_allocated=33 * GIB,
                   max_reserved=35 * GIB, ooms=ooms),
            Device(UUID1, allocated=20 * GIB, reserved=21 * GIB, max_allocated=22 * GIB,
                   max_reserved=24 * GIB),
        ],
        initialized=True,
    )  # fmt: skip


def fake_nvml(clock: ManualClock, *, unsupported_second: bool = False) -> Any:
    second: dict[str, Any] = {"name": "B", "memory_total_mib": 81920, "power_w": 100.0}
    second["uuid"] = "GPU-" + UUID1
    if unsupported_second:
        second["unsupported"] = ["energy"]
    scenario = Scenario.model_validate(
        {
            "gpus": [
                {
                    "name": "A",
                    "uuid": "GPU-" + UUID0,
                    "memory_total_mib": 81920,
                    "power_w": [[0, 200.0], [10, 400.0]],
                },
                second,
            ]
        }
    )
    return make_fake_pynvml(scenario, clock)


# -- tokens per second ---------------------------------------------------------------------------


def test_tokens_per_second_over_a_scripted_clock() -> None:
    clock = Clock()
    progress = Progress(clock)
    assert progress.snapshot().tokens_per_s is None
    progress.step(tokens=1000)
    assert progress.snapshot().tokens_per_s is None  # one step: no duration yet
    for _ in range(10):
        clock.now += 0.5
        progress.step(tokens=1000, samples=4)
    seen = progress.snapshot()
    assert seen.steps == 11 and seen.tokens == 11_000 and seen.samples == 40
    assert seen.tokens_per_s == pytest.approx(2000.0)
    assert seen.step_time_s == pytest.approx(0.5)
    assert seen.first_step_at == 1000.0 and seen.last_step_at == 1005.0
    assert seen.sequences is None and not seen.tokens_estimated


def test_a_checkpoint_save_is_left_out_of_tokens_per_second() -> None:
    clock = Clock()
    progress = Progress(clock)
    progress.step(tokens=500)
    for index in range(20):
        clock.now += 30.0 if index == 10 else 0.25  # a 30 s save between two steps
        progress.step(tokens=500)
    seen = progress.snapshot()
    assert seen.tokens_per_s == pytest.approx(2000.0)  # 500 tokens / 0.25 s, the save left out
    assert seen.step_time_s == pytest.approx(0.25)
    # A step of 4x the median is training speed all the same: kept.
    rate, median = window_rate([*range(1, 10), 14.0], [1.0] * 9 + [4.0], [100] * 10)
    assert median == 1.0 and rate == pytest.approx(1000 / 13)
    # Steps older than a minute before the latest are out of the window (the 999 tokens).
    rate, median = window_rate([0.0, 70.0, 71.0, 72.0, 73.0], [1.0, 5.0, 1, 1, 1], [999, *[10] * 4])
    assert (rate, median) == (5.0, 1.0)


def test_the_window_is_the_last_minute_but_never_fewer_than_three_steps() -> None:
    clock = Clock()
    progress = Progress(clock)
    progress.step(tokens=100)
    for _ in range(100):  # 100 s at 100 tokens/s...
        clock.now += 1.0
        progress.step(tokens=100)
    for _ in range(240):  # ...then a minute at 400 tokens/s: only the minute counts
        clock.now += 0.25
        progress.step(tokens=100)
    assert progress.snapshot().tokens_per_s == pytest.approx(400.0)
    slow = Progress(clock)
    for _ in range(4):  # steps of two minutes each still give a rate
        slow.step(tokens=6000)
        clock.now += 120.0
    assert slow.snapshot().tokens_per_s == pytest.approx(50.0)
    assert slow.snapshot().step_time_s == pytest.approx(120.0)


def test_estimated_tokens_and_no_tokens_at_all() -> None:
    clock = Clock()
    progress = Progress(clock)
    for _ in range(3):
        clock.now += 1
        progress.step(samples=8)
    assert progress.snapshot().tokens is None and progress.snapshot().tokens_per_s is None
    progress.step(tokens=10, estimated=True)
    assert progress.snapshot().tokens_estimated


def test_the_run_object_in_the_probe_file(tmp_path: Path) -> None:
    clock, wall = Clock(50.0), Clock(1_764_120_000.0)
    writer = Probe(
        directory=tmp_path,
        torch_module=lambda: None,
        plan="my-plan",
        max_steps=1000,
        clock=clock,
        wall_clock=wall,
    )
    writer.publish()
    run = json.loads(writer.path.read_bytes())["run"]
    assert run["step"] is None and run["tokens"] is None and run["tokens_per_s"] is None
    writer.record_step(tokens=4096, sequences=2)
    clock.now += 2.0
    writer.record_step(tokens=4096, sequences=2)
    writer.publish()
    written = json.loads(writer.path.read_bytes())
    run = written["run"]
    assert set(run) == {
        "started_at", "command", "plan", "step", "tokens", "samples", "sequences",
        "tokens_estimated", "tokens_per_s", "step_time_s", "first_step_at", "last_step_at",
        "max_steps", "total_tokens", "energy_j", "world_size", "exit",
    }  # fmt: skip
    assert run["started_at"] == 1_764_120_000.0 and run["plan"] == "my-plan"
    assert run["step"] == 2 and written["step"] == 2
    assert (run["tokens"], run["sequences"], run["samples"]) == (8192, 4, None)
    assert run["tokens_per_s"] == pytest.approx(2048.0) and run["step_time_s"] == 2.0
    assert run["first_step_at"] == 1_764_120_000.0 and run["last_step_at"] == 1_764_120_002.0
    assert run["max_steps"] == 1000 and run["total_tokens"] is None and run["energy_j"] is None
    assert run["command"].startswith(os.path.basename(sys.executable) + " ")
    writer.step = 77  # set_step: the Trainer's global step wins over counting
    writer.publish()
    assert json.loads(writer.path.read_bytes())["run"]["step"] == 77
    assert parse_reading(json.loads(writer.path.read_bytes())) is not None  # readers still parse
    writer.stop()


def test_module_step_and_set_step_reach_the_running_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe.step(tokens=5)  # no probe: nothing happens
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    running = probe.start(interval_s=30, total_tokens=10_000)
    try:
        probe.step(tokens=100, samples=2)
        probe.step(100, samples=2, step=41)
        probe.set_total(max_steps=500)
        run = running.run_object()
        assert (run["tokens"], run["samples"], run["step"]) == (200, 4, 41)
        assert (run["max_steps"], run["total_tokens"]) == (500, 10_000)
        probe.set_step(42)
        assert running.run_object()["step"] == 42
    finally:
        probe.stop()


def test_hwdash_plan_names_the_plan_and_start_overrides_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HWDASH_PLAN", "llama-lora")
    assert Probe(directory=tmp_path).plan == "llama-lora"
    assert Probe(directory=tmp_path, plan="other").plan == "other"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HWDASH_PLAN", "plans/p.json")
    assert Probe(directory=tmp_path).plan == str(tmp_path / "plans" / "p.json")
    monkeypatch.setenv("HWDASH_PLAN", "  ")
    assert Probe(directory=tmp_path).plan is None


# -- energy ----------------------------------------------------------------------------------------


def test_the_fake_nvml_energy_counter_integrates_power() -> None:
    clock = ManualClock(0.0)
    nvml = fake_nvml(clock, unsupported_second=True).module
    meter = EnergyMeter(nvml)
    first = meter.read([UUID0, "GPU-" + UUID1, "GPU-nope"])
    assert first == {UUID0: ENERGY_START_MJ, "GPU-" + UUID1: None, "GPU-nope": None}
    clock.advance(10.0)  # 200 W rising to 400 W: 3000 J
    assert meter.read([UUID0])[UUID0] == ENERGY_START_MJ + 3_000_000
    clock.advance(5.0)  # 400 W held: 2000 J more
    assert meter.read([UUID0])[UUID0] == ENERGY_START_MJ + 5_000_000
    clock.now_s = 1.0  # a clock that goes back never makes the counter go back
    assert meter.read([UUID0])[UUID0] == ENERGY_START_MJ + 5_000_000


def test_energy_meter_without_nvml_reads_none_and_never_raises() -> None:
    broken = make_fake_pynvml(Scenario.model_validate({"failure": "driver-not-loaded"}))
    assert EnergyMeter(broken.module).read([UUID0]) == {UUID0: None}
    bare = types.ModuleType("pynvml")
    bare.nvmlInit = lambda: None  # type: ignore[attr-defined]  # bindings without the calls
    assert EnergyMeter(bare).read([UUID0]) == {UUID0: None}
    assert nvml_uuid(UUID0) == "GPU-" + UUID0 and nvml_uuid("MIG-x") == "MIG-x"


def test_the_probe_publishes_the_energy_of_its_gpus_since_it_first_saw_them(
    tmp_path: Path,
) -> None:
    nvml_clock = ManualClock(100.0)  # the counters ran before the probe: a baseline is needed
    fake = fake_nvml(nvml_clock)
    cuda = gpu_torch()
    cuda.devices[1].reserved = cuda.devices[1].max_reserved = 0  # GPU 1: not the run's
    writer = Probe(directory=tmp_path, torch_module=lambda: StandInTorch(cuda), nvml=fake.module)
    writer.publish()
    assert json.loads(writer.path.read_bytes())["run"]["energy_j"] == 0.0
    nvml_clock.advance(30.0)  # 400 W on GPU 0 for 30 s; GPU 1's 100 W is another process's
    writer.publish()
    assert json.loads(writer.path.read_bytes())["run"]["energy_j"] == pytest.approx(12_000.0)
    writer.stop()


# -- the end of the run ----------------------------------------------------------------------------


@pytest.fixture
def ledger(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """A stand-in ``hwdash.runs.recorder`` that keeps what the probe hands it."""
    records: list[dict[str, Any]] = []
    recorder = types.ModuleType("hwdash.runs.recorder")
    recorder.record_run = records.append  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "hwdash.runs.recorder", recorder)
    return records


def test_final_record_has_every_ledger_key(tmp_path: Path) -> None:
    clock, wall = Clock(10.0), Clock(1_764_120_000.0)
    nvml_clock = ManualClock(0.0)
    cuda = gpu_torch()
    writer = Probe(
        directory=tmp_path,
        torch_module=lambda: StandInTorch(cuda),
        plan="my-plan",
        clock=clock,
        wall_clock=wall,
        nvml=fake_nvml(nvml_clock).module,
    )
    writer.publish()
    writer.record_step(tokens=1000, samples=2)  # the first step: its tokens came before timing
    for _ in range(4):
        clock.now += 0.5
        writer.record_step(tokens=1000, samples=2)
    nvml_clock.advance(10.0)  # GPU 0: 3000 J, GPU 1: 1000 J
    cuda.devices[0].max_reserved = 36 * GIB
    writer.publish()
    wall.now += 3600.0
    record = writer.final_record("normal")
    assert list(record) == [*RECORD_KEYS, "world_size"]
    assert record["version"] == 1 and len(record["id"]) == 12
    assert record["pid"] == os.getpid() and record["exit"] == "normal"
    assert record["started"] == 1_764_120_000.0 and record["duration_s"] == 3600.0
    assert record["gpus"] == [
        {"uuid": "GPU-" + UUID0, "name": "NVIDIA A100-SXM4-80GB", "index": 0},
        {"uuid": "GPU-" + UUID1, "name": "NVIDIA A100-SXM4-80GB", "index": 1},
    ]
    assert (record["plan"], record["steps"], record["tokens"], record["samples"]) == (
        "my-plan", 5, 5000, 10,
    )  # fmt: skip
    assert record["tokens_per_s"] == pytest.approx(2000.0)  # 4000 tokens in 2 s of stepping
    assert record["energy_kwh"] == pytest.approx(4000 / 3.6e6)
    assert record["measured_peak_bytes"] == 36 * GIB
    assert record["measured_peak_allocated_bytes"] == 33 * GIB
    assert record["tokens_estimated"] is False
    for unknown in ("mfu", "cost_usd", "planned_peak_bytes", "peak_error", "model", "method"):
        assert record[unknown] is None
    writer.stop()


def test_exit_kinds() -> None:
    class OutOfMemoryError(RuntimeError):  # torch.OutOfMemoryError, matched by name
        pass

    class CudaOom(OutOfMemoryError):
        pass

    assert exit_kind(None, 0) == "normal"
    assert exit_kind(None, 2) == "oom"
    assert exit_kind(OutOfMemoryError, 0) == "oom" and exit_kind(CudaOom, 0) == "oom"
    assert exit_kind(ValueError, 0) == "error"


def test_stop_records_the_run_once_with_the_allocators_oom(
    tmp_path: Path, ledger: list[dict[str, Any]]
) -> None:
    writer = Probe(directory=tmp_path, torch_module=lambda: StandInTorch(gpu_torch(ooms=1)))
    writer.publish()
    writer.stop()
    writer.stop()
    assert [record["exit"] for record in ledger] == ["oom"]


def test_an_import_only_run_is_not_recorded(tmp_path: Path, ledger: list[dict[str, Any]]) -> None:
    Probe(directory=tmp_path, torch_module=lambda: None).stop()
    assert ledger == []
    stepped = Probe(directory=tmp_path, torch_module=lambda: None)
    stepped.record_step(tokens=1)
    stepped.stop()
    assert [record["exit"] for record in ledger] == ["normal"]


def test_a_failing_recorder_never_reaches_the_training_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    recorder = types.ModuleType("hwdash.runs.recorder")

    def refuse(raw: dict[str, Any]) -> None:
        raise PermissionError("the ledger belongs to another user")

    recorder.record_run = refuse  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "hwdash.runs.recorder", recorder)
    writer = Probe(directory=tmp_path, torch_module=lambda: None)
    writer.record_step()
    writer.stop()
    assert "not recorded" in capsys.readouterr().err


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_never_records(tmp_path: Path, ledger: list[dict[str, Any]]) -> None:
    writer = Probe(30, tmp_path, torch_module=lambda: None)
    writer.record_step(tokens=10)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a DataLoader worker that stops the probe (atexit does) and says what it did
        writer.stop(timeout=0)
        os.write(write, str(len(ledger)).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 16) == b"0"
    writer.stop()
    assert len(ledger) == 1


def _run(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(filter(None, [SRC, str(tmp_path), os.environ.get("PYTHONPATH")]))
    environ = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path), PYTHONPATH=path, **env)
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=environ, timeout=60
    )


RECORDER = """
import json, os
def record_run(raw):
    with open(os.environ["TEST_RECORDS"], "a") as out:
        out.write(json.dumps(raw) + "\\n")
"""


@pytest.mark.parametrize(
    "body, kind",
    [
        ("hwdash.probe.step(tokens=8)", "normal"),
        ("hwdash.probe.step(tokens=8)\nraise ValueError('bad batch')", "error"),
        (
            "hwdash.probe.step(tokens=8)\n"
            "class OutOfMemoryError(RuntimeError): pass\n"
            "raise OutOfMemoryError('CUDA out of memory')",
            "oom",
        ),
        ("pass", None),  # imported, never stepped, never used CUDA: no record
    ],
)
def test_the_exit_kind_of_a_real_process(body: str, kind: str | None, tmp_path: Path) -> None:
    package = tmp_path / "hwdash_test_runs"
    package.mkdir()
    # Stand in for the lead's hwdash.runs.recorder: the probe imports it by name at the end.
    (tmp_path / "sitecustomize.py").write_text(
        "import sys, types\n"
        "module = types.ModuleType('hwdash.runs.recorder')\n"
        f"exec({RECORDER!r}, module.__dict__)\n"
        "sys.modules['hwdash.runs.recorder'] = module\n"
    )
    records = tmp_path / "records.jsonl"
    script = tmp_path / "train.py"
    script.write_text("import hwdash.probe\n" + body + "\n")
    done = _run(
        ["-m", "hwdash.probe", "--plan", "my-plan", str(script), "--lr", "1e-4"],
        tmp_path,
        TEST_RECORDS=str(records),
    )
    lines = records.read_text().splitlines() if records.exists() else []
    if kind is None:
        assert done.returncode == 0 and lines == []
        return
    (record,) = (json.loads(line) for line in lines)
    assert record["exit"] == kind and record["plan"] == "my-plan"
    assert record["command"].endswith(f"{script} --lr 1e-4")
    assert record["tokens"] == 8 and record["steps"] == 1
    assert (done.returncode == 0) == (kind == "normal")
    if kind != "normal":
        assert "Traceback" in done.stderr  # the previous excepthook still prints it


@pytest.mark.parametrize(
    "args, message",
    [
        (["--plan"], "--plan: a value is needed"),
        (["--plan", "", "x.py"], "--plan: '' is neither a saved plan's name nor a plan file"),
        (["--plan", "plans/missing.json", "x.py"], "no such plan file"),
        (["--plan=-m", "x.py"], "--plan: '-m' is neither"),
    ],
)
def test_python_m_hwdash_probe_refuses_a_bad_plan(
    args: list[str], message: str, tmp_path: Path
) -> None:
    done = _run(["-m", "hwdash.probe", *args], tmp_path)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


def test_the_probe_imports_neither_pydantic_nor_textual(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import sys
        import hwdash.probe, hwdash.probe.progress, hwdash.probe.record
        import hwdash.telemetry.nvml_energy
        import time
        hwdash.probe.start(0.05).record_step(tokens=3)
        time.sleep(0.2)  # a few publishing rounds
        bad = {"pydantic", "textual", "rich"} & {name.split(".")[0] for name in sys.modules}
        assert not bad, bad
        # Only the end of the run reads the plan machinery (the ledger record's MFU and cost).
        hwdash.probe.stop()
        """
    )
    done = _run(["-c", code], tmp_path)
    assert done.returncode == 0, done.stderr


def test_a_round_stuck_in_the_driver_does_not_hang_the_record(
    tmp_path: Path, ledger: list[dict[str, Any]]
) -> None:
    writer = Probe(directory=tmp_path, torch_module=lambda: None)
    writer.record_step(tokens=1)
    writer._publishing.acquire()  # the publishing thread, blocked in an NVML call
    stopping = threading.Thread(target=writer.stop, kwargs={"timeout": 0}, daemon=True)
    stopping.start()
    stopping.join(10)
    finished = not stopping.is_alive()
    writer._publishing.release()
    assert finished, "stop() waited for the stuck round"
    assert [record["steps"] for record in ledger] == [1]
