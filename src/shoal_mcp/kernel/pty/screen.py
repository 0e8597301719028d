"""The PTY terminal emulator and `pty.read` rendering (docs/protocol.md, PTYs).

Owns the pyte `Screen` subclass, rendering its rows to text, and fitting a read result
(screen rows, a window of them, scrollback) under VALUE_HARD_CAP. No processes, fds or
threads here: `pty.PtyManager` feeds the screen and holds the locks.

* **Emulation.** A `pyte.Screen` subclass, not `pyte.HistoryScreen`: HistoryScreen wraps
  every attribute access (2.4x slower feeding) and keeps scrolled-off lines as cell objects;
  ours keeps a bounded deque (PTY_SCROLLBACK_LINES) of *rendered* lines that scrolled off a
  region whose top is row 0 (xterm's rule). It also answers device status / attribute
  queries through the master, ignores DECCOLM (the tty winsize is the only size), drops
  zero-width non-combining characters (pyte would stop drawing at them) and caps a cell at
  PTY_MAX_CELL_CHARS code points (pyte's combining path is quadratic otherwise).
* **Reading.** `screen` always has one entry per terminal row (trailing empty rows are kept,
  so `screen[i]` is row i and lines up with `cursor.row`), each right-trimmed. When the
  encoded result would exceed VALUE_HARD_CAP, `screen` is a window of rows around the
  cursor (and, only if fewer than PTY_WINDOW_MIN_ROWS rows would fit, also of columns)
  and `"window": {"top", "left", "rows", "cols"}` says which: `screen[i]` is then row
  `top + i` from column `left`. `cursor` is always in absolute screen coordinates.
  `scrollback: n` adds the newest ≤ n lines above the screen (oldest first) plus
  `scrollback_total`; when both do not fit, scrollback gets at most half the budget.
"""

from __future__ import annotations

import unicodedata
from collections import deque
from typing import Any

import orjson
import pyte
from pyte.screens import Margins
from wcwidth import wcwidth

from ...protocol.limits import VALUE_HARD_CAP
from ..config.limits import PTY_MAX_CELL_CHARS, PTY_WINDOW_MIN_ROWS

_RESULT_RESERVE = 256
"""Bytes kept free in the read budget for the window/scrollback keys."""

_DECCKM = 1 << 5  # pyte stores private modes shifted by 5
_DECCOLM_PARAM = 3


def _line_cells(line: Any, columns: int) -> list[str]:
    cells = [" "] * columns
    for x, ch in line.items():
        if x < columns:
            cells[x] = ch.data
    return cells


def _render(line: Any, columns: int) -> str:
    return "".join(_line_cells(line, columns)).rstrip()


class _Screen(pyte.Screen):
    """pyte.Screen + bounded rendered scrollback + the fixes listed in the module docstring."""

    def __init__(self, columns: int, lines: int, history: int) -> None:
        self.history: deque[str] = deque(maxlen=history)
        self.responses: list[str] = []
        super().__init__(columns, lines)

    @property
    def app_cursor(self) -> bool:
        return _DECCKM in self.mode

    def index(self) -> None:
        top, bottom = self.margins or Margins(0, self.lines - 1)
        if self.cursor.y == bottom and top == 0:
            self.history.append(_render(self.buffer[0], self.columns))
        super().index()

    def erase_in_display(self, how: int = 0, *args: Any, **kwargs: Any) -> None:
        super().erase_in_display(how, *args, **kwargs)
        if how == 3:  # "clear scrollback" (xterm)
            self.history.clear()

    def set_mode(self, *modes: int, **kwargs: Any) -> None:
        if kwargs.get("private"):
            modes = tuple(m for m in modes if m != _DECCOLM_PARAM)
        super().set_mode(*modes, **kwargs)

    def reset_mode(self, *modes: int, **kwargs: Any) -> None:
        if kwargs.get("private"):
            modes = tuple(m for m in modes if m != _DECCOLM_PARAM)
        super().reset_mode(*modes, **kwargs)

    def write_process_input(self, data: str) -> None:
        if len(self.responses) < 64:
            self.responses.append(data)

    def draw(self, data: str) -> None:
        if not data.isascii():
            data = self._sanitize(data)
        if data:
            super().draw(data)

    def _sanitize(self, data: str) -> str:
        # Room for combining marks on the cell pyte would combine into (see pyte's draw).
        x, y = self.cursor.x, self.cursor.y
        if x:
            room = PTY_MAX_CELL_CHARS - len(self.buffer[y][x - 1].data)
        elif y:
            room = PTY_MAX_CELL_CHARS - len(self.buffer[y - 1][self.columns - 1].data)
        else:
            room = 0
        out = []
        for ch in data:
            w = wcwidth(ch)
            if w > 0:
                out.append(ch)
                room = PTY_MAX_CELL_CHARS - 1
            elif w == 0 and unicodedata.combining(ch) and room > 0:
                out.append(ch)
                room -= 1
            # else: zero-width non-combining / unprintable: dropped
        return "".join(out)


