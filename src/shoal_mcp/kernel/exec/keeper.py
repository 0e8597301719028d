"""The warm pool's one background thread (``pool.py``): it starts zygotes, reaps retired
ones and discarded ready shells, and expires idle keys.

The pool used to start a thread for every zygote start, every retire (a retire waits
until the zygote's running jobs ended, which takes as long as they do) and every
discarded ready shell (its bash has to be reaped and its spools removed), and ran a
reaper that woke every ``idle_s / 4`` to look for idle keys. This thread waits on the
things themselves: a wake pipe for new work, the pidfd of every zygote that was told to
stop, the report socket of every discarded shell's job, and the next key's expiry as its
timeout. Nothing here takes a lock: work arrives through a ``SimpleQueue``, and the
tables of what is being waited for belong to this thread alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import selectors
import threading
from collections.abc import Callable
from typing import Protocol

from ..config.limits import ZYGOTE_EXIT_WAIT_S
from .supervisor import Job, Supervisor

log = logging.getLogger(__name__)

PoolKey = tuple[str, bytes]  # (principal, SandboxSpec.to_bytes() or b"")


class Droppable(Protocol):
    """A discarded ready shell (``ready.ReadyShell``): its job, and what to remove once
    that job ended."""

    job: Job

    def remove_files(self) -> None: ...


Work = tuple[str, object]  # ("start", PoolKey) | ("retire", Supervisor) | ("drop", Droppable)


class PoolKeeper:
    """Runs ``start(key)`` for every :meth:`start_zygote`, stops and reaps every retired
    zygote, and calls ``expire()`` (which closes what is due and returns the seconds
    until the next key is, or None) whenever it wakes."""

    def __init__(
        self, start: Callable[[PoolKey], None], expire: Callable[[], float | None]
    ) -> None:
        self._start = start
        self._expire = expire
        self._work: queue.SimpleQueue[Work] = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._retiring: dict[int, Supervisor] = {}  # pidfd → a zygote told to stop
        self._dropping: dict[int, Droppable] = {}  # job socket fd → a discarded shell
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="warm-pool", daemon=True)
        self._thread.start()

    def start_zygote(self, key: PoolKey) -> None:
        self._submit(("start", key))

    def retire(self, zygote: Supervisor) -> None:
        """No more jobs for ``zygote``; it is reaped once its running jobs ended."""
        self._submit(("retire", zygote))

    def drop(self, shell: Droppable) -> None:
        """``shell``'s job was told to end; its files go once it has."""
        self._submit(("drop", shell))

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):  # a wake-up is already pending
            os.write(self._wake_w, b"\0")

    def _submit(self, item: Work) -> None:
        self._work.put(item)
        self._wake()

    def close(self) -> None:
        """Kernel exit: the thread ends; zygotes still retiring exit on their own once
        their jobs did (the task manager kills those).  Once only; again is a no-op."""
        if self._closing:
            return
        self._closing = True
        self._wake()
        self._thread.join(ZYGOTE_EXIT_WAIT_S)
        if self._thread.is_alive():  # a start that hangs; its fds stay with it
            log.warning("warm pool keeper did not end")
            return
        for pidfd in self._retiring:
            os.close(pidfd)
        retired = list(self._retiring.values())
        dropped = list(self._dropping.values())
        self._retiring.clear()
        self._dropping.clear()
        while True:  # handed over after the thread's last round (say a start that saw the close)
            try:
                kind, item = self._work.get_nowait()
            except queue.Empty:
                break
            if kind == "retire":
                retired.append(item)  # type: ignore[arg-type]
            elif kind == "drop":
                dropped.append(item)  # type: ignore[arg-type]
        for zygote in retired:
            zygote.stop_taking()
            zygote.sock.close()
        for shell in dropped:  # killed already (ReadyShells.close): their ends are near
            shell.job.wait(ZYGOTE_EXIT_WAIT_S)
            shell.remove_files()
        self._selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _run(self) -> None:
        while not self._closing:
            try:
                timeout = self._expire()
                for key, _events in self._selector.select(timeout):
                    if key.fd == self._wake_r:
                        with contextlib.suppress(BlockingIOError):
                            os.read(self._wake_r, 4096)
                    elif key.fd in self._dropping:
                        self._dropped(key.fd)
                    else:
                        self._reap(key.fd)
                self._drain()
            except Exception:  # never let the keeper die silently
                log.exception("warm pool keeper")

    def _drain(self) -> None:
        while not self._closing:
            try:
                kind, item = self._work.get_nowait()
            except queue.Empty:
                return
            try:
                if kind == "start":
                    self._start(item)  # type: ignore[arg-type]
                elif kind == "retire":
                    self._stop(item)  # type: ignore[arg-type]
                else:
                    self._watch(item)  # type: ignore[arg-type]
            except Exception:  # one failed item must not strand the ones behind it
                log.exception("warm pool keeper: %s", kind)

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
        self._selector.register(pidfd, selectors.EVENT_READ)

    def _reap(self, pidfd: int) -> None:
        self._selector.unregister(pidfd)
        os.close(pidfd)
        self._retiring.pop(pidfd).close()  # it exited: the wait returns at once

    def _watch(self, shell: Droppable) -> None:
        fd = shell.job.sock.fileno()
        if shell.job.exit is not None or fd < 0:  # ended already: nothing to wait for
            shell.job.wait()
            shell.remove_files()
            return
        self._dropping[fd] = shell
        self._selector.register(fd, selectors.EVENT_READ)

    def _dropped(self, fd: int) -> None:
        """The discarded shell's report socket is readable: its end, or a line before it."""
        # Out of the selector before the wait, which closes the socket once the end is in.
        self._selector.unregister(fd)
        shell = self._dropping.pop(fd)
        if shell.job.wait(0) is None:
            self._dropping[fd] = shell
            self._selector.register(fd, selectors.EVENT_READ)
            return
        shell.remove_files()
