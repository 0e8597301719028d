"""The facade's connections to the kernel: one multiplexed call link + one for events.

Both attach to the same session. A lost kernel fails in-flight calls (the demux
thread does that) and the next call reconnects, autostarting the kernel if allowed.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from ..client import KernelClient, KernelLost, connect, version_mismatch

log = logging.getLogger(__name__)


class KernelLink:
    def __init__(
        self, client_info: dict | None = None, on_event: Callable[[dict], None] | None = None
    ) -> None:
        # Unset: the kernel gives us the session of our working directory (the project the
        # MCP client started us in), the one the human's `shoal` there joins too.
        self.session = os.environ.get("SHOAL_SESSION") or None
        self.token = os.environ.get("SHOAL_TOKEN")
        self.client_info = client_info or {}
        self.on_event = on_event
        self._calls: KernelClient | None = None
        self._events: KernelClient | None = None
        self._lock = threading.Lock()
        self.attach_info: dict | None = None

    def _attach(self, client: KernelClient) -> dict:
        params: dict[str, Any] = {
            "client": {
                "kind": "mcp",
                **{k: v for k, v in self.client_info.items() if k in ("name", "version")},
            },
            "cwd": os.getcwd(),
        }
        if self.session:
            params["session"] = self.session
        if self.token:
            params["token"] = self.token
        info = client.call("session.attach", params)
        mismatch = version_mismatch(info.get("kernel"))
        if mismatch:
            log.warning("%s", mismatch)
        return info

    def _open(self, on_event: Callable[[dict], None] | None) -> KernelClient:
        client = connect(on_event=on_event)
        try:
            self.attach_info = self._attach(client)
        except BaseException:
            client.close()
            raise
        return client

    def calls(self) -> KernelClient:
        with self._lock:
            if self._calls is None or self._calls.closed.is_set():
                self._calls = self._open(None)
            return self._calls

    def events(self) -> KernelClient:
        with self._lock:
            if self._events is None or self._events.closed.is_set():
                self._events = self._open(self.on_event)
            return self._events

    def connected_calls(self) -> KernelClient | None:
        """The call link if it is open now, else None (never connects: no waiting)."""
        client = self._calls
        return client if client is not None and not client.closed.is_set() else None

    def events_alive(self) -> bool:
        return self._events is not None and not self._events.closed.is_set()

    def start_call(self, method: str, params: dict) -> tuple[KernelClient, int, Future]:
        client = self.calls()
        msg_id, fut = client.start_call(method, params)
        return client, msg_id, fut

    def call(self, method: str, params: dict | None = None, timeout: float | None = None) -> Any:
        return self.calls().call(method, params or {}, timeout)

    def close(self) -> None:
        for client in (self._calls, self._events):
            if client is not None:
                client.close()


__all__ = ["KernelLink", "KernelLost"]
