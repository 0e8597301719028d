"""Waiting for a foreground exec on the calling thread, within the caller's budget."""

from __future__ import annotations

import time

from .calls import Caller
from .tasks import Task, TaskManager

DISCONNECT_POLL_S = 0.25
"""How often a foreground exec checks that its caller is still connected."""


def wait_for(tasks: TaskManager, task: Task, timeout_ms: int | None, caller: Caller) -> bool:
    """Watch ``task`` on this thread within the budget; False when the budget ran out
    or the caller left (the task is then still running, or finishing)."""
    deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
    while True:
        step = DISCONNECT_POLL_S
        if deadline is not None:
            step = min(step, max(0.0, deadline - time.monotonic()))
        if tasks.watch(task, step):
            return True
        if caller.gone() or (deadline is not None and time.monotonic() >= deadline):
            return False
