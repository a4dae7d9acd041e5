"""Send the terminal only the characters that changed, as curses does.

Textual repaints a widget by rewriting its whole region: a GPU row whose memory moves from
``34.4`` to ``34.6 GiB`` is sent again in full, each segment with its full colour codes. Over SSH on a
training box that is most of what the dashboard costs. :class:`ScreenDiff` sits between Textual and
the terminal: it reads the output Textual writes (cursor positions, SGR colour codes, text), keeps a
copy of what the terminal shows, and writes only the cells whose character or style differ, with a
cursor move per changed run and a colour code only where the colour changes.

It understands exactly the subset of output Textual's Linux driver writes for screen updates
(``CSI row;col H``, ``CSI ... m``, printable text, ``CR``, ``LF``). Everything else (mode switches,
queries, titles) passes through unchanged, in order; anything that could change the screen in a way
the copy cannot follow (erase, scroll, alternate screen, a resize) makes the copy unknown, so the next
update is written in full. The user can force that with ``ctrl+l``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from rich.cells import get_character_cell_size

if TYPE_CHECKING:
    from textual.driver import Driver

#: One token of terminal output: a CSI sequence, an OSC string, another two-byte escape, CR, LF,
#: another control character, or a run of printable text.
_TOKEN = re.compile(
    r"(?P<csi>\x1b\[(?P<params>[0-?]*)(?P<inter>[ -/]*)(?P<final>[@-~]))"
    r"|(?P<osc>\x1b\][^\x07\x1b]*(?:\x07|\x1b\\))"
    r"|(?P<esc>\x1b[^\[\]])"
    r"|(?P<cr>\r)|(?P<lf>\n)"
    r"|(?P<ctl>[\x00-\x1f\x7f])"
    r"|(?P<text>[^\x00-\x1f\x7f\x1b]+)"
)
#: An escape sequence cut off at the end of a write (kept for the next write).
_PARTIAL = re.compile(r"\x1b(?:\[[0-?]*[ -/]*|\][^\x07\x1b]*)?")
#: Private modes that switch to or from the alternate screen (its content is not ours to know).
_SCREEN_MODES = frozenset(("?47", "?1047", "?1049"))
#: CSI finals that move the cursor to a place this module follows.
_POSITION = frozenset("Hf")
#: CSI finals that change the screen's cells or scroll it (the copy cannot follow them).
_CHANGES_SCREEN = frozenset("JKXLMP@STrb")
#: A write this long onto a screen the copy knows nothing of is a full frame: sent as it is.
_FULL_FRAME = 4096
#: Rewriting this many unchanged cells between two changed runs costs less than a cursor move.
_MAX_GAP = 4

#: A cell: (style, character). ``""`` as the character marks the right half of a wide character.
Cell = tuple[str, str]
#: A cell whose content on the terminal is not known (always rewritten).
_UNKNOWN: Cell = ("\x00", "\x00")


def _sgr(style: str) -> str:
    """The escape code that sets exactly ``style`` (SGR parameters after a reset)."""
    return f"\x1b[0;{style}m" if style else "\x1b[0m"


#: A parsed style: (foreground, background, other attributes), or None for one not understood.
Pen = tuple[str | None, str | None, frozenset[str]]
#: Attributes that show on a blank cell (underline, reverse, strike-through, overline, ...).
_SHOW_ON_BLANK = frozenset(("4", "7", "9", "21", "53"))


@lru_cache(maxsize=512)
def _parse(style: str) -> Pen | None:
    """Split SGR parameters (as Rich writes them, after a reset) into colours and attributes."""
    foreground: str | None = None
    background: str | None = None
    flags: set[str] = set()
    params = style.split(";") if style else []
    index = 0
    while index < len(params):
        param = params[index]
        if param in ("38", "48", "58"):
            mode = params[index + 1] if index + 1 < len(params) else ""
            size = 3 if mode == "5" else 5 if mode == "2" else 0
            if not size or index + size > len(params):
                return None
            colour = ";".join(params[index : index + size])
            index += size
            if param == "38":
                foreground = colour
            elif param == "48":
                background = colour
            else:
                flags.add(colour)  # an underline colour: removed only by a reset
            continue
        if not param.isdigit():
            return None
        number = int(param)
        if number == 0:
            foreground = background = None
            flags.clear()
        elif 30 <= number <= 37 or 90 <= number <= 97:
            foreground = param
        elif number == 39:
            foreground = None
        elif 40 <= number <= 47 or 100 <= number <= 107:
            background = param
        elif number == 49:
            background = None
        elif 20 <= number <= 29:
            return None  # "attribute off" codes: not followed, a reset is written instead
        else:
            flags.add(param)
        index += 1
    return (foreground, background, frozenset(flags))


@lru_cache(maxsize=2048)
def _transition(current: str | None, target: str) -> str:
    """The shortest escape code that takes the terminal from style ``current`` to ``target``."""
    if current == target:
        return ""
    full = _sgr(target)
    if current is None:
        return full
    before, after = _parse(current), _parse(target)
    if before is None or after is None or not before[2] <= after[2]:
        return full
    codes = sorted(after[2] - before[2])
    if after[0] != before[0]:
        codes.append(after[0] or "39")
    if after[1] != before[1]:
        codes.append(after[1] or "49")
    delta = f"\x1b[{';'.join(codes)}m"
    return delta if len(delta) < len(full) else full


@lru_cache(maxsize=2048)
def _blank_looks_same(current: str | None, target: str) -> bool:
    """Whether a space drawn in style ``current`` looks like one drawn in ``target``."""
    if current is None:
        return False
    before, after = _parse(current), _parse(target)
    if before is None or after is None:
        return False
    return (
        before[1] == after[1]
        and before[2] & _SHOW_ON_BLANK == after[2] & _SHOW_ON_BLANK
        and not any(flag.startswith("58;") for flag in before[2] ^ after[2])
        and ("7" not in after[2] or before[0] == after[0])
    )


def _move_code(x: int, y: int, from_x: int | None, from_y: int | None) -> str:
    """The shortest cursor move from (from_x, from_y) to (x, y), 0-based."""
    absolute = f"\x1b[{y + 1};{x + 1}H"
    if from_y != y or from_x is None:
        return absolute
    step = x - from_x
    if step == 0:
        return ""
    relative = (
        ("\x1b[C" if step == 1 else f"\x1b[{step}C")
        if step > 0
        else ("\x1b[D" if step == -1 else f"\x1b[{-step}D")
    )
    return relative if len(relative) < len(absolute) else absolute


@dataclass
class ScreenDiff:
    """A copy of the terminal's screen and a filter that writes only what differs from it."""

    enabled: bool = True
    """When false, :meth:`feed` returns its input unchanged (and the copy is forgotten)."""
    _rows: dict[int, list[Cell]] = field(default_factory=dict)
    """What the terminal shows, by row (0-based); missing rows and cells are unknown."""
    _dirty: dict[int, dict[int, Cell]] = field(default_factory=dict)
    """Cells Textual wrote in this write that differ from the copy, by row and column."""
    _x: int | None = 0
    _y: int | None = 0
    """Where Textual's output has put the cursor (None: somewhere this module does not follow)."""
    _style: str = ""
    """The SGR parameters Textual's output has set."""
    _term_x: int | None = None
    _term_y: int | None = None
    _term_style: str | None = None
    """Cursor and style of the real terminal after what this module wrote (None: unknown)."""
    _carry: str = ""
    """An escape sequence cut off at the end of the last write."""
    _size: tuple[int, int] | None = None
    _learn: str | None = None
    """A frame written as it is, to read into the copy at the next write."""

    def invalidate(self) -> None:
        """Forget what the terminal shows: the next update is written in full."""
        self._learn = None
        self._rows.clear()
        self._dirty.clear()
        self._term_x = self._term_y = None
        self._term_style = None

    def check_size(self, size: tuple[int, int] | None) -> None:
        """Forget the copy when the terminal's size changed (a resize may reflow or clear it)."""
        if size != self._size:
            self._size = size
            self.invalidate()

    def feed(self, data: str) -> str:
        """Take what Textual would write and return what to write instead."""
        if not self.enabled:
            self._rows.clear()
            return data
        if self._learn is not None:
            self._learn_screen(self._learn)
        data = self._carry + data
        self._carry = ""
        last_escape = data.rfind("\x1b")
        if last_escape >= 0 and _PARTIAL.fullmatch(data, last_escape):
            self._carry = data[last_escape:]
            data = data[:last_escape]
        if not self._rows and not self._dirty and len(data) >= _FULL_FRAME:
            # Nothing is known of the screen (the first frame, a resize, ctrl+l): there is nothing
            # to leave out, so the frame goes out as it is, at once, and is read into the copy
            # at the next write (the first screen appears sooner).
            self._learn = data
            return data
        out: list[str] = []
        self._process(data, out)
        return "".join(out)

    def _process(self, data: str, out: list[str]) -> None:
        for token in _TOKEN.finditer(data):
            kind = token.lastgroup
            if kind == "text":
                self._text(token.group(), out)
            elif kind == "csi":
                self._csi(token, out)
            elif kind == "cr":
                self._x = 0
            elif kind == "lf":
                self._linefeed(out)
            else:  # OSC, other escapes and control characters: pass through in order
                self._flush(out)
                out.append(token.group())
        self._flush(out)

    def _learn_screen(self, data: str) -> None:
        """Bring the copy up to date with a frame that was written as it is."""
        self._learn = None
        self._process(data, [])  # as if written: the copy now holds what the terminal shows
        # The terminal's cursor and colours are where that output left them.
        self._term_x, self._term_y, self._term_style = self._x, self._y, self._style

    # -- input -----------------------------------------------------------------------------------

    def _csi(self, token: re.Match[str], out: list[str]) -> None:
        params, inter, final = token.group("params", "inter", "final")
        if final == "m" and not inter:
            if params in ("", "0"):
                self._style = ""
            elif params.startswith("0;"):
                self._style = params[2:]
            else:
                self._style = f"{self._style};{params}" if self._style else params
            return
        if final in _POSITION and not inter and "?" not in params:
            parts = params.split(";")
            try:
                row = int(parts[0]) if parts[0] else 1
                column = int(parts[1]) if len(parts) > 1 and parts[1] else 1
            except ValueError:
                row = column = 1
            self._y, self._x = max(row, 1) - 1, max(column, 1) - 1
            return
        # Anything else goes out as it came, after what is pending, with Textual's colours set.
        self._flush(out)
        if final in _CHANGES_SCREEN or (final in "hl" and params in _SCREEN_MODES):
            self._pass_style(out)
            self.invalidate()
        elif final in "ABCDEFGd":
            self._x = self._y = None  # relative moves: not followed
            self._term_x = self._term_y = None
        out.append(token.group())

    def _linefeed(self, out: list[str]) -> None:
        if self._y is None:
            out.append("\n")
            return
        if self._size is not None and self._y + 1 >= self._size[1]:
            # A line feed on the last row scrolls the screen: pass it on and start over.
            self._flush(out)
            self._move(self._x or 0, self._y, out)
            out.append("\n")
            self.invalidate()
            return
        self._y += 1

    def _text(self, text: str, out: list[str]) -> None:
        x, y = self._x, self._y
        if x is None or y is None:
            # Text at a place not followed: pass it through and forget the screen.
            self._flush(out)
            self._pass_style(out)
            out.append(text)
            self.invalidate()
            return
        row = self._rows.get(y)
        dirty = self._dirty.setdefault(y, {})
        style = self._style
        if text.isascii():
            for offset, char in enumerate(text):
                cell = (style, char)
                column = x + offset
                if row is None or column >= len(row) or row[column] != cell:
                    dirty[column] = cell
                elif column in dirty:
                    del dirty[column]  # written back to what the terminal shows
            self._x = x + len(text)
            return
        for char in text:
            width = get_character_cell_size(char)
            if width == 0:
                # A combining mark joins the previous cell.
                if x > 0:
                    previous = dirty.get(x - 1) or (
                        row[x - 1] if row and x - 1 < len(row) else None
                    )
                    if previous is not None:
                        dirty[x - 1] = (previous[0], previous[1] + char)
                continue
            cells = [(style, char)] + [(style, "")] * (width - 1)
            for offset, cell in enumerate(cells):
                column = x + offset
                if row is None or column >= len(row) or row[column] != cell:
                    dirty[column] = cell
                elif column in dirty:
                    del dirty[column]
            x += width
        self._x = x

    # -- output ----------------------------------------------------------------------------------

    def _pass_style(self, out: list[str]) -> None:
        """Set the terminal to Textual's current colours (before output passed through)."""
        out.append(_transition(self._term_style, self._style))
        self._term_style = self._style

    def _move(self, x: int, y: int, out: list[str]) -> None:
        out.append(_move_code(x, y, self._term_x, self._term_y))
        self._term_x, self._term_y = x, y

    def _flush(self, out: list[str]) -> None:
        """Write the changed cells of this write and bring the copy up to date."""
        if self._dirty:
            # Grouped by style: the cells of one colour are written one after the other over the
            # whole screen, so a frame sets each colour once rather than once per row (eight GPU
            # rows whose coloured readings change cost a colour code per reading otherwise).
            # Where cells go on the screen does not depend on the order they are written in.
            by_style: dict[str, dict[int, dict[int, Cell]]] = {}
            for y in sorted(self._dirty):
                for x, cell in self._dirty[y].items():
                    by_style.setdefault(cell[0], {}).setdefault(y, {})[x] = cell
            for style in sorted(by_style):
                for y, mine in by_style[style].items():
                    self._write_row(y, mine, out, pending=self._dirty[y])
            self._dirty.clear()
            out.append(_transition(self._term_style, ""))
            self._term_style = ""
        # Leave the cursor where Textual left it (it may be shown, e.g. in an input field).
        if self._x is not None and self._y is not None:
            width = self._size[0] if self._size else None
            if width is None or self._x < width:
                self._move(self._x, self._y, out)

    def _write_row(
        self, y: int, changed: dict[int, Cell], out: list[str], *, pending: dict[int, Cell]
    ) -> None:
        """Write ``changed`` (some of the row's ``pending`` changes: those of one style)."""
        row = self._rows.setdefault(y, [])
        last = max(changed)
        if last >= len(row):
            row.extend([_UNKNOWN] * (last + 1 - len(row)))
        for column in sorted(changed):
            cell = changed[column]
            if cell[1] == "":
                # The right half of a wide character: drawn with its left half.
                if row[column] == cell:
                    continue  # its left half was just written
                left = changed.get(column - 1, row[column - 1]) if column > 0 else _UNKNOWN
                if left == _UNKNOWN or get_character_cell_size(left[1][:1] or " ") != 2:
                    # An orphan right half (its wide character was overwritten): a blank.
                    cell = (cell[0], " ")
                else:
                    column -= 1
                    cell = left
            self._reach(column, y, row, out, pending)
            self._put(column, cell, row, pending, out)
            if pending.get(column) == cell:
                del pending[column]  # written: a later style's gap may reuse it

    def _reach(
        self, column: int, y: int, row: list[Cell], out: list[str], pending: dict[int, Cell]
    ) -> None:
        """Bring the cursor to ``column``: by a move, or by writing the few cells before it again
        when that takes fewer bytes (never cells still waiting for their new content)."""
        start = self._term_x
        if (
            self._term_y == y
            and start is not None
            and start < column <= start + 2 * _MAX_GAP
            and not any(index in pending for index in range(start, column))
        ):
            gap = row[start:column]
            # A wide character ending the gap would carry the cursor past ``column``, and a
            # right half in it is not drawn on its own: move instead.
            if _UNKNOWN not in gap and row[column][1] != "" and all(cell[1] for cell in gap):
                style = self._term_style
                cost = 0
                for cell_style, char in gap:
                    if char == "" or (char == " " and _blank_looks_same(style, cell_style)):
                        cost += len(char)
                        continue
                    code = _transition(style, cell_style)
                    style = cell_style
                    cost += len(code) + len(char.encode())
                if cost <= len(_move_code(column, y, start, y)):
                    for index in range(start, column):
                        self._put(index, row[index], row, {}, out)
                    return
        self._move(column, y, out)

    def _put(
        self, column: int, cell: Cell, row: list[Cell], changed: dict[int, Cell], out: list[str]
    ) -> None:
        """Write one cell at the cursor (which is at ``column``)."""
        style, char = cell
        if char == "":
            return
        if cell == _UNKNOWN:
            style, char = "", " "  # what a terminal leaves of a wide character cut in half
        if not (char == " " and _blank_looks_same(self._term_style, style)):
            out.append(_transition(self._term_style, style))
            self._term_style = style
        out.append(char)
        row[column] = (style, char)
        width = 2 if get_character_cell_size(char[0]) == 2 else 1
        following = column + 1
        if width == 2:
            if following >= len(row):
                row.append(_UNKNOWN)
            row[following] = (style, "")  # the right half, drawn with it
        elif following < len(row) and row[following][1] == "" and following not in changed:
            row[following] = _UNKNOWN  # a narrow character over a wide one blanks its right half
        self._term_x = column + width
        if self._size is not None and self._term_x >= self._size[0]:
            self._term_x = None  # the cursor waits to wrap at the margin: place it next time


