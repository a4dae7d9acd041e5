"""The order a cluster's GPUs are shown in, by the dashboard's cluster view and ``monitor --once``.

Hosts come fullest first: the host whose fullest GPU has the highest memory pressure leads (a GPU
without a reading counts as emptiest), ties broken by the host's name; within a host its GPUs come
fullest first, ties by their number on the host. This is the order the README documents ("the host
with the fullest GPU first"), so the line a user must look at is at the top of both views.
"""

from __future__ import annotations

from collections.abc import Iterable

from hwdash.telemetry.types import GpuSample, NvmlStatus

LOCAL_HOST = "this machine"
"""The host name shown for GPUs read from this machine's NVML (``GpuSample.host`` is None)."""


def _heat(gpu: GpuSample) -> float:
    return -1.0 if gpu.pressure is None else gpu.pressure


def hosts_fullest_first(gpus: Iterable[GpuSample]) -> list[tuple[str, list[GpuSample]]]:
    """``gpus`` grouped by host in the documented order (see the module)."""
    hosts: dict[str, list[GpuSample]] = {}
    for gpu in gpus:
        hosts.setdefault(gpu.host or LOCAL_HOST, []).append(gpu)
    for members in hosts.values():
        members.sort(key=lambda gpu: (-_heat(gpu), gpu.host_gpu or 0, gpu.index))
    order = sorted(hosts, key=lambda host: (-_heat(hosts[host][0]), host))
    return [(host, hosts[host]) for host in order]


def gpu_label(host: str | None, number: int | None, index: int) -> str:
    """``3`` for this machine's GPU 3; ``node-c:1`` for GPU 1 of host node-c (``node-c:?`` when
    the host did not number it)."""
    if host is None:
        return str(index)
    return f"{host}:{'?' if number is None else number}"


def gpu_count_text(gpus: tuple[GpuSample, ...]) -> str:
    """``4 GPUs``, or ``20 GPUs on 3 hosts`` for a cluster (the status line and ``--once``)."""
    text = f"{len(gpus)} GPU" + ("" if len(gpus) == 1 else "s")
    hosts = {gpu.host for gpu in gpus if gpu.host}
    if hosts:
        text += f" on {len(hosts)} host" + ("" if len(hosts) == 1 else "s")
    return text


def source_text(nvml: NvmlStatus, unknown: str = "unknown") -> str:
    """Where the readings come from: ``Prometheus http://...`` or ``NVIDIA driver 550.54.15``
    (``unknown`` stands for a driver version NVML did not give)."""
    return nvml.source or f"NVIDIA driver {nvml.driver_version or unknown}"
