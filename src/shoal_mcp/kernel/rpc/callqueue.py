"""A connection's blocking calls: ``MAX_BLOCKING_CALLS`` run at once, the next ones wait.

Each blocking call (exec, task.await, …) runs on a thread of its own. Past the limit a
call waits in the connection's FIFO queue, itself bounded in calls and frame bytes, and
the thread of a call that ends runs the next one. The facade sends every MCP request of
its client on one connection and accepts ``MCP_INPUT_QUEUE`` (256) pipelined ones: its
65th blocking call was refused -32031 before this queue (issue 31). The connection's
reader never waits here, so a ``task.cancel`` of a queued call is still read.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ..config.limits import MAX_BLOCKING_CALLS, MAX_QUEUED_BLOCKING_BYTES, MAX_QUEUED_BLOCKING_CALLS
from ..owner.tables import TABLES

RUN, QUEUED, REFUSED = "run", "queued", "refused"


class BlockingCalls:
    def __init__(self) -> None:
        self._running = 0
        self._queued: deque[tuple[Any, int]] = deque()  # (call, frame bytes)
        self._queued_bytes = 0

    def admit(self, call: Any, size: int) -> str:
        """RUN (the caller runs it now), QUEUED (a running call's thread will) or REFUSED."""
        with TABLES:
            if self._running < MAX_BLOCKING_CALLS:
                self._running += 1
                return RUN
            if (
                len(self._queued) < MAX_QUEUED_BLOCKING_CALLS
                and self._queued_bytes + size <= MAX_QUEUED_BLOCKING_BYTES
            ):
                self._queued.append((call, size))
                self._queued_bytes += size
                return QUEUED
            return REFUSED

    def next_after(self, closed: bool) -> tuple[Any, list[Any]]:
        """After a call ended on this thread: the next queued call to run here, or None
        and, when the connection ``closed``, the calls dropped from the queue."""
        with TABLES:
            if self._queued and not closed:
                call, size = self._queued.popleft()
                self._queued_bytes -= size
                return call, []
            self._running -= 1
            dropped = [call for call, _ in self._queued] if closed else []
            if closed:
                self._queued.clear()
                self._queued_bytes = 0
            return None, dropped
