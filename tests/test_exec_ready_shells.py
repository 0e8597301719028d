"""Ready shells (kernel/exec/ready.py): after an exec, the session's next bash is
started ahead with the session's state and waits for its source; the next exec runs in
it when nothing changed, with the semantics of a fresh ``bash -c``."""

from __future__ import annotations

import os
import threading
import time

from shoal_mcp.kernel.config.limits import READY_SHELL_WAIT_S
from shoal_mcp.kernel.exec.keeper import PoolKeeper
from shoal_mcp.kernel.exec.ready import ReadyShells
from shoal_mcp.kernel.exec.ready_start import ShellOrder
from shoal_mcp.kernel.exec.supervisor import Supervisor
from tests.support.kernel import close_client, running_kernel
from tests.support.polling import wait_until
from tests.support.procfs import descendants_of, is_waiting_ready_shell


def out(c, src: str, **params) -> str:
    reply = c.call("exec", {"src": src, "position": "value", **params}, timeout=60)
    return reply["value"]["out"]["v"] if isinstance(reply["value"]["out"], dict) else ""


def ready_shells() -> list[int]:
    """Waiting ready shells on this machine (other kernels' too: compared by pid)."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and is_waiting_ready_shell(p)]


def new_ready_shells(kernel, before: set[int]) -> set[int]:
    """``kernel``'s waiting ready shells not in ``before`` (other kernels on the machine,
    and this kernel's other sessions, have theirs too)."""
    return (set(ready_shells()) & descendants_of(kernel.pid)) - before


def test_the_next_exec_runs_in_a_started_shell_as_if_fresh(kernel, tmp_path):
    c = kernel.client("ready-fresh")
    try:
        before = new_ready_shells(kernel, set())
        first_pid, cold_zero = out(c, 'echo "$$ $0"').split()  # the first exec starts cold
        wait_until(lambda: new_ready_shells(kernel, before), timeout=30, what="a ready shell")
        waiting = new_ready_shells(kernel, before)
        time.sleep(1.2)  # the shell waits; its clock must not count that
        second = out(c, 'echo "$$ $SECONDS $? ${#BASH_SOURCE[@]} $0"; echo "$LINENO"')
        pid, seconds, status, sources, zero = second.split("\n")[0].split()
        assert int(pid) in waiting and pid != first_pid  # the started shell, a new process
        assert (seconds, status, sources, zero) == ("0", "0", "0", cold_zero)
        assert second.split("\n")[1] == "1"  # line numbers are the source's own
        # state: cd and export persist, shell variables and functions do not
        out(c, f"cd {tmp_path}; export READY_T=1; plain=2; f() {{ :; }}")
        assert out(c, 'echo "$PWD ${READY_T:-} ${plain:-unset} $(type -t f || echo none)"') == (
            f"{tmp_path} 1 unset none\n"
        )
        assert out(c, "unset READY_T; cd /") == ""
        assert out(c, 'echo "$PWD ${READY_T:-gone}"') == "/ gone\n"
    finally:
        close_client(c)


def test_back_to_back_execs_run_in_ready_shells(kernel):
    """Execs sent one right after another still find their session's ready shell (made
    after each reply; one still starting is waited for, READY_SHELL_WAIT_S), and
    kernel.status counts hits and misses."""
    c = kernel.client("ready-b2b")
    try:
        before = c.call("kernel.status", timeout=30)["warm"]
        for i in range(10):
            assert out(c, f"echo {i}") == f"{i}\n"
        after = c.call("kernel.status", timeout=30)["warm"]
        takes = {k: after[k] - before[k] for k in ("ready_hits", "ready_misses")}
        assert sum(takes.values()) == 10  # one take per exec
        assert takes["ready_hits"] >= 5  # the first is cold
    finally:
        close_client(c)


def test_status_stderr_and_syntax_errors(kernel):
    c = kernel.client("ready-status")
    try:
        others = new_ready_shells(kernel, set())  # other sessions'
        out(c, "true")
        wait_until(lambda: new_ready_shells(kernel, others), timeout=30, what="a ready shell")
        reply = c.call("exec", {"src": "echo e >&2; exit 7", "position": "value"}, timeout=60)
        assert reply["value"]["status"] == 7 and reply["value"]["err"]["v"] == "e\n"
        # the shell it ran in waits no more; the next one is made after the reply
        wait_until(lambda: new_ready_shells(kernel, others), timeout=30, what="a ready shell")
        reply = c.call("exec", {"src": "echo a\nif then", "position": "value"}, timeout=60)
        assert reply["value"]["status"] == 2 and reply["value"]["out"]["v"] == "a\n"
        assert "line 2: syntax error" in reply["value"]["err"]["v"]
    finally:
        close_client(c)


