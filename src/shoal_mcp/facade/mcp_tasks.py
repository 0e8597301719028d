"""MCP tasks for ``tools/call``, backed by kernel tasks (docs/protocol.md, "Tasks").

Two dialects over one store: the 2025-11-25 tasks utility (task-augmented calls,
``tasks/get|result|list|cancel``, ``notifications/tasks/status``) and the 2026-07-28
``io.modelcontextprotocol/tasks`` extension (a task handle answered for an exec that runs
on as a task, ``tasks/get`` with the result inline, ``tasks/update``, ``tasks/cancel``).
A task's ``failed`` follows its revision: in 2025-11-25 it means the result has
``isError: true``; in the extension it is reserved for a JSON-RPC error, so a command
that exited non-zero is ``completed`` there.

A task-augmented ``shoal_exec`` starts the command as a kernel background task and
answers a ``CreateTaskResult`` at once. The MCP task id is the kernel's ``task:N``, so
the same task is readable as ``shoal://task/N`` and through ``shoal_get``. Each task has
a watcher thread that waits for the kernel task to end, records its final status and
sends ``notifications/tasks/status``; ``tasks/result`` waits for that and answers the
``CallToolResult`` the plain call would have given. Tasks are kept for their TTL (the
client may ask for less than ``MCP_TASK_TTL_MS``, not more) and at most
``MCP_TASKS_KEPT`` of them (oldest finished ones go first).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..client import KernelLost
from ..protocol.errors import ErrorCode, RpcError, invalid_params
from ..protocol.limits import (
    MCP_TASK_AWAIT_SLICE_MS,
    MCP_TASK_POLL_MS,
    MCP_TASK_RESULT_POLL_S,
    MCP_TASK_TTL_MS,
    MCP_TASKS_KEPT,
    PROGRESS_INTERVAL_S,
    WAIT_MAX_MS,
)
from .inflight import CallCancelled, Progress, current_flight
from .kernel_link import KernelLink
from .paging import page
from .results import error_result, tool_result
from .versions import LATEST, Revision

log = logging.getLogger("shoal.mcp")

RELATED_TASK = "io.modelcontextprotocol/related-task"
IMMEDIATE_RESPONSE = "io.modelcontextprotocol/model-immediate-response"
TERMINAL = frozenset({"completed", "failed", "cancelled"})
# Kernel task states → MCP task statuses (a suspended task is still working).
STATUS = {
    "starting": "working",
    "running": "working",
    "suspended": "working",
    "completed": "completed",
    "failed": "failed",
    "cancelled": "cancelled",
}


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class McpTask:
    task_id: str
    created: float
    ttl_ms: int
    status: str = "working"
    message: str | None = None
    updated: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)
    result: dict | None = None  # the CallToolResult, once terminal
    rev: Revision | None = None  # the revision it was created under
    error: dict | None = None  # the extension's failed: the JSON-RPC error

    def wire_modern(self) -> dict:
        """The 2026-07-28 extension's Task: ``ttlMs``/``pollIntervalMs``, result inline."""
        out: dict[str, Any] = {
            "taskId": self.task_id,
            "status": self.status,
            "createdAt": _iso(self.created),
            "lastUpdatedAt": _iso(self.updated or self.created),
            "ttlMs": self.ttl_ms,
            "pollIntervalMs": MCP_TASK_POLL_MS,
        }
        if self.message:
            out["statusMessage"] = self.message
        if self.status == "completed" and self.result is not None:
            out["result"] = {"resultType": "complete", **self.result}
        if self.status == "failed":
            out["error"] = self.error or {"code": ErrorCode.INTERNAL, "message": self.message or ""}
        return out

    def wire(self) -> dict:
        out: dict[str, Any] = {
            "taskId": self.task_id,
            "status": self.status,
            "createdAt": _iso(self.created),
            "lastUpdatedAt": _iso(self.updated or self.created),
            "ttl": self.ttl_ms,
            "pollInterval": MCP_TASK_POLL_MS,
        }
        if self.message:
            out["statusMessage"] = self.message
        return out

    def expired(self, now: float) -> bool:
        return now > self.created + self.ttl_ms / 1000


