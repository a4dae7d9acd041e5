"""The SSH source without a server: the two parsers on hostile input, the host checks, the ssh
command line, the reader's line cap, and the stale/unreachable marking on a controlled clock."""

from __future__ import annotations

import json
import stat
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwdash.cli import main
from hwdash.errors import UsageError
from hwdash.telemetry.snapshot_json import snapshot_to_dict
from hwdash.telemetry.ssh_source import (
    APP_PREFIX,
    APPS_BEGIN,
    APPS_END,
    MAX_LINE_BYTES,
    HostStream,
    LineError,
    SshSampler,
    check_host,
    parse_app_line,
    parse_gpu_line,
    parse_hosts,
    parse_snapshot_line,
    remote_command,
)
from hwdash.telemetry.types import GpuSample, NvmlStatus, ProcessSample, Snapshot
from hwdash.ui.widgets.monitor_cluster import cluster_lines

MIB = 2**20


# -- nvidia-smi's CSV -----------------------------------------------------------------------------


def test_a_gpu_line_is_read_in_mib_percent_celsius_and_watts() -> None:
    line = parse_gpu_line("3, GPU-1234, NVIDIA H100 80GB HBM3, 40960, 81559, 35, 51, 210.5")
    assert (line.index, line.uuid, line.name) == (3, "GPU-1234", "NVIDIA H100 80GB HBM3")
    assert (line.used_bytes, line.total_bytes) == (40960 * MIB, 81559 * MIB)
    assert (line.utilization_gpu, line.temperature_c, line.power_w) == (35.0, 51.0, 210.5)


def test_not_available_readings_are_none_not_zero() -> None:
    line = parse_gpu_line("0, GPU-x, Tesla T4, [N/A], 15360, [Not Supported], nan, inf")
    assert line.used_bytes is None and line.total_bytes == 15360 * MIB
    assert line.utilization_gpu is None and line.temperature_c is None and line.power_w is None


@pytest.mark.parametrize(
    "line",
    [
        "",
        "0, GPU-x, name, 1, 2, 3, 4",  # a field short
        "0, GPU-x, A, B, 1, 2, 3, 4, 5",  # a comma in the name: one field too many
        "-1, GPU-x, name, 1, 2, 3, 4, 5",
        "1e3, GPU-x, name, 1, 2, 3, 4, 5",
        "99999, GPU-x, name, 1, 2, 3, 4, 5",
        "\u00b2, GPU-x, name, 1, 2, 3, 4, 5",  # a digit to str.isdigit, not to int()
        "0, GPU-x, name, -5, 2, 3, 4, 5",
        "0, GPU-x, name, 9, 2, 3, 4, 5",  # more used than the GPU has
        "0, GPU-x, name, 1, 0, 3, 4, 5",
        "$(touch /tmp/pwned), `id`, ;rm -rf /, 1, 2, 3, 4, 5",
    ],
)
def test_a_line_that_is_not_a_gpu_is_refused(line: str) -> None:
    with pytest.raises(LineError):
        parse_gpu_line(line)


def test_escape_sequences_and_markup_in_a_name_stay_text() -> None:
    line = parse_gpu_line("0, GPU-\x07, [bold red]X[/]\x1b]0;title\x07\x1b[2J, 1, 2, 3, 4, 5")
    assert line.name == "[bold red]X[/]\ufffd]0;title\ufffd\ufffd[2J"
    assert line.uuid == "GPU-\ufffd"
    assert "\x1b" not in (line.name or "")


def test_an_app_line_keeps_commas_in_the_process_name() -> None:
    app = parse_app_line("GPU-1, 4242, 1024, python train.py --a=1,2,3")
    assert (app.gpu_uuid, app.pid, app.used_bytes) == ("GPU-1", 4242, 1024 * MIB)
    assert app.name == "python train.py --a=1,2,3"


@pytest.mark.parametrize(
    "line",
    ["GPU-1, 0, 5, x", "GPU-1, -4, 5, x", "GPU-1, 12", "GPU-1, 1, -5, x", "GPU-1, \u00b2, 5, x"],
)
def test_a_bad_app_line_is_refused(line: str) -> None:
    with pytest.raises(LineError):
        parse_app_line(line)


# -- hwdash monitor --json ------------------------------------------------------------------------


