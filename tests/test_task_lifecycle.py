"""TaskLifecycle, in-process: every move of its table, every move it refuses, cancel in
each state, and TaskManager driving it (with a stand-in command, no process)."""

from __future__ import annotations

import threading

import pytest

from shoal_mcp.kernel.exec.lifecycle import (
    CANCEL_RESULTS,
    TERMINAL_STATES,
    TRANSITIONS,
    CancelResult,
    InvalidTransition,
    Move,
    TaskLifecycle,
    TaskState,
)
from shoal_mcp.kernel.exec.tasks import TaskManager
from shoal_mcp.protocol.errors import ErrorCode, RpcError
from shoal_mcp.protocol.params import TASK_LIST

S = TaskState
ALL_MOVES = [(state, move) for state in TaskState for move in Move]


@pytest.mark.parametrize(("state", "move"), sorted(TRANSITIONS, key=str))
def test_every_move_of_the_table_lands_where_it_says(state: TaskState, move: Move) -> None:
    lifecycle = TaskLifecycle(state)
    assert lifecycle.allows(move)
    assert lifecycle.fire(move) is TRANSITIONS[state, move]
    assert lifecycle.state is TRANSITIONS[state, move]


@pytest.mark.parametrize(
    ("state", "move"), [pair for pair in ALL_MOVES if pair not in TRANSITIONS], ids=str
)
def test_every_move_outside_the_table_raises_and_changes_nothing(
    state: TaskState, move: Move
) -> None:
    lifecycle = TaskLifecycle(state)
    assert not lifecycle.allows(move)
    with pytest.raises(InvalidTransition, match=f"task is {state.name}: {move.value}"):
        lifecycle.fire(move)
    assert lifecycle.state is state


def test_the_table_has_the_documented_shape() -> None:
    # cancel is valid in every state; nothing leaves a terminal state but a no-op cancel
    assert all((state, Move.CANCEL) in TRANSITIONS for state in TaskState)
    assert set(CANCEL_RESULTS) == set(TaskState)
    for (state, move), target in TRANSITIONS.items():
        if state in TERMINAL_STATES:
            assert (move, target) == (Move.CANCEL, state)
    path = [Move.SPAWN, Move.SUSPEND, Move.RESUME, Move.EXIT, Move.FINISH_OK]
    lifecycle = TaskLifecycle()
    assert [lifecycle.fire(move) for move in path] == [
        S.RUNNING,
        S.SUSPENDED,
        S.RUNNING,
        S.FINALIZING,
        S.COMPLETED,
    ]
    assert lifecycle.done


CANCEL_IN_EACH_STATE = [
    (S.SPAWN_PENDING, CancelResult.AT_SPAWN, S.SPAWN_PENDING, True),
    (S.RUNNING, CancelResult.TERMINATE, S.CANCELLING, True),
    (S.SUSPENDED, CancelResult.TERMINATE, S.CANCELLING, True),
    (S.CANCELLING, CancelResult.TERMINATE, S.CANCELLING, True),
    (S.FINALIZING, CancelResult.TOO_LATE, S.FINALIZING, False),
    (S.COMPLETED, CancelResult.ALREADY_DONE, S.COMPLETED, False),
    (S.FAILED, CancelResult.ALREADY_DONE, S.FAILED, False),
    (S.CANCELLED, CancelResult.ALREADY_DONE, S.CANCELLED, False),
]


@pytest.mark.parametrize(("state", "result", "after", "cancelled"), CANCEL_IN_EACH_STATE)
def test_cancel_in_each_state(
    state: TaskState, result: CancelResult, after: TaskState, cancelled: bool
) -> None:
    lifecycle = TaskLifecycle(state)
    assert lifecycle.cancel() is result
    assert lifecycle.state is after
    assert lifecycle.cancelled is cancelled


def test_every_state_is_covered_by_the_cancel_cases() -> None:
    assert {case[0] for case in CANCEL_IN_EACH_STATE} == set(TaskState)


def test_a_cancel_before_the_spawn_is_applied_at_the_spawn() -> None:
    lifecycle = TaskLifecycle()
    assert lifecycle.cancel() is CancelResult.AT_SPAWN
    assert lifecycle.cancel() is CancelResult.AT_SPAWN  # asked twice: still one cancel
    assert lifecycle.shown is S.SPAWN_PENDING
    assert lifecycle.spawned() is True  # the spawner kills it at once
    assert lifecycle.state is S.CANCELLING
    assert lifecycle.shown is S.CANCELLED
    lifecycle.exited()
    assert lifecycle.finished(ok=True) is S.CANCELLED  # it ran, but was cancelled


def test_a_spawn_without_a_cancel_runs() -> None:
    lifecycle = TaskLifecycle()
    assert lifecycle.spawned() is False
    assert lifecycle.state is S.RUNNING


def test_a_cancel_during_finalize_is_a_no_op_that_says_so() -> None:
    lifecycle = TaskLifecycle(S.RUNNING)
    lifecycle.exited()
    assert lifecycle.cancel() is CancelResult.TOO_LATE
    assert lifecycle.finished(ok=True) is S.COMPLETED  # the cancel changed nothing


def test_a_cancel_after_done_is_a_no_op() -> None:
    lifecycle = TaskLifecycle(S.RUNNING)
    lifecycle.exited()
    lifecycle.finished(ok=False)
    assert lifecycle.cancel() is CancelResult.ALREADY_DONE
    assert lifecycle.state is S.FAILED


