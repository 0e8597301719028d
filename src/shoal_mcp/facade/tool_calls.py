"""``tools/call``: validate arguments, call the kernel, wait (with progress), shape the result.

A bad tool name or bad arguments is a JSON-RPC -32602; a kernel error is a normal
result with ``isError: true`` (the model can read it). The result is shaped for the
request's revision. An exec or apply that needs approval asks the human through the
client when it can (``approvals``); under 2026-07-28 with the tasks extension, an exec
that outlives its wait (or runs in the background) answers a task handle. While a call waits, progress goes out only after the
kernel answered a liveness probe (a stopped kernel sends none), and a cancelled call
stops waiting at once, freeing its worker even when the kernel does not answer.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from ..client import KernelLost
from ..protocol import uri
from ..protocol.errors import ErrorCode, RpcError
from ..protocol.limits import PROGRESS_INTERVAL_S
from ..protocol.params import FIND_PARAMS
from ..protocol.schema import validate
from .approvals import CANCELLED, ApprovalAnswerRefused, Approvals
from .inflight import CallCancelled, InFlight, Progress, progress_reporter, progress_token
from .kernel_link import KernelLink
from .mcp_tasks import McpTasks
from .resources import route
from .results import error_result, tool_result
from .tools import TOOLS_BY_NAME, Tool
from .versions import LATEST, TASKS_EXTENSION, RequestContext, Revision

VALUE_ARGS = ("path", "slice", "format", "offset", "length", "elide", "match")
"""``shoal_get`` arguments that go to ``value.get`` as they are."""
# Open: _meta and whatever later MCP versions add are not errors.
CALL_PARAMS = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "arguments": {"type": "object"}},
    "required": ["name"],
}


class ArgumentError(RpcError):
    """Bad tool name or arguments: answered as a JSON-RPC error, not an isError result."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One ``tools/call`` request whose tool name and arguments passed the facade's schema
    check (``checked_call``); however it is then served, nothing checks it again."""

    tool: Tool
    args: dict
    params: dict  # the whole request: its task, requestState and _meta are read from it

    @property
    def progress_token(self) -> Any:
        return progress_token(self.params)


def checked_call(params: dict) -> ToolCall:
    """``params`` as a ``ToolCall``: the request's shape, the tool's name and the arguments
    against the tool's schema (the kernel's own validator), each checked once; -32602 if not."""
    validate(params, CALL_PARAMS)
    name = params["name"]
    tool = TOOLS_BY_NAME.get(name)
    if tool is None:
        raise ArgumentError(ErrorCode.INVALID_PARAMS, f"unknown tool: {name}", {"tool": name})
    args = params.get("arguments") or {}
    try:
        validate(args, tool.accepts, "arguments")
    except RpcError as exc:
        raise ArgumentError(exc.code, exc.message, exc.data) from None
    return ToolCall(tool, args, params)


class ToolRunner:
    """Serves checked ``tools/call`` requests: ``begin``/``finish`` when the call is lean (one
    kernel call, answered where the kernel's reply lands), ``serve`` on a worker otherwise."""

    def __init__(
        self,
        link: KernelLink,
        notify: Callable[[str, dict], None],
        revision: Callable[[], Revision] = lambda: LATEST,
        tasks: McpTasks | None = None,
        context: Callable[[], RequestContext] | None = None,
        approvals: Approvals | None = None,
    ) -> None:
        self.link = link
        self.notify = notify
        self.revision = revision
        self.tasks = tasks
        self.context = context or (lambda: RequestContext(self.revision()))
        self.approvals = approvals

    def serve(self, call: ToolCall, flight: InFlight | None) -> dict:
        """Serve ``call`` to its answer (on a worker thread; ``flight`` makes it cancellable)."""
        ctx = self.context()
        rev = ctx.revision
        params, tool = call.params, call.tool
        if "task" in params and rev.tasks and self.tasks is not None:
            return self._as_task(call)
        progress = progress_reporter(call.progress_token, self.notify)
        approvals = self.approvals if tool.cancels_task and ctx.elicits_forms() else None

        def run_plan(plan_ref: str) -> dict:
            """The approved plan, run with the call's own options (wait budget, shape)."""
            _, kernel_params = tool.to_kernel(call.args)
            opts = {k: v for k, v in kernel_params.items() if k in PLAN_RUN_OPTIONS}
            try:
                done = self._wait(
                    "plan.apply", {**opts, "plan_ref": plan_ref}, True, progress, flight
                )
            except RpcError as exc:
                return error_result(exc, rev)
            return self._shape(done, ctx)

        if approvals is not None and rev.stateless and "requestState" in params:
            decision = approvals.decision_in(params)
            if decision == CANCELLED:
                approvals = None  # dismissed: answer the -32011 result, ask no more
            elif decision is not None:
                answered = self._approval(
                    lambda: approvals.decide(params["requestState"], decision, run_plan), rev
                )
                assert answered is not None  # decide always answers a result
                return answered
        try:
            result = self._run(call, progress, flight)
        except CallCancelled:
            raise
        except RpcError as exc:
            ref = exc.data.get("plan_ref") if isinstance(exc.data, dict) else None
            if exc.code == ErrorCode.APPROVAL_REQUIRED and approvals and isinstance(ref, str):
                asked = self._approval(lambda: approvals.ask(ref, rev, run_plan), rev)
                if asked is not None:
                    return asked
            return error_result(exc, rev)
        return self._shape(result, ctx)

    def _shape(self, result: Any, ctx: RequestContext) -> dict:
        """The tool result; a task handle when the exec went on as a task (2026-07-28 with
        the tasks extension: background, or past its wait budget)."""
        if (
            ctx.revision.stateless
            and self.tasks is not None
            and ctx.has_extension(TASKS_EXTENSION)
            and is_task_handle(result)
        ):
            return self.tasks.adopt(result, ctx.revision)
        return tool_result(result, ctx.revision)

    @staticmethod
    def _approval(step: Callable[[], dict | None], rev: Revision) -> dict | None:
        """One approval step; a kernel refusal other than of the request state is the
        call's isError result."""
        try:
            return step()
        except (ApprovalAnswerRefused, CallCancelled):
            raise
        except RpcError as exc:
            return error_result(exc, rev)

    def _as_task(self, call: ToolCall) -> dict:
        """2025-11-25 task-augmented call: a ``CreateTaskResult`` at once."""
        tool = call.tool
        if not tool.task_support:
            raise RpcError(
                ErrorCode.METHOD_NOT_FOUND,
                f"{tool.name} cannot run as a task (execution.taskSupport: forbidden)",
                {"tool": tool.name},
            )
        assert self.tasks is not None
        _, kernel_params = tool.to_kernel(call.args)
        progress = progress_reporter(call.progress_token, self.notify)
        return self.tasks.start(kernel_params, call.params["task"], progress)

    def begin(self, call: ToolCall, flight: InFlight | None) -> Future | None:
        """Start ``call`` from the reader thread when it is the lean case; the kernel reply
        then completes it where it lands (``finish``), with no worker thread.

        The lean case: one kernel call (not ``shoal_get``), no progress token (nothing to
        report while waiting) and a call link already open (connecting may wait). Anything
        else returns None and is ``serve``d on a worker.
        """
        params, tool = call.params, call.tool
        if tool.name == "shoal_get":
            return None
        ctx = self.context()
        if "task" in params and ctx.revision.tasks:
            return None  # a task-augmented call: serve answers CreateTaskResult
        if ctx.elicits_forms() or ctx.has_extension(TASKS_EXTENSION) or "requestState" in params:
            return None  # may ask the human or answer a task handle: kernel calls of its own
        client = self.link.connected_calls()
        if client is None or call.progress_token is not None:
            return None
        method, kernel_params = tool.to_kernel(call.args)
        try:
            kernel_id, fut = client.start_call(method, kernel_params)
        except KernelLost:
            return None  # serve reconnects
        if tool.cancels_task and flight is not None:
            flight.own_kernel_call(client, kernel_id, fut)
        return fut

    def finish(self, fut: Future) -> dict:
        """The tool result of a call ``begin`` started (its future is done)."""
        rev = self.revision()
        try:
            return tool_result(fut.result(), rev)
        except RpcError as exc:
            return error_result(exc, rev)

    def _run(self, call: ToolCall, progress: Progress | None, flight: InFlight | None) -> Any:
        if call.tool.name == "shoal_get":
            return self._get(call.args)
        method, params = call.tool.to_kernel(call.args)
        return self._wait(method, params, call.tool.cancels_task, progress, flight)

    def _wait(
        self,
        method: str,
        params: dict,
        cancels_task: bool,
        progress: Progress | None,
        flight: InFlight | None,
    ) -> Any:
        """Call the kernel and wait for its answer, reporting progress, cancellable."""
        client, kernel_id, fut = self.link.start_call(method, params)
        if flight is not None:
            if cancels_task:
                flight.own_kernel_call(client, kernel_id, fut)
            flight.wake.clear()
            fut.add_done_callback(lambda _f: flight.wake.set())
        while True:
            if flight is not None:
                if not flight.cancelled:
                    flight.wake.wait(PROGRESS_INTERVAL_S)
                if flight.cancelled and not fut.done():
                    raise CallCancelled(flight.request_id)
            if fut.done():
                return fut.result()  # KernelStalled is a TimeoutError: never swallow it
            if flight is None:
                try:
                    return fut.result(timeout=PROGRESS_INTERVAL_S)
                except TimeoutError:
                    if fut.done():
                        return fut.result()
            if progress is not None and not fut.done():
                asked = time.monotonic()
                alive, out_bytes = self._probe(client, kernel_id)
                if alive:
                    progress(out_bytes)
                elif client.throttled_since(asked - PROGRESS_INTERVAL_S):
                    progress(None, throttled_note(client))

    @staticmethod
    def _probe(client: Any, kernel_id: int) -> tuple[bool, int | None]:
        """(the kernel answered, output bytes so far): progress only from a live kernel."""
        try:
            record = client.call("task.get", {"call": kernel_id}, timeout=PROGRESS_INTERVAL_S)
        except RpcError:
            return True, None  # it answered, with an error: alive
        except (KernelLost, TimeoutError):
            return False, None
        return True, record.get("out_bytes")

    def _get(self, args: dict) -> Any:
        ref = args["ref"].strip()
        value_args = {k: args[k] for k in (*VALUE_ARGS, *FIND_PARAMS) if k in args}
        kind, ident = _record_kind(ref)
        if kind is None and _is_resource_only(ref):
            # Any shoal:// URI works as a ref: val/journal/session/events… read as resources.
            found, parsed = route(ref)
            method, params = found.read(parsed)
            return self.link.call(method, params)
        if kind == uri.PLAN:
            return self.link.call("plan.get", {"plan_ref": ident})
        if kind == uri.TASK:
            task_ref = uri.task_ref(int(ident))
            if "wait_ms" in args:
                record = self.link.call(
                    "task.await", {"task": task_ref, "timeout_ms": args["wait_ms"]}
                )
            else:
                record = self.link.call("task.get", {"task": task_ref})
            if "result_ref" not in record:
                return record
            value = self._value(record["result_ref"], value_args)
            value["task"] = record
            return value
        return self._value(ref, value_args)

    def _value(self, ref: str, value_args: dict) -> dict:
        params = {"ref": ref, **value_args}
        if "format" not in params:
            params["with_render"] = True
        return raw_page_render(self.link.call("value.get", params))


def throttled_note(client: Any) -> str:
    """The progress note of a call the kernel holds back for its principal's CPU budget."""
    return (
        f"throttled: the kernel holds this client's calls for its CPU budget "
        f"(max_cpu_ms_per_s), about {client.throttled_for_s:.1f} s of debt left"
    )


PLAN_RUN_OPTIONS = frozenset({"background", "timeout_ms", "position", "elide"})
"""Exec params an approved plan runs with (``plan.apply`` takes the same ones)."""


def is_task_handle(result: Any) -> bool:
    """A kernel exec answer that names a still-running task (background, or past its wait)."""
    return (
        isinstance(result, dict)
        and isinstance(result.get("task"), str)
        and "events" in result
        and "ref" not in result
    )


def raw_page_render(result: dict) -> dict:
    """A raw page shown as its own text (not escaped inside JSON), with the next call.

    The page itself stays in structuredContent; the text a model reads is the bytes
    (or their base64) and one line that says where they are and what comes next.
    """
    data = result.get("raw", result.get("raw_base64"))
    if not isinstance(data, str) or "render" in result:
        return result
    offset, length, total = result.get("offset", 0), result.get("length", 0), result.get("total")
    where = f"bytes {offset}-{offset + length} of {total}"
    if "raw_base64" in result:
        where += " (base64)"
    nxt = result.get("next")
    call = json.dumps({"ref": nxt}, ensure_ascii=False)  # a path may hold quotes
    trailer = f"[{where}; next: shoal_get {call}]" if nxt else f"[{where}, end]"
    return {**result, "render": f"{data}\n{trailer}"}


def _is_resource_only(ref: str) -> bool:
    """A shoal:// URI that names no value (a blob, the journal, a session view…)."""
    if not ref.startswith(uri.SCHEME):
        return False
    try:
        kind = uri.parse_uri(ref).kind
    except uri.BadName:
        return False  # value.get answers -32004 for it
    return kind not in (uri.OUT, uri.TASK, uri.TASK_OUT, uri.TASK_ERR, uri.PLAN, uri.OUTPUTS)


def _record_kind(ref: str) -> tuple[str | None, str]:
    """(PLAN, plan ref) or (TASK, N) when ``ref`` names a plan or a task record; else None.

    A task's streams (``shoal://task/N/out``) are values, not records.
    """
    try:
        if ref.startswith(uri.SCHEME):
            parsed = uri.parse_uri(ref)
            return (
                (parsed.kind, parsed.ident or "")
                if parsed.kind in (uri.PLAN, uri.TASK)
                else (None, "")
            )
        name = uri.parse_ref(ref)
    except uri.BadName:
        return None, ""
    return (name.kind, name.ident) if name.kind in (uri.PLAN, uri.TASK) else (None, "")
