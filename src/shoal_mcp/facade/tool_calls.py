"""``tools/call``: validate arguments, call the kernel, wait (with progress), shape the result.

A bad tool name or bad arguments is a JSON-RPC -32602; a kernel error is a normal
result with ``isError: true`` (the model can read it).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from ..client import KernelLost
from ..protocol import uri
from ..protocol.errors import ErrorCode, RpcError
from ..protocol.limits import PROGRESS_INTERVAL_S
from ..protocol.schema import validate
from .inflight import InFlight, Progress, progress_reporter, progress_token
from .kernel_link import KernelLink
from .resources import route
from .results import error_result, tool_result
from .tools import TOOLS_BY_NAME

# Open: _meta and whatever later MCP versions add are not errors.
CALL_PARAMS = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "arguments": {"type": "object"}},
    "required": ["name"],
}


class ArgumentError(RpcError):
    """Bad tool name or arguments: answered as a JSON-RPC error, not an isError result."""


class ToolRunner:
    def __init__(self, link: KernelLink, notify: Callable[[str, dict], None]) -> None:
        self.link = link
        self.notify = notify

    def call(self, params: dict, flight: InFlight | None) -> dict:
        """Serve one ``tools/call`` request (on a worker thread; ``flight`` makes it cancellable)."""
        validate(params, CALL_PARAMS)
        progress = progress_reporter(progress_token(params), self.notify)
        own = flight.own_kernel_call if flight is not None else _not_cancellable
        try:
            result = self.run(params["name"], params.get("arguments") or {}, progress, own)
        except ArgumentError:
            raise
        except RpcError as exc:
            return error_result(exc)
        return tool_result(result)

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
        client = self.link.connected_calls()
        if client is None or progress_token(params) is not None:
            return None
        try:
            validate(args, tool.schema, "arguments")
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

    @staticmethod
    def finish(fut: Future) -> dict:
        """The tool result of a call ``begin`` started (its future is done)."""
        try:
            return tool_result(fut.result())
        except RpcError as exc:
            return error_result(exc)

    def run(
        self,
        name: str,
        args: dict,
        progress: Progress | None,
        own_kernel_call: Callable[[Any, int, Any], None],
    ) -> Any:
        tool = TOOLS_BY_NAME.get(name)
        if tool is None:
            raise ArgumentError(ErrorCode.INVALID_PARAMS, f"unknown tool: {name}", {"tool": name})
        try:
            validate(args, tool.schema, "arguments")
        except RpcError as exc:
            raise ArgumentError(exc.code, exc.message, exc.data) from None
        if name == "shoal_get":
            return self._get(args)
        method, params = tool.to_kernel(args)
        client, kernel_id, fut = self.link.start_call(method, params)
        if tool.cancels_task:
            own_kernel_call(client, kernel_id, fut)
        if progress is None:
            return fut.result()
        while True:
            try:
                return fut.result(timeout=PROGRESS_INTERVAL_S)
            except TimeoutError:
                progress(self._out_bytes(client, kernel_id))

    @staticmethod
    def _out_bytes(client: Any, kernel_id: int) -> int | None:
        try:
            record = client.call("task.get", {"call": kernel_id}, timeout=PROGRESS_INTERVAL_S)
        except (RpcError, KernelLost, TimeoutError):
            return None
        return record.get("out_bytes")

    def _get(self, args: dict) -> Any:
        ref = args["ref"].strip()
        value_args = {
            k: args[k]
            for k in ("path", "slice", "format", "offset", "length", "elide", "match")
            if k in args
        }
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
    trailer = f'[{where}; next: shoal_get {{"ref": "{nxt}"}}]' if nxt else f"[{where}, end]"
    return {**result, "render": f"{data}\n{trailer}"}


def _not_cancellable(client: Any, kernel_id: int, fut: Any) -> None:
    pass


def _is_resource_only(ref: str) -> bool:
    """A shoal:// URI that names no value (a blob, the journal, a session view…)."""
    if not ref.startswith(uri.SCHEME):
        return False
    try:
        kind = uri.parse_uri(ref).kind
    except uri.BadName:
        return False  # value.get answers -32004 for it
    return kind not in (uri.OUT, uri.TASK, uri.TASK_OUT, uri.TASK_ERR, uri.PLAN)


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
