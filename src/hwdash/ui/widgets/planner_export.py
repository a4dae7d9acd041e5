"""The planner's export dialog: choose a format and the file; the pane writes it (asking first
when the file exists)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from hwdash.ui.widgets.ordered_input import OrderedInput

#: (format, what it is) in the order the dialog lists them.
FORMATS = (
    ("deepspeed", "DeepSpeed JSON config (ZeRO, offload, batch sizes)"),
    ("trainer", "Hugging Face Trainer / TRL arguments with PEFT and bitsandbytes (Python)"),
    ("accelerate", "accelerate config YAML"),
    ("hf-jobs", "the `hf jobs uv run` line, with a timeout and its cost"),
)
#: A serving plan's (``--engine vllm|sglang``) format, listed first: ``hwdash plan --export vllm``.
SERVER_FORMAT = ("vllm", "the `vllm serve` (SGLang: launch_server) line with the settings shown")

#: What the hint says while nothing is wrong with the path.
HINT = "enter writes the file · tab edits the path · escape leaves"


def resolve_export_path(text: str, default: Path) -> Path:
    """The file a typed path names: ``~`` expanded, relative to the folder hwdash started in (as
    ``hwdash plan -o``), and a folder gets the format's default file name. Raises ``ValueError``
    for an empty path."""
    text = text.strip()
    if not text:
        raise ValueError("name the file to write")
    path = Path(text).expanduser()
    if not path.is_absolute():
        path = Path.cwd() / path
    if path.is_dir():
        path = path / default.name
    return path


class ExportDialog(ModalScreen[tuple[str, Path] | None]):
    """Pick an export format and the file. Dismisses with (format, path), or None (escape).

    ``paths`` holds each format's default file; the path field follows the highlighted format
    until the user edits it."""

    DEFAULT_CSS = """
    ExportDialog {
        align: center middle;
    }
    ExportDialog > Vertical {
        width: 90;
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
        height: auto;
    }
    ExportDialog #export-hint.-warning {
        color: $warning;
    }
    ExportDialog #export-hint.-error {
        color: $error;
    }
    ExportDialog OptionList {
        height: auto;
    }
    ExportDialog Horizontal {
        height: auto;
        margin-top: 1;
    }
    ExportDialog Horizontal Label {
        width: 6;
        color: $text-muted;
    }
    ExportDialog #export-path {
        width: 1fr;
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Leave")]

    def __init__(
        self, paths: Mapping[str, Path], formats: tuple[tuple[str, str], ...] = FORMATS
    ) -> None:
        super().__init__()
        self.paths = dict(paths)
        self.formats = formats
        """(format, what it is) as listed: :data:`FORMATS`, a serving plan's with
        :data:`SERVER_FORMAT` first."""
        self._format = formats[0][0]
        self._default_shown = str(self.paths[self._format])
        """The default path the field was last given (a field that differs was edited)."""

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text("Export the plan"), id="export-title")
            yield OptionList(
                *(Option(Text(f"{name:<11}{words}"), id=name) for name, words in self.formats),
                id="export-formats",
            )
            with Horizontal():
                yield Label("file")
                yield OrderedInput(self._default_shown, compact=True, id="export-path")
            yield Static("", id="export-hint", markup=False)

    def on_mount(self) -> None:
        self.query_one(OptionList).focus()
        self._update_hint()

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        event.stop()
        if event.option_id is None:
            return
        self._format = event.option_id
        field = self.query_one("#export-path", Input)
        if field.value == self._default_shown:  # not edited: follow the format
            self._default_shown = str(self.paths[self._format])
            field.value = self._default_shown
        self._update_hint()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option_id is not None:
            self._format = event.option_id
            self._accept()

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self._update_hint()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._accept()

    @property
    def path_text(self) -> str:
        """What the path field holds."""
        return self.query_one("#export-path", Input).value

    def _update_hint(self) -> Path | None:
        hint = self.query_one("#export-hint", Static)
        try:
            path = resolve_export_path(self.path_text, self.paths[self._format])
        except ValueError as exc:
            hint.update(str(exc))
            hint.set_classes("-error")
            return None
        if path.exists():
            hint.update(f"{path} exists: enter asks before replacing it · escape leaves")
            hint.set_classes("-warning")
        else:
            hint.update(HINT)
            hint.set_classes("")
        return path

    def _accept(self) -> None:
        path = self._update_hint()
        if path is not None:
            self.dismiss((self._format, path))

    def action_cancel(self) -> None:
        self.dismiss(None)
