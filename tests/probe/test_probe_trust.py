"""The monitor reads the probe folder as untrusted: it may be in the shared temporary folder, made
by another user, and the monitor often runs as root. Every bad file is skipped with one warning and
never stops the other files, the monitor or an exporter scrape."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hwdash.probe import Probe
from hwdash.telemetry.probes import MAX_PROBE_FILE_BYTES, ProbeDirectory

SRC = str(Path(__file__).resolve().parents[2] / "src")
UUID0 = "5a1c2e0b-7d3f-4c21-9a6e-000000000000"


def probe_text(pid: int, **fields: object) -> str:
    data: dict[str, object] = {
        "format": 1,
        "pid": pid,
        "written_at": time.time(),
        "interval_s": 1.0,
        "cuda": "ready",
        "step": None,
        "devices": [{"uuid": UUID0, "allocated_bytes": 1 << 30, "reserved_bytes": 2 << 30}],
    }
    data.update(fields)
    return json.dumps(data)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A probe folder as the writer makes it (0700, ours) holding one good file: this process's."""
    path = tmp_path / "hwdash" / "probes"
    path.mkdir(parents=True, mode=0o700)
    path.parent.chmod(0o700)
    (path / f"{os.getpid()}.json").write_text(probe_text(os.getpid()))
    return path


def other_pid() -> int:
    """A live process that is not this one (the test runner's parent)."""
    return os.getppid()


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "hwdash.telemetry.probes"]


HOSTILE_TEXTS = {
    "nan": lambda pid: probe_text(pid).replace('"interval_s": 1.0', '"interval_s": NaN'),
    "infinity": lambda pid: probe_text(pid).replace('"step": null', '"step": -Infinity'),
    "overflowing float": lambda pid: probe_text(pid, written_at=0).replace(
        '"written_at": 0', '"written_at": 1e999'
    ),
    "huge integer": lambda pid: probe_text(pid).replace('"step": null', '"step": ' + "9" * 5000),
    "deep nesting": lambda pid: probe_text(pid).replace('"step": null', '"x": ' + "[" * 100_000),
    "deep but closed": lambda pid: probe_text(pid, x=None).replace(
        '"x": null', '"x": ' + "[" * 50 + "]" * 50
    ),
    "not utf-8": lambda pid: probe_text(pid).replace('"ready"', '"\udcff"'),
}


@pytest.mark.parametrize("devices", [5, "GPU-0", {"uuid": "x"}, True])
def test_devices_that_are_not_a_list_are_no_devices(folder: Path, devices: object) -> None:
    # Found by the fuzz test: `for item in 5` raised TypeError and ended the reader.
    pid = other_pid()
    (folder / f"{pid}.json").write_text(probe_text(pid, devices=devices))
    readings = ProbeDirectory(folder).read()
    assert set(readings) == {os.getpid(), pid}
    assert readings[pid].devices == ()