def terminal_size(stream: object) -> tuple[int, int] | None:
    """The (columns, rows) of the terminal ``stream`` writes to, or None when it cannot be read."""
    try:
        size = os.get_terminal_size(stream.fileno())  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return None
    return (size.columns, size.lines)


def diffing_driver(base: type[Driver]) -> type[Driver]:
    """``base`` (Textual's terminal driver) with its screen updates sent through :class:`ScreenDiff`.

    Only Textual's full-screen Linux driver is wrapped (the one whose output this module reads);
    headless test drivers, inline mode and other platforms get ``base`` unchanged.
    """
    try:
        from textual.drivers.linux_driver import LinuxDriver
    except ImportError:  # Windows
        return base
    if not issubclass(base, LinuxDriver):
        return base

    class DiffingDriver(base):  # type: ignore[valid-type,misc]
        """The terminal driver, writing only what changed on the screen."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.screen_diff = ScreenDiff(enabled=not self.is_inline)

        def write(self, data: str) -> None:
            diff = self.screen_diff
            if diff.enabled:
                diff.check_size(terminal_size(self._file))
                data = diff.feed(data)
            if data:
                super().write(data)

    DiffingDriver.__name__ = f"Diffing{base.__name__}"
    return DiffingDriver


def terminal_hung_up(fd: int) -> bool:
    """Whether the terminal behind ``fd`` is gone (its other end closed: a dropped SSH link, a
    killed tmux pane without SIGHUP to us). Textual's input thread then reads end-of-file in a
    loop and keeps a core busy, so the app checks this and quits (False where poll() is missing)."""
    try:
        import select

        poller = select.poll()
        poller.register(fd, select.POLLIN)
        events = poller.poll(0)
    except (AttributeError, OSError, ValueError):
        return False
    gone = select.POLLHUP | select.POLLERR | select.POLLNVAL
    return any(mask & gone for _fd, mask in events)
