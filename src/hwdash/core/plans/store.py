"""Saved plans: a small JSON file in the XDG data folder that survives restarts.

The file is ``$XDG_DATA_HOME/hwdash/plans.json`` (``~/.local/share/hwdash/plans.json`` when the variable
is unset)::

    {"format": "hwdash-plans", "version": 1, "plans": [{"name": ..., "plan": {...},
     "saved_at": "2026-11-22T04:30:00Z", "summary": {...}}]}

Rules this module keeps:

* Every write goes to a temporary file in the same folder and then ``os.replace`` s the old one, so a
  crash or a full disk never leaves half a file behind.
* Every operation re-reads the file, so two dashboards (or the dashboard and ``hwdash plan --save``)
  see each other's plans.
* A file that is not valid JSON, not a plans file, or from another format version is never
  overwritten: a write (save, rename, remove) moves it aside to ``plans.json.bak-<UTC timestamp>``
  (a read only says what is wrong) and :class:`PlanStoreError`
  says so and where it went. The next operation starts a fresh list.

**Summaries: recomputed on display, cached as a fallback.** Each saved plan keeps the summary that
was true when it was saved (per-GPU bytes by component, best flavor, hours, cost). Displays call
:func:`current_summary`, which re-runs the estimator against today's catalog, because prices, flavors
and the estimator itself change and a stale number would mislead. Only when the plan can no longer be
evaluated (its model left the catalog, a ``config.json`` path is gone) does the cached summary show,
marked as such (``SummaryView.fresh`` is False, ``SummaryView.problem`` says why).
"""

from __future__ import annotations

import builtins
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal, NoReturn

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hwdash.core import strict_json
from hwdash.core.catalog import Catalog, CatalogError
from hwdash.core.plan import Plan
from hwdash.core.results import MEMORY_COMPONENTS, PlanReport
from hwdash.errors import UsageError

#: The ``format`` marker of a plans file.
PLANS_FORMAT = "hwdash-plans"
#: The format version this code reads and writes.
PLANS_VERSION = 1
#: Longest plan name accepted (names appear as column headings in the compare view).
MAX_NAME_LENGTH = 80


class PlanStoreError(UsageError):
    """The plans file cannot be used, or a name is wrong. One line; exit status 2 on the CLI."""

    def __init__(self, message: str, *, backup: Path | None = None) -> None:
        self.backup = backup
        """Where a broken file was moved to, when it was moved aside."""
        super().__init__(message)


class PlanSummary(BaseModel):
    """What a plan came to when it was saved: enough to draw a compare column without the estimator."""

    # Finite numbers only: Python's json reads NaN and Infinity, and a hand-edited file holding
    # them would otherwise be carried along until the next write refused it (no JSON has them).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    model_name: str
    """Display name of the resolved model."""
    memory: dict[str, int]
    """Peak bytes per GPU by component (``weights`` ... ``overhead``) plus ``total``."""
    gpus: int = Field(ge=1)
    """GPU count the per-GPU figures assume."""
    host_bytes: int = Field(default=0, ge=0)
    """Host RAM that CPU offload needs."""
    best_flavor: str | None = None
    """The recommended flavor id (cheapest that fits), None when nothing fits."""
    hours: float | None = Field(default=None, ge=0)
    """Estimated hours on the best flavor (None without a data size)."""
    cost: float | None = Field(default=None, ge=0)
    """Dollars on the best flavor (None without a price or hours)."""

    @property
    def per_gpu_total(self) -> int:
        """Peak bytes per GPU."""
        return self.memory.get("total", sum(self.memory.get(c, 0) for c in MEMORY_COMPONENTS))

    @classmethod
    def from_report(cls, report: PlanReport) -> PlanSummary:
        """Summarize an estimate."""
        best = next((f for f in report.flavors if f.flavor.id == report.recommended), None)
        return cls(
            model_name=report.model.name,
            memory=report.estimate.per_gpu.as_dict(),
            gpus=report.estimate.gpus,
            host_bytes=report.estimate.host_bytes,
            best_flavor=report.recommended,
            hours=best.hours if best else None,
            cost=best.cost if best else None,
        )


class SavedPlan(BaseModel):
    """One entry of the plans file."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field(min_length=1, max_length=MAX_NAME_LENGTH)
    """Unique name, shown as the column heading in the compare view."""
    plan: Plan
    """The plan's inputs."""
    saved_at: datetime
    """When it was saved or last overwritten (UTC)."""
    summary: PlanSummary | None = None
    """The estimate when it was saved; a fallback for display (see the module docstring)."""


class _PlansFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal["hwdash-plans"]
    version: Literal[1]
    plans: list[SavedPlan]


