"""What a method handler is given: the ``Call`` (kernel, connection, caller, slot).

It lives apart from the server so that the registry and the method modules name it
without importing the server (which imports the registry). The connection and the
in-flight slot are described by what handlers use of them (``CallConnection``,
``CallSlot``), which the server's own classes satisfy.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..access.identity import Principal
from ..app import Kernel
from .closed_flag import ClosedFlag
from .fairness import CpuBudgets

log = logging.getLogger(__name__)


class CallSlot(Protocol):
    """A blocking call's in-flight entry: its task once spawned, and an early cancel."""

    @property
    def cancel_requested(self) -> bool: ...

    @property
    def task(self) -> Any: ...

    def attach(self, task: Any) -> bool:
        """Record the spawned task; True when a cancel already arrived for it."""
        ...

    def request_cancel(self) -> Any:
        """The task to cancel now, or None when not spawned yet (cancelled on spawn)."""
        ...


class CallConnection(Protocol):
    """The parts of a kernel connection that method handlers read and set."""

    who: Principal | None  # set by session.attach
    client: dict  # the client's self-description, from session.attach
    subscriptions: dict[str, Any]  # event subscriptions by id

    @property
    def id(self) -> int: ...

    @property
    def closed(self) -> ClosedFlag: ...

    def inflight_call(self, request_id: Any) -> CallSlot | None:
        """The blocking call in flight under ``request_id`` (a ``task.get {call}``)."""
        ...

    def notify_event(self, event: dict) -> None: ...


@dataclass
class Call:
    """What a handler sees: the kernel, the connection, the caller and (if blocking) its slot."""

    kernel: Kernel
    conn: CallConnection
    id: Any
    slot: CallSlot | None = None
    cpu: CpuBudgets | None = None  # the server's, for kernel.status
    deferred: list[Callable[[], None]] = field(default_factory=list)  # after_reply work

    @property
    def who(self) -> Principal:
        assert self.conn.who is not None
        return self.conn.who

    # The exec service's ``Caller``: whether anyone still waits, and early cancels.

    @property
    def hangup(self) -> ClosedFlag:
        return self.conn.closed

    def spawned(self, task: Any) -> bool:
        return self.slot is not None and self.slot.attach(task)

    def cancelled(self) -> bool:
        return self.slot is not None and self.slot.cancel_requested

    def after_reply(self, work: Callable[[], None]) -> None:
        self.deferred.append(work)

    def run_deferred(self) -> None:
        """The handler's ``after_reply`` work, once its reply is written (or not)."""
        for work in self.deferred:
            try:
                work()
            except Exception:  # noqa: BLE001 - housekeeping: logged, the reply is gone
                log.exception("work after the reply of %s failed", self.id)
        self.deferred.clear()