def _snapshot_line(name: str = "NVIDIA A100", command: str = "python train.py") -> str:
    gpu = GpuSample(
        index=1,
        name=name,
        uuid="GPU-a",
        total_bytes=80 * 2**30,
        used_bytes=60 * 2**30,
        free_bytes=20 * 2**30,
        processes=(
            ProcessSample(pid=7, gpu_index=1, kind="compute", used_bytes=2**30, cmdline=command),
        ),
    )
    snapshot = Snapshot(timestamp=1.0, nvml=NvmlStatus(available=True), gpus=(gpu,))
    return json.dumps(snapshot_to_dict(snapshot, []))


def test_a_snapshot_line_gives_the_remote_gpus_by_their_own_number() -> None:
    (gpu,), error = parse_snapshot_line(_snapshot_line())
    assert error is None
    assert (gpu.index, gpu.name, gpu.free_bytes) == (1, "NVIDIA A100", 20 * 2**30)
    assert gpu.processes[0].cmdline == "python train.py"


def test_a_snapshot_line_with_escapes_keeps_them_as_text() -> None:
    (gpu,), _error = parse_snapshot_line(_snapshot_line("\x1b[31m[red]A", "rm\r\x1b[2K -rf"))
    assert gpu.name == "\ufffd[31m[red]A"
    assert gpu.processes[0].cmdline == "rm\ufffd\ufffd[2K -rf"


@pytest.mark.parametrize(
    "line",
    [
        '{"gpus": [], "timestamp": NaN}',
        '{"timestamp": 1, "gpus": [{"index": 1e999}]}',
        '{"timestamp": 1, "gpus": [{"index": -3}]}',
        "{" * 5000,
        '{"timestamp": 1, "gpus": [' + "[" * 100 + "]" * 100 + "]}",
        '{"no": "gpus"}',
        "{not json",
    ],
)
def test_a_bad_snapshot_line_is_refused(line: str) -> None:
    with pytest.raises(LineError):
        parse_snapshot_line(line)


# -- hosts ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host", ["-oProxyCommand=touch /tmp/x", "-F/etc/passwd", "", "a b", "node\x1b[2J", "x\n-oA"]
)
def test_hostile_host_names_are_refused(host: str) -> None:
    with pytest.raises(UsageError, match="--ssh"):
        check_host(host)


def test_hosts_from_a_list_or_a_file(tmp_path: Path) -> None:
    assert parse_hosts("node-a,me@node-b,node-a") == ("node-a", "me@node-b")
    listing = tmp_path / "hosts"
    listing.write_text("# the fleet\nnode-a\n\n  node-b  # the new one\n")
    assert parse_hosts(f"@{listing}") == ("node-a", "node-b")
    listing.write_text("node-a\n-oProxyCommand=sh\n")
    with pytest.raises(UsageError, match="starts with '-'"):
        parse_hosts(f"@{listing}")
    with pytest.raises(UsageError, match="cannot read"):
        parse_hosts(f"@{tmp_path / 'missing'}")
    listing.write_text("# nothing\n")
    with pytest.raises(UsageError, match="names no host"):
        parse_hosts(f"@{listing}")


def test_the_cli_refuses_a_hostile_host_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["monitor", "--ssh=-oProxyCommand=touch /tmp/pwned", "--once"]) == 2
    err = capsys.readouterr().err
    assert "--ssh" in err and "starts with '-'" in err and "Traceback" not in err


def test_ssh_config_only_with_ssh(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["monitor", "--ssh-config", "/nonexistent", "--once", "--fake-nvml", "h100x8"]) == 2
    assert "--ssh-config: only applies with --ssh" in capsys.readouterr().err


# -- the ssh command line -------------------------------------------------------------------------


def test_the_ssh_command_line_is_an_argv_with_the_host_after_double_dash() -> None:
    sampler = SshSampler(["node-a"], interval_s=2, ssh=("ssh",), start=False)
    try:
        argv = sampler.argv("node-a")
        assert argv[0] == "ssh"
        end = argv.index("--")
        assert argv[end + 1] == "node-a" and argv[end + 2] == remote_command(2)
        assert len(argv) == end + 3
        options = set(argv[1:end])
        assert {"BatchMode=yes", "ConnectTimeout=10", "ControlMaster=auto"} <= options
        assert not any("StrictHostKeyChecking" in option for option in argv)
        (path,) = [option for option in argv if option.startswith("ControlPath=")]
        folder = Path(path.removeprefix("ControlPath=")).parent
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    finally:
        sampler.close()
    assert not folder.exists()


