"""A ``Select`` that survives the edges of its life: being set while it is still being built, and
being torn down while it is being built.

Textual's ``Select`` looks up its two parts (``SelectCurrent``, the line showing the choice, and
``SelectOverlay``, the list) whenever its value changes and when it is mounted
(textual/widgets/_select.py ``_watch_value``, ``_on_mount``). Two moments break those look-ups:

* a value set after the ``Select`` has its parts but before ``SelectCurrent`` has built its own
  label (a saved plan loaded into the planner while the form is still being mounted):
  ``NoMatches: '#label'``;
* an app that quits while the pane is being mounted after the first frame: the teardown removes
  the parts before the ``Select``'s mount handler runs, ``NoMatches: 'SelectOverlay'``.

:class:`FormSelect` keeps a value set before it is mounted and shows it once it is, and skips the
mount handler when its parts are gone.
"""

from __future__ import annotations

from typing import Any

from textual import events
from textual.widgets import Select
from textual.widgets._select import SelectCurrent, SelectOverlay, SelectType


class FormSelect(Select[SelectType]):
    """Textual's ``Select``, safe to set before it is mounted and to tear down mid-mount."""

    _value_to_show = False
    """A value was set before mounting: show it once mounted (``Select``'s mount assigns the same
    value again, which runs no watcher, so the line would keep the prompt)."""

    def _on_mount(self, event: events.Mount) -> None:
        # Runs before Select._on_mount (Textual calls each class's handler, subclass first).
        if not self.query(SelectCurrent) or not self.query(SelectOverlay):
            # Torn down while being built: nothing to show it on; the value is still its own.
            event.prevent_default()
            self.set_reactive(Select.value, self._value)  # type: ignore[misc]  # (the descriptor)

    def _parts_ready(self) -> bool:
        """Whether the parts showing the choice are there: the line with its label (built after
        the line itself, removed before it) and the list."""
        return bool(self.query("SelectCurrent > #label")) and bool(self.query(SelectOverlay))

    def _watch_value(self, value: Any) -> None:
        if not self._parts_ready():
            # Not built yet, its parts without their own parts yet, or being torn down: keep the
            # value (Select._on_mount shows ``self._value``).
            self._value = value
            self._value_to_show = True
            return
        super()._watch_value(value)

    def _init_selected_option(self, hint: Any = Select.NULL) -> None:
        super()._init_selected_option(hint)
        if self._value_to_show and self._parts_ready():
            self._value_to_show = False
            super()._watch_value(self.value)
