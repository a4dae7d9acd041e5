"""The planner's dialogs: make it fit (``f``), export (``e``) and save (``s``), each an action that
opens a dialog and acts on the answer.

Part of :class:`~hwdash.ui.planner_pane.PlannerPane` (a mixin, see :mod:`hwdash.ui.planner_base`).
May import the core, Textual, the planner widgets and :mod:`hwdash.ui.planner_base`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from hwdash.core.planning.fit_options import FitOption, closest_flavor
from hwdash.core.planning.local_flavor import LOCAL_FLAVOR_ID
from hwdash.core.planning.serving_command import server_command
from hwdash.core.planning.serving_fit import fit_options_for
from hwdash.core.plans.exports import FILE_SUFFIXES, export_text
from hwdash.core.plans.store import (
    PlanStoreError,
    PlanSummary,
    clean_name,
    default_exports_folder,
)
from hwdash.core.results import FlavorFit, PlanReport
from hwdash.errors import UsageError
from hwdash.ui.planner_base import PlannerParts
from hwdash.ui.widgets.planner_dialogs import ConfirmDialog, NameDialog
from hwdash.ui.widgets.planner_export import FORMATS, SERVER_FORMAT, ExportDialog
from hwdash.ui.widgets.planner_fit import FitOptionsDialog
from hwdash.ui.widgets.planner_flavors import FlavorTable
from hwdash.ui.widgets.planner_serving import serving_memory_shown


class PlannerDialogs(PlannerParts):
    """The planner pane's actions that ask something in a dialog: fit options, export, save."""

    def action_fit_options(self) -> None:
        """Options that make the plan fit the selected flavor (else the recommended one, else
        the cheapest that comes close): enter applies one to the form."""
        report = self.report
        if report is None or self.errors:
            self.notify(
                "Nothing to fit: fix the marked fields first.", severity="warning", timeout=4
            )
            return
        fit = self._flavor_to_fit(report)
        if fit is None:
            self.notify("No GPU flavor to fit.", severity="warning", timeout=4, markup=False)
            return
        flavor = fit.flavor
        search = fit_options_for(report.plan, report.model, self.catalog, flavor.id, [flavor])
        label = flavor.id + (" (this machine)" if flavor.id == LOCAL_FLAVOR_ID else "")

        def chosen(option: FitOption | None) -> None:
            if option is None:
                return
            self.load_plan(option.plan)
            applied = "Applied: " + "; ".join(option.words)
            self.notify(applied, title="Make it fit", timeout=5, markup=False)

        self.app.push_screen(FitOptionsDialog(search, label), chosen)

    def _flavor_to_fit(self, report: PlanReport) -> FlavorFit | None:
        """The flavor to fit: the table's row under the cursor, else the recommended one, else
        the closest."""
        table = self.query_one(FlavorTable)
        if 0 <= table.cursor_row < len(table.shown) and table.has_focus:
            return table.shown[table.cursor_row]
        by_id = {fit.flavor.id: fit for fit in report.flavors}
        if report.recommended in by_id:
            return by_id[report.recommended]
        return closest_flavor(report)

    def action_export(self) -> None:
        """Choose a format and a file (default: the exports folder in hwdash's data folder); a
        file that exists is replaced only after a yes."""
        report = self.report
        if report is None or self.errors:
            self.notify(
                "Nothing to export: fix the marked fields first.", severity="warning", timeout=4
            )
            return
        folder = default_exports_folder()
        stem = re.sub(r"[^A-Za-z0-9._-]+", "-", report.model.id).strip("-") or "plan"
        # a serving plan: the server's command line first (hwdash plan --export vllm)
        formats = (SERVER_FORMAT, *FORMATS) if report.plan.is_serving else FORMATS
        suffixes = {**FILE_SUFFIXES, SERVER_FORMAT[0]: "sh"}
        paths = {kind: folder / f"hwdash-{stem}-{kind}.{suffixes[kind]}" for kind, _ in formats}

        def chosen(result: tuple[str, Path] | None) -> None:
            if result is None:
                return
            kind, path = result
            try:
                if kind == SERVER_FORMAT[0]:
                    text, notes = self._server_command(report)
                else:
                    text, notes = export_text(kind, report, self.catalog)
            except (ValueError, UsageError) as exc:
                self.notify(str(exc), title="Export", severity="error", timeout=8, markup=False)
                return
            if not path.exists():
                self._write_export(path, text, notes)
                return

            def answered(replace_it: bool | None) -> None:
                if replace_it:
                    self._write_export(path, text, notes)
                else:
                    message = f"not written: {path} is as it was"
                    self.notify(message, title="Export", timeout=5, markup=False)

            question = f"Replace the file that exists?\n{path}"
            self.app.push_screen(ConfirmDialog(question), answered)

        self.app.push_screen(ExportDialog(paths, formats), chosen)

    def _server_command(self, report: PlanReport) -> tuple[str, list[str]]:
        """A serving plan's ``vllm serve`` (or SGLang) line on the flavor of the serving lines,
        the text ``hwdash plan --export vllm`` writes; raises ``ValueError`` without a GPU
        flavor to size it for."""
        shown = serving_memory_shown(report, self.catalog)
        if shown is None:
            raise ValueError("no GPU flavor to size the server for: add a flavor with a GPU")
        flavor, memory = shown
        model_id = report.model.hf_id or report.plan.model
        text = server_command(memory, model_id, report.plan.quant)
        return text, [f"sized for {flavor}: {memory.max_concurrency:.2f}x max concurrency"]

    def _write_export(self, path: Path, text: str, notes: Sequence[str]) -> None:
        """Write an export and say where (or why not)."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        except OSError as exc:
            message = f"cannot write {path}: {exc.strerror or exc}"
            self.notify(message, title="Export", severity="error", timeout=8, markup=False)
            return
        self.exported = path
        message = "\n".join([f"wrote {path}", *notes])
        self.notify(message, title="Export", timeout=8, markup=False)

    def action_save_current(self, name: str | None = None) -> None:
        """Save the current plan: under ``name``, or after asking (default: model and method)."""
        report = self.report
        if report is None or self.errors:
            self.notify(
                "Nothing to save: fix the marked fields first.", severity="warning", timeout=4
            )
            return
        if name is not None:
            self._save(name, report)
            return

        def describe(text: str) -> str:
            try:
                clean_name(text)
            except PlanStoreError as exc:
                raise ValueError(str(exc)) from None  # the name itself is unusable
            try:
                final = self.store.unique_name(text)
            except PlanStoreError as exc:
                # A broken plans file: the dialog says so, and saving moves it aside.
                return str(exc)
            if final != " ".join(text.split()):
                return f"that name is taken: will save as '{final}'"
            return f"saves to {self.store.path}"

        def saved(result: str | None) -> None:
            if result is not None:
                self._save(result, report)

        default = report.plan.default_name(report.model.name)
        self.app.push_screen(
            NameDialog("Save plan as", default, describe=describe, ok_label="Save"), saved
        )

    def save_current(self, name: str | None = None) -> None:
        """Public alias of the ``s`` action (see :meth:`action_save_current`)."""
        self.action_save_current(name)

    def _save(self, name: str, report: PlanReport) -> None:
        """Save ``report``'s plan under ``name``; a broken plans file is moved aside and the save
        tried once more."""
        summary = PlanSummary.from_report(report)
        try:
            saved = self.store.save(name, report.plan, summary=summary)
        except PlanStoreError as exc:
            self.notify(str(exc), title="Plans file", severity="error", timeout=10, markup=False)
            if exc.backup is None:
                return
            # The broken file was moved aside; the store is empty now, so saving again works.
            try:
                saved = self.store.save(name, report.plan, summary=summary)
            except PlanStoreError as again:
                self.notify(
                    str(again), title="Plans file", severity="error", timeout=10, markup=False
                )
                return
        self.notify(f"Saved plan '{saved.name}'", title="Planner", timeout=4, markup=False)
        self._announce_saved(saved)
        self._chosen_name = saved.name
        self.request_recompute()  # the monitor now draws the plan under its saved name
