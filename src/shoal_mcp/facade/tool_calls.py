"""``tools/call``: validate arguments, call the kernel, wait (with progress), shape the result.

A bad tool name or bad arguments is a JSON-RPC -32602; a kernel error is a normal
result with ``isError: true`` (the model can read it). The result is shaped for the
session's negotiated revision. While a call waits, progress goes out only after the
kernel answered a liveness probe (a stopped kernel sends none), and a cancelled call
stops waiting at once, freeing its worker even when the kernel does not answer.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from ..client import KernelLost
from ..protocol import uri
from ..protocol.errors import ErrorCode, RpcError
from ..protocol.limits import PROGRESS_INTERVAL_S
from ..protocol.params import FIND_PARAMS
from ..protocol.schema import validate
from .inflight import CallCancelled, InFlight, Progress, progress_reporter, progress_token
from .kernel_link import KernelLink
from .mcp_tasks import McpTasks
from .resources import route
from .results import error_result, tool_result
from .tools import TOOLS_BY_NAME
from .versions import LATEST, Revision

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


class ToolRunner:
    def __init__(
        self,
        link: KernelLink,
        notify: Callable[[str, dict], None],
        revision: Callable[[], Revision] = lambda: LATEST,
        tasks: McpTasks | None = None,
    ) -> None:
        self.link = link
        self.notify = notify
        self.revision = revision
        self.tasks = tasks

    def call(self, params: dict, flight: InFlight | None) -> dict:
        """Serve one ``tools/call`` request (on a worker thread; ``flight`` makes it cancellable)."""
        validate(params, CALL_PARAMS)
        rev = self.revision()
        if "task" in params and rev.tasks and self.tasks is not None:
            return self._as_task(params)
        progress = progress_reporter(progress_token(params), self.notify)
        try:
            result = self.run(params["name"], params.get("arguments") or {}, progress, flight)
        except (ArgumentError, CallCancelled):
            raise
        except RpcError as exc:
            return error_result(exc, rev)
        return tool_result(result, rev)

    def _as_task(self, params: dict) -> dict:
        """2025-11-25 task-augmented call: a ``CreateTaskResult`` at once."""
        tool = self._tool(params["name"])
        args = self._validated(tool, params.get("arguments") or {})
        if not tool.task_support:
            raise RpcError(
                ErrorCode.METHOD_NOT_FOUND,
                f"{tool.name} cannot run as a task (execution.taskSupport: forbidden)",
                {"tool": tool.name},
            )
        assert self.tasks is not None
        _, kernel_params = tool.to_kernel(args)
        progress = progress_reporter(progress_token(params), self.notify)
        return self.tasks.start(kernel_params, params["task"], progress)

    @staticmethod
    def _tool(name: str) -> Any:
        tool = TOOLS_BY_NAME.get(name)
        if tool is None:
            raise ArgumentError(ErrorCode.INVALID_PARAMS, f"unknown tool: {name}", {"tool": name})
        return tool

    @staticmethod
    def _validated(tool: Any, args: dict) -> dict:
        try:
            validate(args, tool.accepts, "arguments")
        except RpcError as exc:
            raise ArgumentError(exc.code, exc.message, exc.data) from None
        return args

    def begin(self, params: dict, flight: InFlight | None) -> Future | None:
        """Start a ``tools/call`` from the reader thread when it is the lean case; the
        kernel reply then completes it where it lands (``finish``), with no worker thread.

        The lean case: one kernel call (not ``shoal_get``), no progress token (nothing to
        report while waiting), valid arguments (the tool schema: the facade's one check)
        and a call link already open (connecting may wait). Anything else returns None
        and is served on the pool as before, errors included.
        """
        name = params.get("name")
        args = params.get("arguments", {})
        tool = TOOLS_BY_NAME.get(name) if isinstance(name, str) else None
        if tool is None or name == "shoal_get" or not isinstance(args, dict):
            return None
        if "task" in params and self.revision().tasks:
            return None  # a task-augmented call: the pool path answers CreateTaskResult
        client = self.link.connected_calls()
        if client is None or progress_token(params) is not None:
            return None
        try:
            validate(args, tool.accepts, "arguments")
        except RpcError:
            return None
        method, kernel_params = tool.to_kernel(args)
        try:
            kernel_id, fut = client.start_call(method, kernel_params)
        except KernelLost:
            return None  # the pool path reconnects
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

    def run(
        self,
        name: str,
        args: dict,
        progress: Progress | None,
        flight: InFlight | None = None,
    ) -> Any:
        tool = self._tool(name)
        self._validated(tool, args)
        if name == "shoal_get":
            return self._get(args)
        method, params = tool.to_kernel(args)
        client, kernel_id, fut = self.link.start_call(method, params)
        if flight is not None:
            if tool.cancels_task:
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