@pytest.mark.parametrize(
    ("cancel", "ok", "crash", "outcome"),
    [
        (False, True, False, S.COMPLETED),
        (False, False, False, S.FAILED),
        (True, True, False, S.CANCELLED),
        (True, False, False, S.CANCELLED),
        (False, True, True, S.FAILED),
        (True, True, True, S.FAILED),  # finalize broke: failed, whatever came before
    ],
)
def test_the_outcome(cancel: bool, ok: bool, crash: bool, outcome: TaskState) -> None:
    lifecycle = TaskLifecycle(S.RUNNING)
    if cancel:
        lifecycle.cancel()
    lifecycle.exited()
    assert (lifecycle.crashed() if crash else lifecycle.finished(ok)) is outcome
    assert lifecycle.done and lifecycle.shown is outcome


@pytest.mark.parametrize(
    ("before", "shown"),
    [(S.RUNNING, S.RUNNING), (S.SUSPENDED, S.SUSPENDED), (S.CANCELLING, S.CANCELLED)],
)
def test_finalizing_shows_the_state_it_left(before: TaskState, shown: TaskState) -> None:
    lifecycle = TaskLifecycle(before)
    lifecycle.exited()
    assert lifecycle.state is S.FINALIZING
    assert lifecycle.shown is shown


def test_the_states_shown_are_the_strings_the_wire_always_carried() -> None:
    listed = set(TASK_LIST["properties"]["state"]["enum"])
    shown = {TaskLifecycle(state).shown for state in TaskState if state is not S.FINALIZING}
    assert {state.value for state in shown} == listed | {"starting"}
    assert S.CANCELLING not in shown
    assert S.RUNNING == "running"  # a StrEnum: compares and serializes as its string


# -- TaskManager driving the lifecycle --------------------------------------------------


class StandInCommand:
    """What TaskManager needs of a RunningCommand, without a process."""

    pid = 4242

    def __init__(self) -> None:
        self.exited = threading.Event()
        self.signals: list[int] = []
        self.terminated = threading.Event()

    def wait(self, timeout: float | None, wake: int | None = None) -> int | None:
        return 0 if self.exited.wait(timeout) else None

    def output_sizes(self) -> tuple[int, int]:
        return (0, 0)

    def signal_group(self, sig: int) -> bool:
        if self.exited.is_set():
            return False
        self.signals.append(sig)
        return True

    def begin_terminate(self, *, at_once: bool = False) -> None:
        self.terminated.set()
        self.exited.set()


class Published:
    def __init__(self) -> None:
        self.events: list[dict] = []

    def publish(self, channel: str, payload: dict) -> None:
        self.events.append(payload)


def _manager(finalize) -> tuple[TaskManager, Published]:
    events = Published()
    return TaskManager(events, finalize), events  # type: ignore[arg-type]


def _start(manager: TaskManager) -> tuple:
    run = StandInCommand()
    task = manager.start("s", "p", "sleep 9", run, False, [])  # type: ignore[arg-type]
    return task, run


def test_the_manager_steers_a_task_through_its_lifecycle() -> None:
    manager, events = _manager(lambda task: {"ok": True, "ref": "out:1", "uri": "u"})
    task, run = _start(manager)
    assert task.record()["state"] == "running"
    manager.suspend(task)
    assert (task.state, type(task.record()["state"])) == (S.SUSPENDED, str)
    with pytest.raises(RpcError, match="is suspended; SIGSTOP needs running") as refused:
        manager.suspend(task)
    assert refused.value.code == ErrorCode.TASK_CONTROL
    manager.resume(task)
    assert manager.cancel(task) is CancelResult.TERMINATE
    assert task.state is S.CANCELLED
    with pytest.raises(RpcError, match="is cancelled; SIGSTOP needs running"):
        manager.suspend(task)
    assert run.terminated.wait(5)
    assert manager.watch(task, 5) is True
    assert task.state is S.CANCELLED and task.done.is_set()
    assert [e["kind"] for e in events.events] == ["started", "suspended", "running", "finished"]
    assert events.events[-1]["state"] == "cancelled"
    with pytest.raises(RpcError, match="already cancelled") as again:
        manager.cancel(task)
    assert again.value.data == {"state": "cancelled"}


def test_the_manager_leaves_a_finalizing_task_alone() -> None:
    seen: dict = {}

    def finalize(task) -> dict:
        seen["cancel"] = manager.cancel(task)
        seen["shown"] = task.record()["state"]
        with pytest.raises(RpcError, match="process group is gone"):
            manager.suspend(task)
        return {"ok": True, "ref": "out:1", "uri": "u"}

    manager, _ = _manager(finalize)
    task, run = _start(manager)
    run.exited.set()
    assert manager.watch(task, 5) is True
    assert seen == {"cancel": CancelResult.TOO_LATE, "shown": "running"}
    assert not run.terminated.is_set()
    assert task.state is S.COMPLETED


def test_a_finalize_that_breaks_fails_the_task() -> None:
    def finalize(task) -> dict:
        raise OSError("disk on fire")

    manager, events = _manager(finalize)
    task, run = _start(manager)
    run.exited.set()
    assert manager.watch(task, 5) is True
    assert task.state is S.FAILED
    assert task.error is not None and "disk on fire" in task.error["message"]
    assert events.events[-1] == {"kind": "finished", "task": task.ref, "state": "failed"}
