"""A synchronous driver for a real ``shoal-mcp`` subprocess through the official MCP SDK.

The SDK client is async (anyio); live tests are plain pytest functions. ``McpStdioClient``
runs the SDK's ``stdio_client`` + ``ClientSession`` inside an anyio blocking portal (an
event loop on a helper thread), so a test calls ``client.call_tool(...)`` synchronously
and one facade can serve a whole test module. Server notifications (e.g.
``notifications/resources/updated``) are collected and can be awaited with a deadline.

No mocks: the facade is ``python -m shoal_mcp.facade`` talking to a real kernel (start one
with ``kernel.running_kernel`` and pass ``facade.facade_env(kernel)``). Complements
``facade.RawFacade`` (raw pipes) for tests that want the SDK.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from anyio.from_thread import start_blocking_portal
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

__all__ = ["MCPError", "McpStdioClient", "Notification"]

CALL_TIMEOUT_S = 30.0


class Notification:
    """One server notification as received: ``method`` and ``params`` (wire-shaped dict)."""

    __slots__ = ("method", "params", "at")

    def __init__(self, method: str, params: dict) -> None:
        self.method = method
        self.params = params
        self.at = time.monotonic()

    def __repr__(self) -> str:
        return f"Notification({self.method!r}, {self.params!r})"


class McpStdioClient:
    """``shoal-mcp`` over stdio, driven by the official SDK from synchronous code.

    ``env`` is the facade's complete environment (``facade.facade_env``); the facade's stderr goes to ``stderr_path``.
    """

    def __init__(
        self,
        env: dict[str, str],
        *,
        cwd: str | Path | None = None,
        stderr_path: str | Path | None = None,
        command: tuple[str, ...] = (sys.executable, "-m", "shoal_mcp.facade"),
    ) -> None:
        self.params = StdioServerParameters(
            command=command[0], args=list(command[1:]), env=dict(env), cwd=cwd
        )
        self.stderr_path = Path(stderr_path) if stderr_path else None
        self.notifications: list[Notification] = []
        self.transport_errors: list[Exception] = []
        self._cond = threading.Condition()
        self._stack = contextlib.ExitStack()
        self.session: ClientSession | None = None
        self.init: types.InitializeResult | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> McpStdioClient:
        try:
            errlog = (
                self._stack.enter_context(open(self.stderr_path, "w"))  # noqa: SIM115
                if self.stderr_path
                else sys.stderr
            )
            self.portal = self._stack.enter_context(start_blocking_portal())
            read, write = self._stack.enter_context(
                self.portal.wrap_async_context_manager(stdio_client(self.params, errlog=errlog))
            )
            self.session = self._stack.enter_context(
                self.portal.wrap_async_context_manager(
                    ClientSession(read, write, message_handler=self._on_message)
                )
            )
            self.init = self._run(self.session.initialize)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Close stdin (the facade exits on EOF); the SDK kills it if it lingers."""
        self._stack.close()

    def __enter__(self) -> McpStdioClient:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stderr(self) -> str:
        if self.stderr_path and self.stderr_path.exists():
            return self.stderr_path.read_text(errors="replace")
        return ""

    # -- calls -------------------------------------------------------------------------

    def _run(self, fn: Callable[..., Any], *args: Any, timeout: float = CALL_TIMEOUT_S) -> Any:
        async def bounded() -> Any:
            with anyio.fail_after(timeout):
                return await fn(*args)

        return self.portal.call(bounded)

    def call_tool(
        self, name: str, arguments: dict | None = None, timeout: float = CALL_TIMEOUT_S
    ) -> types.CallToolResult:
        """``tools/call``; a JSON-RPC error raises ``MCPError`` (``.code``)."""
        assert self.session is not None
        return self._run(self.session.call_tool, name, arguments or {}, timeout=timeout)

    def tool(
        self, name: str, arguments: dict | None = None, timeout: float = CALL_TIMEOUT_S
    ) -> dict:
        """``tools/call`` that must succeed: its ``structuredContent``."""
        result = self.call_tool(name, arguments, timeout)
        assert not result.is_error, f"{name} failed: {result.structured_content or result.content}"
        assert isinstance(result.structured_content, dict), result
        return result.structured_content

    def list_tools(self) -> types.ListToolsResult:
        assert self.session is not None
        return self._run(self.session.list_tools)

    def read_resource(self, uri: str, timeout: float = CALL_TIMEOUT_S) -> types.ReadResourceResult:
        assert self.session is not None
        return self._run(self.session.read_resource, uri, timeout=timeout)

    def subscribe(self, uri: str) -> None:
        # resources/subscribe as a plain request: the SDK's helper is deprecated for 2026
        # servers (it warns), but it is exactly the 2025-06-18 method shoal speaks.
        assert self.session is not None
        request = types.SubscribeRequest(params=types.SubscribeRequestParams(uri=uri))
        self._run(self.session.send_request, request, types.EmptyResult)

    def unsubscribe(self, uri: str) -> None:
        assert self.session is not None
        request = types.UnsubscribeRequest(params=types.UnsubscribeRequestParams(uri=uri))
        self._run(self.session.send_request, request, types.EmptyResult)

    # -- notifications -----------------------------------------------------------------

    async def _on_message(self, message: Any) -> None:
        with self._cond:
            if isinstance(message, Exception):
                self.transport_errors.append(message)
            else:
                params = getattr(message, "params", None)
                wire = (
                    params.model_dump(by_alias=True, mode="json", exclude_none=True)
                    if params
                    else {}
                )
                self.notifications.append(Notification(message.method, wire))
            self._cond.notify_all()

    def received(self, method: str, **match: Any) -> list[Notification]:
        """Notifications so far with this method whose params contain ``match``."""
        with self._cond:
            return [
                n for n in self.notifications
                if n.method == method and all(n.params.get(k) == v for k, v in match.items())
            ]  # fmt: skip

    def wait_for(
        self, method: str, count: int = 1, timeout: float = 10.0, **match: Any
    ) -> list[Notification]:
        """Block until at least ``count`` matching notifications arrived (AssertionError if not)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = [
                    n for n in self.notifications
                    if n.method == method and all(n.params.get(k) == v for k, v in match.items())
                ]  # fmt: skip
                if len(found) >= count:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"{count} x {method} {match} not received within {timeout} s; got {self.notifications!r}"
                    )
                self._cond.wait(left)
