"""Access checks that span services: quotas and visibility that need more than the guard.

Subscriptions and connections are counted across every connection of a principal; a
blob is readable through the caller's journal rows; an event channel through the task
or PTY it names, or the policy. ``Kernel`` (``app.py``) is built with these checks; the
RPC methods call them on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ...protocol import uri
from ...protocol.errors import ErrorCode, RpcError
from ..config.limits import DURABLE_CHANNELS
from ..owner.tables import TABLES
from ..store.db import Database
from .budgets import over_budget
from .guard import Guard
from .identity import Principal, owner_key


class TaskLookup(Protocol):
    """The task table as these checks see it (``exec/tasks.py``)."""

    def get(self, task_id: int | str, session: str, principal: str, see_all: bool = ...) -> Any:
        """The task, or -32031 when the caller may not name it."""
        ...


class PtyListing(Protocol):
    """The PTY table as these checks see it (``pty/manager.py``)."""

    def list(self, owner: str | None) -> list[dict[str, Any]]:
        """The PTYs of ``owner`` (None: all)."""
        ...

    def count_of(self, principal: str) -> int:
        """Open PTYs of ``principal`` in all its sessions."""
        ...


class CrossServiceChecks:
    """The kernel's checks that combine the guard with its other services; the kernel
    provides those services as attributes."""

    guard: Guard
    db: Database
    tasks: TaskLookup
    ptys: PtyListing
    connections_of: Callable[[str], int]
    _subscriptions: dict[str, set[str]]  # principal -> live subscription ids (TABLES)

    def subscriptions_of(self, principal: str) -> int:
        """The principal's live subscriptions on every connection (max_subscriptions)."""
        with TABLES:
            return len(self._subscriptions.get(principal, ()))

    def track_subscription(self, principal: str, sub_id: str, live: bool) -> None:
        with TABLES:
            ids = self._subscriptions.setdefault(principal, set())
            if live:
                ids.add(sub_id)
            else:
                ids.discard(sub_id)

    def check_connection_budget(self, principal: str, already: bool) -> None:
        """max_connections: attached connections per principal (``already``: this
        connection is one of them, re-attaching)."""
        limit = self.guard.for_principal(principal).budget("max_connections")
        held = self.connections_of(principal) - (1 if already else 0)
        if held >= limit:
            raise over_budget("max_connections", limit, f"{principal} has {held} connections")

    def pty_count(self, principal: str) -> int:
        """Open PTYs of ``principal`` across all its sessions (max_ptys is per principal)."""
        return self.ptys.count_of(principal)

    def can_see_all_tasks(self, principal: str) -> bool:
        return self.guard.for_principal(principal).tasks_read == "all"

    def journal_read_all(self, principal: str) -> bool:
        return self.guard.for_principal(principal).journal_read == "all"

    def check_blob_access(self, who: Principal, digest: str) -> None:
        """A blob is readable by principals whose journal rows (or policy) reach it."""
        if self.journal_read_all(who.principal):
            return
        rows = self.db.query(
            "SELECT 1 FROM journal WHERE principal = ? AND outputs LIKE ? LIMIT 1",
            (who.principal, f"%{digest}%"),
        )
        if not rows:
            raise RpcError(ErrorCode.UNKNOWN_REF, f"unknown blob {digest}", {"hash": digest})

    def check_channel_access(self, who: Principal, channel: str) -> None:
        """task.N / pty.N only for their owners; journal and approval per policy."""
        kind = channel.partition(".")[0]
        num = uri.parse_channel(channel)[1]
        if kind == "task":
            self.tasks.get(
                channel.partition(".")[2] if num is None else num,  # a bad N: unknown task
                who.session,
                who.principal,
                see_all=self.can_see_all_tasks(who.principal),
            )
        elif kind == "pty":
            pty_id = uri.pty_ref(num) if num is not None else channel.partition(".")[2]
            if not any(p["pty_id"] == pty_id for p in self.ptys.list(owner_key(who))):
                raise RpcError(
                    ErrorCode.UNKNOWN_PTY, f"unknown pty {pty_id}"[:200], {"pty_id": pty_id[:100]}
                )
        elif channel in DURABLE_CHANNELS and not self.journal_read_all(who.principal):
            raise RpcError(
                ErrorCode.DENIED, f"{channel} events need journal_read = all", {"channel": channel}
            )
        elif channel == "approval" and not self.guard.for_principal(who.principal).approver:
            raise RpcError(
                ErrorCode.DENIED, "approval events are for approvers", {"channel": channel}
            )
