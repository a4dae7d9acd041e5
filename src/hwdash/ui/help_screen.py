"""The help screen (``?``): every key of every tab, in one list.

May import Textual only.
"""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

#: Every key of every tab (tests/ui/test_keys.py checks that each binding is listed). A key line
#: is two spaces, the keys (``a / b``), two spaces or more, what they do.
HELP_TEXT = """\
[b]hwdash[/b]: will it fit, what will it cost, is it about to run out?

[b]Everywhere[/b] (but in a text field, where escape leaves the field)
  p             planner: what a plan needs in memory, time and cost
  c             compare saved plans side by side
  m             live monitor of the GPUs and the host
  ?             this help
  q / ctrl+q    quit (ctrl+q also in a text field)
  tab           next field or table (shift+tab: the one before)
  escape        leave a field for the tab bar (where these keys work)
  left / right  on the tab bar: the tab before / after (or click a tab)
  ctrl+l        redraw the whole screen
  ctrl+p        command palette (themes, keys)

[b]Monitor[/b]
  o             sort the process table by the next column (or click one)
  O             reverse the order (when the table has focus)
  up / down     move in the process table
  home / end    its first or last process
  enter         the selected process in detail (memory history, command,
                PyTorch allocated/reserved where it runs hwdash.probe)
  k / K         SIGTERM / SIGKILL the selected process (asks first; your
                own processes unless root; off with --readonly)
  space         replay (--replay FILE): pause or resume
  left / right  replay: one recorded snapshot back or forward
  [ / ]         history (this box's, recorded by whichever hwdash
                samples it): one point back / forward
  { / }         history: ten minutes back / forward
  end           back to live (else the last process)
  OOM in        time until a GPU is full at its current climb
  bar           ▒ reserved by the driver  █ used  │ alert level  ┃ plan

[b]Planner[/b] (anywhere on the planner tab; in a text field, ctrl+ keys)
  s / ctrl+s    save the current plan
  t / ctrl+t    trace the plan on fake tensors
  f             make it fit: the smallest changes that fit the selected
                flavor (else the recommended one); enter applies one
  1 / 2 / 3     sort flavors by cost, time or memory (again: reverse)
  v             next provider (filters the flavor table)
  o             show only the flavors the plan fits
  x             max column: the longest seq, largest batch, fewest gpus
                that fit each flavor (as hwdash plan --max), off
  e             export: DeepSpeed, Trainer/TRL, accelerate or hf jobs
                (a serving plan: its vllm serve / SGLang line first)
  escape        leave a text field (or a dialog)

[b]Compare[/b]
  left / right  choose a saved plan
  enter / l     load it into the planner
  r             rename it
  d             delete it (asks first: y yes, n or escape no)

Press escape, q or ? to close this help."""


class HelpScreen(ModalScreen[None]):
    """The list of keys; ``status`` (plain text, never markup: it may hold a server's host name)
    is said under it, e.g. what ``--webhook`` has sent and its last error."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss", "Close"),
        Binding("q", "dismiss", "Close", show=False),
        Binding("question_mark", "dismiss", "Close", show=False),
    ]

    def __init__(self, status: str = "") -> None:
        super().__init__()
        self.status = status

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body"):
            yield Static(HELP_TEXT, id="help-text")
            if self.status:
                yield Static("\n" + self.status, id="help-status", markup=False)
