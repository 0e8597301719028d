"""PTY program containment (issue 19, item 5), live.

A PTY's program runs below its own supervisor, a child subreaper
(``kernel/pty/supervise.py``): whatever the program starts — ``&``, ``setsid``,
``nohup`` — is killed when the program exits, on ``pty.close``, on kernel SIGTERM and
after a kernel SIGKILL (the supervisor sees its control pipe close).  Processes are found
by a unique ``sleep`` argument (``procfs.pids_with_arg``); a failed test kills what it
left.  Before the supervisor, each of these left the ``setsid`` sleep running.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from shoal_mcp.client import KernelClient
from shoal_mcp.protocol.errors import ErrorCode, RpcError
from shoal_mcp.tokens import TokenStore
from tests.support.kernel import KernelProcess
from tests.support.polling import wait_until
from tests.support.procfs import (
    alive_with_marks,
    pids_with_arg,
    proc_ids,
    sleep_marker,
    sleeping_with_marks,
)
from tests.support.tmp import short_tmp

WAIT_S = 60.0  # a budget for a loaded machine, not a speed check


def escapes(marks: list[str]) -> str:
    """A shell line whose three children try to outlive the program, each its own way;
    then the program waits for a line of input."""
    a, b, c = marks
    return (
        f"setsid sleep {a} & nohup sleep {b} >/dev/null 2>&1 & sleep {c} & "
        "echo started; read line; echo bye"
    )


def open_escaping(c: KernelClient, marks: list[str]) -> dict:
    opened = c.call("pty.open", {"cmd": "bash", "args": ["-c", escapes(marks)]}, timeout=WAIT_S)
    wait_until(
        lambda: len(sleeping_with_marks(marks)) == 3, WAIT_S, what="the three children to start"
    )
    return opened


def test_program_exit_kills_what_it_detached(kernel, marks) -> None:
    c = kernel.client("ptyc-exit")
    try:
        opened = open_escaping(c, marks)
        pty = opened["pty_id"]
        (setsid_child,) = pids_with_arg(marks[0])
        # It really left the program's session: closing the terminal would not reach it.
        assert proc_ids(setsid_child)["session"] != opened["pid"]
        c.call("pty.send", {"pty_id": pty, "input": "\r"})
        wait_until(lambda: not alive_with_marks(marks), WAIT_S, what="the detached children to die")
        done = wait_until(
            lambda: (r := c.call("pty.read", {"pty_id": pty}))["alive"] is False and r,
            WAIT_S,
            what="the exit to be recorded",
        )
        assert done["exit"] == {"status": 0}  # the program's own status, not the supervisor's
        assert "bye" in "\n".join(done["screen"])
        c.call("pty.close", {"pty_id": pty})
    finally:
        c.close()


def test_close_kills_what_the_program_detached(kernel, marks) -> None:
    c = kernel.client("ptyc-close")
    try:
        pty = open_escaping(c, marks)["pty_id"]
        closed = c.call("pty.close", {"pty_id": pty}, timeout=WAIT_S)
        assert closed["exit"] == {"signal": signal.SIGHUP}
        wait_until(
            lambda: not alive_with_marks(marks), WAIT_S, what="every process of the tree to die"
        )
    finally:
        c.close()


def test_close_of_a_hup_ignoring_program_kills_its_tree(kernel, marks) -> None:
    c = kernel.client("ptyc-trap")
    try:
        a, b, _ = marks
        src = f"trap '' HUP; setsid sleep {a} & sleep {b} & echo started; read line"
        pty = c.call("pty.open", {"cmd": "bash", "args": ["-c", src]}, timeout=WAIT_S)["pty_id"]
        wait_until(
            lambda: len(sleeping_with_marks(marks)) == 2, WAIT_S, what="both children to start"
        )
        closed = c.call("pty.close", {"pty_id": pty}, timeout=WAIT_S)
        assert closed["exit"] == {"signal": signal.SIGKILL}
        wait_until(
            lambda: not alive_with_marks(marks), WAIT_S, what="every process of the tree to die"
        )
    finally:
        c.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_kernel_exit_kills_every_pty_tree(kernel_factory, marks, sig) -> None:
    """After SIGKILL nobody closes the PTYs: each supervisor sees its control pipe close
    (the kernel held the only write end) and kills its tree."""
    k = kernel_factory()
    c = k.client("ptyc-kernel")
    more = [sleep_marker() for _ in range(3)]
    marks.extend(more)
    try:
        open_escaping(c, marks[:3])
        open_escaping(c, more)
        k.stop(sig)
        wait_until(
            lambda: not alive_with_marks(marks), WAIT_S, what="every process of both trees to die"
        )
    finally:
        c.close()


def test_spawn_failure_leaves_no_supervisor(kernel, tmp_path) -> None:
    """A program the supervisor cannot exec (ENOEXEC): it reports why and ends."""
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\x7fELF not really")
    garbage.chmod(0o755)
    c = kernel.client("ptyc-fail")
    try:
        with pytest.raises(RpcError) as info:
            c.call("pty.open", {"cmd": str(garbage)}, timeout=WAIT_S)
        assert info.value.code == ErrorCode.PTY_SPAWN
        assert "Exec format error" in info.value.data["reason"]
        assert pids_with_arg(str(garbage)) == []  # neither the supervisor nor its child
    finally:
        c.close()


POLICY = """
[principal."agent:pty"]
proc_spawn = ["bash"]
"""


def test_confined_program_is_contained_too(marks) -> None:
    """A token principal's PTY program is sandboxed (applied in the supervisor's forked
    child before the exec) and its detached children still die with the PTY."""
    with short_tmp("shpc") as tmp:
        policy = Path(tmp) / "policy.toml"
        policy.write_text(POLICY)
        k = KernelProcess(tmp, "--policy", str(policy))
        token = TokenStore(k.state / "tokens.json").create("agent:pty")[1]
        k.start()
        c = k.client("ptyc-agent", token=token)
        try:
            opened = open_escaping(c, marks)
            status = Path(f"/proc/{opened['pid']}/status").read_text()
            assert "NoNewPrivs:\t1" in status  # the sandbox's first step
            for pid in alive_with_marks(marks):  # inherited by everything the program started
                assert "NoNewPrivs:\t1" in Path(f"/proc/{pid}/status").read_text()
            c.call("pty.close", {"pty_id": opened["pty_id"]}, timeout=WAIT_S)
            wait_until(
                lambda: not alive_with_marks(marks), WAIT_S, what="every process of the tree to die"
            )
        finally:
            c.close()
            k.stop()