def test_the_remote_command_prefers_hwdash_then_nvidia_smi() -> None:
    command = remote_command(0.5)
    assert command.index("hwdash monitor --json --interval 0.5") < command.index("nvidia-smi")
    assert "-l 1" in command  # nvidia-smi loops in whole seconds
    assert "--query-compute-apps=gpu_uuid,pid,used_memory,process_name" in command


# -- the reader -----------------------------------------------------------------------------------


def _fake_ssh(tmp_path: Path, body: str) -> tuple[str, ...]:
    script = tmp_path / "fake_ssh.py"
    script.write_text(body)
    return (sys.executable, str(script))


def test_a_huge_line_is_cut_and_the_next_line_is_still_read(tmp_path: Path) -> None:
    ssh = _fake_ssh(
        tmp_path,
        "import sys, time\n"
        f"sys.stdout.write('x' * {MAX_LINE_BYTES + 10})\n"
        "sys.stdout.write('\\n0, GPU-a, A100, 100, 1000, 5, 40, 100\\n')\n"
        "sys.stdout.write('garbage\\n')\n"
        "sys.stdout.flush()\n"
        "time.sleep(30)\n",
    )
    sampler = SshSampler(["node-a"], interval_s=1, ssh=ssh, first_wait_s=20)
    try:
        snapshot = sampler.sample()
        (gpu,) = snapshot.gpus
        assert (gpu.host, gpu.host_gpu, gpu.used_bytes) == ("node-a", 0, 100 * MIB)
        assert "node-a: 2 line(s) of its output could not be read and were skipped" in (
            snapshot.errors
        )
    finally:
        sampler.close()


