"""This machine as a flavor: the GPUs NVML sees, as the planner's ``local`` (or ``local-free``) flavor.

Built from a live snapshot, never from the catalog's marketing numbers: each GPU's usable memory is
the total NVML reports (a "16 GB" T4 shows 15360 MiB), or, for ``local-free``, the memory free right
now (other processes hold the rest). The accelerator is matched to the catalog by the name NVML
reports (``Accelerator.nvml_names``), which brings its speed and bf16 support; an unknown GPU keeps
its memory and has no speed (hours and cost unknown, and said so).

Pure: it takes plain readings, so the core never imports telemetry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from hwdash.core.catalog import Catalog
from hwdash.core.specs import Accelerator, Flavor
from hwdash.core.units import GIB, MIB

LOCAL_FLAVOR_ID = "local"
"""The flavor of this machine with each GPU's whole memory."""
LOCAL_FREE_FLAVOR_ID = "local-free"
"""The same with only the memory free right now."""
LOCAL_TARGETS = (LOCAL_FLAVOR_ID, LOCAL_FREE_FLAVOR_ID)


@dataclass(frozen=True)
class LocalGpu:
    """One GPU as NVML reports it."""

    name: str | None
    total_bytes: int | None
    free_bytes: int | None


@dataclass(frozen=True)
class LocalMachine:
    """This machine as a flavor, its accelerator, and what the user should know about it."""

    flavor: Flavor
    accelerator: Accelerator
    notes: tuple[str, ...]
    """E.g. the GPU is not in the catalog (speed unknown), GPUs differ (the smallest counts)."""


class NoLocalGpu(ValueError):
    """No GPU to build the flavor from; the message says why."""


def local_machine(
    gpus: Sequence[LocalGpu], catalog: Catalog, *, free_only: bool = False
) -> LocalMachine:
    """The ``local`` (``free_only``: ``local-free``) flavor from the GPUs NVML sees.

    Data-parallel plans run the same step on every GPU, so the GPU with the least memory decides;
    mixed GPU models are matched by the first one's name and said so.
    """
    readable = [
        gpu for gpu in gpus if gpu.total_bytes and (gpu.free_bytes is not None or not free_only)
    ]
    if not readable:
        raise NoLocalGpu("NVML shows no GPU whose memory can be read on this machine")
    notes: list[str] = []
    names = {gpu.name for gpu in readable}
    first_name = readable[0].name or "unknown GPU"
    if len(names) > 1:
        notes.append(
            "the GPUs differ (" + ", ".join(sorted(n or "unknown" for n in names)) + "): the one "
            "with the least memory decides, the first one's speed is used"
        )
    memory = min((gpu.free_bytes if free_only else gpu.total_bytes) or 0 for gpu in readable)
    matched = catalog.match_nvml_name(first_name) if readable[0].name else None
    mib = max(1, memory // MIB)
    flavor_id = LOCAL_FREE_FLAVOR_ID if free_only else LOCAL_FLAVOR_ID
    if matched is not None:
        accelerator = matched.model_copy(
            update={"id": f"{flavor_id}-{matched.id}", "nvml_total_mib": mib}
        )
    else:
        notes.append(
            f"{first_name} is not in the catalog: its memory is known, its speed is not "
            "(no hours or cost; add it with an [[accelerator]] entry whose nvml_names lists it)"
        )
        try:
            accelerator = _unknown_accelerator(flavor_id, first_name, memory, mib)
        except ValidationError:
            raise NoLocalGpu(
                f"NVML reports an impossible memory size for {first_name} ({memory} bytes)"
            ) from None
    what = "free now" if free_only else "as NVML reports it"
    flavor = Flavor(
        id=flavor_id,
        name=f"this machine: {len(readable)}x {first_name}, {memory / GIB:.1f} GiB {what}",
        provider="local",
        accelerator=accelerator.id,
        gpu_count=len(readable),
        source="this machine's GPUs, read from NVML",
    )
    return LocalMachine(flavor=flavor, accelerator=accelerator, notes=tuple(notes))


def _unknown_accelerator(flavor_id: str, name: str, memory: int, mib: int) -> Accelerator:
    """A GPU the catalog does not know: its memory as NVML reports it, no speed. Raises
    ``pydantic.ValidationError`` for a size no GPU has (the catalog's bounds)."""
    return Accelerator(
        id=f"{flavor_id}-gpu",
        name=name,
        vendor="nvidia",
        kind="gpu",
        memory_gb=memory / 1e9,
        nvml_total_mib=mib,
        bf16=True,
        nvml_names=(name,),
        source="this machine, as NVML reports it (memory only; speed unknown)",
    )


def with_local_machine(catalog: Catalog, machine: LocalMachine) -> Catalog:
    """The catalog plus this machine's flavor and accelerator (for the flavor table and ``--fit``)."""
    return Catalog(
        accelerators={**catalog.accelerators, machine.accelerator.id: machine.accelerator},
        flavors={**catalog.flavors, machine.flavor.id: machine.flavor},
        models=catalog.models,
        slowdowns=catalog.slowdowns,
        files=catalog.files,
    )
