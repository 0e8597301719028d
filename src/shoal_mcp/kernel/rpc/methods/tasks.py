"""task.list / get / await / cancel / suspend / resume."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ....protocol.errors import ErrorCode, RpcError, invalid_params
from ....protocol.params import TASK_AWAIT, TASK_CANCEL, TASK_GET, TASK_LIST, TASK_STEER
from ...exec.lifecycle import TaskState
from ..paging import bounded_page
from ..registry import method

if TYPE_CHECKING:
    from ..call import Call


def _task(call: Call, params: dict):
    return call.kernel.tasks.get(
        params["task"],
        call.who.session,
        call.who.principal,
        see_all=call.kernel.can_see_all_tasks(call.who.principal),
    )


def _steerable(call: Call, params: dict):
    """The task, if the caller may control it: tasks_read = all lets one see others'
    tasks, not cancel or stop them; only the creator or an approver may."""
    task = _task(call, params)
    who = call.who.principal
    if task.principal != who and not call.kernel.guard.for_principal(who).approver:
        raise RpcError(
            ErrorCode.DENIED,
            f"{task.ref} belongs to {task.principal}; only it or an approver may control it",
            {"task": task.ref, "principal": task.principal},
        )
    return task


@method("task.list", TASK_LIST, on_loop=True)
def task_list(call: Call, params: dict) -> dict:
    tasks = call.kernel.tasks.list(
        call.who.session,
        call.who.principal,
        see_all=call.kernel.can_see_all_tasks(call.who.principal),
    )
    if "state" in params:
        tasks = [t for t in tasks if t.state == params["state"]]
    tasks.sort(key=lambda t: t.id)
    if "cursor" in params:
        cursor = params["cursor"]
        if not cursor.isdigit() or len(cursor) > 19:
            raise invalid_params("cursor", "not a cursor from task.list")
        tasks = [t for t in tasks if t.id > int(cursor)]
    return bounded_page(tasks, lambda t: t.record(), lambda t: str(t.id)).reply("tasks")


@method("task.get", TASK_GET, on_loop=True)
def task_get(call: Call, params: dict) -> dict:
    if "task" in params:
        return _task(call, params).record()
    slot = _inflight(call, params)
    if slot.task is None:
        state = TaskState.SPAWN_PENDING.value
        return {"call": params["call"], "state": state, "out_bytes": 0, "err_bytes": 0}
    return slot.task.record()


def _inflight(call: Call, params: dict):
    """The in-flight exec behind request id ``call`` on this connection."""
    if "call" not in params:
        raise invalid_params("task", "required (or call)")
    slot = call.conn.inflight_call(params["call"])
    if slot is None:
        raise RpcError(
            ErrorCode.UNKNOWN_TASK,
            f"no exec in flight with request id {params['call']!r}",
            {"call": params["call"]},
        )
    return slot


@method("task.await", TASK_AWAIT, blocking=True)
def task_await(call: Call, params: dict) -> dict:
    task = _task(call, params)
    timeout_ms = params.get("timeout_ms", 30_000)
    task.done.wait(timeout_ms / 1000)
    record = task.record()
    record["done"] = task.done.is_set()
    return record


@method("task.cancel", TASK_CANCEL)
def task_cancel(call: Call, params: dict) -> dict:
    if "task" in params:
        task = _steerable(call, params)
    else:
        task = _inflight(call, params).request_cancel()
        if task is None:  # not spawned yet: it is cancelled the moment it is
            return {"call": params["call"], "state": TaskState.CANCELLED.value}
    call.kernel.tasks.cancel(task)
    return {"task": task.ref, "state": task.state.value}


@method("task.suspend", TASK_STEER)
def task_suspend(call: Call, params: dict) -> dict:
    task = _steerable(call, params)
    call.kernel.tasks.suspend(task)
    return {"task": task.ref, "state": task.state.value}


@method("task.resume", TASK_STEER)
def task_resume(call: Call, params: dict) -> dict:
    task = _steerable(call, params)
    call.kernel.tasks.resume(task)
    return {"task": task.ref, "state": task.state.value}
