"""The facade's connections to the kernel: one multiplexed call link + one for events.

Both attach to the same session. The call connection is opened when the facade starts
(``prewarm``: connecting, autostarting the kernel if needed, in the background) and
attached once ``initialize`` told us who the client is (``attach_soon``), so the first
tool call finds a warm connection. A lost kernel fails in-flight calls (the demux
thread does that) and the next call reconnects, autostarting the kernel if allowed. A
kernel that stops answering (SIGSTOP, a wedged listener) is found by the call link's
heartbeat, which fails every in-flight call with ``KernelStalled`` after the liveness
bound the CLI uses too (``protocol/limits.liveness_bounds``).
What happens to the connection is reported through ``on_log`` (MCP logging).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from ..client import KernelClient, KernelLost, KernelUntrusted, connect
from ..client_transport import RemoteHost, configured_host, connect_remote, remote_dir
from ..client_versions import version_mismatch
from ..protocol.limits import REMOTE_RECONNECT_BACKOFF_S
from .inflight import current_flight, wait_cancellable

log = logging.getLogger(__name__)

LogSink = Callable[[str, str], None]
"""(level, message): an MCP log line (level is an RFC 5424 name)."""


UNCONFINED_ENV = "SHOAL_UNCONFINED"
UNCONFINED_FLAG = "--unconfined"


def unconfined_requested() -> bool:
    """``shoal-mcp --unconfined`` or ``SHOAL_UNCONFINED=1``: attach as the local human."""
    import sys

    env = os.environ.get(UNCONFINED_ENV, "") not in ("", "0")
    return env or UNCONFINED_FLAG in sys.argv[1:]


class KernelLink:
    def __init__(
        self, client_info: dict | None = None, on_event: Callable[[dict], None] | None = None
    ) -> None:
        # Unset: the kernel gives us the session of our working directory (the project the
        # MCP client started us in), the one the human's `shoal` there joins too.
        self.session = os.environ.get("SHOAL_SESSION") or None
        self.token = os.environ.get("SHOAL_TOKEN")
        # Without a token the facade attaches as the sandboxed agent (AGENT_PRINCIPAL), a
        # downgrade; ``--unconfined`` / SHOAL_UNCONFINED=1 is the explicit opt-out that
        # attaches as the local human instead (docs/security.md, "The default agent").
        self.unconfined = unconfined_requested()
        self.client_info = client_info or {}
        self.on_event = on_event
        self.on_log: LogSink = lambda level, message: None
        self._calls: KernelClient | None = None
        self._events: KernelClient | None = None
        self._unattached: KernelClient | None = None  # prewarmed, waiting for initialize
        self._lock = threading.Lock()
        self.attach_info: dict | None = None
        # --host / SHOAL_HOST: the kernel of that host through the user's ssh
        # (client_transport); one facade talks to one host.
        self.host: RemoteHost | None = configured_host()
        self.remote_dir = remote_dir() if self.host else None
        self.backoff = ReconnectBackoff()

    def _attach(self, client: KernelClient) -> dict:
        params: dict[str, Any] = {
            "client": {
                "kind": "mcp",
                **{k: v for k, v in self.client_info.items() if k in ("name", "version")},
            },
        }
        if self.host is None:
            params["cwd"] = os.getcwd()
        elif self.remote_dir:  # a local path means nothing on another host
            params["cwd"] = self.remote_dir
        if self.session:
            params["session"] = self.session
        if self.token:
            params["token"] = self.token
        elif not self.unconfined:
            params["agent"] = True
        info = client.call("session.attach", params)
        mismatch = version_mismatch(info.get("kernel"))
        if mismatch:
            log.warning("%s", mismatch)
            if self.host is not None:  # skew across hosts: the client hears of it too
                self.on_log("warning", f"{mismatch} (the kernel on {self.host.label})")
        self.backoff.succeeded()
        return info

    def _connect(self, on_event: Callable[[dict], None] | None) -> KernelClient:
        host = self.host
        if host is not None:
            return self.backoff.attempt(lambda: connect_remote(host, on_event))
        try:
            return connect(on_event=on_event, autostart=False)
        except KernelUntrusted:
            raise  # not ours (another user's, another state dir's): never start over it
        except KernelLost:
            if os.environ.get("SHOAL_NO_AUTOSTART", "") not in ("", "0"):
                raise
        self.on_log("info", "no shoal kernel was listening; starting one")
        client = connect(on_event=on_event)
        self.on_log("info", "shoal kernel started")
        return client

    def _open(self, on_event: Callable[[dict], None] | None) -> KernelClient:
        client = self._connect(on_event)
        try:
            self.attach_info = self._attach(client)
        except BaseException as exc:
            client.close()
            if self.host is not None and isinstance(exc, KernelLost):
                self.backoff.failed(exc)  # the link came up but broke before attaching
            raise
        return client

    def calls(self) -> KernelClient:
        with self._lock:
            if self._calls is None or self._calls.closed.is_set():
                lost = self._calls is not None
                pending, self._unattached = self._unattached, None
                if pending is not None and not pending.closed.is_set():
                    try:
                        self.attach_info = self._attach(pending)
                    except BaseException:
                        pending.close()
                        raise
                    self._calls = pending
                else:
                    self._calls = self._open(None)
                # Calls answered on the kernel's reply (the lean path) have no thread of
                # their own waiting: the heartbeat fails them if the kernel stalls.
                self._calls.start_heartbeat()
                if lost:
                    self.on_log("notice", "reconnected to the shoal kernel")
            return self._calls

    def prewarm(self) -> None:
        """Connect (autostarting if allowed) in the background, without attaching yet."""

        def run() -> None:
            with self._lock:
                if self._calls is not None or self._unattached is not None:
                    return
                try:
                    self._unattached = self._connect(None)
                except (KernelLost, OSError) as exc:
                    # The first call reports it, with a hint (a state dir that is a
                    # file: NotADirectory); a warm-up never prints a traceback.
                    log.info("prewarm: %s", exc)

        threading.Thread(target=run, name="mcp-prewarm", daemon=True).start()

    def attach_soon(self) -> None:
        """Attach the call connection in the background (after ``initialize``)."""

        def run() -> None:
            try:
                self.calls()
            except (KernelLost, Exception) as exc:  # noqa: BLE001 - the first call reports it
                log.info("attach: %s", exc)

        threading.Thread(target=run, name="mcp-attach", daemon=True).start()

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
        """A kernel call; on a worker serving a request, cancelling it stops the wait."""
        if current_flight() is None:
            return self.calls().call(method, params or {}, timeout)
        _, _, fut = self.start_call(method, params or {})
        return wait_cancellable(fut, timeout)

    def close(self) -> None:
        with self._lock:
            clients = (self._calls, self._events, self._unattached)
        for client in clients:
            if client is not None:
                client.close()


class ReconnectBackoff:
    """Spacing of remote (re)connects: after a failure the next try waits, doubling up
    to a ceiling (``REMOTE_RECONNECT_BACKOFF_S``); a call in between fails at once with
    the last error, so an unreachable host costs the agent no ssh timeout per call."""

    def __init__(self) -> None:
        self.delay = 0.0
        self.not_before = 0.0
        self.last_error: KernelLost | None = None

    def attempt(self, connect_once: Callable[[], KernelClient]) -> KernelClient:
        wait = self.not_before - time.monotonic()
        if wait > 0 and self.last_error is not None:
            raise KernelLost(f"{self.last_error} (next reconnect try in {wait:.1f} s)")
        try:
            client = connect_once()
        except KernelLost as exc:
            self.failed(exc)
            raise
        return client

    def failed(self, exc: KernelLost) -> None:
        first, ceiling = REMOTE_RECONNECT_BACKOFF_S
        self.delay = min(ceiling, self.delay * 2 if self.delay else first)
        self.not_before = time.monotonic() + self.delay
        self.last_error = exc

    def succeeded(self) -> None:
        self.delay, self.not_before, self.last_error = 0.0, 0.0, None


__all__ = ["KernelLink", "KernelLost"]
