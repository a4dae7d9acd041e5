"""The names transformers gives each family's modules, read from ``catalog/shapes/module_names.toml``.

A LoRA target list written for PEFT names modules by their attribute names in the model
(``c_attn`` on GPT-2, ``query_key_value`` on GPT-NeoX, ``q`` on T5). PEFT matches a target
``t`` against a module's dotted name ``key`` when ``key == t`` or ``key`` ends with ``"." + t``
(``check_target_module_exists`` in ``peft/tuners/tuners_utils.py``); :func:`matches` does the
same against a module's path inside one block.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

#: The scheme ``ModelSpec.module_names`` "" stands for.
DEFAULT_SCHEME = "llama"


@dataclass(frozen=True)
class NamingScheme:
    """One family's module names (a table of ``module_names.toml``)."""

    name: str
    linears: tuple[tuple[str, str], ...]
    """(role, path inside a block): the role is the name hwdash counts the projection by."""
    cross_linears: tuple[tuple[str, str], ...]
    aliases: tuple[tuple[str, str], ...]
    """(accepted name, role): names an older transformers gave the module."""
    embedding: str
    lm_head: str
    source: str

    def path(self, role: str) -> str:
        """The module path of ``role`` inside a block (the role itself where the table has none)."""
        return dict(self.linears + self.cross_linears).get(role, role)

    @property
    def fused_qkv(self) -> bool:
        """q, k and v are one matrix (GPT-2's ``c_attn``, GPT-NeoX's ``query_key_value``)."""
        return any(role == "qkv_proj" for role, _ in self.linears)

    @property
    def fused_gate_up(self) -> bool:
        """gate and up are one matrix (Phi-3's ``gate_up_proj``)."""
        return any(role == "gate_up_proj" for role, _ in self.linears)


@functools.cache
def naming_schemes() -> dict[str, NamingScheme]:
    """Every scheme of ``catalog/shapes/module_names.toml``, by name."""
    from hwdash.core.data_files import packaged_catalog_dir

    path = packaged_catalog_dir() / "shapes" / "module_names.toml"
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    return {
        name: NamingScheme(
            name=name,
            linears=tuple(table["linears"].items()),
            cross_linears=tuple(table.get("cross_linears", {}).items()),
            aliases=tuple(table.get("aliases", {}).items()),
            embedding=table["embedding"],
            lm_head=table["lm_head"],
            source=table["source"],
        )
        for name, table in data.items()
    }


def scheme(name: str) -> NamingScheme:
    """The scheme ``ModelSpec.module_names`` names ("" is Llama's)."""
    return naming_schemes()[name or DEFAULT_SCHEME]


def matches(target: str, path: str) -> bool:
    """Whether PEFT's target name ``target`` selects the module at ``path`` (a dotted name inside a
    block, or a top-level module name): the whole name or a dotted suffix of it."""
    return path == target or path.endswith("." + target)
