"""Generations, not moments (issue 31): gc, verify and discovery judged under a lock or
by identity, not by a check made earlier.

The gc race (a value being stored shares a blob gc is deleting) is reproduced exactly
with the store's own pieces (real SQLite, real files, in-process): placed, then gc,
then committed. The live test runs the same interleaving loosely through a real kernel
(gc's writes and the exec's commit queued behind a write lock another process holds)
and checks the value reads back and ``store.verify`` finds no dangling reference.
``store.verify`` finds values whose blobs are gone; a client set up for one state dir
refuses the kernel of another that listens on the default socket.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import blake3
import pytest

from shoal_mcp.client import KernelMisrouted, connect
from shoal_mcp.kernel.store.cas import ContentStore, Placed
from shoal_mcp.kernel.store.db import Database
from shoal_mcp.kernel.store.gc import GarbageCollector
from shoal_mcp.kernel.store.journal import Journal
from shoal_mcp.kernel.store.refs import RefCounter
from shoal_mcp.kernel.store.transcript import TranscriptStore
from tests.support.kernel import KernelProcess, child_env, close_client
from tests.support.polling import wait_until
from tests.test_cli import CLI

SHARED = "shared-output-7c1e"


def _running(client, task: str) -> bool:
    return client.call("task.get", {"task": task}, timeout=10).get("state") == "running"


def _store_value(db, cas, transcript, session: str, spool: Path) -> tuple[int, Placed]:
    placed = cas.place(spool)
    n = transcript.allocate(session)
    with db.transaction() as conn:
        cas.record_in(conn, placed.info)
        transcript.insert_in(conn, session, n, "uid:0", {"$": "outcome", "out": placed.info.node()})
    return n, placed


def test_gc_keeps_a_blob_placed_for_a_value_not_yet_committed(tmp_path):
    """The store's own pieces (real SQLite, real files): an exec has placed its output,
    which an old pruned value shares, and gc runs before the exec's row is committed.
    Before, gc deleted the blob and the new value referenced nothing."""
    db = Database(tmp_path / "journal.sqlite3")
    Journal(db)  # its tables
    cas = ContentStore(tmp_path / "cas", db)
    transcript = TranscriptStore(db, RefCounter(tmp_path / "refs.json", db))
    try:
        spool = tmp_path / "spool"
        spool.write_bytes(f"{SHARED}\n".encode())
        _, old = _store_value(db, cas, transcript, "gone", spool)
        cas.release(old)
        spool.write_bytes(f"{SHARED}\n".encode())
        fresh = cas.place(spool)  # an exec in "live" finalizing: placed, not recorded
        collector = GarbageCollector(db, cas)
        plan = collector.plan({"live"}, 0, None)
        assert fresh.info.hash in plan.blobs  # the only value referencing it is pruned
        collector.apply(plan)
        n = transcript.allocate("live")
        with db.transaction() as conn:  # the exec's commit, after gc
            cas.record_in(conn, fresh.info)
            transcript.insert_in(
                conn, "live", n, "uid:0", {"$": "outcome", "out": fresh.info.node()}
            )
        cas.release(fresh)
        assert cas.read_range(fresh.info.hash, 0, 100) == f"{SHARED}\n".encode()
    finally:
        db.close()


def test_gc_never_deletes_a_blob_an_exec_is_storing(kernel_factory):
    """Live, loosely ordered: whichever of gc's check and the exec's commit comes first,
    the value stays readable and nothing dangles."""
    k = kernel_factory()
    old = k.client("gone")  # a session nobody is attached to once this client leaves
    try:
        old.call("exec", {"src": f"echo {SHARED}"}, timeout=60)
    finally:
        close_client(old)
    live = k.client("live")
    admin = k.client("admin")
    db = sqlite3.connect(k.state / "journal.sqlite3", timeout=60, isolation_level=None)
    try:
        task = live.call("exec", {"src": f"sleep 3; echo {SHARED}", "background": True})["task"]
        wait_until(lambda: _running(live, task), timeout=30, what="the exec to run")
        db.execute("BEGIN IMMEDIATE")  # every kernel write now waits for this process
        try:
            gc_id, gc = admin.start_call("store.gc", {"max_age_s": 0, "dry_run": False})
            # The exec ends and queues its finalize behind gc's first write.
            wait_until(lambda: not _running_pid(live, task), timeout=30, what="the exec to end")
        finally:
            db.execute("ROLLBACK")
        report = admin.wait(gc_id, gc, "store.gc", 60)
        assert report["values"] >= 1  # the old session's value was pruned
        done = live.call("task.await", {"task": task, "timeout_ms": 30000}, timeout=60)
        ref = done["result_ref"]
        text = live.call("value.get", {"ref": ref, "path": ".out", "format": "raw"}, timeout=30)
        assert text["raw"] == f"{SHARED}\n"
        verify = admin.call("store.verify", {}, timeout=60)
        assert verify["dangling"] == 0 and verify["corrupted"] == 0, verify
    finally:
        db.close()
        close_client(live)
        close_client(admin)


def _running_pid(client, task: str) -> bool:
    """The exec's process still exists (its finalize may be waiting)."""
    pid = client.call("task.get", {"task": task}, timeout=10).get("pid")
    return isinstance(pid, int) and Path(f"/proc/{pid}").exists()


