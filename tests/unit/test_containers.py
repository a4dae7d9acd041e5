"""The container of a process, from its cgroup file."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hwdash.telemetry.containers import container_from_cgroup, container_of

ID = "3f2a1b9c0d4e" + "5" * 52
POD = "0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d"


@pytest.mark.parametrize(
    "cgroup, runtime, short, pod",
    [
        (f"0::/system.slice/docker-{ID}.scope\n", "docker", "docker:3f2a1b9c0d4e", None),
        (
            f"12:memory:/docker/{ID}\n11:cpu,cpuacct:/docker/{ID}\n1:name=systemd:/docker/{ID}\n",
            "docker",
            "docker:3f2a1b9c0d4e",
            None,
        ),
        (
            f"0::/system.slice/cri-containerd-{ID}.scope\n",
            "containerd",
            "containerd:3f2a1b9c0d4e",
            None,
        ),
        (f"0::/machine.slice/crio-{ID}.scope\n", "cri-o", "cri-o:3f2a1b9c0d4e", None),
        (f"0::/machine.slice/libpod-{ID}.scope/container\n", "podman", "podman:3f2a1b9c0d4e", None),
        (f"4:devices:/kubepods/burstable/pod{POD}/{ID}\n", "kubernetes", "k8s:3f2a1b9c0d4e", POD),
        (
            "0::/kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{POD.replace('-', '_')}.slice/cri-containerd-{ID}.scope\n",
            "kubernetes",
            "k8s:3f2a1b9c0d4e",
            POD,
        ),
        ("0::/lxc.payload.trainer\n", "lxc", "lxc:trainer", None),
        ("3:cpu:/lxc/builder\n", "lxc", "lxc:builder", None),
    ],
)
def test_each_runtime_shape_is_recognised(
    cgroup: str, runtime: str, short: str, pod: str | None
) -> None:
    found = container_from_cgroup(cgroup)
    assert found is not None
    assert (found.runtime, found.short, found.pod) == (runtime, short, pod)


@pytest.mark.parametrize(
    "cgroup",
    [
        "0::/\n",  # a private cgroup namespace: nothing can be told
        "0::/user.slice/user-1000.slice/session-2.scope\n",
        "0::/init.scope\n",
        "1:name=systemd:/system.slice/ssh.service\n",
        "",
        "garbage without colons",
        "0::/docker/not-an-id\n",
    ],
)
def test_host_processes_and_unknowns_have_no_container(cgroup: str) -> None:
    assert container_from_cgroup(cgroup) is None


def test_the_file_is_read_from_proc_and_a_missing_one_is_none(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(f"0::/system.slice/docker-{ID}.scope\n")
    found = container_of(42, tmp_path)
    assert found is not None and found.short == "docker:3f2a1b9c0d4e"
    assert container_of(43, tmp_path) is None


@given(st.text())
def test_any_text_is_read_without_an_exception(text: str) -> None:
    container_from_cgroup(text)


def test_the_host_process_table_names_the_container_of_a_pid(tmp_path: Path) -> None:
    import os

    from hwdash.telemetry.host_sampler import PsutilProcessTable

    me = os.getpid()
    (tmp_path / str(me)).mkdir()
    (tmp_path / str(me) / "cgroup").write_text(f"0::/system.slice/docker-{ID}.scope\n")
    info = PsutilProcessTable(proc_root=str(tmp_path)).lookup({me})[me]
    assert info.visible and info.container == "docker:3f2a1b9c0d4e"
