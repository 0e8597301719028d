"""``resourcesListChanged`` for 2026-07-28 ``subscriptions/listen`` (docs/protocol.md, "MCP
versions").

The resource list (running and recent tasks, pending plans, open PTYs) changes as the
kernel works. A change is looked for on a hint: after each ``tools/call`` this facade
serves, and on each event of the kernel's ``journal`` and ``approval`` channels (a task
ended, a plan was requested or decided, by anyone) when the principal may follow them. The
list is then read again, on a thread of its own, and only a real difference is announced,
to each listen that asked for it. A task started by another client of the same session
while this facade is idle is seen at the next hint.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from ..client import KernelLost
from ..protocol.errors import RpcError
from .versions import SUBSCRIPTION_ID_KEY

log = logging.getLogger("shoal.mcp")

LIST_CHANNELS = ("journal", "approval")
"""Kernel channels whose events may change the resource list."""


class ListWatch:
    def __init__(
        self, entries: Callable[[], list[dict]], notify: Callable[[str, dict], None]
    ) -> None:
        self.entries = entries
        self.notify = notify
        self._lock = threading.Lock()
        self._listeners: dict[tuple[str, Any], Any] = {}  # key -> listen request id
        self._last: list[dict] | None = None
        self._hint = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, key: tuple[str, Any], request_id: Any) -> None:
        """Follow the list for a listen; its baseline is the list as it is now."""
        baseline = self._read()
        with self._lock:
            if not self._listeners:
                self._last = baseline
            self._listeners[key] = request_id
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="mcp-list-watch", daemon=True
                )
                self._thread.start()

    def remove(self, key: tuple[str, Any]) -> None:
        with self._lock:
            self._listeners.pop(key, None)

    def active(self) -> bool:
        with self._lock:
            return bool(self._listeners)

    def hint(self) -> None:
        """Something may have changed the list: look again (soon, on the watch thread)."""
        if self.active():
            self._hint.set()

    def _read(self) -> list[dict] | None:
        try:
            return self.entries()
        except (RpcError, KernelLost) as exc:
            log.debug("resource list for listChanged: %s", exc)
            return None

    def _run(self) -> None:
        while True:
            self._hint.wait()
            self._hint.clear()
            current = self._read()
            if current is None:
                continue
            with self._lock:
                changed = self._last is not None and current != self._last
                self._last = current
                listeners = list(self._listeners.values())
            if changed:
                for request_id in listeners:
                    self.notify(
                        "notifications/resources/list_changed",
                        {"_meta": {SUBSCRIPTION_ID_KEY: request_id}},
                    )
