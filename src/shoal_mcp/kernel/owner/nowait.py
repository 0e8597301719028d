"""Work the owner loop does at once or not at all.

Every client waits on the owner loop, so the loop must never wait on something another
thread or process holds: the database's write lock (another process, ``store.gc``, a
worker's transaction), a session's lock held by a worker whose finalize waits on it.
Code that may run on the loop takes such locks through :func:`hold`. Inside
:func:`no_wait` (the loop, around an exec's start and its finalize) a lock is taken only
if it is free, else :class:`WouldWait` is raised before the work has done anything, and
the caller runs the work on a worker, where waiting is allowed. Outside it :func:`hold`
is a plain ``with lock``.

The mode is per thread: only the thread that entered :func:`no_wait` is affected.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol


class WouldWait(Exception):
    """Work tried inside :func:`no_wait` would have waited; nothing of it was done."""


class _Lock(Protocol):
    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...

    def release(self) -> None: ...


_mode = threading.local()


def waits_allowed() -> bool:
    """False inside :func:`no_wait` on this thread."""
    return not getattr(_mode, "no_wait", False)


@contextmanager
def no_wait() -> Iterator[None]:
    """Run the block at once or raise :class:`WouldWait` (nested: stays in the mode)."""
    before = getattr(_mode, "no_wait", False)
    _mode.no_wait = True
    try:
        yield
    finally:
        _mode.no_wait = before


def hold(lock: _Lock) -> AbstractContextManager[None]:
    """``with lock``, except inside :func:`no_wait`, where a held lock raises WouldWait."""
    return _held(lock, not waits_allowed())


@contextmanager
def _held(lock: _Lock, at_once: bool) -> Iterator[None]:
    if not lock.acquire(blocking=not at_once):
        raise WouldWait()
    try:
        yield
    finally:
        lock.release()


def take_now(lock: _Lock) -> None:
    """Acquire ``lock`` if it is free, else :class:`WouldWait` (for a holder that
    releases it elsewhere, like a claim held across several steps)."""
    if not lock.acquire(blocking=False):
        raise WouldWait()