@pytest.mark.parametrize("kind", sorted(HOSTILE_TEXTS))
def test_a_hostile_number_or_nesting_skips_that_file_only_with_one_warning(
    folder: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    pid = other_pid()
    text = HOSTILE_TEXTS[kind](pid)
    (folder / f"{pid}.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    reader = ProbeDirectory(folder)
    with caplog.at_level(logging.WARNING, logger="hwdash.telemetry.probes"):
        for _round in range(3):
            assert set(reader.read()) == {os.getpid()}  # the good file still reads
    (warning,) = warnings_of(caplog)  # one warning for the bad file, not one per round
    assert f"{pid}.json skipped" in warning
    assert (folder / f"{pid}.json").exists()  # a live process's file is not ours to remove


def test_a_fifo_named_like_a_probe_file_does_not_block_the_reader(folder: Path) -> None:
    os.mkfifo(folder / f"{other_pid()}.json")
    script = textwrap.dedent(
        f"""
        import os, sys
        from pathlib import Path
        from hwdash.telemetry.probes import ProbeDirectory
        print(sorted(ProbeDirectory(Path({str(folder)!r})).read()))
        """
    )
    # Opening a FIFO for reading without O_NONBLOCK waits for a writer forever: a timeout, not a hang.
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": SRC},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"[{os.getpid()}]"
    assert "not a regular file" in done.stderr


def test_a_symlink_named_like_a_probe_file_is_not_followed(
    folder: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pid = other_pid()
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(probe_text(pid))  # a good probe file, but not in the folder
    (folder / f"{pid}.json").symlink_to(elsewhere)
    with caplog.at_level(logging.WARNING, logger="hwdash.telemetry.probes"):
        assert set(ProbeDirectory(folder).read()) == {os.getpid()}
    assert any(f"{pid}.json skipped" in message for message in warnings_of(caplog))


def test_an_oversized_probe_file_is_not_read(
    folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pid = other_pid()
    text = probe_text(pid)
    (folder / f"{pid}.json").write_text(text + " " * (MAX_PROBE_FILE_BYTES + 1 - len(text)))
    with caplog.at_level(logging.WARNING, logger="hwdash.telemetry.probes"):
        assert set(ProbeDirectory(folder).read()) == {os.getpid()}
    assert any("bytes (at most" in message for message in warnings_of(caplog))
    (folder / f"{pid}.json").write_text(text)  # the same reading at its own size is read
    assert set(ProbeDirectory(folder).read()) == {os.getpid(), pid}


def test_a_probe_file_naming_another_pid_is_skipped_with_a_warning(
    folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pid = other_pid()
    (folder / f"{pid}.json").write_text(probe_text(os.getpid()))  # claims to be this process
    with caplog.at_level(logging.WARNING, logger="hwdash.telemetry.probes"):
        readings = ProbeDirectory(folder).read()
    assert set(readings) == {os.getpid()}
    assert any(f"names PID {os.getpid()}, not {pid}" in m for m in warnings_of(caplog))


@pytest.mark.parametrize(
    "name, pid_text", [("0", "0"), ("1", "true"), ("99999999999999999999", "99999999999999999999")]
)
def test_a_pid_that_names_no_single_process_is_refused(
    folder: Path, name: str, pid_text: str
) -> None:
    # kill(0, 0) asks about the process group and succeeds; True is 1 (init) to Python; a PID past
    # a C int makes os.kill raise OverflowError. None of them is a probed process.
    (folder / f"{name}.json").write_text(probe_text(0).replace('"pid": 0', f'"pid": {pid_text}'))
    assert set(ProbeDirectory(folder).read()) == {os.getpid()}


def test_a_folder_of_another_user_is_not_read(
    folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stranger = os.geteuid() + 1  # as if someone else had made the folder first
    with caplog.at_level(logging.WARNING, logger="hwdash.telemetry.probes"):
        reader = ProbeDirectory(folder, owner_uid=stranger)
        assert reader.read() == {} and reader.read() == {}
    (warning,) = warnings_of(caplog)  # said once, not every round
    assert f"belongs to uid {os.geteuid()}, not {stranger}" in warning
    assert set(ProbeDirectory(folder, owner_uid=os.geteuid()).read()) == {os.getpid()}


@pytest.mark.parametrize("which, mode", [("probes", 0o777), ("probes", 0o720), ("parent", 0o703)])
def test_a_folder_others_may_write_to_is_not_read(
    folder: Path, which: str, mode: int, caplog: pytest.LogCaptureFixture
) -> None:
    target = folder if which == "probes" else folder.parent
    target.chmod(mode)
    with caplog.at_level(logging.WARNING, logger="hwdash.telemetry.probes"):
        assert ProbeDirectory(folder).read() == {}
    assert any("is writable by other users" in m for m in warnings_of(caplog))
    assert (folder / f"{os.getpid()}.json").exists()  # nothing removed from a folder not trusted


def test_a_symlinked_probe_folder_is_not_read(folder: Path, tmp_path: Path) -> None:
    link = tmp_path / "link-parent"
    link.mkdir(mode=0o700)
    (link / "probes").symlink_to(folder)
    assert ProbeDirectory(link / "probes").read() == {}
    assert set(ProbeDirectory(folder).read()) == {os.getpid()}


def test_no_folder_yet_is_no_readings_and_no_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="hwdash.telemetry.probes"):
        assert ProbeDirectory(tmp_path / "none" / "probes").read() == {}
    assert warnings_of(caplog) == []


def test_a_file_fixed_after_a_warning_reads_and_a_new_fault_warns_again(
    folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pid = other_pid()
    path = folder / f"{pid}.json"
    reader = ProbeDirectory(folder)
    with caplog.at_level(logging.WARNING, logger="hwdash.telemetry.probes"):
        path.write_text("NaN")
        reader.read()
        path.write_text(probe_text(pid))
        assert pid in reader.read()
        path.write_text("NaN")
        reader.read()
    assert len(warnings_of(caplog)) == 2


def test_the_writer_does_not_follow_a_link_planted_at_its_temporary_file(tmp_path: Path) -> None:
    folder = tmp_path / "probes"
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    probe = Probe(directory=folder, torch_module=lambda: None)
    probe.publish()  # makes the folder
    probe._temporary.symlink_to(victim)  # where the next write goes
    with pytest.raises(OSError):
        probe.publish()
    assert victim.read_text() == "precious"
    assert json.loads(probe.path.read_text())["pid"] == os.getpid()  # the last good file stays
