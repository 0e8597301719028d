"""Requests the facade sends the client (2025-06-18/11-25 ``elicitation/create``).

The older revisions let a server ask the client mid-call; the call's worker thread waits
for the answer (cancellable), which the reader thread hands over by id. 2026-07-28 has no
server-to-client requests: it asks with ``input_required`` results instead (approvals).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from ..protocol.jsonrpc import Response
from ..protocol.limits import MCP_TASK_RESULT_POLL_S
from .inflight import CallCancelled, current_flight


class ClientRequests:
    def __init__(self, send: Callable[[Any], None]) -> None:
        self.send = send
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._waiting: dict[str, Future] = {}

    def elicit(self, params: dict, timeout: float) -> dict | None:
        """Send ``elicitation/create`` and wait for the ElicitResult; None when the client
        answered an error or the wait ran out. A cancelled call stops waiting at once."""
        ask_id = f"shoal-elicit-{next(self._ids)}"
        waiting: Future = Future()
        with self._lock:
            self._waiting[ask_id] = waiting
        self.send(
            {"jsonrpc": "2.0", "id": ask_id, "method": "elicitation/create", "params": params}
        )
        flight = current_flight()
        waited = 0.0
        try:
            while waited < timeout:
                if flight is not None and flight.cancelled:
                    raise CallCancelled(flight.request_id)
                try:
                    # how often a wait looks whether its call was cancelled
                    result = waiting.result(timeout=MCP_TASK_RESULT_POLL_S)
                except TimeoutError:
                    waited += MCP_TASK_RESULT_POLL_S
                    continue
                return result if isinstance(result, dict) else None
            return None
        finally:
            with self._lock:
                self._waiting.pop(ask_id, None)

    def resolve(self, reply: Response) -> None:
        """A client's answer to one of our requests (others are ignored)."""
        with self._lock:
            waiting = self._waiting.pop(str(reply.id), None)
        if waiting is not None and not waiting.done():
            waiting.set_result(reply.result if reply.error is None else None)
