"""Minimal repro: an Input's bound keys run after characters that arrived later in the same burst.

Upstream: Textualize/textual#6605 ("Input/Textarea action synchronization bug", open), with a fix
proposed in Textualize/textual#6631 (open). Seen with textual 8.2.8.

What happens
    A printable key is typed by ``Input._on_key`` as soon as the key reaches the field. A key bound on
    the Input (backspace, ctrl+u, ctrl+e/end, left/right, ...) has no handler in the field: the Key
    event bubbles up through every ancestor's message queue, and only ``App._on_key`` looks the key
    up (``App._check_bindings`` over ``Screen._modal_binding_chain``, which starts at the focused
    Input) and runs the Input's action. Meanwhile ``App.on_event`` has already forwarded the later
    keys of the burst to the focused Input, which typed them. So the layer at fault is the app's key
    dispatch (textual/app.py: ``on_event`` forwards, ``_on_key`` resolves non-priority bindings only
    after the bubble), not the driver's parser (``XTermParser.feed`` returns the keys in order) and
    not Input's editing actions (each is right on its own).

Reproduce
    python docs/upstream/textual_key_order.py --check
        headless: feeds ``XTermParser`` one chunk, ctrl+u then "world" (what one read() of the
        terminal gives), posts the events to the app as the Linux driver does, and prints the
        field; exit 1 when the field is wrong. Expected "world"; textual 8.2.8 gives "".
    python docs/upstream/textual_key_order.py
        in a real terminal, e.g. in tmux, then from another pane send the keys in one write:
        ``tmux send-keys -t <pane> C-u world`` (or paste a macro that types them). The field should
        read "world"; it reads "" (ctrl+u ran after the five letters). ``--check`` needs no terminal.

A workaround (what hwdash does in src/hwdash/ui/widgets/ordered_input.py): a subclass of Input whose
``_on_key`` runs the field's own non-priority bindings inline and stops the event.
"""

from __future__ import annotations

import asyncio
import sys

from textual._xterm_parser import XTermParser  # the parser the drivers feed each read() to
from textual.app import App, ComposeResult
from textual.widgets import Input

BURST = "\x15world"  # ctrl+u, then w o r l d, as one chunk from the terminal
EXPECTED = "world"


class KeyOrderApp(App[None]):
    """One text field that starts with text and the cursor at its end."""

    def compose(self) -> ComposeResult:
        yield Input("hello ")


async def check() -> int:
    app = KeyOrderApp()
    async with app.run_test() as pilot:
        field = app.query_one(Input)
        field.focus()
        await pilot.pause()
        for event in XTermParser().feed(BURST):
            app.post_message(event)  # what the driver does with each parsed event
        for _ in range(5):
            await pilot.pause()
        value = field.value
    print(f"field after ctrl+u, 'world' in one burst: {value!r} (expected {EXPECTED!r})")
    return 0 if value == EXPECTED else 1


if __name__ == "__main__":
    if "--check" in sys.argv[1:]:
        sys.exit(asyncio.run(check()))
    KeyOrderApp().run()
