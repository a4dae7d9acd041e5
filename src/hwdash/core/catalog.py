"""The hardware and model catalog: pydantic schemas and the loader.

The catalog is data, never code: ``catalog/*.toml`` in the repository (shipped inside the wheel as
``hwdash/catalog``) holds accelerators, flavors and models, each number with a ``source``. User files in
``$XDG_CONFIG_HOME/hwdash/catalog/``, ``HWDASH_CATALOG`` or ``--catalog DIR`` add entries or override
them by id.

A TOML file may hold arrays of tables of each kind: ``[[accelerator]]``, ``[[flavor]]``, ``[[model]]``,
``[[slowdown]]``, ``[[framework]]``, and the software footprint's ``[[cuda_context]]``,
``[[interconnect]]``, ``[[nccl]]`` and ``[[allocator_pool]]`` (``software.toml``).
A broken file raises :class:`CatalogError`, whose message names the file, the entry and the field.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, ValidationError

from hwdash.core.data_files import packaged_catalog_dir, read_catalog_toml
from hwdash.core.estimator.software import SOFTWARE_TABLES, Software, software_from
from hwdash.core.specs import (
    ID_PATTERN,
    Accelerator,
    EngineDefaults,
    Flavor,
    Framework,
    ModelSpec,
    Slowdown,
    _entry_label,
    _Strict,
    _validation_error,
)

# Re-exported: it lives in hwdash.errors so the command line can catch it without pydantic.
from hwdash.errors import CatalogError as CatalogError

if TYPE_CHECKING:
    from hwdash.core.plan import Plan


#: The fields a ``[[model]]`` table with a ``[model.config]`` keeps beside it: what a config.json
#: does not say (catalog id, display name, Hub id, published parameter count, sources, notes).
CATALOG_ONLY_MODEL_FIELDS = ("id", "name", "hf_id", "params", "source", "notes")


class CatalogModel(_Strict):
    """A built-in catalog model: its config.json fields plus catalog-only metadata.

    ``config`` holds the model's Hugging Face config.json keys (``model_type`` and at least the ones
    hwdash reads; a multimodal model's ``text_config`` too). It is read by the same reader as
    ``hwdash plan --model path/to/config.json`` (:func:`hwdash.core.models.config.model_from_config`), so a
    catalog id and its config.json give the same plan. The architecture is never written out beside
    it: the fields of :class:`ModelSpec` (``layers``, ``norm_type``...) are the advanced form, for
    models without a config.json.
    """

    id: str = Field(pattern=ID_PATTERN)
    """Catalog id, lowercase (``qwen2.5-7b``)."""
    name: str
    """Display name."""
    hf_id: str = ""
    """Hugging Face repository id, if any."""
    params: int | None = Field(default=None, gt=0, le=10**16)
    """Published total parameter count (the Hub's safetensors metadata, the model card)."""
    source: str = Field(min_length=1)
    """Where the config and the parameter count come from."""
    notes: str = ""
    """Caveats."""
    config: dict[str, Any]
    """The model's config.json fields (``model_type`` first)."""

    def to_spec(self) -> ModelSpec:
        """The :class:`ModelSpec` the config.json reader makes of ``config``, with this entry's
        metadata. Raises :class:`~hwdash.errors.UsageError` for a config the reader refuses."""
        # models imports this module: the reader is imported when a catalog is read.
        from hwdash.core.models.config import model_from_config

        spec = model_from_config(self.config, name=self.name, source="[model.config]")
        return spec.model_copy(
            update={name: getattr(self, name) for name in CATALOG_ONLY_MODEL_FIELDS}
        )


def _model_entry(path: Path, label: str, raw: dict[str, Any]) -> ModelSpec:
    """A ``[[model]]`` table with a ``[model.config]``, read through the config.json reader."""
    from hwdash.errors import UsageError

    written_out = sorted(set(raw) - {*CATALOG_ONLY_MODEL_FIELDS, "config"})
    if written_out:
        known = [name for name in written_out if name in ModelSpec.model_fields]
        reason = (
            "is an architecture field: a model with a [model.config] takes its architecture from "
            "the config (write the config.json key instead, or leave [model.config] out and write "
            "every ModelSpec field)"
            if known
            else "unknown field"
        )
        raise CatalogError(path, reason, entry=label, field=written_out[0])
    try:
        entry = CatalogModel.model_validate(raw)
    except ValidationError as exc:
        raise _validation_error(path, label, exc) from None
    try:
        return entry.to_spec()
    except UsageError as exc:
        message = str(exc).removeprefix("--model: ").removeprefix("[model.config]: ")
        raise CatalogError(path, message, entry=label, field="config") from None


CatalogKind = Literal[
    "accelerator",
    "flavor",
    "model",
    "slowdown",
    "framework",
    "cuda_context",
    "interconnect",
    "nccl",
    "allocator_pool",
]
_SCHEMAS: dict[str, type[_Strict]] = {
    "accelerator": Accelerator,
    "flavor": Flavor,
    "model": ModelSpec,
    "slowdown": Slowdown,
    "framework": Framework,
    "engine": EngineDefaults,
    **SOFTWARE_TABLES,
}


@dataclass(frozen=True)
class Catalog:
    """Everything the planner knows about hardware and models, keyed by id."""

    accelerators: dict[str, Accelerator] = field(default_factory=dict)
    flavors: dict[str, Flavor] = field(default_factory=dict)
    models: dict[str, ModelSpec] = field(default_factory=dict)
    slowdowns: dict[str, Slowdown] = field(default_factory=dict)
    """Step-time factors for ``--fit`` options, by id."""
    frameworks: dict[str, Framework] = field(default_factory=dict)
    """Training stacks' saver defaults (``--framework``), by id."""
    engines: dict[str, EngineDefaults] = field(default_factory=dict)
    """Serving engines' memory defaults (``--engine``, ``engines.toml``), by id."""
    software: Software | None = None
    """The software footprint tables (``software.toml``: CUDA context by compute capability, NCCL
    buffers and channels); None when the folders read hold none (the estimator then reads the
    packaged file)."""
    files: tuple[str, ...] = ()
    """The files this catalog was read from, in order (later files override earlier ones)."""

    def accelerator_for(self, flavor: Flavor) -> Accelerator | None:
        """The accelerator a flavor carries, or None for CPU-only."""
        return None if flavor.accelerator is None else self.accelerators[flavor.accelerator]

    def framework_for(self, plan: Plan) -> Framework | None:
        """This catalog's entry for the plan's ``--framework`` (a user catalog's override wins); None
        when the catalog has no such entry (the estimator then reads the packaged one)."""
        return self.frameworks.get(plan.framework.value)

    def find_model(self, name: str) -> ModelSpec | None:
        """Look a model up by id, display name or Hugging Face id, ignoring case."""
        key = name.strip().lower()
        if key in self.models:
            return self.models[key]
        for model in self.models.values():
            if key in (model.name.lower(), model.hf_id.lower()):
                return model
        return None

    def match_nvml_name(self, nvml_name: str) -> Accelerator | None:
        """The accelerator whose ``nvml_names`` contains what NVML reported, if any."""
        for acc in self.accelerators.values():
            if nvml_name in acc.nvml_names:
                return acc
        return None


def user_catalog_dirs(explicit: Sequence[str | Path] = ()) -> list[Path]:
    """User catalog folders in override order: XDG config, then ``HWDASH_CATALOG``, then ``--catalog``."""
    dirs: list[Path] = []
    config_home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    xdg = Path(config_home) / "hwdash" / "catalog"
    try:
        if xdg.is_dir():
            dirs.append(xdg)
    except OSError as exc:  # a name too long, a folder we may not enter
        raise CatalogError(xdg, f"cannot be read: {exc.strerror or exc}") from None
    env = os.environ.get("HWDASH_CATALOG")
    if env:
        dirs.extend(Path(p) for p in env.split(os.pathsep) if p)
    dirs.extend(Path(p) for p in explicit)
    return dirs


def _catalog_files(directory: Path) -> list[Path]:
    try:
        if directory.is_file():
            return [directory]
        if not directory.is_dir():
            raise CatalogError(directory, "no such catalog folder or file")
        return sorted(directory.glob("*.toml"))
    except OSError as exc:  # a name too long, a folder we may not enter
        raise CatalogError(directory, f"cannot be read: {exc.strerror or exc}") from None


def parse_catalog_file(path: Path) -> dict[str, list[_Strict]]:
    """Read and validate one TOML file. Raises :class:`CatalogError` naming file, entry and field."""
    data = read_catalog_toml(path)
    out: dict[str, list[_Strict]] = {kind: [] for kind in _SCHEMAS}
    for key, value in data.items():
        if key not in _SCHEMAS:
            raise CatalogError(
                path,
                f"unknown table '{key}' (expected "
                + ", ".join(f"[[{kind}]]" for kind in _SCHEMAS)
                + ")",
            )
        if not isinstance(value, list):
            raise CatalogError(path, f"'{key}' must be an array of tables: write [[{key}]]")
        seen: set[str] = set()
        for index, raw in enumerate(value):
            label = _entry_label(key, index, raw)
            entry: _Strict
            if key == "model" and isinstance(raw, dict) and "config" in raw:
                entry = _model_entry(path, label, raw)
            else:
                try:
                    entry = _SCHEMAS[key].model_validate(raw)
                except ValidationError as exc:
                    raise _validation_error(path, label, exc) from None
            ident = entry.id  # type: ignore[attr-defined]
            if ident in seen:
                raise CatalogError(path, "duplicate id in the same file", entry=label, field="id")
            seen.add(ident)
            out[key].append(entry)
    return out


def load_catalog(extra_dirs: Sequence[str | Path] = (), *, include_user: bool = True) -> Catalog:
    """Load the built-in catalog, then user folders that add or override entries by id.

    ``extra_dirs`` are ``--catalog`` folders (or single files), applied last.
    """
    dirs: list[Path] = [packaged_catalog_dir()]
    dirs.extend(user_catalog_dirs(extra_dirs) if include_user else [Path(p) for p in extra_dirs])
    return load_catalog_from(dirs)


def _software_of(
    tables: dict[str, dict[str, Any]], origin: dict[tuple[str, str], Path]
) -> Software | None:
    """``software.toml``'s tables as one :class:`Software` (None when no folder read holds any),
    each accelerator's ``interconnect`` checked against its ``[[interconnect]]`` ids."""
    origins = [path for (kind, _), path in origin.items() if kind in SOFTWARE_TABLES]
    if not origins:
        return None
    links = tables["interconnect"]
    software = software_from(
        tables["cuda_context"], links, tables["nccl"], tables["allocator_pool"], origins[-1]
    )
    for ident, accelerator in tables["accelerator"].items():
        if accelerator.interconnect is not None and accelerator.interconnect not in links:
            raise CatalogError(
                origin[("accelerator", ident)],
                f"unknown interconnect '{accelerator.interconnect}' (software.toml's "
                "[[interconnect]] ids: " + ", ".join(sorted(links)) + ")",
                entry=f"accelerator '{ident}'",
                field="interconnect",
            )
    return software


def load_catalog_from(dirs: Iterable[Path]) -> Catalog:
    """Load exactly these folders (or files), later ones overriding earlier ones by id."""
    tables: dict[str, dict[str, Any]] = {kind: {} for kind in _SCHEMAS}
    origin: dict[tuple[str, str], Path] = {}
    files: list[str] = []
    for directory in dirs:
        # Within one folder the same id twice is a mistake (which file wins would depend on
        # file names); a later folder overriding an earlier one is the point of user catalogs.
        in_this_folder: dict[tuple[str, str], Path] = {}
        for path in _catalog_files(Path(directory)):
            files.append(str(path))
            for kind, entries in parse_catalog_file(path).items():
                for entry in entries:
                    ident = entry.id  # type: ignore[attr-defined]
                    other = in_this_folder.get((kind, ident))
                    if other is not None:
                        raise CatalogError(
                            path,
                            f"duplicate id: {other.name} in the same folder defines it too",
                            entry=f"{kind} '{ident}'",
                            field="id",
                        )
                    in_this_folder[(kind, ident)] = path
                    tables[kind][ident] = entry
                    origin[(kind, ident)] = path
    software = _software_of(tables, origin)
    catalog = Catalog(
        accelerators=tables["accelerator"],
        flavors=tables["flavor"],
        models=tables["model"],
        slowdowns=tables["slowdown"],
        frameworks=tables["framework"],
        engines=tables["engine"],
        software=software,
        files=tuple(files),
    )
    for ident, flavor in catalog.flavors.items():
        if flavor.accelerator is not None and flavor.accelerator not in catalog.accelerators:
            raise CatalogError(
                origin[("flavor", ident)],
                f"unknown accelerator '{flavor.accelerator}'",
                entry=f"flavor '{ident}'",
                field="accelerator",
            )
    return catalog
