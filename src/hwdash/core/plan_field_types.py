"""The types of the plan field registry (:mod:`hwdash.core.plan_fields`): how a flag sets its
field, how a value is read, a field's planner form row, its keys in the config files, and the
:class:`PlanField` entry that declares them; and :func:`member_docs`, an Enum's member docstrings
for ``--help``.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

from hwdash.core.plan import Plan

FlagKind = Literal["value", "list", "repeat", "toggle", "switch", "negated", "pair"]
"""How a flag sets its field:

* ``value``: ``--flag VALUE`` (``choices`` when the field is an enum);
* ``list``: ``--flag a,b`` (comma-separated names);
* ``repeat``: ``--flag a --flag b`` (each may also be comma-separated);
* ``toggle``: ``--flag`` / ``--no-flag`` (argparse's ``BooleanOptionalAction``);
* ``switch``: ``--flag`` sets the field true;
* ``negated``: ``--no-flag`` sets the field false (the flag is written with its ``no-``);
* ``pair``: ``--flag`` / ``--no-flag`` as two exclusive options, neither given: the plan's default.
"""

ValueParser = Literal["whole", "number", "count", "elements"]
"""How the command line reads a value: a whole number, a finite number, a count (``50k``), or an
element count that may be 0 or ``auto`` (a DeepSpeed bucket: ``5e8``, ``500M``, ``auto``)."""

FormWidget = Literal["text", "select", "switch", "integer", "number", "count"]
"""The planner form's control of a row."""


@dataclass(frozen=True)
class FormRow:
    """A Plan field's row in the planner form."""

    label: str
    """The row's label."""
    widget: FormWidget
    """Its control."""
    shown: str | None = None
    """The row class that shows it only where it applies (``-rl-only``...; None: always shown)."""
    placeholder: str | None = None
    """A typed row's words while it is empty (None: the text box's own, none)."""
    box: str = ""
    """A ``switch`` row's words beside its check box."""
    unset: str | None = None
    """A ``select`` row whose field may be unset (None): the first choice's words, which leave it
    unset (the loss row's ``framework default``)."""


FileFormat = Literal["trainer", "deepspeed", "accelerate", "axolotl", "llama-factory", "peft"]
"""A config file format whose keys :class:`FileKeys` declares."""


@dataclass(frozen=True)
class FileKeys:
    """A Plan field's keys in the config files, where a key maps one-to-one onto the field (the
    same value in the same unit). Several keys of one format: the exports write the first, and
    the first wins when a file gives more than one."""

    trainer: tuple[str, ...] = ()
    """Hugging Face ``TrainingArguments`` / TRL config keys (and the ``--export trainer``
    snippet's keyword arguments)."""
    deepspeed: tuple[str, ...] = ()
    """DeepSpeed JSON top-level keys."""
    accelerate: tuple[str, ...] = ()
    """accelerate config YAML top-level keys."""
    axolotl: tuple[str, ...] = ()
    """axolotl YAML keys (read only: hwdash writes no axolotl config)."""
    llama_factory: tuple[str, ...] = ()
    """LLaMA-Factory YAML keys (read only)."""
    peft: tuple[str, ...] = ()
    """PEFT ``LoraConfig`` keyword arguments (in the ``--export trainer`` snippet)."""

    def of(self, file_format: FileFormat) -> tuple[str, ...]:
        """The keys of ``file_format``."""
        return tuple(getattr(self, file_format.replace("-", "_")))


@dataclass(frozen=True)
class PlanField:
    """One Plan field as the command line (and the planner form) spell it."""

    name: str
    """The Plan field."""
    flag: str
    """The long option that sets it (for ``negated``, the ``--no-`` option itself)."""
    group: str
    """The ``--help`` section that lists it (one of :data:`FLAG_GROUPS`)."""
    help: str | Callable[[], str]
    """Its ``--help`` text (a callable: built when the parser is)."""
    kind: FlagKind = "value"
    parse: ValueParser | None = None
    """How a ``value`` is read (None: as text, or one of ``choices``)."""
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    off_help: str = ""
    """``pair``: the ``--no-`` option's help."""
    always_written: bool = False
    """Written by ``plan_arguments`` even at its default (a copied line says what it trains)."""
    also: tuple[tuple[str, str], ...] = ()
    """Further options (flag, help) that give the field another way, listed right after it and
    never written back (``--params`` for ``--model``)."""
    form: FormRow | None = None
    """Its planner form row (None: the form has none)."""
    keys: FileKeys = FileKeys()
    """Its keys in the config files ``--export`` writes and ``--from`` reads."""
    unset_unless_given: bool = False
    """Its unset value (None) means the framework's own default (DeepSpeed's buffers, FSDP's
    settings): ``hwdash plan`` passes it to the Plan only when its flag was given, so that an
    untyped one stays out of the Plan's ``model_fields_set``."""

    @property
    def spelling(self) -> str:
        """How messages name the flag: ``--batch``, or both forms (``--compile/--no-compile``)."""
        if self.kind in ("toggle", "pair"):
            return f"{self.flag}/--no-{self.flag.removeprefix('--')}"
        return self.flag

    @property
    def default(self) -> Any:
        """The parser's default: the Plan field's own, as the command line would type it."""
        info = Plan.model_fields[self.name]
        value = None if info.is_required() else info.default
        if self.kind == "list":
            return ",".join(value or ())
        if self.kind == "repeat":
            return []
        if self.kind in ("negated", "switch"):
            return False
        if self.kind == "pair":
            return None
        return getattr(value, "value", value)

    def help_text(self) -> str:
        """The ``--help`` text."""
        return self.help if isinstance(self.help, str) else self.help()


def _values(members: Any) -> tuple[str, ...]:
    return tuple(str(member.value) for member in members)


def member_docs(enum_class: type[Enum]) -> dict[str, str]:
    """The docstrings written under an Enum's members (Python keeps them only in the source).

    Read with :mod:`ast` from the class source; empty when the source is not available.
    """
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(enum_class)))
    except (OSError, TypeError, SyntaxError):
        return {}
    docs: dict[str, str] = {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for current, following in itertools.pairwise(body):
        if (
            isinstance(current, ast.Assign)
            and isinstance(current.targets[0], ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            member = enum_class[current.targets[0].id]
            docs[str(member.value)] = " ".join(following.value.value.replace("``", "").split())
    return docs
