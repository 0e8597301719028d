"""Every task nobody waits for is watched on the owner loop: supervisor reports as fd
readiness.

A background task, or a foreground one whose caller stopped waiting, used to get a
thread of its own, blocked in ``select()`` on its supervisor's socket until the exit;
then one watcher thread held all those sockets in one selector. Now they are readers
on the kernel's owner loop (``owner/loop.py``): a readable socket is a report line
(``exit``), read without blocking; a timer per task sends its throttled ``output``
event. Finalize runs on a worker (``elsewhere``; on the loop for a watcher without
one): it writes to the database and the CAS, which may be held for seconds by
another process or by ``store.gc``, and every client's reading waits on the loop.

Tasks come in through ``call_soon``, so ``add`` never waits for the loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from ..config.limits import TASK_OUTPUT_EVENT_INTERVAL_S
from ..owner.loop import LoopClosed, OwnerLoop, leave
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
    """Watches tasks until they exit, then hands each to ``finish`` exactly once.

    ``loop``: the kernel's owner loop; without one the watcher makes (and closes) its own.
    """

    def __init__(
        self,
        finish: Callable[[Task], None],
        publish_output: Callable[[Task], None],
        loop: OwnerLoop | None = None,
        elsewhere: Callable[[Callable[[], None]], None] | None = None,
    ):
        self._finish = finish
        self._publish_output = publish_output
        self._elsewhere = elsewhere  # where finalize runs (a worker), else on the loop
        self._own_loop = loop is None
        self._loop = loop if loop is not None else OwnerLoop("task-watcher")
        # task id → (its report socket's fd, its output timer): the loop thread's alone
        self._watched: dict[int, tuple[int, asyncio.TimerHandle]] = {}
        self._closing = False

    def add(self, task: Task) -> None:
        """Watch ``task`` from now on (its previous watcher has stopped)."""
        try:
            self._loop.call_soon(self._take, task)
        except LoopClosed:
            log.warning("task %s handed to the watcher after kernel exit", task.id)

    def close(self, timeout: float | None = None) -> None:
        """Stop watching (kernel exit, once the tasks are drained); a report or finalize
        under way finishes first."""
        if self._closing:
            return
        self._closing = True
        leave(self._loop, self._close_on_loop, timeout, owned=self._own_loop, who="task watcher")

    # -- on the loop ----------------------------------------------------------------------

    def _take(self, task: Task) -> None:
        if self._closing:
            return
        if task.run.check_exit() is not None:  # ended while changing hands
            self._finished(task)
            return
        fd = task.run.job.sock.fileno()
        timer = self._loop.call_at(task.next_output_at, self._on_timer, task)
        self._watched[task.id] = (fd, timer)
        self._loop.add_reader(fd, self._on_report, task)

    def _on_report(self, task: Task) -> None:
        # Readable: a report line, part of one, or EOF; never blocks (timeout 0).
        fd, timer = self._watched[task.id]
        try:
            ended = task.run.check_exit() is not None
        except Exception:  # noqa: BLE001 - one task's broken report must not stop the rest
            log.exception("reading the report of task %s failed", task.id)
            ended = True
        if ended:
            self._loop.remove_reader(fd)  # closed by now: the loop copes
            timer.cancel()
            del self._watched[task.id]
            self._finished(task)

    def _finished(self, task: Task) -> None:
        if self._elsewhere is not None:
            # Finalize writes to the database and the CAS, which another process or a
            # store.gc may hold for seconds: never on the loop every client waits on.
            self._elsewhere(lambda: self._finish_now(task))
            return
        self._finish_now(task)

    def _finish_now(self, task: Task) -> None:
        try:
            self._finish(task)
        except Exception:  # noqa: BLE001 - finish catches its own; belt and braces
            log.exception("finishing task %s failed", task.id)

    def _on_timer(self, task: Task) -> None:
        if task.done.is_set() or task.id not in self._watched:
            return
        task.next_output_at = time.monotonic() + TASK_OUTPUT_EVENT_INTERVAL_S
        self._publish_output(task)
        fd, _ = self._watched[task.id]
        self._watched[task.id] = (fd, self._loop.call_at(task.next_output_at, self._on_timer, task))

    def _close_on_loop(self) -> None:
        for fd, timer in self._watched.values():
            self._loop.remove_reader(fd)
            timer.cancel()
        self._watched.clear()
