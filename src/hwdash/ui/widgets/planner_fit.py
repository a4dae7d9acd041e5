"""The planner's "make it fit" dialog: the options for one flavor; enter applies one, escape leaves."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from hwdash.core.planning.fit_options import FitOption, FitSearch
from hwdash.core.results import FitVerdict
from hwdash.core.units import GIB


def option_prompt(number: int, option: FitOption) -> Text:
    """One option as two lines: the changes, then kind, memory, headroom and slowdown. The kind
    is set off from the figures by a " · ": spaces alone vanish where a line wraps or is copied
    out of the terminal ("keeps the experiment18.9 GiB")."""
    prompt = Text(f"{number}. ", style="bold")
    prompt.append("; ".join(option.words))  # plain text: never markup
    kind = "keeps the experiment" if option.keeps_experiment else "changes the experiment"
    style = "green" if option.keeps_experiment else "yellow"
    prompt.append("\n   ")
    prompt.append(kind, style=style)
    fit = option.fit
    # short enough for one line of the dialog at 80 columns (72 inside it)
    details = f" · {fit.need_bytes / GIB:.1f} GiB/GPU, {fit.headroom_bytes / GIB:+.1f} GiB free"
    if fit.verdict is FitVerdict.TIGHT:
        details += " (tight)"
    if option.slowdown is not None:
        details += f", x{option.slowdown:.2f} step time"
    prompt.append(details, style="dim")
    return prompt


class FitOptionsDialog(ModalScreen[FitOption | None]):
    """Options that make the plan fit a flavor. Dismisses with the chosen option, or None."""

    DEFAULT_CSS = """
    FitOptionsDialog {
        align: center middle;
    }
    FitOptionsDialog > Vertical {
        width: 84;
        max-width: 100%;
        height: auto;
        max-height: 90%;
        border: round $accent;
        background: $surface;
        padding: 0 1;
    }
    FitOptionsDialog #fit-title {
        text-style: bold;
        height: auto;
    }
    FitOptionsDialog #fit-hint, FitOptionsDialog #fit-closest-title {
        color: $text-muted;
        height: auto;
    }
    FitOptionsDialog OptionList {
        height: auto;
        max-height: 18;
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Leave")]

    def __init__(self, search: FitSearch, flavor_label: str) -> None:
        super().__init__()
        self.search = search
        self.flavor_label = flavor_label

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text(f"Make it fit {self.flavor_label}"), id="fit-title")
            if self.search.options:
                yield OptionList(
                    *(
                        Option(option_prompt(number, option), id=str(number - 1))
                        for number, option in enumerate(self.search.options, 1)
                    ),
                    id="fit-options",
                )
                hint = "enter applies the option to the form · escape leaves"
            elif self.search.fits_already:
                hint = "It fits as it is: nothing to change. escape leaves"
            else:
                hint = " ".join(self.search.notes) or "Nothing tried fits."
                hint += " escape leaves"
                if self.search.closest:
                    # the target's own options least over its memory: shown, never applied
                    yield Static(
                        Text(
                            f"Closest to fitting {self.flavor_label} (least over; none fits):",
                            style="bold",
                        ),
                        id="fit-closest-title",
                    )
                    yield OptionList(
                        *(
                            Option(option_prompt(number, option), disabled=True)
                            for number, option in enumerate(self.search.closest, 1)
                        ),
                        id="fit-closest",
                    )
            for note in self.search.notes if self.search.options else ():
                yield Static(Text(note), classes="fit-note")
            yield Static(Text(hint), id="fit-hint")

    def on_mount(self) -> None:
        if self.search.options:
            self.query_one("#fit-options", OptionList).focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option_list.id == "fit-options" and event.option_id is not None:
            self.dismiss(self.search.options[int(event.option_id)])

    def action_cancel(self) -> None:
        self.dismiss(None)
