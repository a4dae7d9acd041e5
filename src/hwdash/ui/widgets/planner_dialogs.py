"""Small modal dialogs shared by the planner and the compare view: ask for a name, confirm an action."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from hwdash.ui.widgets.ordered_input import OrderedInput


class NameDialog(ModalScreen[str | None]):
    """Ask for a plan name. Dismisses with the text (``enter``/OK) or None (``escape``/Cancel).

    ``describe`` turns the current text into a hint line under the input (e.g. "will be saved as
    'x (2)'"), or raises ``ValueError`` whose message is shown as an error and blocks OK.
    """

    DEFAULT_CSS = """
    NameDialog {
        align: center middle;
    }
    NameDialog > Vertical {
        width: 60;
        max-width: 100%;
        height: auto;
        border: round $accent;
        background: $surface;
        padding: 0 1;
    }
    NameDialog #name-hint {
        color: $text-muted;
        height: auto;
    }
    NameDialog #name-hint.-error {
        color: $error;
    }
    NameDialog Horizontal {
        height: auto;
        align-horizontal: right;
    }
    NameDialog Button {
        margin-left: 1;
        min-width: 10;
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(
        self,
        title: str,
        initial: str,
        *,
        describe: Callable[[str], str] | None = None,
        ok_label: str = "OK",
    ) -> None:
        super().__init__()
        self.title_text = title
        self.initial = initial
        self.describe = describe
        self.ok_label = ok_label

    def compose(self) -> ComposeResult:
        with Vertical():
            # The title and the hint quote plan names, which are the user's: text, never markup.
            yield Label(self.title_text, id="name-title", markup=False)
            yield OrderedInput(self.initial, id="name-input", compact=True)
            yield Static("", id="name-hint", markup=False)
            with Horizontal():
                yield Button(self.ok_label, id="name-ok", variant="primary", compact=True)
                yield Button("Cancel", id="name-cancel", compact=True)

    def on_mount(self) -> None:
        self._update_hint(self.initial)
        self.query_one("#name-input", Input).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self._update_hint(event.value)

    def _update_hint(self, text: str) -> bool:
        hint = self.query_one("#name-hint", Static)
        if self.describe is None:
            return True
        try:
            message = self.describe(text)
        except ValueError as exc:
            hint.update(str(exc))
            hint.add_class("-error")
            return False
        hint.update(message)
        hint.remove_class("-error")
        return True

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._accept()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "name-ok":
            self._accept()
        else:
            self.dismiss(None)

    def _accept(self) -> None:
        text = self.query_one("#name-input", Input).value
        if self._update_hint(text):
            self.dismiss(text)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ConfirmDialog(ModalScreen[bool]):
    """Ask a yes/no question. ``y``/``enter`` on Yes confirms; ``n``/``escape`` declines."""

    DEFAULT_CSS = """
    ConfirmDialog {
        align: center middle;
    }
    ConfirmDialog > Vertical {
        width: 60;
        max-width: 100%;
        height: auto;
        border: round $warning;
        background: $surface;
        padding: 0 1;
    }
    ConfirmDialog #confirm-question {
        width: 100%;  /* wrap a long question (a kill's command line) instead of cutting it */
    }
    ConfirmDialog Horizontal {
        height: auto;
        align-horizontal: right;
    }
    ConfirmDialog Button {
        margin-left: 1;
        min-width: 8;
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.question, id="confirm-question", markup=False)  # quotes plan names
            with Horizontal():
                yield Button("Yes", id="confirm-yes", variant="error", compact=True)
                yield Button("No", id="confirm-no", compact=True)

    def on_mount(self) -> None:
        self.query_one("#confirm-no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "confirm-yes")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)
