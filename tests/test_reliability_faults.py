"""Reliability under faults (issue #9): a full state dir, a SIGKILLed kernel, SIGTERM
with running tasks. Real processes only.

Full disk, two honest mechanisms:
* ``tmpfs`` — the state dir is a 4 MiB tmpfs (needs ``mount``: root with
  CAP_SYS_ADMIN; skipped where mounting is refused);
* ``rlimit`` — the kernel runs with RLIMIT_FSIZE = 4 MiB (children inherit it), so a
  spool write past the limit fails exactly like a full disk does for one file.
Either way a command whose output does not fit gets a clean ``-32603`` whose message
starts ``state dir full`` and whose data carries the ``reason``; the kernel drops that
run's partial spool and keeps serving.
"""

from __future__ import annotations

import errno
import os
import resource
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from shoal_mcp.client import KernelClient, KernelLost
from shoal_mcp.protocol.errors import ErrorCode, RpcError
from tests.support.facade import McpPipe, facade_env
from tests.support.kernel import KernelProcess
from tests.support.polling import wait_until
from tests.support.procfs import kernel_commands, kill_group, pgid_members, pid_alive
from tests.support.results import shown, structured, wire_text
from tests.support.tmp import short_tmp

FS_LIMIT = 4 * 1024 * 1024
BIG = "head -c 12000000 /dev/zero"


def _can_mount_tmpfs() -> bool:
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    with short_tmp("shmnt-") as probe:
        ok = (
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe)], capture_output=True
            ).returncode
            == 0
        )
        if ok:
            subprocess.run(["umount", str(probe)], check=False)
        return ok


CAN_MOUNT = _can_mount_tmpfs()


