"""A connection's "closed", readable both as a flag and as a file descriptor.

A foreground exec waits for its command by blocking in ``select()`` on the supervisor's
report socket. It must also wake when its caller leaves (nobody will read the reply, and
the command goes on as a listed task). With a plain ``threading.Event`` that took a poll
of the event every quarter second; with this flag's eventfd in the same ``select()``, the
wait wakes at the moment the connection is closed, and sleeps otherwise.
"""

from __future__ import annotations

import os
import threading
import weakref


class ClosedFlag:
    """Set once, never cleared. ``fileno()`` is readable from the moment it is set."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        # Closed with the flag: a waiter holds the flag (through its call) while it
        # selects on the fd, so the number cannot be reused under it.
        weakref.finalize(self, os.close, self._fd)

    def set(self) -> None:
        if self._event.is_set():
            return
        self._event.set()
        try:
            os.eventfd_write(self._fd, 1)
        except OSError:  # the counter cannot overflow at 1; nothing else can fail here
            pass

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    def fileno(self) -> int:
        return self._fd
