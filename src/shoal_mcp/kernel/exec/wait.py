"""Waiting for a foreground exec on the calling thread, within the caller's budget."""

from __future__ import annotations

from .calls import Caller
from .tasks import Task, TaskManager


def wait_for(tasks: TaskManager, task: Task, timeout_ms: int | None, caller: Caller) -> bool:
    """Watch ``task`` on this thread within the budget; False when the budget ran out
    or the caller left (the task is then still running, or finishing). The wait sleeps
    in ``select()`` on the supervisor's report and the caller's hangup fd: no poll."""
    timeout = None if timeout_ms is None else timeout_ms / 1000
    return tasks.watch(task, timeout, caller.hangup)
