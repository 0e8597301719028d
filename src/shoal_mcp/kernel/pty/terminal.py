"""One open PTY: its program (below its supervisor), the terminal's fds and its screen.

``OpenPty`` holds the state the manager and the reader thread share (under ``lock``)
and controls the program's process: signals to its groups while it is known unreaped
(no pid-reuse races), the supervisor's control pipe, reaping and the exit record. The
supervisor is reaped only by ``proc.poll()`` under ``TABLES``, so inside a ``TABLES``
section "not reaped yet" stays true: its pid is not reused there.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections import OrderedDict
from typing import Any

import pyte

from ...protocol import uri
from ...protocol.limits import PTY_SCROLLBACK_LINES
from ..config.limits import PTY_EVENT_INTERVAL_S
from ..owner.tables import TABLES
from .screen import _render, _Screen
from .spawn import Spawned
from .termfilter import OscFilter


def _open_pidfd(pid: int) -> int | None:
    """A pidfd of ``pid`` (readable once it exits, reaped or not), or None where there
    are none or the kernel refuses one (out of fds, a seccomp filter): then one looks."""
    if not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def _exit_record(returncode: int) -> dict[str, int]:
    return {"signal": -returncode} if returncode < 0 else {"status": returncode}


class OpenPty:
    """A PTY from ``open`` to ``close``; its screen is fed by its reader thread."""

    def __init__(
        self, num: int, owner: str, started: Spawned, cmd: str, cols: int, rows: int
    ) -> None:
        self.id = uri.pty_ref(num)
        self.owner = owner
        self.proc = started.proc  # the supervisor: it ends last, with the program's status
        self.pid = started.pid  # the program: its group is what close signals
        self.master = started.master
        self.ctrl = started.ctrl  # closing it kills the program's whole tree (TABLES)
        self.cmd = cmd
        self.screen = _Screen(cols, rows, PTY_SCROLLBACK_LINES)
        self.stream = pyte.ByteStream(self.screen)
        self.osc_filter = OscFilter()  # pyte would buffer an unterminated OSC without bound
        self.lock = threading.Lock()  # screen, caches, version, exit, pending, closed
        self.write_lock = threading.Lock()  # whole `send`s never interleave
        self.stopping = threading.Event()
        self.closed = False
        self.eof = False  # every slave fd is closed: nothing can read input any more
        self.version = 0
        self.rows_cache: list[str] = [""] * rows
        self.dirty_rows: set[int] = set(range(rows))
        self.seen: OrderedDict[Any, int] = OrderedDict()
        self.exit: dict[str, int] | None = None
        self.exit_emitted = False
        self.pending = False
        self.last_emit = time.monotonic() - PTY_EVENT_INTERVAL_S
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.thread: threading.Thread | None = None

    def wake(self) -> None:
        with contextlib.suppress(OSError):  # pipe full (already awake) or closed
            os.write(self.wake_w, b"\0")

    def refresh_rows(self) -> None:
        """Caller holds ``lock``: re-render the rows the emulator changed since last time."""
        s = self.screen
        if len(self.rows_cache) != s.lines:
            self.rows_cache = [""] * s.lines
            self.dirty_rows = set(range(s.lines))
        for y in self.dirty_rows:
            if y < s.lines:
                self.rows_cache[y] = _render(s.buffer[y], s.columns)
        self.dirty_rows.clear()

    def signal(self, sig: int) -> None:
        """Signal the child's group and the terminal's foreground group, while unreaped."""
        with TABLES:  # nothing reaps the supervisor between its poll and the kills
            if self.proc.poll() is not None:
                return
            groups = {self.pid}
            if not self.closed:
                try:
                    fg = os.tcgetpgrp(self.master)
                    if fg > 0:
                        groups.add(fg)
                except OSError:
                    pass
            for g in groups:
                with contextlib.suppress(OSError):
                    os.killpg(g, sig)

    def release(self) -> None:
        """Close the supervisor's control pipe (once): it kills what is left and ends."""
        with TABLES:
            fd, self.ctrl = self.ctrl, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    def open_pidfd(self) -> int | None:
        """A pidfd of the supervisor (readable once it exits); None if it is reaped
        already or there is none to have (see ``_open_pidfd``)."""
        with TABLES:  # unreaped while held: the pid is the supervisor's, not a reused one
            return None if self.proc.returncode is not None else _open_pidfd(self.proc.pid)

    def wait(self, timeout: float) -> bool:
        """Reap the supervisor within ``timeout``; False if it is still running. No lock
        is held while waiting: on the supervisor's pidfd, or (without one) between looks."""
        deadline = time.monotonic() + timeout
        pidfd = self.open_pidfd()
        if pidfd is not None:
            try:
                poller = select.poll()  # not select.select: the fd may be above FD_SETSIZE
                poller.register(pidfd, select.POLLIN)
                poller.poll(max(0.0, deadline - time.monotonic()) * 1000)
            finally:
                os.close(pidfd)
        delay = 0.001
        # After the pidfd, one look (it reaps). Without one (not Linux, or refused), a look
        # every so often, as Popen.wait does: never Popen.wait itself, which reaps unlocked.
        while True:
            with TABLES:
                if self.proc.poll() is not None:
                    return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.05)

    def record_exit(self) -> bool:
        """Reap the child if it exited; True if this call recorded the exit."""
        with TABLES:
            rc = self.proc.poll()
        if rc is None:
            return False
        with self.lock:
            if self.exit is not None:
                return False
            self.exit = _exit_record(rc)
            return True