def test_a_host_that_cannot_be_reached_says_why(tmp_path: Path) -> None:
    ssh = _fake_ssh(
        tmp_path,
        "import sys\n"
        "sys.stderr.write('ssh: connect to host node-b port 22: Connection refused\\n')\n"
        "sys.exit(255)\n",
    )
    sampler = SshSampler(["node-b"], interval_s=1, ssh=ssh, first_wait_s=20)
    try:
        snapshot = sampler.sample()
    finally:
        sampler.close()
    assert snapshot.gpus == () and not snapshot.nvml.available
    assert snapshot.errors == (
        "node-b: unreachable: ssh: connect to host node-b port 22: Connection refused",
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _offline_sampler(clock: Clock) -> tuple[SshSampler, HostStream, HostStream]:
    sampler = SshSampler(
        ["node-a", "node-b"], interval_s=2, ssh=("ssh",), clock=clock, start=False, first_wait_s=0
    )
    a, b = sampler.streams["node-a"], sampler.streams["node-b"]
    for stream in (a, b):
        stream.connected = True
    return sampler, a, b


def test_a_host_goes_stale_then_unreachable_and_keeps_its_last_values() -> None:
    clock = Clock()
    sampler, a, b = _offline_sampler(clock)
    try:
        a.feed("0, GPU-a0, A100, 100, 1000, 5, 40, 100")
        b.feed("0, GPU-b0, H100, 950, 1000, 5, 40, 100")
        b.feed("1, GPU-b1, H100, 10, 1000, 5, 40, 100")
        snapshot = sampler.sample()
        assert [(gpu.index, gpu.host, gpu.host_gpu) for gpu in snapshot.gpus] == [
            (0, "node-a", 0),
            (1, "node-b", 0),
            (2, "node-b", 1),
        ]
        assert all(gpu.host_stale is None for gpu in snapshot.gpus) and not snapshot.errors
        clock.now += 3.5  # past 1.5 intervals of 2 s; node-a answers again
        a.feed("0, GPU-a0, A100, 200, 1000, 5, 40, 100")
        snapshot = sampler.sample()
        notes = {gpu.host_gpu: gpu.host_stale for gpu in snapshot.gpus if gpu.host == "node-b"}
        assert notes == {
            0: "stale: no data from node-b for 4 s (last values shown)",
            1: "stale: no data from node-b for 4 s (last values shown)",
        }
        assert snapshot.gpus[0].host_stale is None and snapshot.gpus[0].used_bytes == 200 * MIB
        clock.now += 2.5  # 6 s: 3 intervals
        a.feed("0, GPU-a0, A100, 200, 1000, 5, 40, 100")
        snapshot = sampler.sample()
        stale_b = [gpu for gpu in snapshot.gpus if gpu.host == "node-b"]
        assert all((gpu.host_stale or "").startswith("unreachable: ") for gpu in stale_b)
        assert stale_b[0].used_bytes == 950 * MIB  # the last values stay
        assert snapshot.errors == (
            "node-b: unreachable: no data for 6 s (its last values are shown, marked stale)",
        )
        lines = cluster_lines(snapshot.gpus, 0.9)
        assert [line.text[0] for line in lines if line.text[0]] == [
            "node-b (unreachable)",
            "node-a",
        ]
    finally:
        sampler.close()


def test_a_lost_connection_is_unreachable_at_once() -> None:
    clock = Clock()
    sampler, a, _b = _offline_sampler(clock)
    try:
        a.feed("0, GPU-a0, A100, 100, 1000, 5, 40, 100")
        a.connected = False
        a.error = "Connection closed by 127.0.0.1 port 2222"
        snapshot = sampler.sample()
        assert (snapshot.gpus[0].host_stale or "").startswith("unreachable: no data from node-a")
        assert snapshot.errors[0] == (
            "node-a: unreachable: no data for 0 s; Connection closed by 127.0.0.1 port 2222 "
            "(its last values are shown, marked stale)"
        )
    finally:
        sampler.close()


def test_processes_join_their_gpu_by_uuid_and_a_list_replaces_the_last() -> None:
    clock = Clock()
    sampler, a, _b = _offline_sampler(clock)
    try:
        a.feed("0, GPU-a0, A100, 100, 1000, 5, 40, 100")
        a.feed("1, GPU-a1, A100, 100, 1000, 5, 40, 100")
        for line in (APPS_BEGIN, f"{APP_PREFIX}GPU-a1, 77, 64, python x.py", APPS_END):
            a.feed(line)
        gpus = sampler.sample().gpus
        assert gpus[0].processes == ()
        (process,) = gpus[1].processes
        assert (process.pid, process.host, process.host_gpu, process.gpu_index) == (
            77,
            "node-a",
            1,
            1,
        )
        assert not process.visible and not process.verifiable
        a.feed(APPS_BEGIN)
        a.feed(f"{APP_PREFIX}GPU-a1, 78, 64, python y.py")  # not yet complete: the old list stays
        assert [p.pid for p in sampler.sample().gpus[1].processes] == [77]
        a.feed(APPS_END)
        assert [p.pid for p in sampler.sample().gpus[1].processes] == [78]
    finally:
        sampler.close()


def test_a_hwdash_host_replaces_its_gpus_with_each_snapshot() -> None:
    clock = Clock()
    sampler, a, _b = _offline_sampler(clock)
    try:
        a.feed(_snapshot_line())
        (gpu,) = sampler.sample().gpus
        assert (gpu.host, gpu.host_gpu, gpu.index) == ("node-a", 1, 0)
        assert gpu.processes[0].host == "node-a" and gpu.processes[0].gpu_index == 0
        assert a.mode == "hwdash"
    finally:
        sampler.close()


def _local_ssh(tmp_path: Path, path: str) -> tuple[str, ...]:
    """A stand-in ssh that runs the remote command here with ``path`` as the PATH."""
    return _fake_ssh(
        tmp_path,
        "import os, sys\n"
        "if '-O' in sys.argv:\n"
        "    sys.exit(0)\n"
        f"os.execve('/bin/sh', ['sh', '-c', sys.argv[-1]], {{'PATH': {path!r}}})\n",
    )


def test_the_remote_command_reads_a_stand_in_nvidia_smi_and_its_processes(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = Path(__file__).resolve().parents[1] / "data" / "ssh" / "nvidia-smi"
    (bin_dir / "nvidia-smi").write_bytes(stand_in.read_bytes())
    (bin_dir / "nvidia-smi").chmod(0o755)
    (bin_dir / "gpus.csv").write_text(
        "0, GPU-0, H100, 1000, 81559, 10, 40, 100\n1, GPU-1, H100, 80000, 81559, 99, 70, 600\n"
    )
    (bin_dir / "apps.csv").write_text("GPU-1, 31337, 79000, python $(rm -rf ~) train.py\n")
    ssh = _local_ssh(tmp_path, f"{bin_dir}:/usr/bin:/bin")
    sampler = SshSampler(["node-a"], interval_s=1, ssh=ssh, first_wait_s=20)
    try:
        snapshot = sampler.sample()
        deadline = 40
        while not any(gpu.processes for gpu in snapshot.gpus) and deadline:
            deadline -= 1
            time.sleep(0.1)
            snapshot = sampler.sample()
    finally:
        sampler.close()
    assert [(gpu.host_gpu, gpu.used_bytes) for gpu in snapshot.gpus] == [
        (0, 1000 * MIB),
        (1, 80000 * MIB),
    ]
    (process,) = snapshot.gpus[1].processes
    assert (process.pid, process.cmdline) == (31337, "python $(rm -rf ~) train.py")
    assert snapshot.errors == ()


def test_a_host_without_hwdash_or_nvidia_smi_says_so(tmp_path: Path) -> None:
    ssh = _local_ssh(tmp_path, str(tmp_path / "empty"))
    sampler = SshSampler(["node-a"], interval_s=1, ssh=ssh, first_wait_s=20)
    try:
        snapshot = sampler.sample()
    finally:
        sampler.close()
    assert snapshot.errors == ("node-a: unreachable: neither hwdash nor nvidia-smi is on the PATH",)


def test_a_streaming_line_names_a_remote_gpu_by_host_and_number() -> None:
    from hwdash.commands.monitor_print import gpu_line

    remote = GpuSample(index=4, name="H100", uuid=None, host="node-a", host_gpu=1)
    assert gpu_line(remote, "07:00:00").startswith("07:00:00 node-a:1 H100 ")
    local = GpuSample(index=4, name="H100", uuid=None)
    assert gpu_line(local, "07:00:00").startswith("07:00:00 gpu4 H100 ")


def test_a_hwdash_host_without_gpus_says_why() -> None:
    clock = Clock()
    sampler, a, _b = _offline_sampler(clock)
    empty = Snapshot(
        timestamp=1.0, nvml=NvmlStatus(available=False, error="no NVIDIA driver\x1b[2J found")
    )
    try:
        a.feed(json.dumps(snapshot_to_dict(empty, [])))
        snapshot = sampler.sample()
        assert snapshot.errors[0] == "node-a: no GPUs (no NVIDIA driver\ufffd[2J found)"
    finally:
        sampler.close()


def test_nvidia_smi_hosts_are_held_to_whole_second_loops() -> None:
    """Below 1 s nvidia-smi still answers once a second (its -l takes whole seconds): a 0.9 s old
    reading is fresh at --interval 0.5, and stale after 1.5 s."""
    clock = Clock()
    sampler = SshSampler(["node-a"], interval_s=0.5, ssh=("ssh",), clock=clock, start=False)
    stream = sampler.streams["node-a"]
    stream.connected = True
    try:
        stream.feed("0, GPU-a0, A100, 100, 1000, 5, 40, 100")
        clock.now += 0.9
        assert sampler.sample().gpus[0].host_stale is None
        clock.now += 0.7
        assert (sampler.sample().gpus[0].host_stale or "").startswith("stale: ")
    finally:
        sampler.close()


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=30,
)
_snapshot_like = st.fixed_dictionaries(
    {"timestamp": st.floats() | st.integers(), "gpus": st.lists(_json_values, max_size=3)},
    optional={"nvml": _json_values},
)


@settings(max_examples=200, deadline=None)
@given(
    st.text(max_size=300)
    | st.lists(st.text(max_size=40), min_size=8, max_size=8).map(", ".join)
    | _snapshot_like.map(lambda value: json.dumps(value, allow_nan=True))
)
def test_any_remote_line_is_a_reading_or_a_counted_refusal(line: str) -> None:
    """Whatever a remote prints: each parser gives a reading whose words hold no control
    character, or refuses it with LineError; a host's stream counts it and goes on."""
    for parse in (parse_gpu_line, parse_app_line, parse_snapshot_line):
        try:
            parsed = parse(line)
        except LineError:
            continue
        text = json.dumps(parsed, default=lambda value: getattr(value, "__dict__", str(value)))
        decoded = json.loads(text)
        stack = [decoded]
        while stack:
            value = stack.pop()
            if isinstance(value, str):
                assert value.isprintable(), value
            elif isinstance(value, dict):
                stack.extend(value.values())
            elif isinstance(value, list):
                stack.extend(value)
    stream = HostStream("node-a")
    stream.feed(line)  # never raises
    stream.readings()
