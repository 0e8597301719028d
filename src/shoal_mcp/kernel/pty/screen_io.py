"""A PTY's screen IO: output read into its emulator, input written, changes reported.

Each open PTY has a reader thread (``ScreenPump.run``) that feeds the program's output
to the screen, answers its device status queries, and reports screen changes and the
exit through ``on_screen_change``, never under a lock. Input is written non-blocking
within a time budget (``write``); the manager's ``send`` and the answers share it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import time
from collections.abc import Callable
from typing import Any

from ..config.limits import PTY_EVENT_INTERVAL_S, PTY_IDLE_POLL_S, PTY_READ_CHUNK
from .screen import _cursor
from .terminal import OpenPty

log = logging.getLogger(__name__)


class ScreenPump:
    """Moves bytes between PTYs and their screens; reports what changed."""

    def __init__(self, on_screen_change: Callable[[str, dict], None] | None) -> None:
        self._on_change = on_screen_change

    def write(self, p: OpenPty, data: bytes, timeout: float) -> int | None:
        """Write what the program accepts within `timeout`; None if the terminal is gone."""
        view = memoryview(data)
        sent = 0
        deadline = time.monotonic() + timeout
        with p.write_lock:
            if p.closed or p.eof:
                return None
            poller = select.poll()
            poller.register(p.master, select.POLLOUT)
            if any(ev & select.POLLHUP for _fd, ev in poller.poll(0)):
                return None  # no slave fd open (the reader may not have seen EOF yet)
            while sent < len(data):
                try:
                    sent += os.write(p.master, view[sent:])
                    continue
                except BlockingIOError:
                    pass
                except OSError as e:
                    if e.errno in (errno.EIO, errno.EBADF, errno.ENXIO):
                        return sent or None
                    raise
                left = deadline - time.monotonic()
                if left <= 0 or p.stopping.is_set():
                    break
                poller.poll(min(left, 0.05) * 1000)
        return sent

    def run(self, p: OpenPty) -> None:
        """The reader thread of ``p``: feed its output to the screen, report changes
        (throttled) and, once the child is gone, its exit."""
        poller = select.poll()
        poller.register(p.master, select.POLLIN)
        poller.register(p.wake_r, select.POLLIN)
        # The program's supervisor as a pidfd, readable once it exited: a program that
        # ended while something else (a background job) holds the tty is seen then,
        # not by looking every so often. Without one (not Linux, or already reaped by
        # close()), looking it is.
        pidfd = p.open_pidfd()
        if pidfd is not None:
            poller.register(pidfd, select.POLLIN)
        exited = False  # the pidfd said so; recorded once the master is drained
        eof = False
        next_check = time.monotonic() + PTY_IDLE_POLL_S
        try:
            while not p.stopping.is_set():
                timeout: float | None = None if pidfd is not None else PTY_IDLE_POLL_S
                if exited and p.exit is None:
                    timeout = 0.0  # one more round: record the exit once drained
                elif p.pending:
                    timeout = max(0.0, p.last_emit + PTY_EVENT_INTERVAL_S - time.monotonic())
                drained = True  # nothing was waiting on the master this round
                for fd, _ev in poller.poll(None if timeout is None else timeout * 1000):
                    if fd == p.wake_r:
                        with contextlib.suppress(OSError):
                            os.read(p.wake_r, 4096)
                        continue
                    if fd == pidfd:
                        poller.unregister(pidfd)
                        exited = True
                        continue
                    try:
                        data = os.read(p.master, PTY_READ_CHUNK)
                    except BlockingIOError:
                        continue
                    except OSError:  # EIO: every slave fd is closed
                        data = b""
                    if not data:
                        eof = p.eof = True
                        break
                    drained = False
                    self._feed(p, data)
                self.emit_screen(p)
                if eof:
                    break
                # Only once the master is drained: an exit recorded while output is still
                # buffered would report a finished program with a half-drawn screen.
                if drained and p.exit is None and self._exit_due(pidfd, exited, next_check):
                    next_check = time.monotonic() + PTY_IDLE_POLL_S
                    if p.record_exit():
                        # The child is gone but someone (a background job) holds the tty.
                        self.emit_exit(p)
            if eof and not p.stopping.is_set():
                self._await_exit(p)
                self.emit_screen(p, wait=True)
                self.emit_exit(p)
        except Exception:  # never let a reader die silently
            log.exception("%s: reader thread failed", p.id)
        finally:
            if pidfd is not None:
                os.close(pidfd)

    @staticmethod
    def _await_exit(p: OpenPty) -> None:
        """The terminal is closed: wait for the program's supervisor to end and record its
        exit. ``OpenPty.wait`` waits on its pidfd, never on its pid: ``close()`` may reap
        it meanwhile, and the system may then give that pid to an unrelated process (a
        wait on it would follow that one). ``close()`` ends the program, so the wait;
        ``stopping`` is looked at between waits of ``PTY_IDLE_POLL_S``."""
        while not p.stopping.is_set() and not p.wait(PTY_IDLE_POLL_S):
            pass
        p.record_exit()

    @staticmethod
    def _exit_due(pidfd: int | None, exited: bool, next_check: float) -> bool:
        """Whether to try recording the exit now: the pidfd said the program ended, or
        (without a pidfd) the next look is due."""
        return exited if pidfd is not None else time.monotonic() >= next_check

    def _feed(self, p: OpenPty, data: bytes) -> None:
        with p.lock:
            s = p.screen
            c = s.cursor
            before = (c.x, c.y, c.hidden)
            try:
                p.stream.feed(p.osc_filter.feed(data))
            except Exception as e:  # a malformed sequence must not stop the terminal
                log.debug("%s: emulator error: %r", p.id, e)
            c = s.cursor
            if s.dirty or before != (c.x, c.y, c.hidden):
                p.dirty_rows.update(s.dirty)
                s.dirty.clear()
                p.version += 1
                p.pending = True
            responses, s.responses = s.responses, []
        if responses:  # answers to device status queries, best effort
            self.write(p, "".join(responses).encode(), 0.0)

    def emit_screen(self, p: OpenPty, wait: bool = False) -> None:
        """Report a pending screen change, at most once per PTY_EVENT_INTERVAL_S
        (``wait``: sleep until it is due, else leave it to a later round)."""
        if not p.pending:
            return
        due = p.last_emit + PTY_EVENT_INTERVAL_S - time.monotonic()
        if due > 0 and (not wait or p.stopping.wait(due)):
            return
        with p.lock:
            p.pending = False
            cursor = _cursor(p.screen)
        p.last_emit = time.monotonic()
        self._notify(p.id, {"kind": "screen", "cursor": cursor})

    def emit_exit(self, p: OpenPty) -> None:
        """Report the exit once per PTY, whoever recorded it."""
        with p.lock:
            if p.exit is None or p.exit_emitted:
                return
            p.exit_emitted = True
            exit_ = dict(p.exit)
        self._notify(p.id, {"kind": "exit", "exit": exit_})

    def _notify(self, pty_id: str, payload: dict[str, Any]) -> None:
        if self._on_change is None:
            return
        try:
            self._on_change(pty_id, payload)
        except Exception:
            log.exception("%s: on_screen_change callback failed", pty_id)
