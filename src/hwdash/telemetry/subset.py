"""Watching some of the GPUs: ``--gpus 0,2`` or, when it is not given, ``CUDA_VISIBLE_DEVICES``.

Entries are NVML indices or UUIDs (or a UUID's first characters, ``GPU-5a1c``), as
``CUDA_VISIBLE_DEVICES`` takes them (CUDA's documentation, "CUDA environment variables"); ``all`` shows
every GPU. The sampler still reads every GPU (NVML numbers them all); the subset is what the monitor
shows, alerts on and prints. An entry that names no GPU, or a UUID prefix that several GPUs share, is
refused on the first sample that lists GPUs (a usage error, before anything is shown).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from hwdash.core.numbers import is_ascii_whole
from hwdash.errors import UsageError
from hwdash.telemetry.types import GpuSample, Sampler, Snapshot


def parse_selection(text: str, flag: str = "--gpus") -> tuple[str, ...] | None:
    """The entries of ``0,2`` or ``GPU-5a1c,3``; None for ``all`` (every GPU)."""
    cleaned = text.strip()
    if cleaned.lower() == "all":
        return None
    entries = tuple(part.strip() for part in cleaned.split(","))
    if not cleaned or any(not entry for entry in entries):
        raise UsageError(f"{text!r} is not a list of GPU indices or UUIDs (e.g. 0,2)", flag=flag)
    for entry in entries:
        if not is_ascii_whole(entry) and not entry.upper().startswith(("GPU-", "MIG-")):
            raise UsageError(
                f"{entry!r} is not a GPU index or UUID (e.g. 0 or GPU-5a1c...)", flag=flag
            )
    return entries


def selection_from(
    gpus_flag: str | None, environ: Mapping[str, str]
) -> tuple[tuple[str, ...] | None, str | None]:
    """The entries to show and where they come from (``--gpus 0,2``, ``CUDA_VISIBLE_DEVICES=1``);
    (None, None) for every GPU."""
    if gpus_flag is not None:
        entries = parse_selection(gpus_flag)
        return entries, None if entries is None else f"--gpus {gpus_flag.strip()}"
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return None, None
    entries = parse_selection(visible, flag="CUDA_VISIBLE_DEVICES")
    return entries, None if entries is None else f"CUDA_VISIBLE_DEVICES={visible.strip()}"


def _chosen(gpu: GpuSample, entries: tuple[str, ...]) -> bool:
    for entry in entries:
        if is_ascii_whole(entry):
            if gpu.index == int(entry) and gpu.host is None:
                return True
        elif gpu.uuid and gpu.uuid.lower().startswith(entry.lower()):
            return True
    return False


def _index_list(indices: list[int]) -> str:
    """``0-7`` for a run of numbers, else ``0, 2, 5``."""
    if len(indices) > 2 and indices == list(range(indices[0], indices[-1] + 1)):
        return f"{indices[0]}-{indices[-1]}"
    return ", ".join(str(index) for index in indices)


def check_selection(entries: tuple[str, ...], gpus: tuple[GpuSample, ...], flag: str) -> None:
    """Raise :class:`UsageError` for an entry that names none of ``gpus`` or (a UUID prefix)
    several of them; ``flag`` (``--gpus``, ``CUDA_VISIBLE_DEVICES``) is named in the message."""
    local = sorted(gpu.index for gpu in gpus if gpu.host is None)
    for entry in entries:
        if is_ascii_whole(entry):
            if int(entry) not in local:
                here = (
                    f"GPUs here: {_index_list(local)}"
                    if local
                    else "a cluster's GPUs are chosen by UUID"
                )
                raise UsageError(f"there is no GPU {entry} ({here})", flag=flag)
            continue
        matches = [gpu for gpu in gpus if _chosen(gpu, (entry,))]
        if not matches:
            raise UsageError(f"no GPU's UUID starts with {entry}", flag=flag)
        if len(matches) > 1:
            numbers = ", ".join(
                f"{gpu.host}:{gpu.host_gpu}" if gpu.host else str(gpu.index) for gpu in matches
            )
            raise UsageError(
                f"{entry} matches {len(matches)} GPUs ({numbers}): give more of its UUID",
                flag=flag,
            )


class SubsetSampler:
    """A sampler showing only the chosen GPUs of another (implements the sampler protocol)."""

    def __init__(self, inner: Sampler, entries: tuple[str, ...], source: str) -> None:
        self.inner = inner
        self.entries = entries
        self.source = source
        """What chose them, said on screen (``--gpus 0,2``)."""
        self.checked = False
        """The entries were held against the first sample (checked once: a GPU lost later does
        not make them a usage error in the middle of a run)."""

    @property
    def flag(self) -> str:
        """The flag or variable the entries come from (``--gpus``, ``CUDA_VISIBLE_DEVICES``)."""
        return self.source.split("=", 1)[0].split(" ", 1)[0]

    def sample(self) -> Snapshot:
        """The chosen GPUs of the next sample; the first one that lists GPUs raises
        :class:`UsageError` for an entry that names none or several of them."""
        snapshot = self.inner.sample()
        if not self.checked:
            self.checked = True
            if snapshot.gpus and not snapshot.stale:
                check_selection(self.entries, snapshot.gpus, self.flag)
        return self.select(snapshot)

    def select(self, snapshot: Snapshot) -> Snapshot:
        """``snapshot`` with only the chosen GPUs, saying so in its ``subset``."""
        if not snapshot.gpus:
            return snapshot
        kept = tuple(gpu for gpu in snapshot.gpus if _chosen(gpu, self.entries))
        note = f"{len(kept)} of {len(snapshot.gpus)} GPUs ({self.source})"
        if not kept:
            note = f"no GPU matches {self.source} (the machine has {len(snapshot.gpus)})"
        return dataclasses.replace(snapshot, gpus=kept, subset=note)

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)  # e.g. the fake NVML behind it (tests, the demo)
