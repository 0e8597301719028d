"""Kernel exit, piece by piece: the database pool and the task manager.

The sqlite3 module does not guard a connection closed under a running statement; the
interpreter crashes (CI saw the kernel die with SIGSEGV on SIGTERM). ``close()`` must
leave leased connections to their holders, and the task manager must store every killed
task's result, and start no new one, before the daemon closes the databases. The whole
sequence on a live kernel is in ``test_reliability_faults.py`` (SIGTERM test).
"""

from __future__ import annotations

import ctypes
import os
import platform
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from shoal_mcp.kernel.events.bus import EventBus
from shoal_mcp.kernel.exec.runner import spawn
from shoal_mcp.kernel.exec.tasks import TaskManager
from shoal_mcp.kernel.store.db import Database
from shoal_mcp.protocol.errors import ErrorCode, RpcError
from tests.support.kernel import KernelProcess, close_client
from tests.support.procfs import pid_alive
from tests.support.tmp import short_tmp

SYS_TGKILL = {"x86_64": 234, "aarch64": 131}[platform.machine()]
STOP_WAIT_S = 30.0


def test_close_lets_a_leased_transaction_finish(tmp_path: Path) -> None:
    db = Database(tmp_path / "db.sqlite3")
    with db.transaction() as conn:
        conn.execute("CREATE TABLE t (x INTEGER)")
    leased = threading.Event()
    closed = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            with db.transaction() as conn:
                conn.execute("INSERT INTO t VALUES (1)")
                leased.set()
                closed.wait(10)
                conn.execute("INSERT INTO t VALUES (2)")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    th = threading.Thread(target=writer)
    th.start()
    assert leased.wait(10)
    db.close()
    closed.set()
    th.join(10)
    assert not errors, errors
    # The lease closed its connection on return; a new pool sees both rows committed.
    assert not db._idle and not db._leased
    assert [
        r[0] for r in Database(tmp_path / "db.sqlite3").query("SELECT x FROM t ORDER BY x")
    ] == [1, 2]


def test_close_under_concurrent_writers_does_not_crash(tmp_path: Path) -> None:
    # In a child: before the fix this died with SIGSEGV within a few runs.
    script = textwrap.dedent(
        f"""
        import threading, time
        from pathlib import Path
        from shoal_mcp.kernel.store.db import Database
        db = Database(Path({str(tmp_path / "stress.sqlite3")!r}))
        with db.transaction() as c:
            c.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
        stop = threading.Event()
        def work():
            while not stop.is_set():
                with db.transaction() as c:
                    for i in range(200):
                        c.execute("INSERT INTO t VALUES (?)", (i,))
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        db.close()
        time.sleep(0.3)
        stop.set()
        for t in threads:
            t.join()
        print("clean")
        """
    )
    for _ in range(3):
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
        assert proc.stdout.strip() == b"clean"


def test_task_shutdown_waits_for_results_then_refuses_new_tasks(tmp_path: Path) -> None:
    stored: list[int] = []

    def slow_finalize(task) -> dict:
        time.sleep(0.3)  # storing the result takes a while; shutdown must wait for it
        stored.append(task.id)
        return {"ok": False, "ref": f"out:{task.id}", "uri": f"shoal://x/{task.id}"}

    tasks = TaskManager(EventBus(), slow_finalize)
    env = dict(os.environ)
    first = tasks.start(
        "s", "p", "sleep 60", spawn("sleep 60", str(tmp_path), env, tmp_path), True, []
    )
    assert tasks.shutdown(drain_s=10) is True
    assert stored == [first.id] and first.done.is_set()
    assert not pid_alive(first.run.pid)
    # A call that spawns after shutdown began: the command is killed, the caller told why.
    late = spawn("sleep 60", str(tmp_path), env, tmp_path)
    with pytest.raises(RpcError) as info:
        tasks.start("s", "p", "sleep 60", late, False, [])
    assert info.value.code == ErrorCode.INTERNAL and "shutting down" in info.value.message
    assert not pid_alive(late.pid)
    assert stored == [first.id]


def test_a_stop_signal_taken_by_another_thread_still_stops_the_kernel(tmp_path: Path) -> None:
    """The OS may give SIGTERM to any of the kernel's threads; Python runs its handler on
    the main thread only, which waits in the accept loop. Taken by the owner loop's
    thread, it was never handled (the kernel ran on until SIGKILL, and a clean stop's
    bookkeeping, such as the ref numbers it gives back, was lost). Sent here to a thread
    that is not the main one, with tgkill."""
    with short_tmp("shsig-") as tmp:
        kernel = KernelProcess(tmp).start()
        try:
            client = kernel.client("sig")
            client.call("exec", {"src": "true"}, timeout=60)  # its threads are all up
            close_client(client)
            pid = kernel.proc.pid
            others = sorted(int(t.name) for t in Path(f"/proc/{pid}/task").iterdir())
            others.remove(pid)
            assert others, "the kernel has no thread but its main one"
            libc = ctypes.CDLL(None, use_errno=True)
            assert libc.syscall(SYS_TGKILL, pid, others[0], signal.SIGTERM) == 0
            assert kernel.proc.wait(STOP_WAIT_S) == 0  # (SIGKILLed after it, else)
            assert "signal 15: shutting down" in kernel.log()
        finally:
            kernel.stop()
            kernel.release_pipes()
