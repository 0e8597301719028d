"""Process containment (issue 19, item 5; issue 14, max_tasks and max_output_bytes), live.

Each exec runs under a supervisor that is a child subreaper: whatever the command
starts — ``&``, ``setsid``, ``nohup`` — is killed when bash exits, on cancel, on kernel
SIGTERM and after a kernel SIGKILL.  Processes are found by a unique ``sleep`` argument
(``procfs.pids_with_arg``); a failed test kills what it left.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shoal_mcp.client import KernelClient
from shoal_mcp.protocol.errors import RpcError
from shoal_mcp.tokens import TokenStore
from tests.support.kernel import KernelProcess
from tests.support.polling import wait_until
from tests.support.procfs import alive_with_marks, pids_with_arg, sleep_marker
from tests.support.tmp import short_tmp

QUOTA = -32031
RAISED = -32002


def escapes(marks: list[str]) -> str:
    """A script whose three children try to outlive it, each in a different way."""
    a, b, c = marks
    return (
        f"setsid sleep {a} & nohup sleep {b} >/dev/null 2>&1 & (sleep {c}; echo late) & echo early"
    )


def test_exec_end_kills_everything_the_command_started(kernel, marks) -> None:
    c = kernel.client("contain-end")
    try:
        got = c.call("exec", {"src": escapes(marks)}, timeout=60)
        # The reply comes after the supervisor reaped the whole tree: nothing is left,
        # without waiting.
        assert alive_with_marks(marks) == []
        assert got["value"]["out"]["v"] == "early\n"
    finally:
        c.close()


def test_recorded_output_is_final_once_the_exec_returned(kernel) -> None:
    """Issue 19, item 4: a background writer cannot grow a stored output afterwards."""
    c = kernel.client("contain-final")
    try:
        got = c.call("exec", {"src": "echo early; (sleep 0.3; echo late) &"}, timeout=60)
        ref = got["ref"]
        c.call("exec", {"src": "sleep 1"}, timeout=60)  # longer than the writer's delay
        again = c.call("value.get", {"ref": ref, "path": ".out"}, timeout=30)
        assert again["value"]["v"] == "early\n"
        assert got["value"]["out"]["v"] == "early\n"
    finally:
        c.close()


def test_cancel_kills_detached_descendants(kernel, marks) -> None:
    c = kernel.client("contain-cancel")
    try:
        task = c.call("exec", {"src": escapes(marks) + f"; sleep {marks[0]}", "background": True})[
            "task"
        ]
        wait_until(lambda: len(alive_with_marks(marks)) >= 4, what="the tree to start")
        c.call("task.cancel", {"task": task})
        done = c.call("task.await", {"task": task, "timeout_ms": 20000}, timeout=30)
        assert done["done"] is True
        assert alive_with_marks(marks) == []
    finally:
        c.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_kernel_exit_kills_every_tree(kernel_factory, marks, sig) -> None:
    """Background and in-flight foreground execs alike; after SIGKILL the supervisors
    see their control socket close and kill their trees."""
    k = kernel_factory()
    c = k.client("contain-exit")
    fg_mark = sleep_marker()
    marks.append(fg_mark)
    try:
        c.call("exec", {"src": escapes(marks[:3]) + f"; sleep {marks[0]}", "background": True})
        c.start_call("exec", {"src": f"setsid sleep {fg_mark} & sleep {fg_mark}"})
        wait_until(lambda: len(alive_with_marks(marks)) >= 6, what="both trees to start")
        k.stop(sig)
        wait_until(
            lambda: not alive_with_marks(marks),
            timeout=20,
            what="every process of the trees to die",
        )
    finally:
        c.close()


def test_kill_of_bash_itself_still_kills_the_rest(kernel, marks) -> None:
    c = kernel.client("contain-selfkill")
    try:
        with pytest.raises(RpcError) as info:
            c.call("exec", {"src": f"setsid sleep {marks[0]} & kill -9 $$"}, timeout=60)
        assert info.value.code == RAISED and info.value.data["status"] == 137
        assert alive_with_marks(marks) == []
    finally:
        c.close()


# -- budgets: a kernel with a policy ------------------------------------------------------

POLICY = """
[principal."agent:q"]
proc_spawn = ["sleep", "true", "echo"]
max_tasks = 2
max_output_bytes = 1048576
"""


@pytest.fixture(scope="module")
def quota_kernel() -> Iterator[tuple[KernelProcess, Callable[[], KernelClient]]]:
    with short_tmp("shct") as tmp:
        policy = Path(tmp) / "policy.toml"
        policy.write_text(POLICY)
        k = KernelProcess(tmp, "--policy", str(policy))
        token = TokenStore(k.state / "tokens.json").create("agent:q")[1]
        k.start()
        clients: list[KernelClient] = []

        def agent() -> KernelClient:
            client = k.client("quota", token=token)
            clients.append(client)
            return client

        try:
            yield k, agent
        finally:
            for client in clients:
                client.close()
            k.stop()


def test_foreground_execs_count_toward_max_tasks(quota_kernel, marks) -> None:
    _, agent = quota_kernel
    c = agent()
    mark = marks[0]
    # Pipelined: the kernel runs them in parallel; each one past its 300 ms wait becomes
    # a listed task, so the two that started stay counted.
    calls = [c.start_call("exec", {"src": f"sleep {mark}", "timeout_ms": 300}) for _ in range(12)]
    started, refused = [], []
    for _, fut in calls:
        try:
            started.append(fut.result(60)["task"])
        except RpcError as exc:
            refused.append(exc)
    try:
        assert len(pids_with_arg(mark)) <= 2
        assert len(started) == 2 and len(refused) == 10
        for exc in refused:
            assert exc.code == QUOTA and exc.data["quota"] == "max_tasks", exc
            assert "max_tasks" in exc.message
    finally:
        for t in started:
            c.call("task.cancel", {"task": t})
        for t in started:
            c.call("task.await", {"task": t, "timeout_ms": 20000}, timeout=30)
    assert pids_with_arg(mark) == []
    # Slots come back: a new exec runs.
    assert c.call("exec", {"src": "true"}, timeout=60)["value"]["status"] == 0


def test_output_cap_stops_a_builtin_loop(quota_kernel) -> None:
    """Issue 14: `while :; do echo …; done` spooled without limit until the caller left."""
    k, agent = quota_kernel
    c = agent()
    with pytest.raises(RpcError) as info:
        c.call("exec", {"src": "while :; do echo yyyyyyyyyyyyyyyyyyyy; done"}, timeout=120)
    assert info.value.code == RAISED
    data = info.value.data
    assert data["output_capped"] is True and data["status"] == 137
    outcome = c.call("value.get", {"ref": data["ref"]}, timeout=30)["value"]
    assert outcome["output_capped"] is True and outcome["ok"] is False
    assert outcome["out"]["bytes"] == 1048576 and outcome["err"]["v"] == ""
    # Under the cap nothing is said.
    small = c.call("exec", {"src": "echo fine"}, timeout=60)
    assert "output_capped" not in small["value"]