def data_folder() -> Path:
    """hwdash's data folder: ``$XDG_DATA_HOME/hwdash``, or ``~/.local/share/hwdash`` when the
    variable is unset, empty or relative."""
    data_home = os.environ.get("XDG_DATA_HOME", "")
    # The XDG spec says a relative value is invalid and must be ignored.
    base = Path(data_home) if os.path.isabs(data_home) else Path.home() / ".local" / "share"
    return base / "hwdash"


def default_plans_path() -> Path:
    """``$XDG_DATA_HOME/hwdash/plans.json``, or ``~/.local/share/hwdash/plans.json`` when the
    variable is unset, empty or relative."""
    return data_folder() / "plans.json"


def default_exports_folder() -> Path:
    """Where the dashboard's export writes unless told otherwise: ``<data folder>/exports``."""
    return data_folder() / "exports"


def clean_name(name: str) -> str:
    """A plan name with surrounding space removed; raises :class:`PlanStoreError` when unusable."""
    cleaned = " ".join(name.split())
    if not cleaned:
        raise PlanStoreError("a plan needs a name")
    if len(cleaned) > MAX_NAME_LENGTH:
        raise PlanStoreError(f"a plan name is at most {MAX_NAME_LENGTH} characters")
    return cleaned


class PlanStore:
    """Saved plans in one JSON file. Each call reads the file afresh; each change rewrites it atomically."""

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else default_plans_path()
        """The plans file."""

    # -- reading ---------------------------------------------------------------------------------

    def list(self) -> list[SavedPlan]:
        """Every saved plan, in the order they were first saved."""
        return self._read()

    def get(self, name: str) -> SavedPlan | None:
        """The plan with that name, or None."""
        key = " ".join(name.split())
        return next((p for p in self._read() if p.name == key), None)

    def names(self) -> builtins.list[str]:
        """Names of the saved plans."""
        return [p.name for p in self._read()]

    def unique_name(self, name: str) -> str:
        """``name`` if free, else ``name (2)``, ``name (3)``, ... (what :meth:`save` would use)."""
        return _free_name(clean_name(name), {p.name for p in self._read()})

    # -- changing --------------------------------------------------------------------------------

    def save(
        self,
        name: str,
        plan: Plan,
        *,
        summary: PlanSummary | None = None,
        overwrite: bool = False,
    ) -> SavedPlan:
        """Save a plan. A taken name is overwritten only with ``overwrite``; else a suffix is added.

        Returns the stored entry (its ``name`` says which name was used).
        """
        cleaned = clean_name(name)
        with self._locked():
            plans = self._read(for_write=True)
            taken = {p.name for p in plans}
            now = datetime.now(timezone.utc).replace(microsecond=0)
            if overwrite and cleaned in taken:
                saved = SavedPlan(name=cleaned, plan=plan, saved_at=now, summary=summary)
                plans = [saved if p.name == cleaned else p for p in plans]
            else:
                final = _free_name(cleaned, taken)
                if len(final) > MAX_NAME_LENGTH:
                    raise PlanStoreError(f"a plan name is at most {MAX_NAME_LENGTH} characters")
                saved = SavedPlan(name=final, plan=plan, saved_at=now, summary=summary)
                plans.append(saved)
            self._write(plans)
        return saved

    def rename(self, old: str, new: str) -> SavedPlan:
        """Rename a plan; the new name must be free. Returns the renamed entry."""
        old_key = " ".join(old.split())
        new_name = clean_name(new)
        with self._locked():
            plans = self._read(for_write=True)
            index = _index_of(plans, old_key)
            if new_name != old_key and any(p.name == new_name for p in plans):
                raise PlanStoreError(f"a plan named '{new_name}' already exists")
            renamed = plans[index].model_copy(update={"name": new_name})
            plans[index] = renamed
            self._write(plans)
        return renamed

    def remove(self, name: str) -> SavedPlan:
        """Delete a plan. Returns what was removed."""
        with self._locked():
            plans = self._read(for_write=True)
            index = _index_of(plans, " ".join(name.split()))
            removed = plans.pop(index)
            self._write(plans)
        return removed

    # -- the file --------------------------------------------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold an exclusive lock on ``plans.json.lock`` around a read-change-write.

        Two writers (the dashboard and ``hwdash plan --save`` in a script) would otherwise both read
        the old list and the second write would drop the first one's plan. Where ``fcntl`` does not
        exist (Windows) the lock is skipped; the atomic replace still keeps the file whole.
        """
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not on the platforms we test
            yield
            return
        lock_path = self.path.with_name(self.path.name + ".lock")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(lock_path, "a")  # noqa: SIM115 - held across the yield
        except OSError as exc:
            raise PlanStoreError(f"{lock_path}: cannot lock plans: {exc.strerror or exc}") from None
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            yield
        finally:
            handle.close()  # closing releases the lock

    def _read(self, *, for_write: bool = False) -> builtins.list[SavedPlan]:
        """The saved plans. A broken file is moved aside only by a write (``for_write``); a read
        says where it is and what is wrong, and leaves it as it is."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise PlanStoreError(f"{self.path}: cannot be read: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            self._refuse(for_write, "is not a text file")
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            self._refuse(for_write, f"is not valid JSON (line {exc.lineno}: {exc.msg})")
        except (RecursionError, ValueError):
            self._refuse(for_write, "is not usable JSON (nested too deeply, or a number too long)")
        if not isinstance(raw, dict) or raw.get("format") != PLANS_FORMAT:
            self._refuse(for_write, "is not a hwdash plans file")
        version = raw.get("version")
        if isinstance(version, int) and not isinstance(version, bool) and version > PLANS_VERSION:
            # A newer hwdash wrote it: its plans are fine, this hwdash is old. Never move it
            # aside (the newer hwdash would lose its plans) and never overwrite it.
            raise PlanStoreError(
                f"{self.path}: written by a newer hwdash (format version {version}; this one "
                f"reads version {PLANS_VERSION}): upgrade hwdash to use it; the file is left as it is"
            )
        if version != PLANS_VERSION:
            self._refuse(
                for_write,
                f"has format version {version!r}, and this hwdash reads version {PLANS_VERSION}",
            )
        try:
            parsed = _PlansFile.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            self._refuse(for_write, f"has a bad entry at {where}: {first['msg']}")
        return builtins.list(parsed.plans)

    def _refuse(self, move: bool, reason: str) -> NoReturn:
        """Raise :class:`PlanStoreError` for a broken file, moving it aside first when ``move``."""
        if not move:
            raise PlanStoreError(
                f"{self.path}: {reason}; left as it is: fix or remove it "
                "(saving a plan moves it aside and starts a new list)"
            )
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        backup = self.path.with_name(f"{self.path.name}.bak-{stamp}")
        counter = 2
        while backup.exists():
            backup = self.path.with_name(f"{self.path.name}.bak-{stamp}-{counter}")
            counter += 1
        try:
            os.replace(self.path, backup)
        except OSError as exc:
            raise PlanStoreError(
                f"{self.path}: {reason}; could not move it aside ({exc.strerror or exc}): "
                "fix or remove it by hand"
            ) from None
        raise PlanStoreError(
            f"{self.path}: {reason}; moved it to {backup} and started a new list",
            backup=backup,
        )

    def _write(self, plans: builtins.list[SavedPlan]) -> None:
        document = _PlansFile(format=PLANS_FORMAT, version=PLANS_VERSION, plans=plans)
        text = strict_json.dumps(document.model_dump(mode="json"), indent=2, ensure_ascii=False)
        text += "\n"
        folder = self.path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
            handle, temp_name = tempfile.mkstemp(
                prefix=f".{self.path.name}.", suffix=".tmp", dir=folder
            )
        except OSError as exc:
            raise PlanStoreError(f"{folder}: cannot write plans: {exc.strerror or exc}") from None
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp_name, self.path)
        except OSError as exc:
            Path(temp_name).unlink(missing_ok=True)
            raise PlanStoreError(
                f"{self.path}: cannot write plans: {exc.strerror or exc}"
            ) from None


