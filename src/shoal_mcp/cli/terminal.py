"""A kernel PTY on the user's terminal: its screen mirrored, the keyboard typed into it.

Used by ``shoal exec -t`` (a command of one's own on a PTY) and ``shoal pty attach``
(any PTY one may see, the agent's included: a shared terminal, like ``tmux attach``).
The kernel keeps the screen (an emulator per PTY, docs/protocol.md "PTYs"); this side
polls ``pty.read`` and repaints what changed, and sends the bytes typed as
``{"bytes": base64}``, so Ctrl-C (``\\x03``) reaches the program through its terminal's
line discipline exactly as on a local terminal.

The user's terminal is in raw mode while mirrored and restored on every way out. The
detach key (``DETACH_KEY``, Ctrl-]) leaves the PTY running.
"""

from __future__ import annotations

import base64
import contextlib
import os
import select
import signal
import sys
import termios
import tty
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..protocol.limits import KiB

DETACH_KEY = b"\x1d"
"""Ctrl-] (as telnet): leaves ``shoal pty attach`` / ``shoal exec -t``, the PTY keeps running."""
DETACH_NAME = "Ctrl-]"
POLL_S = 0.03
"""How often the screen is read while nothing is typed (a human terminal's refresh)."""
INPUT_CHUNK = 4 * KiB


@contextlib.contextmanager
def raw_terminal(fd: int) -> Iterator[None]:
    """``fd``'s terminal in raw mode (no echo, no line editing, no signals from keys)
    for the block; restored afterwards whatever happens. A non-terminal is left alone."""
    if not os.isatty(fd):
        yield
        return
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd, termios.TCSANOW)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def terminal_size(fd: int) -> tuple[int, int] | None:
    """(cols, rows) of the terminal on ``fd``, or None when it is not one."""
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return None
    if size.columns <= 0 or size.lines <= 0:
        return None  # a terminal nobody sized (a bare pty): the caller's default
    return size.columns, size.lines


@dataclass
class Mirror:
    """Mirrors PTY ``pty_id`` onto ``out_fd`` and types ``in_fd`` into it.

    ``follow_size``: resize the PTY to the user's terminal (at start and on SIGWINCH);
    ``shoal pty attach`` leaves another's PTY its size unless asked. ``detach``: the
    detach key ends the mirror (else every byte is sent, as for ``exec -t``).
    """

    call: Any
    pty_id: str
    in_fd: int
    out_fd: int
    follow_size: bool = True
    detach: bool = True

    def run(self) -> dict:
        """Mirror until the program exits (the last ``pty.read``) or the user detaches
        (that read with ``"detached": True``)."""
        resized = {"due": self.follow_size}
        old_handler = None
        if self.follow_size and os.isatty(self.out_fd):
            old_handler = signal.signal(signal.SIGWINCH, lambda *_: resized.update(due=True))
        painted: list[str] = []
        try:
            with raw_terminal(self.in_fd):
                self._write(b"\x1b[?1049h\x1b[H\x1b[2J")  # the alternate screen, like a pager
                try:
                    return self._loop(resized, painted)
                finally:
                    self._write(b"\x1b[?25h\x1b[?1049l")
        finally:
            if old_handler is not None:
                signal.signal(signal.SIGWINCH, old_handler)
            # The last screen stays on the primary screen, so it can be read after.
            if painted:
                self._write(("\n".join(painted).rstrip("\n") + "\n").encode())

    def _loop(self, resized: dict, painted: list[str]) -> dict:
        input_open = True
        while True:
            self._follow_resize(resized)
            screen = self.call("pty.read", {"pty_id": self.pty_id})
            if screen.get("changed") or not painted:
                painted[:] = self._paint(screen)
            if not screen.get("alive", True):
                return screen
            wait = [self.in_fd] if input_open else []
            ready, _, _ = select.select(wait, [], [], POLL_S)
            if not ready:
                continue
            try:
                data = os.read(self.in_fd, INPUT_CHUNK)
            except OSError:
                data = b""
            if not data:
                input_open = False  # stdin closed: keep watching until the program ends
                continue
            # A resize that arrived with this input goes first: what the user typed after
            # resizing (``stty size``) must see the new size.
            self._follow_resize(resized)
            if self.detach and DETACH_KEY in data:
                data = data.split(DETACH_KEY, 1)[0]
                if data:
                    self._send(data)
                return {**screen, "detached": True}
            self._send(data)

    def _follow_resize(self, resized: dict) -> None:
        if resized["due"]:
            resized["due"] = False
            size = terminal_size(self.out_fd)
            if size is not None:
                self.call("pty.resize", {"pty_id": self.pty_id, "cols": size[0], "rows": size[1]})

    def _send(self, data: bytes) -> None:
        self.call(
            "pty.send",
            {"pty_id": self.pty_id, "input": {"bytes": base64.b64encode(data).decode()}},
        )

    def _paint(self, screen: dict) -> list[str]:
        """Repaint the whole screen (rows are short; a diff buys nothing at 30 Hz)."""
        rows = list(screen.get("screen", []))
        top = screen.get("window", {}).get("top", 0)
        parts = ["\x1b[H"]
        for i, row in enumerate(rows):
            parts.append(f"\x1b[{top + i + 1};1H{row}\x1b[K")
        parts.append(f"\x1b[{top + len(rows) + 1};1H\x1b[J")
        cursor = screen.get("cursor", {})
        parts.append(f"\x1b[{cursor.get('row', 0) + 1};{cursor.get('col', 0) + 1}H")
        parts.append("\x1b[?25l" if cursor.get("hidden") else "\x1b[?25h")
        self._write("".join(parts).encode("utf-8", "replace"))
        return rows

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self.out_fd, view)
            view = view[n:]


def stdio_fds() -> tuple[int, int]:
    return sys.stdin.fileno(), sys.stdout.fileno()
