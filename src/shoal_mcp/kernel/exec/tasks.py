"""Tasks: every exec runs as one; background and timed-out ones are listed.

See docs/decisions.md, Exec.

``watch`` waits for the child, publishes throttled ``output`` events, and on exit hands the
task to ``finalize`` (CAS ingest, transcript, journal) exactly once. A foreground exec is
watched by the thread serving its call, which then writes the reply itself (no hand-off
to another thread on the lean path); a background task, or a foreground one whose caller
stopped waiting, is handed to the one thread that watches all such tasks on their
supervisors' sockets (``watcher.py``). Only one thread watches a task at a time. A task's state moves only through its
``TaskLifecycle`` (``lifecycle.py``), under the kernel's table lock (``TABLES``).
"""

from __future__ import annotations

import builtins
import itertools
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...protocol import uri
from ...protocol.errors import ErrorCode, RpcError
from ..config.limits import TASK_OUTPUT_EVENT_INTERVAL_S
from ..events.bus import EventBus
from ..owner.loop import OwnerLoop
from ..owner.tables import TABLES
from .lifecycle import CancelResult, Move, TaskLifecycle, TaskState
from .runner import RunningCommand
from .watcher import BackgroundWatcher

log = logging.getLogger(__name__)


class Hangup(Protocol):
    """Set once nobody will read the reply (the connection closed); its fd is readable
    from then on, so a wait in ``select()`` wakes on it without polling."""

    def is_set(self) -> bool: ...

    def fileno(self) -> int: ...


@dataclass
class Task:
    id: int
    session: str
    principal: str
    src: str
    run: RunningCommand
    listed: bool  # background or timed out: visible in task.list
    effects: list[dict] = field(default_factory=list)
    # Created once spawned: its lifecycle starts running (the spawn-pending phase is the
    # in-flight call's, rpc/connection.py).
    lifecycle: TaskLifecycle = field(default_factory=lambda: TaskLifecycle(TaskState.RUNNING))
    started: float = field(default_factory=time.time)
    finished: float | None = None
    result: dict | None = None  # what exec returns, once finished
    error: dict | None = None
    done: threading.Event = field(default_factory=threading.Event)
    journal_id: int | None = None  # its ``running`` journal row (finalize completes it)
    start_state: tuple[str, dict[str, str]] | None = None  # session (cwd, env) at spawn
    # The watcher's throttle for ``output`` events: last sizes sent and when the next may go.
    sizes_sent: tuple[int, int] = (0, 0)
    next_output_at: float = 0.0
    # Its $SHOAL_OUT entry, prepared by finalize and made once (``make_output_entry``).
    output_entry: Callable[[], None] | None = None

    def make_output_entry(self) -> None:
        """Make this task's ``$SHOAL_OUT/<n>`` entry, once (finalize prepared it)."""
        entry, self.output_entry = self.output_entry, None
        if entry is not None:
            entry()

    @property
    def state(self) -> TaskState:
        """The state as clients see it (``TaskLifecycle.shown``)."""
        return self.lifecycle.shown

    @property
    def ref(self) -> str:
        return uri.task_ref(self.id)

    @property
    def channel(self) -> str:
        return uri.task_channel(self.id)

    def record(self) -> dict[str, Any]:
        out_bytes, err_bytes = (
            self.run.output_sizes() if not self.done.is_set() else (self._final_sizes())
        )
        rec: dict[str, Any] = {
            "task": self.ref,
            "uri": uri.task_uri(self.id),
            "session": self.session,
            "principal": self.principal,
            "src": self.src,
            "state": self.state.value,
            "pid": self.run.pid,
            "started": self.started,
            "out_bytes": out_bytes,
            "err_bytes": err_bytes,
            "events": self.channel,
        }
        if self.finished is not None:
            rec["finished"] = self.finished
        if self.result is not None:
            rec["result_ref"] = self.result["ref"]
            rec["result_uri"] = self.result["uri"]
        if self.error is not None:
            rec["error"] = self.error
        return rec

    def _final_sizes(self) -> tuple[int, int]:
        value = (self.result or {}).get("stored") or {}
        return value.get("out_len", 0), value.get("err_len", 0)


