"""A checkbox whose two states differ at a glance.

Textual's ``Checkbox`` draws ``▐X▌`` both on and off and tells them apart by colour alone, which a
monochrome terminal, a colour-blind user or a screenshot in a bug report loses. This one draws the
``X`` only when the box is ticked (``▐X▌`` on, ``▐ ▌`` off).
"""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Checkbox

#: What the box holds when ticked and when not.
TICKED = "X"
UNTICKED = " "


class Check(Checkbox):
    """A ``Checkbox`` showing ``X`` only when on."""

    @property
    def _button(self) -> Content:
        self.BUTTON_INNER = TICKED if self.value else UNTICKED
        return super()._button
