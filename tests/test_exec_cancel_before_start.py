"""A call cancelled before its command was spawned spawns nothing, and one cancelled
while it was being spawned is SIGKILLed at once (exec/service.py).

The kernel is real (in-process, on a temporary state dir); the caller is the exec
service's ``Caller`` as the RPC layer would pass it, with its cancel already in. The
live path (a cancel in the same write as the call, through ``shoal-mcp``) is
``test_mcp_stdio::test_cancel_that_overtakes_the_spawn_still_ends_the_task``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal_mcp.kernel.access.identity import Principal
from shoal_mcp.kernel.app import Kernel, KernelConfig
from shoal_mcp.kernel.exec.calls import RunOptions
from shoal_mcp.kernel.exec.start import CancelledBeforeStart
from shoal_mcp.kernel.rpc.closed_flag import ClosedFlag
from shoal_mcp.protocol.errors import ErrorCode, RpcError


class CancelledCaller:
    """A caller whose cancel arrived before the spawn (``task.cancel {call}``)."""

    def __init__(self) -> None:
        self.spawned_tasks: list = []
        self.deferred: list = []
        self.hangup = ClosedFlag()  # never set: the caller stays

    def spawned(self, task) -> bool:
        self.spawned_tasks.append(task)
        return True

    def cancelled(self) -> bool:
        return True

    def after_reply(self, work) -> None:
        self.deferred.append(work)


class PlainCaller(CancelledCaller):
    """A caller nobody cancelled."""

    def spawned(self, task) -> bool:
        return False

    def cancelled(self) -> bool:
        return False


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[Kernel]:
    k = Kernel(KernelConfig(socket=tmp_path / "run" / "k.sock", state_dir=tmp_path / "state"))
    yield k
    k.stop_work(drain_s=1.0)
    k.close()


def test_nothing_runs_and_the_reply_says_so(kernel: Kernel, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    who = Principal("cancelled-early", f"uid:{os.geteuid()}")
    caller = CancelledCaller()
    with pytest.raises(CancelledBeforeStart) as raised:
        kernel.exec.run(who, f"touch {marker}", RunOptions(), caller)
    err = raised.value.to_error()
    assert err["code"] == ErrorCode.TASK_CONTROL and err["data"] == {
        "cancelled": True,
        "started": False,
    }
    assert caller.spawned_tasks == [] and not marker.exists()
    assert kernel.tasks.running_total() == 0
    # The principal's max_tasks slot taken for the start is given back.
    reply = kernel.exec.run(who, "echo after", RunOptions(), PlainCaller())
    assert reply["value"]["out"]["v"] == "after\n"


class CancelledDuringSpawnCaller(PlainCaller):
    """A caller whose cancel arrived while the command was being spawned."""

    def spawned(self, task) -> bool:
        self.spawned_tasks.append(task)
        return True


def test_a_cancel_during_the_spawn_kills_at_once(kernel: Kernel, tmp_path: Path) -> None:
    # A SIGTERM would reach the trap (once set) and exit 3, or kill bash before it: 143.
    # Nothing has seen the command, so there is no grace: SIGKILL only, status 137.
    marker = tmp_path / "got-term"
    who = Principal("cancelled-mid-spawn", f"uid:{os.geteuid()}")
    caller = CancelledDuringSpawnCaller()
    with pytest.raises(RpcError) as raised:
        kernel.exec.run(
            who, f"trap 'touch {marker}; exit 3' TERM; sleep 30 & wait", RunOptions(), caller
        )
    err = raised.value.to_error()
    assert err["code"] == ErrorCode.RAISED and err["data"]["status"] == 137, err
    assert "(cancelled)" in err["message"]
    assert [t.state for t in caller.spawned_tasks] == ["cancelled"]
    assert not marker.exists()
    assert kernel.tasks.running_total() == 0