def test_verify_reports_values_whose_blobs_are_gone(kernel_factory):
    k = kernel_factory()
    c = k.client("verify")
    try:
        c.call("exec", {"src": "echo will-be-lost-5b2d"}, timeout=60)
        digest = blake3.blake3(b"will-be-lost-5b2d\n").hexdigest()  # the CAS names it so
        clean = c.call("store.verify", {}, timeout=60)
        assert clean["dangling"] == 0, clean
        # What the old gc race left behind: the row and file of a referenced blob gone.
        db = sqlite3.connect(k.state / "journal.sqlite3", timeout=30)
        with db:
            db.execute("DELETE FROM blobs WHERE hash = ?", (digest,))
        db.close()
        (k.state / "cas" / digest[:2] / digest).unlink()
        report = c.call("store.verify", {}, timeout=60)
        assert report["dangling"] == 1, report
        assert {"hash": digest, "ref": "verify:out:1", "reason": "referenced but not stored"} in (
            report["bad"]
        )
        env = child_env({"SHOAL_SOCKET": str(k.socket), "SHOAL_STATE_DIR": str(k.state)})
        doctor = subprocess.run(
            [*CLI, "doctor", "--verify"], env=env, capture_output=True, text=True, timeout=120
        )
        assert doctor.returncode != 0 and "verify:out:1" in doctor.stdout + doctor.stderr
    finally:
        close_client(c)


# -- misrouted --------------------------------------------------------------------------


@pytest.fixture
def two_state_dirs(short_tmp_path):
    """Kernel of S1 on the default socket ($XDG_RUNTIME_DIR/shoal/kernel.sock); S2 has none."""
    runtime = short_tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    k = KernelProcess(short_tmp_path / "s1", env={"XDG_RUNTIME_DIR": str(runtime)})
    k.socket = runtime / "shoal" / "kernel.sock"
    k.start()
    try:
        yield k, runtime, short_tmp_path / "s2" / "state"
    finally:
        k.stop()


def test_a_client_refuses_the_kernel_of_another_state_dir(two_state_dirs, monkeypatch):
    k, runtime, s2 = two_state_dirs
    monkeypatch.delenv("SHOAL_SOCKET", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("SHOAL_STATE_DIR", str(s2))
    with pytest.raises(KernelMisrouted) as caught:
        connect(autostart=False)
    message = str(caught.value)
    assert str(k.state.resolve()) in message and str(s2) in message
    # The CLI refuses too, runs nothing, and `kernel status` does not show S1's kernel.
    env = child_env({"XDG_RUNTIME_DIR": str(runtime), "SHOAL_STATE_DIR": str(s2)})
    env.pop("SHOAL_SOCKET", None)
    ran = subprocess.run(
        [*CLI, "exec", "echo misrouted-9d"], env=env, capture_output=True, text=True, timeout=60
    )
    assert ran.returncode != 0 and str(s2) in ran.stderr, ran.stderr
    status = subprocess.run(
        [*CLI, "kernel", "status", "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    report = json.loads(status.stdout)
    assert status.returncode == 1 and report["running"] is False and report["pid"] is None
    assert str(s2) in report["detail"]
    stopped = subprocess.run(
        [*CLI, "kernel", "stop"], env=env, capture_output=True, text=True, timeout=60
    )
    assert "not running" in stopped.stdout and k.proc.poll() is None  # S1's kernel lives
    c = k.client("default")
    try:
        rows = c.call("journal.query", {"limit": 100}, timeout=30)["rows"]
        assert not any("misrouted-9d" in r.get("src", "") for r in rows)
    finally:
        close_client(c)
    # The right state dir is still accepted on the same socket.
    monkeypatch.setenv("SHOAL_STATE_DIR", str(k.state))
    ok = connect(autostart=False)
    try:
        assert ok.call("ping", {}, 10)["kernel"]["state_dir"] == str(k.state.resolve())
    finally:
        close_client(ok)
