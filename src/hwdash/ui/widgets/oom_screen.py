"""Why a process ran out of memory (``s`` in a process's detail): its allocator snapshot read as
``hwdash oom`` reads it, and held against the run's plan when the run names one.

The snapshot is read on a worker thread (a large one takes a second or two); the screen says so
meanwhile and shows one line instead of the report when the file cannot be read.
"""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

WIDTH = 96


def oom_text(path: str, plan: str | None, width: int = WIDTH) -> str:
    """The report of the snapshot at ``path`` (and against ``plan``), or why it cannot be read."""
    from hwdash.errors import UsageError
    from hwdash.runs.oom_analysis import analyse
    from hwdash.runs.oom_snapshot import read_snapshot
    from hwdash.runs.oom_text import block_lines, category_lines, header_lines, site_lines

    try:
        report = analyse(read_snapshot(path))
    except (UsageError, OSError, ValueError) as exc:
        return f"cannot read {path}: {exc}"
    width = min(width, 80)
    if plan is None:
        against = "no plan named by the run: hwdash oom PATH --plan NAME holds it against one"
    else:
        against = _against(report, plan).strip("\n")
    parts = [
        "\n".join(header_lines(report, path, width)),
        "\n".join(category_lines(report, width)),
        against,  # what the plan said, before the details
        "\n".join(site_lines(report, width)),
        "\n".join(block_lines(report, width)),
    ]
    return "\n\n".join(parts) + "\n"


def _against(report: object, reference: str) -> str:
    from hwdash.core.catalog import load_catalog
    from hwdash.errors import UsageError
    from hwdash.runs.oom_plan import compare, comparison_lines
    from hwdash.runs.plans import read_plan_reference

    try:
        name, plan = read_plan_reference(reference)
        comparison = compare(report, name, plan, load_catalog())  # type: ignore[arg-type]
    except (UsageError, OSError, ValueError) as exc:
        return f"\nthe plan {reference} could not be read: {exc}\n"
    lines = ["", *comparison_lines(comparison, width=WIDTH - 4)]
    lines.append(f"  the changes that fit: hwdash oom PATH --plan {reference} --fit FLAVOR")
    return "\n".join(lines) + "\n"


class OomScreen(ModalScreen[None]):
    """One allocator snapshot, read in the background."""

    DEFAULT_CSS = """
    OomScreen { align: center middle; }
    OomScreen > VerticalScroll {
        width: 100; max-width: 100%; height: auto; max-height: 100%;
        border: round $error; background: $surface; padding: 0 1;
    }
    OomScreen #oom-keys { color: $text-muted; }
    """

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,s", "dismiss", "Close")]

    def __init__(self, path: str, plan: str | None) -> None:
        super().__init__()
        self.path = path
        self.plan = plan
        self.body = Static(f"reading {path} ...", id="oom-body", markup=False)
        self.shown = ""
        """The text on screen once read (tests read it)."""

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield self.body
            yield Static("escape close", id="oom-keys", markup=False)

    def on_mount(self) -> None:
        self.run_worker(self._read, thread=True, exclusive=True)

    def _read(self) -> None:
        text = oom_text(self.path, self.plan)
        self.app.call_from_thread(self._show, text)

    def _show(self, text: str) -> None:
        self.shown = text
        self.body.update(text)
