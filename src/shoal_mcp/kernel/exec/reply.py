"""Shaping an exec's reply: the stored outcome as ``{ref, uri, value, render}``, a
failure in statement position as -32002, and what a sandbox refused (with the one call
that asks for it)."""

from __future__ import annotations

import os
import time
from typing import Any

from ...protocol import uri
from ...protocol.errors import ErrorCode, RpcError
from ..access.exec_gate import ExecGate
from ..access.identity import Principal
from ..config.limits import STDERR_DENIALS_BYTES, STDERR_TAIL_BYTES
from ..values.service import ValueService
from .calls import RunOptions
from .escalation import Escalation
from .tasks import Task


class ExecReply:
    """The reply of a finished exec, from its task's stored result."""

    def __init__(self, *, values: ValueService, gate: ExecGate, escalation: Escalation) -> None:
        self.values = values
        self.gate = gate
        self.escalation = escalation

    def result(self, who: Principal, task: Task, opts: RunOptions, started: float) -> dict:
        """``{ref, uri, value, render, elapsed_ms}``; ``stmt`` position raises on failure."""
        if task.result is None:
            err = task.error or {
                "code": int(ErrorCode.INTERNAL),
                "message": "task ended without a result",
            }
            raise RpcError(err["code"], err["message"], err.get("data"))
        stored = task.result.get("value")
        if stored is not None:
            # The outcome this exec just stored, straight from memory: no transcript read
            # and JSON decode between finalize and the reply.
            sel = self.values.stored(task.result["ref"], task.result["uri"], stored)
        else:
            sel = self.values.select(who, task.result["ref"], "", None)
        result = {
            "ref": sel.ref,
            "uri": sel.base_uri,
            "value": self.values.encode(sel, opts.elide),
            "render": self.values.render(sel, opts.elide),
            "elapsed_ms": round((time.time() - started) * 1000, 3),
        }
        if not task.result["ok"]:
            self._explain_denials(who, task, result)
        if opts.position == "stmt" and not task.result["ok"]:
            raise self._raised(who, task, result)
        return result

    def _explain_denials(self, who: Principal, task: Task, result: dict) -> None:
        """A sandboxed run that failed because the sandbox refused something: say what
        (``sandbox_denied``), and the one call that asks for it (escalation.py)."""
        if not self.gate.guard.isolated(who.principal) or task.start_state is None:
            return
        assert task.result is not None
        err = self.values.select(who, task.result["ref"], ".err", None).node
        tail = err.read(max(0, err.size - STDERR_DENIALS_BYTES))
        home = task.start_state[1].get("HOME") or os.path.expanduser("~")
        result.update(
            self.escalation.explain(
                who,
                task.src,
                self.gate.analyze(who, task.src),
                home,
                tail,
                self.gate.project_of(who),
                lambda plan: self.gate.plans.put(plan, self.gate.plan_budget(who)),
                exec_id=task.journal_id,
            )
        )

    def _raised(self, who: Principal, task: Task, result: dict) -> RpcError:
        """-32002 for a failed command in statement position, with a bounded stderr tail."""
        assert task.result is not None
        err = self.values.select(who, task.result["ref"], ".err", None).node
        tail = err.read(max(0, err.size - STDERR_TAIL_BYTES)).decode("utf-8", "replace")
        status = task.result["status"]
        cancelled = " (cancelled)" if task.state == "cancelled" else ""
        if task.result.get("truncated"):
            cancelled += "; its output lost bytes to a full or failing disk (see truncated)"
        return RpcError(
            ErrorCode.RAISED,
            f"command failed with exit status {status}{cancelled}",
            {
                "ref": result["ref"],
                "uri": result["uri"],
                "status": status,
                "stderr_tail": tail,
                "render": result["render"],
                **({"output_capped": True} if task.result.get("output_capped") else {}),
                **{k: task.result[k] for k in ("truncated",) if k in task.result},
                **{k: result[k] for k in ("sandbox_denied", "ask") if k in result},
            },
        )


def task_handle(task: Task, **extra: Any) -> dict:
    """What a background (or timed-out) exec returns: the task's names."""
    return {"task": task.ref, "uri": uri.task_uri(task.id), "events": task.channel, **extra}
