"""The planner's keys, in one list.

The planner pane binds them (they answer while focus is inside the pane), and the dashboard's tab
bar forwards them to the pane while the planner tab is shown (focus starts on the tab bar, and
escape leaves a field for it), so they work wherever the user is but in a text field. ``ctrl+s``
and ``ctrl+t`` work in a text field too. This module holds only the list, so the app reads it
without importing the planner, which it builds when first shown.
"""

from __future__ import annotations

from textual.binding import Binding

#: The footer shows the three sort keys as one item: ``1 2 3 sort``.
SORT_GROUP = Binding.Group("sort", compact=True)

#: Keys that share an action show once in the footer: the first that works where the focus is
#: (``s`` outside a text field, ``ctrl+s`` in one).
PLANNER_BINDINGS: tuple[Binding, ...] = (
    Binding("s", "save_current", "Save"),
    Binding("ctrl+s", "save_current", "Save"),
    Binding("t", "trace", "Trace"),
    Binding("ctrl+t", "trace", "Trace"),
    # Shown in the help, not the footer: at 80 columns they pushed the app's keys off.
    Binding("1", "sort('cost')", "Sort cost", group=SORT_GROUP, show=False),
    Binding("2", "sort('time')", "Sort time", group=SORT_GROUP, show=False),
    Binding("3", "sort('memory')", "Sort memory", group=SORT_GROUP, show=False),
    Binding("f", "fit_options", "Fit it"),
    Binding("e", "export", "Export", show=False),
    Binding("o", "toggle_fits_only", "Fits only", show=False),
    Binding("v", "next_provider", "Provider", show=False),
    Binding("x", "next_max", "Max column", show=False),
)