class TaskManager:
    def __init__(
        self,
        events: EventBus,
        finalize: Callable[[Task], dict],
        loop: OwnerLoop | None = None,
        elsewhere: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        self.events = events
        self.finalize = finalize
        self._tasks: dict[int, Task] = {}
        self._ids = itertools.count(1)
        self._closing = False  # set by shutdown(): no task may start behind its back
        self.watcher = BackgroundWatcher(self._finish, self.publish_output, loop, elsewhere)

    def start(
        self,
        session: str,
        principal: str,
        src: str,
        run: RunningCommand,
        background: bool,
        effects: list[dict],
        *,
        journal_id: int | None = None,
        start_state: tuple[str, dict[str, str]] | None = None,
    ) -> Task:
        task = Task(
            next(self._ids),
            session,
            principal,
            src,
            run,
            listed=background,
            effects=effects,
            journal_id=journal_id,
            start_state=start_state,
        )
        with TABLES:
            closing = self._closing
            if not closing:
                self._tasks[task.id] = task
        if closing:
            # A call that spawned while the kernel began to exit: shutdown() has already
            # taken its list of tasks to kill, so this one dies here, not as an orphan.
            run.terminate()
            raise RpcError(
                ErrorCode.INTERNAL, "kernel is shutting down; the command was killed as it started"
            )
        self.events.publish(
            task.channel, {"kind": "started", "task": task.ref, "pid": run.pid, "src": src[:256]}
        )
        task.next_output_at = time.monotonic() + TASK_OUTPUT_EVENT_INTERVAL_S
        if background:
            self.watch_in_background(task)
        return task

    def watch_in_background(self, task: Task) -> None:
        """Hand ``task`` to the background watcher (its starter does not watch it)."""
        if task.done.is_set():
            return
        self.watcher.add(task)

    def watch(self, task: Task, timeout: float | None, hangup: Hangup | None = None) -> bool:
        """Watch ``task`` on this thread for up to ``timeout`` seconds (None: until it exits).

        True once the command has exited and been finalized here; False when the time ran
        out first, or ``hangup`` was set (its fd wakes the wait; the caller then watches
        again or calls ``watch_in_background``).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        wake = None if hangup is None else hangup.fileno()
        while True:
            now = time.monotonic()
            step = max(0.0, task.next_output_at - now)
            if deadline is not None:
                step = min(step, max(0.0, deadline - now))
            if task.run.wait(step, wake) is not None:
                break
            if hangup is not None and hangup.is_set():
                return False
            now = time.monotonic()
            if now >= task.next_output_at:
                task.next_output_at = now + TASK_OUTPUT_EVENT_INTERVAL_S
                self.publish_output(task)
            if deadline is not None and now >= deadline:
                return False
        self._finish(task, entry_now=False)  # the caller makes it after its reply
        return True

    def finish_watched(self, task: Task) -> None:
        """A foreground exec whose caller watched it (on the owner loop) has exited:
        finalize it here; its caller makes its ``$SHOAL_OUT`` entry after the reply."""
        self._finish(task, entry_now=False)

    def publish_output(self, task: Task) -> None:
        """Its ``output`` event, when its sizes changed since the last one."""
        sizes = task.run.output_sizes()
        if sizes != task.sizes_sent:
            task.sizes_sent = sizes
            self.events.publish(
                task.channel, {"kind": "output", "out_bytes": sizes[0], "err_bytes": sizes[1]}
            )

    def _finish(self, task: Task, *, entry_now: bool = True) -> None:
        """Finalize ``task`` and publish its end. ``entry_now``: make its ``$SHOAL_OUT``
        entry here too (else its foreground caller does, once the reply is written)."""
        with TABLES:
            task.lifecycle.exited()
        try:
            result = self.finalize(task)
            with TABLES:
                task.result = result
                task.lifecycle.finished(bool(result.get("ok")))
        except RpcError as exc:
            with TABLES:
                task.error = exc.to_error()
                task.lifecycle.finished(ok=False)
        except Exception as exc:  # noqa: BLE001 - a task must always finish
            log.exception("finalizing task %s failed", task.id)
            with TABLES:
                task.error = {"code": int(ErrorCode.INTERNAL), "message": f"finalize failed: {exc}"}
                task.lifecycle.crashed()
        if entry_now:
            task.make_output_entry()
        task.finished = time.time()
        task.done.set()
        payload = {"kind": "finished", "task": task.ref, "state": task.state.value}
        if task.result:
            payload["result_ref"] = task.result["ref"]
        self.events.publish(task.channel, payload)

    # -- lookup ---------------------------------------------------------------------------

    def get(self, task_id: int | str, session: str, principal: str, see_all: bool = False) -> Task:
        num = parse_task_id(task_id)
        with TABLES:
            task = self._tasks.get(num)
        if task is None or task.session != session or (task.principal != principal and not see_all):
            raise RpcError(
                ErrorCode.UNKNOWN_TASK, f"unknown task {task_id}", {"task": str(task_id)}
            )
        return task

    def list(self, session: str, principal: str, see_all: bool = False) -> list[Task]:
        with TABLES:
            tasks = list(self._tasks.values())
        return [
            t
            for t in tasks
            if t.listed and t.session == session and (see_all or t.principal == principal)
        ]

    def running_of(self, session: str, principal: str) -> builtins.list[Task]:
        """The principal's running tasks in a session, listed or not (foreground execs)."""
        with TABLES:
            tasks = list(self._tasks.values())
        return [
            t
            for t in tasks
            if t.session == session and t.principal == principal and not t.done.is_set()
        ]

    def running_total(self) -> int:
        with TABLES:
            return sum(1 for t in self._tasks.values() if not t.done.is_set())

    def running_count(self, principal: str) -> int:
        """Unfinished tasks of ``principal``, foreground execs included: the
        ``max_tasks`` quota (docs/decisions.md, Exec processes)."""
        with TABLES:
            return sum(
                1 for t in self._tasks.values() if t.principal == principal and not t.done.is_set()
            )

    # -- control --------------------------------------------------------------------------

    def forget(self, task: Task) -> None:
        """Drop a finished, unlisted (foreground) task: nothing can look it up any more."""
        with TABLES:  # one step: a detach cannot come between the check and the pop
            if task.done.is_set() and not task.listed:
                self._tasks.pop(task.id, None)

    def detach(self, task: Task) -> None:
        """A foreground exec ran past its wait budget: it becomes a listed task."""
        with TABLES:
            task.listed = True

    def cancel(self, task: Task, *, at_once: bool = False) -> CancelResult:
        """Cancel a running task: SIGTERM its group, SIGKILL after ``CANCEL_GRACE_S``.
        ``at_once``: SIGKILL now, for a cancel that overtook the spawn (nothing has seen
        the command, and bash can hold a SIGTERM that lands while it forks). A task whose
        command has exited and is being finalized is left alone (TOO_LATE)."""
        with TABLES:
            result = task.lifecycle.cancel()
            if result is CancelResult.ALREADY_DONE:
                raise RpcError(
                    ErrorCode.TASK_CONTROL,
                    f"{task.ref} already {task.state}",
                    {"state": task.state.value},
                )
        if result is CancelResult.TOO_LATE:
            return result
        # One write to the supervisor, which times the grace: the task's watcher reads
        # the exit, so no thread here waits for it.
        task.run.begin_terminate(at_once=at_once)
        return result

    def suspend(self, task: Task) -> None:
        self._signal(task, signal.SIGSTOP, Move.SUSPEND, TaskState.RUNNING)

    def resume(self, task: Task) -> None:
        self._signal(task, signal.SIGCONT, Move.RESUME, TaskState.SUSPENDED)

    def _signal(self, task: Task, sig: int, move: Move, need: TaskState) -> None:
        lifecycle = task.lifecycle
        with TABLES:
            # Judged on the state shown: a finalizing task shows the state it left, and
            # its group, which has exited, is then gone (the table refuses the move).
            if task.state is not need:
                raise RpcError(
                    ErrorCode.TASK_CONTROL,
                    f"{task.ref} is {task.state}; {signal.Signals(sig).name} needs {need}",
                    {"state": task.state.value},
                )
            allowed = lifecycle.allows(move)
        # The signal goes outside TABLES (it is a write to the supervisor, under the job's
        # own lock); a task that exits meanwhile is finalizing once this is back, and the
        # move is then not made, as if the signal had come just before the exit.
        if not allowed or not task.run.signal_group(sig):
            raise RpcError(ErrorCode.TASK_CONTROL, f"{task.ref}: process group is gone")
        with TABLES:
            moved = lifecycle.allows(move)
            if moved:
                lifecycle.fire(move)
        if moved:
            self.events.publish(task.channel, {"kind": task.state.value, "task": task.ref})

    def shutdown(self, drain_s: float) -> bool:
        """Kernel exit: terminate every running task's process group, then wait (up to
        ``drain_s``) until each result is stored, so killed commands reach the journal.

        False if some task is still finalizing when the time is up.
        """
        with TABLES:
            self._closing = True
            running = [t for t in self._tasks.values() if not t.done.is_set()]
        for task in running:
            task.run.begin_terminate()  # each task's watcher reads its exit
        deadline = time.monotonic() + drain_s
        drained = all(t.done.wait(max(0.0, deadline - time.monotonic())) for t in running)
        self.watcher.close(timeout=max(0.0, deadline - time.monotonic()))
        return drained


def parse_task_id(value: int | str) -> int:
    """N of ``task:N``, ``shoal://task/N`` or N; -32021 for anything else."""
    try:
        return uri.ref_number(value, uri.TASK)
    except uri.BadName:
        raise RpcError(
            ErrorCode.UNKNOWN_TASK, f"unknown task {value!r}", {"task": str(value)}
        ) from None
