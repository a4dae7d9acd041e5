"""What the planner pane's parts share: the state :class:`~hwdash.ui.planner_pane.PlannerPane`
holds, declared once for the form (:mod:`hwdash.ui.planner_form`), the results
(:mod:`hwdash.ui.planner_results`) and the dialogs (:mod:`hwdash.ui.planner_dialog_actions`).

The parts are mixins of the pane: at run time they derive from ``object`` (Textual sees only the
pane's own class, so its CSS type names, bindings and handlers are the pane's), and for the type
checker from :class:`~textual.widget.Widget`. May import the core and Textual, not the other parts.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from hwdash.core.catalog import Catalog
from hwdash.core.plan import Plan
from hwdash.core.planning.max_fit import MaxField
from hwdash.core.plans.store import PlanStore, SavedPlan
from hwdash.core.results import PlanReport

if TYPE_CHECKING:
    from textual.widget import Widget

    _PaneWidget = Widget
else:
    _PaneWidget = object


class PlannerParts(_PaneWidget):
    """The planner pane's state and the methods its parts call on one another."""

    catalog: Catalog
    store: PlanStore
    report: PlanReport | None
    errors: dict[str, str]
    exported: Path | None
    max_field: MaxField | None
    _base: Plan
    _starting_plan: Plan
    _chosen_defaults: set[str]
    _shown_defaults: dict[str, Any]
    _chosen_name: str | None
    _load_pending: bool
    _shown_errors: dict[str, str] | None

    if TYPE_CHECKING:

        def request_recompute(self) -> None: ...

        def load_plan(self, plan: Plan, name: str | None = None) -> None: ...

        def _announce_saved(self, saved: SavedPlan) -> None: ...
