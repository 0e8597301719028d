"""One task's lifecycle: its states and the one table of moves between them.

Sans-I/O: ``TaskLifecycle`` is a plain object that whoever owns the task drives (today
the thread holding the task's lock). It signals no process and knows no thread; each
move either lands in the state the table names or raises ``InvalidTransition``, and
``cancel`` returns what the caller must do about it.

    SPAWN_PENDING -> RUNNING <-> SUSPENDED
    RUNNING, SUSPENDED -> CANCELLING            (cancel: the group is terminated)
    RUNNING, SUSPENDED, CANCELLING -> FINALIZING (the command exited)
    FINALIZING -> COMPLETED | FAILED | CANCELLED

``cancel`` is valid in every state: before the spawn it is remembered and applied by
``spawned()``; once the command has exited (finalizing, or done) it is a no-op that
says so. The values of ``TaskState`` are the strings the wire has always carried;
CANCELLING and FINALIZING are the kernel's own and never sent: ``shown`` maps them to
what a client has always seen then (``cancelled``, and the state the task left).
An exec's journal row has its own, durable vocabulary (``store/journal.py``,
``RowState``).
"""

from __future__ import annotations

import enum


class TaskState(enum.StrEnum):
    """A task's state; the value is what ``task.list``/``task.get`` and events carry."""

    SPAWN_PENDING = "starting"  # a call known by its request id, nothing spawned yet
    RUNNING = "running"
    SUSPENDED = "suspended"
    CANCELLING = "cancelling"  # never sent: shown as "cancelled"
    FINALIZING = "finalizing"  # never sent: shown as the state it left
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATES = frozenset({TaskState.COMPLETED, TaskState.FAILED, TaskState.CANCELLED})


class Move(enum.Enum):
    """What happens to a task; the table says where each move leads from each state."""

    SPAWN = "spawn"
    SUSPEND = "suspend"
    RESUME = "resume"
    CANCEL = "cancel"
    EXIT = "exit"  # the command exited: its result is being stored
    FINISH_OK = "finish_ok"
    FINISH_FAILED = "finish_failed"  # not ok, or finalize refused (an RpcError)
    FINISH_CANCELLED = "finish_cancelled"  # finalized after a cancel took effect
    CRASH = "crash"  # finalize itself broke: failed, even after a cancel


class CancelResult(enum.Enum):
    """What a ``cancel`` asks of its caller."""

    AT_SPAWN = "at_spawn"  # remembered: ``spawned()`` tells the spawner to kill at once
    TERMINATE = "terminate"  # terminate the process group now
    TOO_LATE = "too_late"  # the command has exited and is being finalized: nothing to do
    ALREADY_DONE = "already_done"  # finished: nothing to do


_S, _M = TaskState, Move

TRANSITIONS: dict[tuple[TaskState, Move], TaskState] = {
    (_S.SPAWN_PENDING, _M.SPAWN): _S.RUNNING,
    (_S.RUNNING, _M.SUSPEND): _S.SUSPENDED,
    (_S.SUSPENDED, _M.RESUME): _S.RUNNING,
    (_S.RUNNING, _M.EXIT): _S.FINALIZING,
    (_S.SUSPENDED, _M.EXIT): _S.FINALIZING,  # killed by someone else while stopped
    (_S.CANCELLING, _M.EXIT): _S.FINALIZING,
    (_S.FINALIZING, _M.FINISH_OK): _S.COMPLETED,
    (_S.FINALIZING, _M.FINISH_FAILED): _S.FAILED,
    (_S.FINALIZING, _M.FINISH_CANCELLED): _S.CANCELLED,
    (_S.FINALIZING, _M.CRASH): _S.FAILED,
    # cancel, valid everywhere; where it changes nothing, CANCEL_RESULTS says why
    (_S.SPAWN_PENDING, _M.CANCEL): _S.SPAWN_PENDING,
    (_S.RUNNING, _M.CANCEL): _S.CANCELLING,
    (_S.SUSPENDED, _M.CANCEL): _S.CANCELLING,
    (_S.CANCELLING, _M.CANCEL): _S.CANCELLING,  # terminating again does no harm
    (_S.FINALIZING, _M.CANCEL): _S.FINALIZING,
    (_S.COMPLETED, _M.CANCEL): _S.COMPLETED,
    (_S.FAILED, _M.CANCEL): _S.FAILED,
    (_S.CANCELLED, _M.CANCEL): _S.CANCELLED,
}
"""The one table of moves: (state, move) -> the state it leads to; absent: invalid."""