def _cursor(screen: _Screen) -> dict[str, Any]:
    return {
        "row": min(screen.cursor.y, screen.lines - 1),
        "col": min(screen.cursor.x, screen.columns - 1),
        "hidden": bool(screen.cursor.hidden),
    }


def _fit_rows(costs: list[int], center: int, budget: int) -> tuple[int, int, int]:
    """Largest contiguous run of rows around `center` whose costs fit `budget`."""
    n = len(costs)
    if not n or costs[center] > budget:
        return center, center, 0
    lo, hi, used = center, center + 1, costs[center]
    down = up = True
    while down or up:
        if down:
            if hi < n and used + costs[hi] <= budget:
                used += costs[hi]
                hi += 1
            else:
                down = False
        if up:
            if lo > 0 and used + costs[lo - 1] <= budget:
                used += costs[lo - 1]
                lo -= 1
            else:
                up = False
    return lo, hi, used


def _cost(s: str) -> int:
    return len(orjson.dumps(s)) + 1


# --------------------------------------------------------------------------- read result


def _fill(s: _Screen, rows: list[str], result: dict[str, Any], history: list[str] | None) -> None:
    """Add `screen` (+`window`) and scrollback within VALUE_HARD_CAP.

    `rows` is the rendered screen (one right-trimmed string per row; not modified).
    """
    cur = result["cursor"]
    budget = VALUE_HARD_CAP - len(orjson.dumps(result)) - _RESULT_RESERVE
    costs = [_cost(r) for r in rows]
    sb_costs = [_cost(r) for r in history] if history else []
    screen_need, sb_need = sum(costs), sum(sb_costs)
    window = None
    if screen_need + sb_need <= budget:
        screen, used = list(rows), screen_need
    else:
        screen_budget = budget - min(sb_need, budget // 2)
        if screen_need <= screen_budget:
            screen, used = list(rows), screen_need
        else:
            lo, hi, used = _fit_rows(costs, cur["row"], screen_budget)
            left, width = 0, s.columns
            if hi - lo < min(s.lines, PTY_WINDOW_MIN_ROWS):
                cells = [_line_cells(s.buffer[y], s.columns) for y in range(s.lines)]
                while hi - lo < min(s.lines, PTY_WINDOW_MIN_ROWS) and width > 1:
                    width = max(1, width // 2)
                    left = max(0, min(cur["col"] - width // 2, s.columns - width))
                    rows = ["".join(c[left : left + width]).rstrip() for c in cells]
                    lo, hi, used = _fit_rows([_cost(r) for r in rows], cur["row"], screen_budget)
            screen = rows[lo:hi]
            window = {"top": lo, "left": left, "rows": hi - lo, "cols": width}
    result["screen"] = screen
    if window is not None:
        result["window"] = window
    if history is not None:
        left_budget = budget - used
        n = 0
        for c in reversed(sb_costs):
            if c > left_budget:
                break
            left_budget -= c
            n += 1
        result["scrollback"] = history[len(history) - n :] if n else []
        result["scrollback_total"] = len(s.history)
    _enforce_cap(result)


def _enforce_cap(result: dict[str, Any]) -> None:
    """Last line of defence: the accounting above should make this a no-op."""
    while len(orjson.dumps(result)) > VALUE_HARD_CAP:
        if result.get("scrollback"):
            result["scrollback"].pop(0)
            continue
        screen = result["screen"]
        win = result.setdefault(
            "window", {"top": 0, "left": 0, "rows": len(screen), "cols": result["cols"]}
        )
        if not screen:
            break
        if win["top"] + len(screen) - 1 > result["cursor"]["row"]:
            screen.pop()
        else:
            screen.pop(0)
            win["top"] += 1
        win["rows"] = len(screen)
