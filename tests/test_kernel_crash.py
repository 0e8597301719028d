"""Stored data integrity and crash consistency, live (issue 19 items 4 read side, 6).

Real kernels are SIGKILLed, their WAL deleted, their database truncated or overwritten,
their blobs truncated or swapped. See docs/decisions.md, Crash consistency.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from shoal_mcp.protocol.errors import ErrorCode
from tests.support.kernel import child_env, close_client
from tests.support.polling import wait_until
from tests.support.procfs import kill_pids, pids_with_arg
from tests.support.results import call_err, out_text

CLI = [sys.executable, "-c", "from shoal_mcp.cli import run; run()"]


def run(c, src: str, **params) -> dict:
    return c.call("exec", {"src": src, "position": "value", **params}, timeout=60)


def ref_number(result: dict) -> int:
    return int(result["ref"].split(":")[1])


def blob_of(client, ref: str, kind: str = "out") -> str:
    rows = client.call("journal.query", {"limit": 50}, timeout=10)["rows"]
    row = next(r for r in rows if r.get("ref") == ref)
    return next(o["hash"] for o in row["outputs"] if o["kind"] == kind)


def blob_path(kernel, digest: str) -> Path:
    return kernel.state / "cas" / digest[:2] / digest


def refused_start(kernel) -> str:
    """Start ``kernel`` expecting a refusal; its stderr."""
    kernel.start(wait=False)
    _, err = kernel.proc.communicate(timeout=30)
    assert kernel.proc.returncode == 2, err
    return err.decode()


# -- 19.4 the read side: stored outputs are what was recorded -------------------------------


def test_a_truncated_blob_is_corrupted_never_served(kernel_factory):
    k = kernel_factory()
    c = k.client("trunc")
    try:
        r = run(c, "printf 'payload-%s\\n' 1 2 3 4 5 6 7 8")
        digest = blob_of(c, r["ref"])
        with open(blob_path(k, digest), "r+b") as fh:
            fh.truncate(10)
        for method, params in (
            ("value.get", {"ref": r["ref"], "path": ".out", "format": "raw"}),
            ("value.get", {"ref": r["uri"] + "?path=.out.lines[1]"}),
            ("blob.get", {"hash": digest}),
        ):
            err = call_err(c, method, params)
            assert err.code == ErrorCode.CORRUPTED, (method, err)
            assert err.data["hash"] == digest and "10 bytes" in err.data["reason"]
        report = c.call("store.verify", {}, timeout=60)
        assert report["corrupted"] == 1 and report["bad"][0]["hash"] == digest
        assert report["database"] == "ok"
    finally:
        close_client(c)


def test_a_swapped_blob_of_the_same_length_is_corrupted(kernel_factory):
    k = kernel_factory()
    c = k.client("swap")
    try:
        r = run(c, "echo original-content")
        digest = blob_of(c, r["ref"])
        path = blob_path(k, digest)
        size = path.stat().st_size
        path.write_bytes(b"X" * size)  # same length, other bytes (a new mtime)
        err = call_err(c, "value.get", {"ref": r["ref"], "path": ".out", "format": "raw"})
        assert err.code == ErrorCode.CORRUPTED and "hashes to" in err.data["reason"]
        assert call_err(c, "blob.get", {"hash": digest}).code == ErrorCode.CORRUPTED
        # Another, intact output of the same kernel is still served.
        assert out_text(run(c, "echo intact")) == "intact\n"
    finally:
        close_client(c)


def test_the_empty_blob_is_served_from_its_record_not_its_file(kernel_factory):
    """An empty output's bytes are known without reading its file (store/cas.py
    ``StoredBlob``): a damaged file never changes what is served; verify still finds it."""
    k = kernel_factory()
    c = k.client("empty")
    try:
        r = run(c, "echo only-stdout")
        digest = blob_of(c, r["ref"], "err")
        blob_path(k, digest).write_bytes(b"damage")
        for params in (
            {"ref": r["ref"], "path": ".err", "format": "raw"},
            {"ref": r["ref"], "path": ".err"},
        ):
            got = c.call("value.get", params, timeout=10)
            assert got.get("raw", got.get("value", {}).get("v")) == "", got
        report = c.call("store.verify", {}, timeout=60)
        assert report["corrupted"] == 1 and report["bad"][0]["hash"] == digest
        # The next empty output stores the same blob: its good copy replaces the file.
        assert out_text(run(c, "echo again")) == "again\n"
        assert c.call("store.verify", {}, timeout=60)["corrupted"] == 0
        assert blob_path(k, digest).stat().st_size == 0
    finally:
        close_client(c)


def test_doctor_verify_reports_corruption(kernel_factory):
    k = kernel_factory()
    c = k.client("doc")
    try:
        r = run(c, "echo doctor-verify-me")
        blob_path(k, blob_of(c, r["ref"])).write_bytes(b"short")
    finally:
        close_client(c)
    env = child_env({"SHOAL_SOCKET": str(k.socket), "SHOAL_STATE_DIR": str(k.state)})
    proc = subprocess.run(
        [*CLI, "doctor", "--verify"], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "stored outputs" in proc.stdout and "corrupted" in proc.stdout


# -- 19.6 crash consistency -----------------------------------------------------------------


def test_sigkill_mid_exec_leaves_a_lost_row_with_the_partial_output(kernel_factory):
    k = kernel_factory()
    marker = "30.4242"
    c = k.client("crash")
    try:
        task = c.call(
            "exec", {"src": f"echo partial-before-crash; sleep {marker}", "background": True}
        )
        wait_until(lambda: pids_with_arg(marker), 10, what="the sleep")
        wait_until(
            lambda: c.call("value.get", {"ref": task["task"], "path": ".out", "format": "raw"}),
            10,
            what="spooled output",
        )
        rows = c.call("journal.query", {"session": "crash"}, timeout=10)["rows"]
        assert rows[0]["state"] == "running"
    finally:
        close_client(c)
    k.stop(signal.SIGKILL)
    kill_pids(pids_with_arg(marker))  # no kernel is left to contain it
    k.start()
    c = k.client("crash")
    try:
        row = c.call("journal.query", {"session": "crash"}, timeout=10)["rows"][0]
        assert row["state"] == "lost" and row["ok"] is False and "partial" in row["error"]
        assert all(o["partial"] for o in row["outputs"])
        value = c.call("value.get", {"ref": row["ref"]}, timeout=10)["value"]
        assert value["lost"] is True and value["partial"] is True
        raw = c.call("value.get", {"ref": row["ref"], "path": ".out", "format": "raw"}, timeout=10)
        assert "partial-before-crash" in str(raw)
    finally:
        close_client(c)


def test_losing_the_wal_never_reuses_a_ref(kernel_factory):
    k = kernel_factory()
    c = k.client("wal")
    try:
        refs = [run(c, f"echo before-{i}")["ref"] for i in range(3)]
    finally:
        close_client(c)
    k.stop(signal.SIGKILL)
    wal = k.state / "journal.sqlite3-wal"
    assert wal.exists() and wal.stat().st_size > 0  # the commits live only there
    wal.unlink()
    k.start()
    c = k.client("wal")
    try:
        after = run(c, "echo after-the-crash")
        assert ref_number(after) > max(int(r.split(":")[1]) for r in refs)
        for ref in refs:  # an old ref never reads the new output
            try:
                got = c.call("value.get", {"ref": ref, "path": ".out", "format": "raw"}, timeout=10)
            except Exception as exc:  # noqa: BLE001 - lost with the WAL: unknown
                assert getattr(exc, "code", None) == ErrorCode.UNKNOWN_REF
            else:
                assert "after-the-crash" not in str(got)
    finally:
        close_client(c)


def test_a_clean_restart_leaves_no_gap(kernel_factory):
    k = kernel_factory()
    c = k.client("gap")
    try:
        n = ref_number(run(c, "true"))
    finally:
        close_client(c)
    k.stop()
    k.start()
    c = k.client("gap")
    try:
        assert ref_number(run(c, "true")) == n + 1
    finally:
        close_client(c)


def _stopped_kernel_with_data(kernel_factory):
    k = kernel_factory()
    c = k.client("db")
    try:
        for i in range(20):
            run(c, f"echo row-{i}-" + "x" * 500)
    finally:
        close_client(c)
    k.stop()
    return k


def test_a_database_truncated_to_zero_is_refused_and_repair_recovers(kernel_factory):
    k = _stopped_kernel_with_data(kernel_factory)
    db = k.state / "journal.sqlite3"
    for extra in ("journal.sqlite3-wal", "journal.sqlite3-shm"):
        (k.state / extra).unlink(missing_ok=True)
    os.truncate(db, 0)
    err = refused_start(k)
    assert str(db) in err and "doctor --repair" in err and "empty" in err
    env = child_env({"SHOAL_SOCKET": str(k.socket), "SHOAL_STATE_DIR": str(k.state)})
    proc = subprocess.run(
        [*CLI, "doctor", "--repair"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "moved aside" in proc.stdout
    assert any(p.name.startswith("journal.sqlite3.bad-") for p in k.state.iterdir())
    k.start()
    c = k.client("db")
    try:
        # A fresh database, and the refs of the old one are still not reused.
        assert ref_number(run(c, "echo fresh")) > 20
    finally:
        close_client(c)


def test_overwritten_pages_are_refused_at_start(kernel_factory):
    k = _stopped_kernel_with_data(kernel_factory)
    db = k.state / "journal.sqlite3"
    conn = sqlite3.connect(db)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
    finally:
        conn.close()
    assert pages > 3
    with open(db, "r+b") as fh:
        for n in range(1, pages):  # every b-tree page but the header page
            fh.seek(n * page)
            fh.write(b"\xa5" * page)
    err = refused_start(k)
    assert str(db) in err and "damaged" in err and "doctor --repair" in err


def test_a_damaged_database_is_not_repaired_under_a_live_kernel(kernel_factory):
    k = kernel_factory()
    env = child_env({"SHOAL_SOCKET": str(k.socket), "SHOAL_STATE_DIR": str(k.state)})
    proc = subprocess.run(
        [*CLI, "doctor", "--repair"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0 and "stop it first" in proc.stderr
    assert (k.state / "journal.sqlite3").exists()


def test_journal_duration_excludes_time_the_kernel_was_stopped(kernel_factory):
    k = kernel_factory()
    c = k.client("dur")
    try:
        task = c.call("exec", {"src": "sleep 0.3", "background": True})
        os.kill(k.pid, signal.SIGSTOP)
        try:
            time.sleep(2.5)  # time itself is under test: stopped well past the sleep
        finally:
            os.kill(k.pid, signal.SIGCONT)
        c.call("task.await", {"task": task["task"], "timeout_ms": 30000}, timeout=60)
        row = c.call("journal.query", {"session": "dur"}, timeout=10)["rows"][0]
        assert row["state"] == "done"
        # The run, not the run + the stop. The report's end is a file mtime (the kernel's
        # coarse clock, a tick or so behind), hence the lower bound's slack.
        assert 250 <= row["duration_ms"] < 2500, row
    finally:
        close_client(c)


def test_a_cwd_deleted_while_the_kernel_was_down_falls_back_to_home(kernel_factory, tmp_path):
    gone = tmp_path / "gone-across-restart"
    gone.mkdir()
    k = kernel_factory(sub="k")
    c = k.client("vanish")
    try:
        run(c, f"cd '{gone}'")
    finally:
        close_client(c)
    k.stop()
    gone.rmdir()
    k.start()
    c = k.client("vanish")
    try:
        r = run(c, "pwd")
        assert "no longer exists" in str(r["value"]["warnings"])
        assert out_text(r).strip() == c.call("session.cwd", {}, timeout=10)["cwd"]
        assert out_text(run(c, "cd / && pwd")) == "/\n"
    finally:
        close_client(c)


def test_a_lost_commands_partial_output_does_not_grow_after_recovery(kernel_factory):
    k = kernel_factory()
    c = k.client("grow")
    try:
        task = c.call(
            "exec",
            {"src": "while :; do echo tick; sleep 0.0517; done", "background": True},
        )
        pid = c.call("task.get", {"task": task["task"]}, timeout=10)["pid"]
        wait_until(
            lambda: c.call("value.get", {"ref": task["task"], "path": ".out", "format": "raw"}),
            10,
            what="spooled output",
        )
    finally:
        close_client(c)
    k.stop(signal.SIGKILL)
    try:
        k.start()  # the loop still writes into its spool while the new kernel recovers
        c = k.client("grow")
        try:
            row = c.call("journal.query", {"session": "grow"}, timeout=10)["rows"][0]
            assert row["state"] == "lost"

            def raw() -> dict:
                return c.call(
                    "value.get", {"ref": row["ref"], "path": ".out", "format": "raw"}, timeout=10
                )

            first = raw()
            # Uncontained, the orphan keeps writing meanwhile (contained, it is gone):
            # either way the stored partial output must not change.
            time.sleep(0.3)
            assert raw() == first and "tick" in str(first)
        finally:
            close_client(c)
    finally:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