def test_a_shell_is_used_only_for_the_exact_state_it_was_started_with(tmp_path):
    z = Supervisor()
    shells = ReadyShells()
    try:
        env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}
        made = ShellOrder("/", env, tmp_path, z, sandbox=None, max_output_bytes=0).prepare()
        shells.refill(("p", "s"), lambda: made)
        wait_until(lambda: len(shells) == 1, timeout=30)
        assert shells.take(("p", "s"), "/tmp", env, b"", 0) is None  # another cwd
        wait_until(lambda: made.job.exit is not None, timeout=30, what="the stale shell to end")
        assert not made.out_path.exists()
        again = ShellOrder("/", env, tmp_path, z, sandbox=None, max_output_bytes=0).prepare()
        shells.refill(("p", "s"), lambda: again)
        wait_until(lambda: len(shells) == 1, timeout=30)
        assert shells.take(("p", "s"), "/", {**env, "X": "1"}, b"", 0) is None  # other env
        third = ShellOrder("/", env, tmp_path, z, sandbox=None, max_output_bytes=0).prepare()
        shells.refill(("p", "s"), lambda: third)
        wait_until(lambda: len(shells) == 1, timeout=30)
        shell = shells.take(("p", "s"), "/", dict(env), b"", 0)
        assert shell is third
        run = shell.start("echo hi; printf '%s' \"$PWD\" >&2")
        assert run is not None and run.wait(60) == 0
        assert run.out_path.read_bytes() == b"hi\n" and run.err_path.read_bytes() == b"/"
        assert run.read_state()[0] == "/"  # type: ignore[index]
        run.discard()
    finally:
        shells.close()
        z.close()


def test_a_take_waits_for_a_reserved_shell_and_not_for_a_released_one(tmp_path):
    """An exec reserves its session's next shell before its reply: the caller's next
    exec, even when it comes before the refill has begun, waits for that shell instead
    of starting cold; a reservation released wakes it at once (a miss, no wait)."""
    z = Supervisor()
    shells = ReadyShells()
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}
    taken: list = []

    def take() -> None:
        taken.append(shells.take(("p", "s"), "/", dict(env), b"", 0))

    try:
        assert shells.reserve(("p", "s"))
        assert not shells.reserve(("p", "s"))  # one refill per key at a time
        waiter = threading.Thread(target=take)
        waiter.start()
        time.sleep(0.05)  # the take is under way and finds nothing made yet
        made = ShellOrder("/", env, tmp_path, z, sandbox=None, max_output_bytes=0).prepare()
        shells.refill(("p", "s"), lambda: made, reserved=True)
        waiter.join(10)
        assert taken == [made] and shells.hits == 1
        made.discard()

        assert shells.reserve(("p", "s"))
        waiter = threading.Thread(target=take)
        began = time.monotonic()
        waiter.start()
        time.sleep(0.05)
        shells.release(("p", "s"))
        waiter.join(10)
        assert taken[-1] is None and shells.misses == 1
        assert time.monotonic() - began < READY_SHELL_WAIT_S  # woken, not timed out
    finally:
        shells.close()
        z.close()


def test_the_pool_keeper_reaps_a_discarded_shell_and_removes_its_files(tmp_path):
    """A shell discarded by ``take`` (stale state) is handed to the warm pool's keeper,
    which waits on its job's report socket: once bash ended its spools and state memfd
    go, with no thread started for it. At close, a shell the keeper still waits for is
    finished there."""
    z = Supervisor()
    keeper = PoolKeeper(lambda key: None, lambda: None)
    shells = ReadyShells(dropper=keeper.drop)
    try:
        env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}
        threads = threading.active_count()
        made = ShellOrder("/", env, tmp_path, z, sandbox=None, max_output_bytes=0).prepare()
        shells.refill(("p", "s"), lambda: made)
        assert made.dropper is not None
        assert shells.take(("p", "s"), "/tmp", env, b"", 0) is None  # another cwd: discarded
        wait_until(
            lambda: made.state_fd == -1 and not made.out_path.exists(),
            timeout=30,
            what="the keeper to reap the shell and remove its files",
        )
        assert made.job.exit is not None and not made.err_path.exists()
        assert threading.active_count() == threads
        last = ShellOrder("/", env, tmp_path, z, sandbox=None, max_output_bytes=0).prepare()
        shells.refill(("p", "s"), lambda: last)
        shells.close()  # kills and discards it; the keeper closes right after
        keeper.close()
        assert last.job.exit is not None and last.state_fd == -1
        assert not last.out_path.exists()
    finally:
        shells.close()
        keeper.close()
        z.close()


def test_no_ready_shell_outlives_the_kernel():
    with running_kernel(prefix="shready-") as k:
        c = k.client("ready-exit")
        out(c, "true")
        mine = wait_until(
            lambda: set(ready_shells()) & descendants_of(k.pid), timeout=30, what="a ready shell"
        )
        close_client(c)
        k.stop()
    wait_until(lambda: not (mine & set(ready_shells())), timeout=30, what="ready shells gone")


def test_an_exec_waiting_for_its_shells_start_is_counted():
    """``when_made`` (an exec on the owner loop whose shell is still starting) is counted
    in ``waited_for`` (kernel.status ``warm.ready_waited_for``); no make under way: not."""
    shells = ReadyShells()
    called: list[str] = []
    try:
        assert not shells.when_made(("p", "s"), lambda: called.append("none"))
        assert shells.waited_for == 0
        assert shells.reserve(("p", "s"))  # the session's next shell is coming
        assert shells.when_made(("p", "s"), lambda: called.append("made"))
        assert shells.waited_for == 1 and called == []
        shells.release(("p", "s"))  # the make ended (here: with no shell)
        assert called == ["made"]
    finally:
        shells.close()