def _free_name(name: str, taken: set[str]) -> str:
    if name not in taken:
        return name
    counter = 2
    while f"{name} ({counter})" in taken:
        counter += 1
    return f"{name} ({counter})"


def _index_of(plans: list[SavedPlan], name: str) -> int:
    for index, saved in enumerate(plans):
        if saved.name == name:
            return index
    raise PlanStoreError(f"no saved plan named '{name}'")


@dataclass(frozen=True)
class SummaryView:
    """The summary a display should show for one saved plan."""

    summary: PlanSummary | None
    """Today's estimate, or the cached one when it cannot be recomputed (None when neither exists)."""
    fresh: bool
    """True when recomputed against the current catalog."""
    problem: str = ""
    """Why it could not be recomputed (empty when fresh)."""
    report: PlanReport | None = None
    """The full recomputed report, when fresh."""


def current_summary(saved: SavedPlan, catalog: Catalog) -> SummaryView:
    """Recompute a saved plan's summary against ``catalog``; fall back to the cached one on failure."""
    from hwdash.core.planning.fit import evaluate_plan
    from hwdash.core.planning.serving_plan import engine_report

    try:
        # a serving plan: the verdicts and the memory are the engine's, as the planner saved them
        report = engine_report(evaluate_plan(saved.plan, catalog), catalog)
    except (UsageError, CatalogError, ValueError) as exc:
        return SummaryView(summary=saved.summary, fresh=False, problem=str(exc))
    return SummaryView(summary=PlanSummary.from_report(report), fresh=True, report=report)
