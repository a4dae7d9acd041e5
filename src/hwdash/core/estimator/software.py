"""The software's own footprint on a GPU: the catalog's ``software.toml`` tables, checked as a set.

:class:`Software` bundles the ``[[cuda_context]]`` rows (the CUDA context and loaded kernels by
compute capability), the ``[[interconnect]]`` rows (NCCL's channel counts by link), the
``[[nccl]]`` entry (NCCL's per-protocol buffers and communicators) and the ``[[allocator_pool]]``
entry (the caching allocator's pool as a fraction of the tensors, alone and in a parallel group);
their schemas are in :mod:`hwdash.core.software_specs`. The estimator reads the packaged file
(:func:`packaged_software`) unless a caller passes the catalog's (a user catalog may override rows by
id). Every number is data, each with its source in ``catalog/software.toml``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import ValidationError

from hwdash.core.data_files import packaged_catalog_dir, read_catalog_toml
from hwdash.core.software_specs import AllocatorPool, CudaContext, Interconnect, NcclBuffers
from hwdash.core.specs import (
    Accelerator,
    _entry_label,
    _Strict,
    _validation_error,
)
from hwdash.errors import CatalogError

#: The packaged file and its tables.
SOFTWARE_FILE = "software.toml"
SOFTWARE_TABLES: dict[str, type[_Strict]] = {
    "cuda_context": CudaContext,
    "interconnect": Interconnect,
    "nccl": NcclBuffers,
    "allocator_pool": AllocatorPool,
}


PoolKind = Literal["single_gpu", "distributed", "param_offload", "megatron"]
"""Which ``[[allocator_pool]]`` fraction a plan takes (:func:`~hwdash.core.estimator.estimate.pool_kind`)."""


@dataclass(frozen=True)
class Software:
    """The software footprint tables, checked as a set (:func:`software_from`)."""

    contexts: tuple[CudaContext, ...]
    interconnects: tuple[Interconnect, ...]
    nccl: NcclBuffers
    pool: AllocatorPool

    def pool_fraction(self, kind: PoolKind) -> float:
        """The allocator pool's fraction of the tensors for a plan of this ``kind``
        (:func:`~hwdash.core.estimator.estimate.pool_kind`): ``single_gpu``, ``distributed``, or
        ``param_offload`` / ``megatron``, which take the ``distributed`` fraction where the catalog
        has none of their own."""
        own = {
            "single_gpu": self.pool.single_gpu,
            "param_offload": self.pool.param_offload,
            "megatron": self.pool.megatron,
        }.get(kind)
        return self.pool.distributed if own is None else own

    def pool_base(self, kind: PoolKind) -> int:
        """Bytes the allocator pool holds for a plan of this ``kind`` whatever its tensors
        (``[[allocator_pool]]``'s ``*_base_bytes``; none for ``single_gpu``)."""
        if kind == "single_gpu":
            return 0
        if kind == "param_offload" and self.pool.param_offload is not None:
            return self.pool.param_offload_base_bytes
        if kind == "megatron" and self.pool.megatron is not None:
            return self.pool.megatron_base_bytes
        return self.pool.distributed_base_bytes

    def context_for(self, accelerator: Accelerator | None) -> tuple[CudaContext, str]:
        """The row for this accelerator's compute capability (the default row without one), and
        the plan's label for it."""
        default = next(row for row in self.contexts if row.default)
        if accelerator is None:
            return default, f"CUDA context and kernels ({default.measured_on}, default)"
        name = accelerator.name.removeprefix("NVIDIA ")
        capability = accelerator.compute_capability
        if accelerator.vendor != "nvidia" or capability is None:
            # no CUDA: its runtime's own footprint is unmeasured; the default row stands in
            return default, f"runtime context and kernels ({name}: as {default.measured_on})"
        for row in self.contexts:
            if capability in row.compute_capabilities:
                return row, f"CUDA context and kernels ({name}, CC {capability})"
        return (
            default,
            f"CUDA context and kernels ({name}, CC {capability}: as {default.measured_on})",
        )

    def interconnect_for(self, accelerator: Accelerator | None) -> Interconnect:
        """The accelerator's interconnect row, or the default one."""
        wanted = None if accelerator is None else accelerator.interconnect
        for row in self.interconnects:
            if row.id == wanted:
                return row
        return next(row for row in self.interconnects if row.default)


_Row = TypeVar("_Row", CudaContext, Interconnect)


def _one_default(rows: Iterable[_Row], kind: str, path: Path) -> None:
    defaults = [row.id for row in rows if row.default]
    if len(defaults) != 1:
        found = ", ".join(defaults) if defaults else "none"
        raise CatalogError(
            path, f"[[{kind}]] needs exactly one row with default = true (found: {found})"
        )


def software_from(
    contexts: Mapping[str, CudaContext],
    interconnects: Mapping[str, Interconnect],
    nccl: Mapping[str, NcclBuffers],
    pools: Mapping[str, AllocatorPool],
    path: Path,
) -> Software:
    """The tables as one :class:`Software`; a broken set raises :class:`CatalogError` on ``path``."""
    _one_default(contexts.values(), "cuda_context", path)
    _one_default(interconnects.values(), "interconnect", path)
    seen: dict[str, str] = {}
    for row in contexts.values():
        for capability in row.compute_capabilities:
            if capability in seen:
                raise CatalogError(
                    path,
                    f"compute capability {capability} is in two rows ('{seen[capability]}' too)",
                    entry=f"cuda_context '{row.id}'",
                    field="compute_capabilities",
                )
            seen[capability] = row.id
    if len(nccl) != 1:
        raise CatalogError(path, f"[[nccl]] needs exactly one entry (found {len(nccl)})")
    if len(pools) != 1:
        raise CatalogError(path, f"[[allocator_pool]] needs exactly one entry (found {len(pools)})")
    return Software(
        contexts=tuple(contexts.values()),
        interconnects=tuple(interconnects.values()),
        nccl=next(iter(nccl.values())),
        pool=next(iter(pools.values())),
    )


@functools.cache
def packaged_software() -> Software:
    """The built-in ``software.toml``, read once: what a caller that passes no catalog gets."""
    path = packaged_catalog_dir() / SOFTWARE_FILE
    data = read_catalog_toml(path)
    tables: dict[str, dict[str, _Strict]] = {kind: {} for kind in SOFTWARE_TABLES}
    for kind, schema in SOFTWARE_TABLES.items():
        for index, raw in enumerate(data.get(kind, [])):
            try:
                entry = schema.model_validate(raw)
            except ValidationError as exc:
                raise _validation_error(path, _entry_label(kind, index, raw), exc) from None
            tables[kind][entry.id] = entry  # type: ignore[attr-defined]
    return software_from(
        tables["cuda_context"],  # type: ignore[arg-type]
        tables["interconnect"],  # type: ignore[arg-type]
        tables["nccl"],  # type: ignore[arg-type]
        tables["allocator_pool"],  # type: ignore[arg-type]
        path,
    )