def unknown_task(task_id: object) -> RpcError:
    return RpcError(
        ErrorCode.INVALID_PARAMS,
        f"invalid params: taskId: no such task: {str(task_id)[:200]}",
        {"field": "taskId", "reason": "unknown or expired task"},
    )


class McpTasks:
    def __init__(
        self,
        link: KernelLink,
        notify: Callable[[str, dict], None],
        revision: Callable[[], Revision],
    ) -> None:
        self.link = link
        self.notify = notify
        self.revision = revision
        self._lock = threading.Lock()
        self._tasks: dict[str, McpTask] = {}

    # -- creating -------------------------------------------------------------------------

    def start(
        self, kernel_params: dict, requested: object, progress: Progress | None = None
    ) -> dict:
        """Start ``exec`` params as a kernel task; the ``CreateTaskResult``.

        With ``progress`` (the request had a progressToken, which stays valid for the
        task's life) the watcher reports about once per ``PROGRESS_INTERVAL_S``, each time
        after the kernel answered.
        """
        ttl = MCP_TASK_TTL_MS
        if isinstance(requested, dict) and "ttl" in requested:
            asked = requested["ttl"]
            if not isinstance(asked, int) or isinstance(asked, bool) or asked < 0:
                raise invalid_params("task.ttl", "a non-negative integer of milliseconds")
            ttl = min(asked, MCP_TASK_TTL_MS)
        started = self.link.call("exec", {**kernel_params, "background": True})
        now = time.time()
        task = McpTask(started["task"], now, ttl, updated=now, rev=self.revision())
        with self._lock:
            self._purge(now)
            self._tasks[task.task_id] = task
        threading.Thread(
            target=self._watch,
            args=(task, progress),
            name=f"mcp-task-{task.task_id}",
            daemon=True,
        ).start()
        return {
            "task": task.wire(),
            "_meta": {
                IMMEDIATE_RESPONSE: f"started {task.task_id} ({started.get('uri', '')}); "
                "its result comes when it finishes"
            },
        }

    def adopt(self, handle: dict, rev: Revision) -> dict:
        """A 2026-07-28 ``CreateTaskResult`` for an exec that went on as kernel task
        ``handle["task"]`` (background, or past its wait budget); watched to its end."""
        now = time.time()
        task = McpTask(handle["task"], now, MCP_TASK_TTL_MS, updated=now, rev=rev)
        with self._lock:
            self._purge(now)
            self._tasks[task.task_id] = task
        threading.Thread(
            target=self._watch, args=(task, None), name=f"mcp-task-{task.task_id}", daemon=True
        ).start()
        return {"resultType": "task", **task.wire_modern()}

    # -- the 2026-07-28 extension's methods ------------------------------------------------

    def get_modern(self, params: dict) -> dict:
        return self._find(params).wire_modern()

    def update_modern(self, params: dict) -> dict:
        """Refused: a shoal task never asks for input (it is a command; it reads no
        elicitation). Input for a program goes to a PTY: shoal_pty."""
        task = self._find(params)
        raise RpcError(
            ErrorCode.INVALID_PARAMS,
            f"invalid params: taskId: {task.task_id} has no outstanding input requests "
            "(shoal tasks never ask for input; to type into a program, run it in a PTY: "
            "shoal_pty)",
            {"field": "taskId", "reason": "no outstanding input requests"},
        )

    def cancel_modern(self, params: dict) -> dict:
        task = self._find(params)
        if task.status not in TERMINAL:
            try:
                self.link.call("task.cancel", {"task": task.task_id})
            except RpcError as exc:
                log.debug("kernel cancel of %s: %s", task.task_id, exc)
            self._finish(task, "cancelled", "cancelled by request", None)
        return {}

    # -- the tasks/* methods --------------------------------------------------------------

    def get(self, params: dict) -> dict:
        return self._find(params).wire()

    def result(self, params: dict) -> dict:
        task = self._find(params)
        flight = current_flight()
        while not task.done.wait(MCP_TASK_RESULT_POLL_S):
            if flight is not None and flight.cancelled:
                raise CallCancelled(flight.request_id)
        assert task.result is not None
        return {**task.result, "_meta": {RELATED_TASK: {"taskId": task.task_id}}}

    def list(self, params: dict) -> dict:
        with self._lock:
            self._purge(time.time())
            tasks = [t.wire() for t in reversed(self._tasks.values())]
        return page(params, "tasks", "tasks", tasks)

    def cancel(self, params: dict) -> dict:
        task = self._find(params)
        with self._lock:
            if task.status in TERMINAL:
                raise RpcError(
                    ErrorCode.INVALID_PARAMS,
                    f"invalid params: taskId: {task.task_id} is already {task.status}",
                    {"field": "taskId", "reason": f"task is {task.status}"},
                )
        try:
            self.link.call("task.cancel", {"task": task.task_id})
        except RpcError as exc:
            log.debug("kernel cancel of %s: %s", task.task_id, exc)
        self._finish(task, "cancelled", "cancelled by request", None)
        return task.wire()

    # -- internals ------------------------------------------------------------------------

    def _find(self, params: dict) -> McpTask:
        task_id = params.get("taskId")
        if not isinstance(task_id, str):
            raise invalid_params("taskId", "required string")
        with self._lock:
            self._purge(time.time())
            task = self._tasks.get(task_id)
        if task is None:
            raise unknown_task(task_id)
        return task

    def _purge(self, now: float) -> None:
        """Forget expired tasks, then the oldest finished ones beyond MCP_TASKS_KEPT."""
        for task_id in [t for t, task in self._tasks.items() if task.expired(now)]:
            del self._tasks[task_id]
        extra = len(self._tasks) - MCP_TASKS_KEPT
        for task_id in [t for t, task in self._tasks.items() if task.done.is_set()][:extra]:
            del self._tasks[task_id]

    def _watch(self, task: McpTask, progress: Progress | None) -> None:
        """Wait for the kernel task to end; record its result and announce its status."""
        waited_ms = 0
        slice_ms = (
            int(PROGRESS_INTERVAL_S * 1000) if progress is not None else MCP_TASK_AWAIT_SLICE_MS
        )
        try:
            while True:
                record = self.link.call(
                    "task.await", {"task": task.task_id, "timeout_ms": slice_ms}
                )
                if record.get("done") or STATUS.get(record.get("state", "")) in TERMINAL:
                    break
                if progress is not None:
                    progress(record.get("out_bytes"))  # the kernel just answered: alive
                waited_ms += slice_ms
                if waited_ms > WAIT_MAX_MS or task.done.is_set():
                    return
            status = STATUS.get(record.get("state", ""), "failed")
            result = self._tool_result(record, task.rev)
            if status != "cancelled":
                # 2025-11-25: failed means isError; the extension: completed with its result
                # (failed only for a JSON-RPC error).
                status = "failed" if result.get("isError") and not _modern(task) else "completed"
            self._finish(task, status, f"kernel task {record.get('state')}", result)
        except (RpcError, KernelLost) as exc:
            err = exc if isinstance(exc, RpcError) else RpcError(ErrorCode.INTERNAL, str(exc))
            task.error = {"code": int(err.code), "message": err.message}
            self._finish(task, "failed", f"lost track of the task: {exc}", error_result(err))

    def _tool_result(self, record: dict, rev: Revision | None = None) -> dict:
        rev = rev or self.revision()
        if "result_ref" not in record:
            return tool_result(record, rev)
        value = self.link.call("value.get", {"ref": record["result_ref"], "with_render": True})
        value["task"] = record["task"]
        return tool_result(value, rev)

    def _finish(self, task: McpTask, status: str, message: str, result: dict | None) -> None:
        with self._lock:
            if task.status in TERMINAL:
                if result is not None and task.result is None:
                    task.result = result  # a cancelled task still gets its (cancelled) output
                    task.done.set()
                return
            task.status, task.message, task.updated = status, message, time.time()
            if result is not None:
                task.result = result
                task.done.set()
            wire = task.wire()
        if not _modern(task):  # the extension's notifications need subscriptions/listen
            self.notify("notifications/tasks/status", wire)


def _modern(task: McpTask) -> bool:
    return (task.rev or LATEST).stateless
