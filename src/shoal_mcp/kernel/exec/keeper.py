"""The warm pool's background work (``pool.py``), on the kernel's owner loop: it starts
zygotes, reaps retired ones and discarded ready shells, and expires idle keys.

The pool used to start a thread for every zygote start, every retire (a retire waits
until the zygote's running jobs ended, which takes as long as they do) and every
discarded ready shell (its bash has to be reaped and its spools removed), and ran a
reaper that woke every ``idle_s / 4`` to look for idle keys; then it had one thread of
its own for all of it. Now each of these is a callback on the owner loop
(``owner/loop.py``), waiting on the things themselves: the pidfd of every zygote that
was told to stop, the report socket of every discarded shell's job, and a timer for
the next key's expiry. Nothing here takes a lock: requests arrive through
``call_soon``, and the tables of what is being waited for belong to the loop thread.

A zygote's start runs on the loop: a ``Popen`` (a few ms), which is all
``Supervisor()`` waits for.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any, Protocol

from ..config.limits import ZYGOTE_EXIT_WAIT_S
from ..owner.loop import LoopClosed, OwnerLoop, leave
from .supervisor import Job, Supervisor

log = logging.getLogger(__name__)

PoolKey = tuple[str, bytes]  # (principal, SandboxSpec.to_bytes() or b"")


class Droppable(Protocol):
    """A discarded ready shell (``ready.ReadyShell``): its job, and what to remove once
    that job ended."""

    job: Job

    def remove_files(self) -> None: ...


class PoolKeeper:
    """Runs ``start(key)`` for every :meth:`start_zygote`, stops and reaps every retired
    zygote, waits for every dropped shell's end, and calls ``expire()`` (which closes
    what is due and returns the seconds until the next key is, or None) after each of
    these and when its timer fires.

    ``loop``: the kernel's owner loop; without one the keeper makes (and closes) its own.
    """

    def __init__(
        self,
        start: Callable[[PoolKey], None],
        expire: Callable[[], float | None],
        loop: OwnerLoop | None = None,
    ) -> None:
        self._start = start
        self._expire = expire
        self._own_loop = loop is None
        self._loop = loop if loop is not None else OwnerLoop("warm-pool")
        self._retiring: dict[int, Supervisor] = {}  # pidfd → a zygote told to stop
        self._dropping: dict[int, Droppable] = {}  # job socket fd → a discarded shell
        self._timer: asyncio.TimerHandle | None = None
        self._closing = False

    # -- from any thread ------------------------------------------------------------------

    def start_zygote(self, key: PoolKey) -> None:
        self._submit(self._start, key, None)  # after the close: no start

    def retire(self, zygote: Supervisor) -> None:
        """No more jobs for ``zygote``; it is reaped once its running jobs ended."""
        self._submit(self._stop, zygote, _let_go)

    def drop(self, shell: Droppable) -> None:
        """``shell``'s job was told to end; its files go once it has."""
        self._submit(self._watch, shell, _wait_and_remove)

    def _submit(
        self, fn: Callable[[Any], None], item: object, closed: Callable[[Any], None] | None
    ) -> None:
        """``fn(item)`` on the loop; once the keeper is closed, ``closed(item)`` instead
        (as close() does with what it still holds), on whichever thread sees it."""
        try:
            self._loop.call_soon(self._do, fn, item, closed)
        except LoopClosed:  # kernel exit
            if closed is not None:
                closed(item)

    def close(self) -> None:
        """Kernel exit: no more starts; the zygotes still retiring exit on their own once
        their jobs did (the task manager kills those), and the dropped shells are waited
        for here (they were killed).  Once only; again is a no-op."""
        if self._closing:
            return
        self._closing = True
        # A start that hangs keeps the loop: the zygotes' fds then stay with it.
        leave(
            self._loop,
            self._close_on_loop,
            ZYGOTE_EXIT_WAIT_S,
            owned=self._own_loop,
            who="warm pool",
        )

    # -- on the loop ----------------------------------------------------------------------

    def _do(
        self, fn: Callable[[Any], None], item: object, closed: Callable[[Any], None] | None
    ) -> None:
        if self._closing:  # handed over before the close, run after it
            if closed is not None:
                closed(item)
            return
        try:
            fn(item)
        except Exception:  # one failed item must not strand the ones behind it
            log.exception("warm pool keeper: %s", fn.__name__)
        self._rearm()

    def _rearm(self) -> None:
        """Expire what is due; the timer set for the next key's expiry."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._closing:
            return
        due_in = self._expire()
        if due_in is not None:
            self._timer = self._loop.call_later(due_in, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._rearm()

    def _stop(self, zygote: Supervisor) -> None:
        zygote.stop_taking()
        if zygote.proc.poll() is not None:  # gone already (and now reaped): its pid
            zygote.close()  # may be another process's, so no pidfd of it
            return
        try:
            pidfd = os.pidfd_open(zygote.pid)
        except (AttributeError, OSError):  # no pidfds (not Linux): wait here, bounded
            zygote.close(ZYGOTE_EXIT_WAIT_S)
            return
        self._retiring[pidfd] = zygote
        self._loop.add_reader(pidfd, self._reap, pidfd)

    def _reap(self, pidfd: int) -> None:
        self._loop.remove_reader(pidfd)
        os.close(pidfd)
        self._retiring.pop(pidfd).close()  # it exited: the wait returns at once

    def _watch(self, shell: Droppable) -> None:
        fd = shell.job.sock.fileno()
        if shell.job.exit is not None or fd < 0:  # ended already: nothing to wait for
            _wait_and_remove(shell)
            return
        self._dropping[fd] = shell
        self._loop.add_reader(fd, self._dropped, fd)

    def _dropped(self, fd: int) -> None:
        """The discarded shell's report socket is readable: its end, or a line before it."""
        shell = self._dropping[fd]
        # Read without waiting (timeout 0); the end closes the socket, so the reader goes
        # first, and comes back if this was only a line before the end.
        self._loop.remove_reader(fd)
        if shell.job.wait(0) is None:
            self._loop.add_reader(fd, self._dropped, fd)
            return
        del self._dropping[fd]
        shell.remove_files()

    def _close_on_loop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for pidfd, zygote in self._retiring.items():
            self._loop.remove_reader(pidfd)
            os.close(pidfd)
            _let_go(zygote)
        for fd, shell in self._dropping.items():
            self._loop.remove_reader(fd)
            _wait_and_remove(shell)  # killed already (ReadyShells.close): their ends are near
        self._retiring.clear()
        self._dropping.clear()


def _let_go(zygote: Supervisor) -> None:
    zygote.stop_taking()
    zygote.sock.close()


def _wait_and_remove(shell: Droppable) -> None:
    shell.job.wait(ZYGOTE_EXIT_WAIT_S)
    shell.remove_files()
