"""MCP logging: ``notifications/message`` lines for the client, at the level it set.

Lines from before ``initialize`` was answered (the background connect may autostart the
kernel by then) are kept, up to ``MCP_EARLY_LOG_LINES``, and sent right after it; once
the client hung up nothing more is sent.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..protocol.errors import ErrorCode, RpcError
from ..protocol.limits import MCP_EARLY_LOG_LINES

LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
"""MCP logging levels (RFC 5424 severities), least severe first."""
DEFAULT_LOG_LEVEL = "info"


class ClientLog:
    def __init__(self, notify: Callable[[str, dict], None]) -> None:
        self.notify = notify
        self.level = DEFAULT_LOG_LEVEL
        self._lock = threading.Lock()
        self._opened = False  # initialize answered: lines may go out
        self._closed = False  # the client hung up: nobody to tell, and it may be exiting
        self._early: list[tuple[str, str, str]] = []

    def log(self, level: str, message: str, logger: str = "shoal") -> None:
        """``notifications/message`` at ``level``, when the client's level lets it through."""
        with self._lock:
            if self._closed:
                return
            if not self._opened:
                if len(self._early) < MCP_EARLY_LOG_LINES:
                    self._early.append((level, message, logger))
                return
        if LOG_LEVELS.index(level) < LOG_LEVELS.index(self.level):
            return
        self.notify("notifications/message", {"level": level, "logger": logger, "data": message})

    def opened(self) -> None:
        """``initialize`` was answered: send the lines kept until then."""
        with self._lock:
            self._opened = True
            early, self._early = self._early, []
        for level, message, logger in early:
            self.log(level, message, logger)

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def set_level(self, params: dict) -> dict:
        """``logging/setLevel``."""
        level = params.get("level")
        if level not in LOG_LEVELS:
            raise RpcError(
                ErrorCode.INVALID_PARAMS,
                f"invalid params: level: one of {', '.join(LOG_LEVELS)}",
                {"field": "level", "allowed": list(LOG_LEVELS)},
            )
        self.level = level
        return {}
