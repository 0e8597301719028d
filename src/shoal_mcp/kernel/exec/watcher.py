"""One thread watches every task nobody waits for: supervisor reports as fd readiness.

A background task, or a foreground one whose caller stopped waiting, used to get a
thread of its own, blocked in ``select()`` on its supervisor's socket until the exit.
Here one thread holds all those sockets in one selector: a readable socket is a report
line (``exit``), read without blocking; a timer per task sends its throttled
``output`` event. Finalize runs on this thread, one task after another: it is the
bookkeeping that stays in the kernel (a few ms; the output itself was written by the
supervisor).

Tasks come in through a queue and an eventfd that wakes the selector, so ``add`` never
waits for the watcher.
"""

from __future__ import annotations

import heapq
import logging
import os
import queue
import selectors
import threading
import time
import weakref
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from ..config.limits import TASK_OUTPUT_EVENT_INTERVAL_S
from .runner import RunningCommand

log = logging.getLogger(__name__)


class Watched(Protocol):
    """What the watcher reads of a task (``tasks.Task``)."""

    id: int
    run: RunningCommand
    done: threading.Event
    next_output_at: float


Task = TypeVar("Task", bound=Watched)


class BackgroundWatcher(Generic[Task]):
    """Watches tasks until they exit, then hands each to ``finish`` exactly once."""

    def __init__(self, finish: Callable[[Task], None], publish_output: Callable[[Task], None]):
        self._finish = finish
        self._publish_output = publish_output
        self._incoming: queue.SimpleQueue[Task] = queue.SimpleQueue()
        self._wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        # Closed with the watcher, never by its thread: add() and close() may write to
        # it at any time, and a number closed under them could be another file's.
        weakref.finalize(self, os.close, self._wake)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake, selectors.EVENT_READ)
        self._timers: list[tuple[float, int, Task]] = []  # (when, task id, task): a heap
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="task-watcher", daemon=True)
        self._thread.start()

    def add(self, task: Task) -> None:
        """Watch ``task`` from now on (its previous watcher has stopped)."""
        self._incoming.put(task)
        os.eventfd_write(self._wake, 1)

    def close(self, timeout: float | None = None) -> None:
        """Stop watching (kernel exit, once the tasks are drained); the thread ends after
        the report or finalize it is busy with."""
        self._closing = True
        os.eventfd_write(self._wake, 1)
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            while not self._closing:
                for key, _ in self._selector.select(self._next_timeout()):
                    if key.fd == self._wake:
                        os.eventfd_read(self._wake)
                        self._take_incoming()
                    else:
                        self._on_report(key.data)
                self._on_timers()
        finally:
            self._selector.close()

    def _take_incoming(self) -> None:
        while not self._closing:
            try:
                task = self._incoming.get_nowait()
            except queue.Empty:
                return
            if task.run.check_exit() is not None:  # ended while changing hands
                self._finished(task)
                continue
            self._selector.register(task.run.job.sock, selectors.EVENT_READ, task)
            heapq.heappush(self._timers, (task.next_output_at, task.id, task))

    def _on_report(self, task: Task) -> None:
        # Readable: a report line, part of one, or EOF; never blocks (timeout 0).
        sock = task.run.job.sock
        try:
            ended = task.run.check_exit() is not None
        except Exception:  # noqa: BLE001 - one task's broken report must not stop the rest
            log.exception("reading the report of task %s failed", task.id)
            ended = True
        if ended:
            self._selector.unregister(sock)  # closed by now: the selector copes
            self._finished(task)

    def _finished(self, task: Task) -> None:
        try:
            self._finish(task)
        except Exception:  # noqa: BLE001 - finish catches its own; belt and braces
            log.exception("finishing task %s failed", task.id)

    def _next_timeout(self) -> float | None:
        while self._timers and self._timers[0][2].done.is_set():
            heapq.heappop(self._timers)
        if not self._timers:
            return None
        return max(0.0, self._timers[0][0] - time.monotonic())

    def _on_timers(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, task = heapq.heappop(self._timers)
            if task.done.is_set():
                continue
            task.next_output_at = now + TASK_OUTPUT_EVENT_INTERVAL_S
            self._publish_output(task)
            heapq.heappush(self._timers, (task.next_output_at, task.id, task))
