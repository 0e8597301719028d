"""The warm pool's one background thread (``pool.py``): it starts zygotes, reaps retired
ones and expires idle keys.

The pool used to start a thread for every zygote start and every retire (a retire waits
until the zygote's running jobs ended, which takes as long as they do) and ran a reaper
that woke every ``idle_s / 4`` to look for idle keys. This thread waits on the things
themselves: a wake pipe for new work, the pidfd of every zygote that was told to stop,
and the next key's expiry as its timeout. Nothing here takes a lock: work arrives through
a ``SimpleQueue``, and the table of retiring zygotes belongs to this thread alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import selectors
import threading
from collections.abc import Callable

from ..config.limits import ZYGOTE_EXIT_WAIT_S
from .supervisor import Supervisor

log = logging.getLogger(__name__)

PoolKey = tuple[str, bytes]  # (principal, SandboxSpec.to_bytes() or b"")


class PoolKeeper:
    """Runs ``start(key)`` for every :meth:`start_zygote`, stops and reaps every retired
    zygote, and calls ``expire()`` (which closes what is due and returns the seconds
    until the next key is, or None) whenever it wakes."""

    def __init__(
        self, start: Callable[[PoolKey], None], expire: Callable[[], float | None]
    ) -> None:
        self._start = start
        self._expire = expire
        self._work: queue.SimpleQueue[tuple[PoolKey | None, Supervisor | None]] = (
            queue.SimpleQueue()
        )
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._retiring: dict[int, Supervisor] = {}  # pidfd → a zygote told to stop
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="warm-pool", daemon=True)
        self._thread.start()

    def start_zygote(self, key: PoolKey) -> None:
        self._submit((key, None))

    def retire(self, zygote: Supervisor) -> None:
        """No more jobs for ``zygote``; it is reaped once its running jobs ended."""
        self._submit((None, zygote))

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):  # a wake-up is already pending
            os.write(self._wake_w, b"\0")

    def _submit(self, item: tuple[PoolKey | None, Supervisor | None]) -> None:
        self._work.put(item)
        self._wake()

    def close(self) -> None:
        """Kernel exit: the thread ends; zygotes still retiring exit on their own once
        their jobs did (the task manager kills those)."""
        self._closing = True
        self._wake()
        self._thread.join(ZYGOTE_EXIT_WAIT_S)
        if self._thread.is_alive():  # a start that hangs; its fds stay with it
            log.warning("warm pool keeper did not end")
            return
        for pidfd in self._retiring:
            os.close(pidfd)
        retired = list(self._retiring.values())
        self._retiring.clear()
        while True:  # retired after the thread's last round (a start that saw the close)
            try:
                _key, zygote = self._work.get_nowait()
            except queue.Empty:
                break
            if zygote is not None:
                retired.append(zygote)
        for zygote in retired:
            zygote.stop_taking()
            zygote.sock.close()
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
                    else:
                        self._reap(key.fd)
                self._drain()
            except Exception:  # never let the keeper die silently
                log.exception("warm pool keeper")

    def _drain(self) -> None:
        while not self._closing:
            try:
                key, zygote = self._work.get_nowait()
            except queue.Empty:
                return
            try:
                if key is not None:
                    self._start(key)
                elif zygote is not None:
                    self._stop(zygote)
            except Exception:  # one failed item must not strand the ones behind it
                log.exception("warm pool keeper: %s", "start" if key else "retire")

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
