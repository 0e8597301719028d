"""exec (run / plan, stmt / value, background, wait budget)."""

from __future__ import annotations

import time

from ....protocol import uri
from ....protocol.errors import ErrorCode, RpcError, invalid_params
from ....protocol.limits import STDERR_TAIL_BYTES
from ...values.elision import ELIDE_SCHEMA, ElideOptions
from ..registry import BOOL, TIMEOUT_MS, method, obj

DISCONNECT_POLL_S = 0.25
"""How often a foreground exec checks that its caller is still connected."""

SRC = {"type": "string", "maxLength": 1 << 20, "description": "bash source"}

EXEC_SCHEMA = obj(
    {
        "src": SRC,
        "mode": {"type": "string", "enum": ["run", "plan"]},
        "position": {"type": "string", "enum": ["stmt", "value"]},
        "background": BOOL,
        "timeout_ms": TIMEOUT_MS,
        "elide": ELIDE_SCHEMA,
    },
    ("src",),
)


def task_handle(task, **extra) -> dict:
    return {"task": task.ref, "uri": uri.task_uri(task.id), "events": task.channel, **extra}


@method("exec", EXEC_SCHEMA, blocking=True)
def exec_(call, params):
    kernel = call.kernel
    who = call.who
    src = params["src"]
    if "\x00" in src:  # bash -c cannot take a NUL byte; say so instead of failing inside spawn
        raise invalid_params("src", "must not contain NUL characters")
    elide = ElideOptions.from_params(params.get("elide"))
    if params.get("mode", "run") == "plan":
        return kernel.plan(who, src)
    started = time.time()
    effects = kernel.gate_exec(who, src)
    return run_and_wait(call, src, effects, params, elide, started)


def run_and_wait(
    call, src: str, effects: list[dict], params: dict, elide: ElideOptions, started: float
) -> dict:
    """Spawn ``src`` for the caller; background → handle, else wait up to the budget."""
    kernel = call.kernel
    who = call.who
    session = kernel.sessions.get_or_create(who.session)
    background = params.get("background", False)
    if background:
        kernel.check_task_quota(who)
    if background:
        return task_handle(kernel.start_exec(who, session, src, background, effects))
    task = kernel.start_exec(who, session, src, background, effects)
    if call.slot is not None and call.slot.attach(task):
        kernel.tasks.cancel(task)  # a cancel overtook the spawn
    timeout_ms = params.get("timeout_ms")
    deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
    while True:
        step = DISCONNECT_POLL_S
        if deadline is not None:
            step = min(step, max(0.0, deadline - time.monotonic()))
        if task.done.wait(step):
            break
        if call.conn.closed.is_set() or (deadline is not None and time.monotonic() >= deadline):
            # Past the wait budget, or the caller hung up (nobody will read the reply): the
            # command keeps running as a listed task, visible in task.list and cancellable,
            # instead of an unlisted process nobody can name.
            kernel.detach_task(who, task)  # within max_tasks, else cancelled + -32031
            return task_handle(task, timed_out=True)
    try:
        return finished_result(kernel, who, task, elide, started, params.get("position", "stmt"))
    finally:
        # A finished foreground exec is never named again (its value is out:N in the
        # transcript): drop the task record so the kernel's memory stays flat.
        kernel.tasks.forget(task)


def finished_result(kernel, who, task, elide: ElideOptions, started: float, position: str) -> dict:
    """exec's reply for a finished task; ``stmt`` position raises on failure."""
    if task.result is None:
        err = task.error or {
            "code": int(ErrorCode.INTERNAL),
            "message": "task ended without a result",
        }
        raise RpcError(err["code"], err["message"], err.get("data"))
    result = kernel.exec_result(who, task, elide, started)
    if position == "stmt" and not task.result["ok"]:
        sel = kernel.values.select(who, task.result["ref"], ".err", None)
        tail = sel.node.read(max(0, sel.node.size - STDERR_TAIL_BYTES)).decode("utf-8", "replace")
        status = task.result["status"]
        raise RpcError(
            ErrorCode.RAISED,
            f"command failed with exit status {status}"
            + (" (cancelled)" if task.state == "cancelled" else ""),
            {
                "ref": result["ref"],
                "uri": result["uri"],
                "status": status,
                "stderr_tail": tail,
                "render": result["render"],
            },
        )
    return result
