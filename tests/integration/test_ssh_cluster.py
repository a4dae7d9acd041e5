"""Two real OpenSSH servers on loopback, read by ``hwdash --ssh`` as two hosts.

Debian's ``openssh-server`` provides ``/usr/sbin/sshd`` (``.ci/run`` installs it); where it is missing
or cannot start here, the test is skipped and says why. Each "host" is its own sshd on a free port,
with a temporary host key and an authorized key for the current user; the client reads a temporary
config (``ssh -F``: the ports, the key, a known-hosts file in the temporary directory). Host
``gpu-a`` has hwdash on its PATH (a wrapper running this repository's ``hwdash`` on a fake scenario),
``gpu-b`` a stand-in ``nvidia-smi`` (``tests/data/ssh/nvidia-smi``).
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from hwdash.core.live.alerts import AlertEngine, AlertRule
from hwdash.telemetry.ssh_source import SshSampler

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
STAND_IN = ROOT / "tests" / "data" / "ssh" / "nvidia-smi"
SSHD = "/usr/sbin/sshd"
SSH = shutil.which("ssh")
KEYGEN = shutil.which("ssh-keygen")

pytestmark = pytest.mark.skipif(
    not (os.path.exists(SSHD) and SSH and KEYGEN),
    reason="no /usr/sbin/sshd or ssh client (Debian's `openssh-server`; .ci/run installs it)",
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def fake_scenario(path: Path) -> Path:
    """One 80 GiB GPU at 95% (over the 90% alert threshold) and one at 20%, steady."""
    rows = []
    for index, used in enumerate((77824, 16384)):
        rows.append(
            f"""
[[gpus]]
name = "NVIDIA A100-SXM4-80GB"
uuid = "GPU-00000000-0000-0000-0000-00000000000{index}"
memory_total_mib = 81920
memory_reserved_mib = 0
used_mib = {used}
utilization = 90
temperature_c = 60
power_w = 300
"""
        )
    path.write_text('description = "ssh test host"\n' + "".join(rows))
    return path


@dataclass
class Hosts:
    config: Path
    servers: dict[str, subprocess.Popen[bytes]]


def start_sshd(home: Path, port: int, bin_dir: Path, keys: Path) -> subprocess.Popen[bytes]:
    config = home / "sshd_config"
    config.write_text(
        f"""Port {port}
ListenAddress 127.0.0.1
HostKey {keys / "host_key"}
PidFile none
AuthorizedKeysFile {keys / "authorized_keys"}
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
SetEnv PATH={bin_dir}:/usr/local/bin:/usr/bin:/bin
"""
    )
    check = subprocess.run([SSHD, "-t", "-f", str(config)], capture_output=True, text=True)
    if check.returncode != 0:
        pytest.skip(f"sshd cannot run here: {check.stderr.strip()}")
    return subprocess.Popen(
        [SSHD, "-D", "-e", "-f", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=(home / "sshd.log").open("wb"),
    )


def listening_sshd(home: Path, bin_dir: Path, keys: Path) -> tuple[subprocess.Popen[bytes], int]:
    """An sshd listening on a probed free port; (the server, its port).

    The port is probed free, then bound by sshd a moment later; another process on a shared
    machine can take it in between, and sshd exits. Such a start is retried on a new port (three
    tries); a server that never listens fails the test with its own log.
    """
    log = home / "sshd.log"
    for _attempt in range(3):
        port = free_port()
        server = start_sshd(home, port, bin_dir, keys)
        deadline = time.monotonic() + 30
        while server.poll() is None and time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    return server, port
            time.sleep(0.1)
        kill_tree(server)
    raise AssertionError(
        f"sshd did not listen after three tries: {log.read_text(errors='replace')}"
    )


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """The server and its connections' processes (sshd starts each in a session of its own)."""
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    proc.kill()
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    proc.wait(timeout=5)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    if os.geteuid() == 0 and not os.path.isdir("/run/sshd"):
        # sshd's privilege separation directory (systemd's tmpfiles makes it on a booted system).
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    tmp = tmp_path_factory.mktemp("ssh")
    keys = tmp / "keys"
    keys.mkdir()
    for name in ("host_key", "id_ed25519"):
        subprocess.run(
            [KEYGEN, "-q", "-t", "ed25519", "-N", "", "-f", str(keys / name)], check=True
        )
    (keys / "authorized_keys").write_text((keys / "id_ed25519.pub").read_text())
    state = tmp / "state"
    state.mkdir()
    scenario = fake_scenario(tmp / "scenario.toml")
    servers: dict[str, subprocess.Popen[bytes]] = {}
    client = ""
    for alias in ("gpu-a", "gpu-b"):
        home = tmp / alias
        bin_dir = home / "bin"
        bin_dir.mkdir(parents=True)
        if alias == "gpu-a":
            wrapper = bin_dir / "hwdash"
            wrapper.write_text(
                "#!/bin/sh\n"
                f"PYTHONPATH={SRC} HWDASH_FAKE_NVML={scenario} XDG_STATE_HOME={state} "
                f'exec {sys.executable} -m hwdash "$@"\n'
            )
            wrapper.chmod(0o755)
        else:
            shutil.copy(STAND_IN, bin_dir / "nvidia-smi")
            (bin_dir / "gpus.csv").write_text(
                "0, GPU-b0, NVIDIA H100 80GB HBM3, 40960, 81559, 35, 51, 210.5\n"
                "1, GPU-b1, [bold red]H100[/] \x1b[31mred, 1024, 81559, [N/A], 40, [N/A]\n"
                "this line is not a GPU\n"
            )
            (bin_dir / "apps.csv").write_text("GPU-b0, 4242, 40000, /usr/bin/python3 train.py\n")
        servers[alias], port = listening_sshd(home, bin_dir, keys)
        client += f"Host {alias}\n  HostName 127.0.0.1\n  Port {port}\n"
    client += (
        f"Host *\n  User {getpass.getuser()}\n  IdentityFile {keys / 'id_ed25519'}\n"
        f"  IdentitiesOnly yes\n  UserKnownHostsFile {tmp / 'known_hosts'}\n"
        # Only this test's config turns the check off: its host keys are made a moment ago.
        "  StrictHostKeyChecking no\n  LogLevel ERROR\n"
    )
    config = tmp / "ssh_config"
    config.write_text(client)
    try:
        yield Hosts(config, servers)
    finally:
        for server in servers.values():
            if server.poll() is None:
                kill_tree(server)


