"""What every ``--from`` reader shares: the result (:class:`ImportedPlan`), typed access to a file's
values that records the keys used (:class:`ConfigReader`), and the small conversions several formats
make (numbers copied onto plan fields, LoRA module names, a path resolved).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hwdash.core.plan_fields import FileFormat, PlanField, fields_with_keys
from hwdash.errors import UsageError

FLAG = "--from"
"""The flag every ``--from`` usage error names."""


@dataclass
class ImportedPlan:
    """What a config file says about a plan."""

    kind: str
    """deepspeed, trainer, accelerate, axolotl, llama-factory, or vllm / sglang (a server's
    command line)."""
    updates: dict[str, Any] = field(default_factory=dict)
    """Plan field -> value."""
    ignored: list[str] = field(default_factory=list)
    """Keys read but not used (named in one warning line)."""
    notes: list[str] = field(default_factory=list)
    """What the reader had to assume."""
    not_carried: list[str] = field(default_factory=list)
    """Plan fields this kind of file has no key for (a DeepSpeed config never says the training
    method): the plan keeps the flag typed or the default, and the CLI says which it used."""
    refused: dict[str, str] = field(default_factory=dict)
    """Plan field -> why the file's setting cannot be planned (an optimizer hwdash does not count):
    the CLI exits 2 with the message unless the field's flag was typed, which replaces it."""


NestedRead = Callable[[Path, tuple[Path, ...]], ImportedPlan]
"""Reads the plan of a file another one names (``path``, the files being read around it): the
dispatch of :mod:`hwdash.core.plans.imports`, handed down so the readers need not import it."""


class ConfigReader:
    """Typed access to one file's values, recording which keys were used."""

    def __init__(
        self,
        path: Path,
        data: Mapping[str, Any],
        chain: tuple[Path, ...],
        read_nested: NestedRead,
    ) -> None:
        self.path = path
        self.data = data
        # the files being read, outermost first, this one last (resolved): a file that names
        # one of them again would be read forever
        self.chain = chain
        # reads a file this one names (its ``deepspeed`` entry), in any format --from reads
        self.read_nested = read_nested
        self.used: set[str] = set()

    def bad(self, key: str, wanted: str, value: Any) -> UsageError:
        try:
            shown = repr(value)
        except ValueError:  # an integer past Python's digit limit for str()
            shown = "an integer of over 4300 digits"
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        return UsageError(f"{self.path}: '{key}' must be {wanted}, got {shown}", flag=FLAG)

    def get(self, key: str) -> Any:
        self.used.add(key)
        value = self.data.get(key)
        return None if value == "auto" else value  # DeepSpeed/HF "auto": decided elsewhere

    def integer(self, key: str) -> int | None:
        value = self.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.bad(key, "a whole number", value)
        return value

    def number(self, key: str) -> float | None:
        value = self.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.bad(key, "a number", value)
        try:
            number = float(value)
        except OverflowError:  # an integer past float's range (10**400 in a JSON file)
            raise self.bad(key, "a finite number", value) from None
        if not math.isfinite(number):  # YAML's .inf, JSON's Infinity / NaN
            raise self.bad(key, "a finite number", value)
        return number

    def flag(self, key: str) -> bool | None:
        value = self.get(key)
        if value is None:
            return None
        if not isinstance(value, bool):
            raise self.bad(key, "true or false", value)
        return value

    def text(self, key: str) -> str | None:
        value = self.get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.bad(key, "a string", value)
        return value

    def mapping(self, key: str) -> Mapping[str, Any]:
        value = self.get(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.bad(key, "a table of settings", value)
        return value

    def ignored(self) -> list[str]:
        return sorted(str(key) for key in self.data if key not in self.used)


def copy_declared_keys(reader: ConfigReader, out: ImportedPlan, file_format: FileFormat) -> None:
    """The values of the keys the plan field registry declares for ``file_format``
    (:attr:`~hwdash.core.plan_fields.PlanField.keys`) copied onto their plan fields: whole numbers
    (kept when positive), then numbers (kept when positive; a dropout also when 0), then
    true/false settings. Of several keys of one field, the first declared wins."""
    declared = fields_with_keys(file_format)
    for how in KEY_READINGS:
        for entry, keys in declared:
            if key_reading(entry) != how:
                continue
            for key in reversed(keys):  # the first key is applied last: it wins
                _copy_key(reader, out, entry.name, key, how)


KEY_READINGS = ("whole", "number", "toggle")
"""How a declared key's value is read, in the order :func:`copy_declared_keys` reads them."""


def key_reading(entry: PlanField) -> str | None:
    """How ``--from`` reads a declared key of ``entry``: ``whole``, ``number``, ``toggle``
    (true/false), or None for a field whose keys it cannot copy as they are."""
    if entry.kind == "toggle":
        return "toggle"
    return entry.parse if entry.parse in ("whole", "number") else None


def _copy_key(reader: ConfigReader, out: ImportedPlan, name: str, key: str, how: str) -> None:
    """One file key's value onto Plan field ``name``, read as :func:`key_reading` says."""
    if how == "whole":
        value = reader.integer(key)
        if value:
            out.updates[name] = value
    elif how == "number":
        number = reader.number(key)
        if number is not None and (number > 0 or name == "lora_dropout"):
            out.updates[name] = number
    else:
        flag = reader.flag(key)
        if flag is not None:
            out.updates[name] = flag


def resolved_path(path: Path) -> Path | None:
    """``path`` made absolute with its links followed; None where the system cannot (a link
    loop, a name too long, a null byte)."""
    try:
        return path.resolve()
    except (OSError, RuntimeError, ValueError):
        return None


def module_names(path: Path, key: str, names: str | Sequence[str]) -> tuple[str, ...]:
    """LoRA target modules from a comma-separated string or a list; none at all is a usage error
    (an empty list would reach the planner as a LoRA on no module)."""
    parts = names.split(",") if isinstance(names, str) else names
    modules = tuple(part.strip() for part in parts if part.strip())
    if not modules:
        raise UsageError(f"{path}: '{key}' names no module", flag=FLAG)
    return modules