def limited_kernel(tmp: Path, fsize: int) -> KernelProcess:
    """A kernel started with RLIMIT_FSIZE set (the fallback full-disk mechanism)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return KernelProcess(tmp, preexec_fn=limit)


@pytest.fixture(params=["tmpfs", "rlimit"])
def full_kernel(request, short_tmp_path):
    tmp = short_tmp_path
    state = tmp / "state"
    state.mkdir(mode=0o700)
    mounted = False
    if request.param == "tmpfs":
        if not CAN_MOUNT:
            pytest.skip(
                "cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN); rlimit covers it"
            )
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={FS_LIMIT},mode=0700", "tmpfs", str(state)],
            check=True,
        )
        mounted = True
        k = KernelProcess(tmp).start()
    else:
        k = limited_kernel(tmp, FS_LIMIT).start()
    k.mechanism = request.param
    try:
        yield k
    finally:
        k.stop()
        if mounted:
            subprocess.run(["umount", "-l", str(state)], check=False)


def _assert_state_dir_full(exc: RpcError) -> None:
    assert exc.code == ErrorCode.INTERNAL, exc
    assert exc.message.startswith("state dir full"), exc.message
    assert isinstance(exc.data, dict) and exc.data.get("reason"), exc.data
    assert "Traceback" not in exc.message


def _free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bfree * st.f_frsize


def test_output_larger_than_the_state_dir(full_kernel):
    k = full_kernel
    c = k.client("full")
    try:
        ok = c.call("exec", {"src": "echo before"}, timeout=30)
        assert ok["value"]["out"]["v"] == "before\n"
        with pytest.raises(RpcError) as info:
            c.call("exec", {"src": BIG, "position": "value"}, timeout=60)
        _assert_state_dir_full(info.value)
        reason = info.value.data["reason"]
        assert (
            ("no space left" in reason) if k.mechanism == "tmpfs" else ("file size limit" in reason)
        )
        # The kernel dropped the partial spool itself and keeps serving. A ready shell
        # made after "echo before" may hold an empty pair (under load BIG may not wait for
        # it and start cold); no spool holds output.
        spools = list((k.state / "spool").glob("run-*"))
        assert [p for p in spools if p.stat().st_size] == [], spools
        assert len(spools) <= 2, spools
        again = c.call("exec", {"src": "echo after"}, timeout=30)
        assert again["value"]["out"]["v"] == "after\n"
        assert (
            c.call("value.get", {"ref": ok["ref"], "path": ".out"}, timeout=30)["value"]["v"]
            == "before\n"
        )
        assert k.proc.poll() is None
    finally:
        c.close()


def test_output_larger_than_the_state_dir_through_the_facade(full_kernel):
    k = full_kernel
    pipe = McpPipe(facade_env(k, "fullmcp"))
    try:
        pipe.initialize()
        reply = pipe.tool("shoal_exec", {"command": BIG})
        result = reply["result"]
        assert result["isError"] is True, result
        err = result["structuredContent"]["error"]
        assert err["code"] == ErrorCode.INTERNAL and err["message"].startswith("state dir full")
        assert "state dir full" in result["content"][0]["text"]
        assert "Traceback" not in result["content"][0]["text"]
        reply_ok = pipe.tool("shoal_exec", {"command": "echo still-serving"})
        assert shown(reply_ok) == "still-serving"
        assert pipe.alive()
    finally:
        assert pipe.close() == 0


@pytest.mark.skipif(not CAN_MOUNT, reason="needs a tmpfs mount")
def test_disk_filled_by_someone_else_then_freed(short_tmp_path):
    """Another writer fills the disk: the next exec fails cleanly; once space is freed
    (the filler removed) the kernel serves again without a restart."""
    tmp = short_tmp_path
    state = tmp / "state"
    state.mkdir(mode=0o700)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={FS_LIMIT},mode=0700", "tmpfs", str(state)],
        check=True,
    )
    k = KernelProcess(tmp).start()
    filler = state / "filler"
    try:
        c = k.client("filled")
        c.call("exec", {"src": "echo warm"}, timeout=30)
        # Unbuffered: a partial last write leaves nothing for close() to flush (and fail).
        with open(filler, "wb", buffering=0) as fh:
            try:
                while True:
                    fh.write(b"\0" * 65536)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        assert _free_bytes(state) == 0
        with pytest.raises(RpcError) as info:
            c.call("exec", {"src": "echo hello; seq 1 100000"}, timeout=30)
        # Refused up front by the free-space budget (issue 14), naming it.
        assert info.value.code == ErrorCode.QUOTA, info.value
        assert info.value.data["quota"] == "kernel.min_free_bytes"
        assert k.proc.poll() is None
        assert c.call("ping", {}, timeout=10)["pong"] is True
        filler.unlink()
        r = c.call("exec", {"src": "echo recovered"}, timeout=30)
        assert r["value"]["out"]["v"] == "recovered\n"
        rows = c.call("journal.query", {"limit": 5}, timeout=30)["rows"]
        assert rows[0]["src"] == "echo recovered"
        c.close()
    finally:
        k.stop()
        subprocess.run(["umount", "-l", str(state)], check=False)


# -- kernel loss ----------------------------------------------------------------------


def _kernel_pid(socket: Path) -> int:
    c = KernelClient(socket)
    try:
        return c.call("ping", {}, timeout=10)["kernel"]["pid"]
    finally:
        c.close()


def _stop_pid(pid: int, timeout: float = 15.0) -> None:
    """SIGTERM a kernel this test did not start (autostarted); SIGKILL if it lingers."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        wait_until(lambda: not pid_alive(pid), timeout, 0.05, what=f"kernel {pid} to exit")
    except AssertionError:
        os.kill(pid, signal.SIGKILL)


