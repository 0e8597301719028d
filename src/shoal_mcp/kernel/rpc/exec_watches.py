"""The waits of a foreground exec on the owner loop: readers and timers, no thread.

While an exec started on the loop runs (``loop_exec.py``), what it waits for is the
loop's: its supervisor's report socket (a line, part of one, or EOF: the exit), its
caller's closed-fd (a hangup), its next ``output`` event and its ``timeout_ms``. The
first of exit, timeout and hangup ends the watch (its readers and timers come off the
loop) and is handed to the ``Ending``, which answers. Everything here runs on the
loop thread and is touched only there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..config.limits import TASK_OUTPUT_EVENT_INTERVAL_S
from ..exec.calls import RunOptions
from ..owner.loop import OwnerLoop
from .call import Call

if TYPE_CHECKING:
    from ..exec.tasks import Task
    from .registry import MethodSpec
    from .socket_connection import SocketConnection

log = logging.getLogger(__name__)


@dataclass(eq=False)  # a watch is itself, kept in sets
class Watch:
    """One exec watched on the loop, from its start to its reply."""

    conn: SocketConnection
    spec: MethodSpec
    msg_id: Any
    call: Call
    task: Task
    started: float
    opts: RunOptions
    ignored: list[str]
    fd: int = -1  # its report socket's, as registered: removed by number once closed
    output_timer: asyncio.TimerHandle | None = None  # its next ``output`` event
    deadline: asyncio.TimerHandle | None = None  # its ``timeout_ms``
    over: bool = False  # its watch has ended (exit, timeout or hangup)


class Ending(Protocol):
    """Who answers once a watch has ended, on the loop."""

    def exited(self, watch: Watch) -> None: ...

    def timed_out(self, watch: Watch) -> None: ...

    def hung_up(self, watch: Watch) -> None: ...


class ExecWatches:
    def __init__(
        self, loop: OwnerLoop, publish_output: Callable[[Task], None], ending: Ending
    ) -> None:
        self.loop = loop
        self.publish_output = publish_output
        self.ending = ending
        self._of_conn: dict[int, set[Watch]] = {}  # by connection id

    def watch(self, watch: Watch) -> None:
        """Its report socket, its caller's hangup and its timers, on the loop."""
        task, conn = watch.task, watch.conn
        mine = self._of_conn.setdefault(conn.id, set())
        if not mine:  # the first exec of this connection watched here: its hangup too
            self.loop.add_reader(conn.closed.fileno(), self._hung_up, conn)
        mine.add(watch)
        watch.fd = task.run.job.sock.fileno()
        self.loop.add_reader(watch.fd, self._on_report, watch)
        watch.output_timer = self.loop.call_at(task.next_output_at, self._on_output, watch)
        if watch.opts.timeout_ms is not None:
            watch.deadline = self.loop.call_later(
                watch.opts.timeout_ms / 1000, self._timed_out, watch
            )

    def end(self, watch: Watch) -> None:
        """Its fds and timers off the loop (before anything else may close them)."""
        watch.over = True
        for timer in (watch.output_timer, watch.deadline):
            if timer is not None:
                timer.cancel()
        if watch.fd >= 0:
            # By the number it was registered with: reading the exit closed the socket,
            # and a reader left under that number would meet the next file to get it.
            self.loop.remove_reader(watch.fd)
            watch.fd = -1
        conn = watch.conn
        mine = self._of_conn.get(conn.id)
        if mine is not None:
            mine.discard(watch)
            if not mine:
                del self._of_conn[conn.id]
                self.loop.remove_reader(conn.closed.fileno())

    def _on_output(self, watch: Watch) -> None:
        if watch.over:
            return
        task = watch.task
        task.next_output_at = time.monotonic() + TASK_OUTPUT_EVENT_INTERVAL_S
        self.publish_output(task)
        watch.output_timer = self.loop.call_at(task.next_output_at, self._on_output, watch)

    def _on_report(self, watch: Watch) -> None:
        # Readable: a report line, part of one, or EOF; never blocks.
        if watch.over:
            return
        try:
            ended = watch.task.run.check_exit() is not None
        except Exception:  # noqa: BLE001 - a broken report ends the watch; finalize says why
            log.exception("reading the report of exec %s failed", watch.msg_id)
            ended = True
        if ended:
            self.end(watch)
            self.ending.exited(watch)

    def _timed_out(self, watch: Watch) -> None:
        if not watch.over:
            self.end(watch)
            self.ending.timed_out(watch)

    def _hung_up(self, conn: SocketConnection) -> None:
        """Nobody will read the replies: each exec watched for ``conn`` ends."""
        for watch in list(self._of_conn.get(conn.id, ())):
            self.end(watch)
            self.ending.hung_up(watch)