def test_monitor_once_json_shows_both_hosts(hosts: Hosts, tmp_path: Path) -> None:
    """``hwdash monitor --ssh gpu-a,gpu-b --once --json``: both hosts' GPUs, the alert on gpu-a's
    full GPU only, the stand-in's bad line counted and its hostile name kept as text."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hwdash",
            "monitor",
            "--ssh",
            "gpu-a,gpu-b",
            "--ssh-config",
            str(hosts.config),
            "--interval",
            "1",
            "--once",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(SRC), "XDG_STATE_HOME": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    placed = {(gpu["host"], gpu["host_gpu"]): gpu for gpu in data["gpus"]}
    assert set(placed) == {("gpu-a", 0), ("gpu-a", 1), ("gpu-b", 0), ("gpu-b", 1)}
    assert data["nvml"]["source"] == "SSH gpu-a, gpu-b"
    alerted = {key for key, gpu in placed.items() if gpu["state"] == "alert"}
    assert alerted == {("gpu-a", 0)}
    assert placed[("gpu-b", 0)]["memory_used_bytes"] == 40960 * 2**20
    assert placed[("gpu-b", 1)]["name"] == "[bold red]H100[/] \ufffd[31mred"
    assert placed[("gpu-b", 1)]["power_w"] is None
    (process,) = placed[("gpu-b", 0)]["processes"]
    assert (process["pid"], process["host"]) == (4242, "gpu-b")
    assert any("gpu-b: 1 line(s)" in error for error in data["errors"])


def test_host_whose_sshd_is_killed_is_unreachable_within_three_intervals(hosts: Hosts) -> None:
    interval = 1.0
    sampler = SshSampler(["gpu-a", "gpu-b"], interval_s=interval, config=hosts.config)
    engine = AlertEngine(AlertRule(threshold=0.9))
    try:
        snapshot = sampler.sample()  # waits for both hosts' first readings
        deadline = time.monotonic() + 10
        while any(gpu.host_stale for gpu in snapshot.gpus) and time.monotonic() < deadline:
            time.sleep(0.2)  # a loaded machine: a host's second line came late
            snapshot = sampler.sample()
        engine.update(snapshot)
        by_host = {(gpu.host, gpu.host_gpu): gpu for gpu in snapshot.gpus}
        assert len(by_host) == 4 and all(gpu.host_stale is None for gpu in snapshot.gpus)
        alerted = {event.gpu_index for event in engine.active if event.kind == "raised"}
        assert {(gpu.host, gpu.host_gpu) for gpu in snapshot.gpus if gpu.index in alerted} == {
            ("gpu-a", 0)
        }
        kill_tree(hosts.servers["gpu-b"])
        killed_at = time.monotonic()
        while True:
            time.sleep(0.2)
            snapshot = sampler.sample()
            notes = {gpu.host_gpu: gpu.host_stale for gpu in snapshot.gpus if gpu.host == "gpu-b"}
            if all(note and note.startswith("unreachable") for note in notes.values()):
                break
            assert time.monotonic() - killed_at < 3 * interval, notes
        assert any(error.startswith("gpu-b: unreachable") for error in snapshot.errors)
        fresh = [gpu for gpu in snapshot.gpus if gpu.host == "gpu-a"]
        assert len(fresh) == 2 and all(gpu.host_stale is None for gpu in fresh)
    finally:
        sampler.close()