def test_kernel_sigkilled_mid_call_facade_recovers(short_tmp_path):
    tmp = short_tmp_path
    k = KernelProcess(tmp).start()
    env = facade_env(k, "crash", SHOAL_NO_AUTOSTART="0")
    pipe = McpPipe(env, stderr_path=tmp / "facade.err")
    orphans: list[int] = []
    new_pid = None
    try:
        pipe.initialize()
        before = structured(pipe.tool("shoal_exec", {"command": "echo durable-before"}))
        assert before["ref"] == "out:1"
        # Two calls in flight when the kernel dies: a long exec and a task wait.
        bg = structured(pipe.tool("shoal_exec", {"command": "sleep 60", "background": True}))
        slow = pipe.send_tool("shoal_exec", {"command": "sleep 60"})
        waiting = pipe.send_tool("shoal_get", {"ref": bg["task"], "wait_ms": 60000})
        wait_until(lambda: len(kernel_commands(k.pid)) >= 2, timeout=15)
        orphans = kernel_commands(k.pid)
        k.proc.send_signal(signal.SIGKILL)
        k.proc.wait(10)
        for msg_id in (slow, waiting):
            reply = pipe.read_reply(msg_id, timeout=30)
            assert "error" in reply, reply
            assert reply["error"]["code"] == ErrorCode.INTERNAL
            assert "kernel" in reply["error"]["message"]
            assert "Traceback" not in reply["error"]["message"]
        # The next call autostarts a new kernel on the same socket and state dir.
        after = pipe.tool("shoal_exec", {"command": "echo after-restart"}, timeout=60)
        assert shown(after) == "after-restart"
        new_pid = _kernel_pid(k.socket)
        assert new_pid != k.pid
        # Durable transcript and journal survived the SIGKILL.
        old = structured(pipe.tool("shoal_get", {"ref": "out:1", "path": ".out", "format": "json"}))
        assert wire_text(old["value"]) == "durable-before\n"
        rows = structured(pipe.tool("shoal_journal", {"limit": 20}))["rows"]
        assert "echo durable-before" in [r["src"] for r in rows]
        assert structured(after)["ref"] != "out:1"
        assert pipe.alive()
    finally:
        pipe.close()
        for pid in orphans:  # the SIGKILLed kernel could not reap its tasks
            kill_group(pid)
        if new_pid is None:
            try:
                new_pid = _kernel_pid(k.socket)
            except KernelLost:
                new_pid = None
        if new_pid is not None:
            _stop_pid(new_pid)
        k.stop()


def test_sigterm_kills_running_tasks_and_removes_socket(short_tmp_path):
    tmp = short_tmp_path
    k = KernelProcess(tmp).start()
    c = k.client("term")
    groups: list[int] = []
    try:
        srcs = ("sleep 60", "trap '' TERM; sleep 60; sleep 60", "sleep 60 & sleep 60; wait")
        for src in srcs:
            handle = c.call("exec", {"src": src, "background": True}, timeout=30)
            groups.append(c.call("task.get", {"task": handle["task"]}, timeout=30)["pid"])
        _, inflight = c.start_call("exec", {"src": "sleep 60"})
        wait_until(lambda: len(kernel_commands(k.pid)) >= 4, timeout=15)
        groups += [pid for pid in kernel_commands(k.pid) if pid not in groups]
        assert all(pgid_members(g) for g in groups)
        code = k.stop(signal.SIGTERM, timeout=30)
        assert code == 0, k.proc.stderr.read().decode(errors="replace")[-2000:]
        assert not k.socket.exists()
        with pytest.raises((KernelLost, RpcError)):
            inflight.result(timeout=10)
        # Every task's process group is gone (the TERM-ignoring one was SIGKILLed).
        wait_until(lambda: not any(pgid_members(g) for g in groups), timeout=15)
        assert "shutting down" in k.log()
        # The kernel stored every killed command's result before it closed its
        # databases: a new kernel on the same state dir journals all four, failed.
        c.close()
        k = KernelProcess(tmp).start()
        c = k.client("term")
        rows = c.call("journal.query", {"session": "term", "limit": 20}, timeout=30)["rows"]
        killed = [r for r in rows if "sleep 60" in r["src"]]
        assert sorted(r["src"] for r in killed) == sorted(srcs + ("sleep 60",)), rows
        assert all(r["ok"] is False for r in killed), killed
    finally:
        c.close()
        for g in groups:
            kill_group(g)
        k.stop()
