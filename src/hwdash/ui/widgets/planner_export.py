"""The planner's export dialog: choose a format, and the current plan is written to a file."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

#: (format, what it is) in the order the dialog lists them.
FORMATS = (
    ("deepspeed", "DeepSpeed JSON config (ZeRO, offload, batch sizes)"),
    ("trainer", "Hugging Face Trainer / TRL arguments with PEFT and bitsandbytes (Python)"),
    ("accelerate", "accelerate config YAML"),
    ("hf-jobs", "the `hf jobs uv run` line, with a timeout and its cost"),
)


class ExportDialog(ModalScreen[str | None]):
    """Pick an export format. Dismisses with the format, or None (escape)."""

    DEFAULT_CSS = """
    ExportDialog {
        align: center middle;
    }
    ExportDialog > Vertical {
        width: 76;
        max-width: 100%;
        height: auto;
        border: round $accent;
        background: $surface;
        padding: 0 1;
    }
    ExportDialog #export-title {
        text-style: bold;
    }
    ExportDialog #export-hint {
        color: $text-muted;
    }
    ExportDialog OptionList {
        height: auto;
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Leave")]

    def __init__(self, folder: str) -> None:
        super().__init__()
        self.folder = folder

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text("Export the plan"), id="export-title")
            yield OptionList(
                *(Option(Text(f"{name:<11}{words}"), id=name) for name, words in FORMATS),
                id="export-formats",
            )
            yield Static(
                Text(f"enter writes the file in {self.folder} · escape leaves"), id="export-hint"
            )

    def on_mount(self) -> None:
        self.query_one(OptionList).focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(event.option_id)

    def action_cancel(self) -> None:
        self.dismiss(None)
