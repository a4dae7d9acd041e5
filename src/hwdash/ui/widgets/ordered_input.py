"""An :class:`~textual.widgets.Input` that handles its own editing keys in the order they arrive.

Textual (8.2.8) types a printable key in ``Input._on_key`` as the key reaches the field, but an
editing key bound on the Input (backspace, ctrl+u, end, the arrows) has no handler there: the event
bubbles up the DOM, one message queue per ancestor, and only the app's ``_on_key`` looks up the
binding and runs it (textual/app.py ``App._on_key`` -> ``_check_bindings``). When the terminal
delivers several keys in one read, the app forwards the later characters to the field before the
bound key has made that trip, so ``ctrl+u`` then ``llama`` leaves an empty field, and ``x``,
backspace, ``y`` gives ``x``. Upstream: Textualize/textual#6605; repro in
docs/upstream/textual_key_order.py.

Here the field runs its own bindings as the key arrives, by the same lookup the app does. The
focused widget is the first place the app looks for a binding (``Screen._binding_chain`` starts at
the focused node), and priority bindings are checked before the key is forwarded at all
(``App.on_event``), so the key runs the same action as before, only in its place in the burst.
"""

from __future__ import annotations

from textual import events
from textual.widgets import Input


class OrderedInput(Input):
    """A text field whose bound keys (backspace, ctrl+u, arrows, enter) keep their order among
    typed characters that arrive in the same burst."""

    async def _on_key(self, event: events.Key) -> None:
        if event.is_printable:
            return  # Input._on_key types it
        # ``_bindings`` is the map ``Screen._binding_chain`` reads for this node (keymap applied).
        for binding in self._bindings.key_to_bindings.get(event.key, ()):
            if binding.priority:
                continue  # the app ran those before forwarding the key
            if await self.app.run_action(binding.action, self):
                event.stop()
                event.prevent_default()  # handled: Input._on_key and the bubble are skipped
                self._restart_blink()
                return
