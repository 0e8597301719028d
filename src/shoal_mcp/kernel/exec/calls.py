"""The calling side of an exec: how to run and answer (``RunOptions``), and what the
service needs to know about the call it serves (``Caller``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from ..values.elision import ElideOptions

if TYPE_CHECKING:
    from .tasks import Hangup, Task


class Caller(Protocol):
    """What the exec service needs to know about the call it serves."""

    @property
    def hangup(self) -> Hangup:
        """Whether (and an fd that says when) the caller left."""
        ...

    def spawned(self, task: Task) -> bool:
        """Record the spawned task; True when a cancel for this call already arrived."""
        ...

    def cancelled(self) -> bool:
        """True when a cancel for this call arrived (before anything was spawned)."""
        ...

    def after_reply(self, work: Callable[[], None]) -> None:
        """Run ``work`` once the reply is written (housekeeping the caller need not wait
        for); it runs even when no reply could be written."""
        ...


@dataclass(frozen=True)
class RunOptions:
    """How to run and answer: ``exec``'s and ``plan.apply``'s shared params."""

    background: bool = False
    timeout_ms: int | None = None
    position: str = "stmt"
    elide: ElideOptions = field(default_factory=ElideOptions)
    stdin: str | None = None
    """A FIFO the command reads as its stdin (``shoal exec -i``); else /dev/null."""

    @classmethod
    def from_params(cls, params: dict) -> RunOptions:
        return cls(
            background=params.get("background", False),
            timeout_ms=params.get("timeout_ms"),
            position=params.get("position", "stmt"),
            elide=ElideOptions.from_params(params.get("elide")),
            stdin=params.get("stdin"),
        )
