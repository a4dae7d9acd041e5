"""The container a process runs in, read from its cgroup (``/proc/<pid>/cgroup``, see cgroups(7)).

Container runtimes name each container's cgroup after its id, in shapes documented by each:

* Docker with the cgroupfs driver: ``/docker/<64 hex>``; with the systemd driver:
  ``/system.slice/docker-<64 hex>.scope`` (Docker docs, "Configure the cgroup driver");
* containerd (CRI): ``.../cri-containerd-<64 hex>.scope``; CRI-O: ``.../crio-<64 hex>.scope``;
* Podman: ``/machine.slice/libpod-<64 hex>.scope`` (maybe followed by ``/container``);
* Kubernetes pods: ``/kubepods/<qos>/pod<uid>/<64 hex>`` (cgroupfs) or
  ``/kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid with _>.slice/<runtime>-<64 hex>.scope``
  (systemd slice names replace ``-`` in the pod UID with ``_``);
* LXC: ``/lxc/<name>`` or ``/lxc.payload.<name>``.

cgroup v1 files have a line per hierarchy (``id:controllers:path``), v2 a single ``0::/path`` line (the
kernel's cgroup-v2 documentation). Inside a container with a private cgroup namespace the path reads
``/`` and nothing can be told: None, as for host processes (user sessions, system services).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

_HEX = r"[0-9a-f]{64}"
_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("docker", re.compile(rf"(?:^|/)docker-({_HEX})\.scope(?:/|$)")),
    ("docker", re.compile(rf"(?:^|/)docker/({_HEX})(?:/|$)")),
    ("containerd", re.compile(rf"(?:^|/)cri-containerd-({_HEX})\.scope(?:/|$)")),
    ("cri-o", re.compile(rf"(?:^|/)crio-({_HEX})\.scope(?:/|$)")),
    ("podman", re.compile(rf"(?:^|/)libpod-({_HEX})\.scope(?:/|$)")),
    # Kubernetes with the cgroupfs driver: the container's id is the last part after pod<uid>.
    ("containerd", re.compile(rf"(?:^|/)pod[0-9a-f_-]+/({_HEX})(?:/|$)")),
)
_LXC = re.compile(r"(?:^|/)(?:lxc/|lxc\.payload\.)([^/]+)")


@dataclass(frozen=True)
class ContainerRef:
    """A container a process belongs to."""

    runtime: str
    """``docker``, ``containerd``, ``cri-o``, ``podman``, ``kubernetes`` or ``lxc``."""
    id: str
    """The container's id as its cgroup names it (the name for LXC)."""
    pod: str | None = None
    """The Kubernetes pod UID when the path names one."""

    @property
    def short(self) -> str:
        """How the monitor shows it: ``docker:3f2a1b9c0d4e``, ``k8s:3f2a1b9c0d4e``, ``lxc:name``."""
        prefix = "k8s" if self.runtime == "kubernetes" else self.runtime
        ident = self.id[:12] if re.fullmatch(_HEX, self.id) else self.id
        return f"{prefix}:{ident}"


def _paths(text: str) -> list[str]:
    paths = []
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) == 3 and parts[2]:
            paths.append(parts[2])
    return paths


def container_from_cgroup(text: str) -> ContainerRef | None:
    """The container a ``/proc/<pid>/cgroup`` file names, or None (a host process, or unknown)."""
    for path in _paths(text):
        pod_match = _POD.search(path)
        for runtime, shape in _SHAPES:
            found = shape.search(path)
            if found:
                if pod_match is not None or "kubepods" in path:
                    pod = pod_match.group(1).replace("_", "-") if pod_match else None
                    return ContainerRef("kubernetes", found.group(1), pod)
                return ContainerRef(runtime, found.group(1))
        lxc = _LXC.search(path)
        if lxc:
            return ContainerRef("lxc", lxc.group(1))
    return None


def container_of(pid: int, proc_root: str | os.PathLike[str] = "/proc") -> ContainerRef | None:
    """The container of process ``pid`` (None when on the host, gone or unreadable)."""
    try:
        with open(
            os.path.join(proc_root, str(pid), "cgroup"), encoding="utf-8", errors="replace"
        ) as file:
            return container_from_cgroup(file.read(65536))
    except OSError:
        return None