CANCEL_RESULTS: dict[TaskState, CancelResult] = {
    _S.SPAWN_PENDING: CancelResult.AT_SPAWN,
    _S.RUNNING: CancelResult.TERMINATE,
    _S.SUSPENDED: CancelResult.TERMINATE,
    _S.CANCELLING: CancelResult.TERMINATE,
    _S.FINALIZING: CancelResult.TOO_LATE,
    _S.COMPLETED: CancelResult.ALREADY_DONE,
    _S.FAILED: CancelResult.ALREADY_DONE,
    _S.CANCELLED: CancelResult.ALREADY_DONE,
}

_SHOWN = {_S.CANCELLING: _S.CANCELLED}


class InvalidTransition(RuntimeError):
    """A move the table does not allow from the current state."""

    def __init__(self, state: TaskState, move: Move) -> None:
        super().__init__(f"task is {state.name}: {move.value} is not allowed")
        self.state = state
        self.move = move


class TaskLifecycle:
    """One task's state, moved only through ``TRANSITIONS``."""

    def __init__(self, state: TaskState = TaskState.SPAWN_PENDING) -> None:
        self.state = state
        self.cancelled = False  # a cancel took effect (before the command exited)
        self._left = state  # the state FINALIZING was entered from (what it shows)

    @property
    def done(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def shown(self) -> TaskState:
        """The state as clients have always seen it (never CANCELLING or FINALIZING)."""
        state = self._left if self.state is TaskState.FINALIZING else self.state
        return _SHOWN.get(state, state)

    def allows(self, move: Move) -> bool:
        return (self.state, move) in TRANSITIONS

    def fire(self, move: Move) -> TaskState:
        """Make ``move``; the new state. InvalidTransition when the table forbids it."""
        target = TRANSITIONS.get((self.state, move))
        if target is None:
            raise InvalidTransition(self.state, move)
        if target is TaskState.FINALIZING and self.state is not TaskState.FINALIZING:
            self._left = self.state
        self.state = target
        return target

    def spawned(self) -> bool:
        """The command is running; True when a cancel came first (kill it at once)."""
        self.fire(Move.SPAWN)
        if self.cancelled:
            self.fire(Move.CANCEL)
        return self.cancelled

    def suspend(self) -> None:
        self.fire(Move.SUSPEND)

    def resume(self) -> None:
        self.fire(Move.RESUME)

    def cancel(self) -> CancelResult:
        """Cancel, whatever the state; the result says what the caller must do."""
        result = CANCEL_RESULTS[self.state]
        self.fire(Move.CANCEL)
        if result in (CancelResult.AT_SPAWN, CancelResult.TERMINATE):
            self.cancelled = True
        return result

    def exited(self) -> None:
        """The command has exited; its result is being stored."""
        self.fire(Move.EXIT)

    def finished(self, ok: bool) -> TaskState:
        """Finalize stored the result (``ok``: it succeeded); a cancelled task stays so."""
        if self.cancelled:
            return self.fire(Move.FINISH_CANCELLED)
        return self.fire(Move.FINISH_OK if ok else Move.FINISH_FAILED)

    def crashed(self) -> TaskState:
        """Finalize itself broke: failed, whatever came before."""
        return self.fire(Move.CRASH)
