"""A tiny curses program for the PTY tests: a box the size of the window, redrawn on resize.

ASCII only (`+`, `-`, `|`) so the test does not depend on the terminal's line-drawing charset.
Row 1 says `size WxH`; `q` quits.
"""

from __future__ import annotations

import contextlib
import curses


def draw(stdscr: curses.window) -> None:
    stdscr.erase()
    h, w = stdscr.getmaxyx()
    if h >= 2 and w >= 2:
        stdscr.addstr(0, 0, "+" + "-" * (w - 2) + "+")
        for y in range(1, h - 1):
            stdscr.addstr(y, 0, "|")
            stdscr.addstr(y, w - 1, "|")
        stdscr.addstr(h - 1, 0, "+" + "-" * (w - 2))
        stdscr.insch(h - 1, w - 1, "+")  # addstr at the last cell would scroll
        if h >= 3 and w >= 12:
            stdscr.addstr(1, 1, f"size {w}x{h}"[: w - 2])
    stdscr.refresh()


def main(stdscr: curses.window) -> None:
    with contextlib.suppress(curses.error):  # not every terminal can hide the cursor
        curses.curs_set(0)
    stdscr.keypad(True)
    draw(stdscr)
    while True:
        key = stdscr.getch()
        if key == curses.KEY_RESIZE:
            draw(stdscr)
        elif key in (ord("q"), 27):
            return


if __name__ == "__main__":
    curses.wrapper(main)
