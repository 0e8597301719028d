"""Durability across a kernel restart on the same state dir (docs/decisions.md, Kernel)."""

from __future__ import annotations

import base64
import signal

from shoal_mcp.protocol.errors import ErrorCode
from tests.support.kernel import close_client
from tests.support.results import call_err


def test_state_survives_restart(kernel_factory, tmp_path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    k1 = kernel_factory(sub="k")
    c = k1.client("persist")
    c.call("exec", {"src": f"cd '{workdir}' && export SHOAL_T_PERSIST=kept"}, timeout=30)
    r = c.call("exec", {"src": "seq 1 3000; echo tail"}, timeout=30)
    ref = r["ref"]
    failed = c.call("exec", {"src": "echo bad >&2; exit 4", "position": "value"}, timeout=30)
    journal_before = c.call("events.read", {"channel": "journal"}, timeout=10)
    transcript_before = c.call("events.read", {"channel": "session.transcript"}, timeout=10)
    rows_before = c.call("journal.query", {"session": "persist"}, timeout=10)["rows"]
    assert len(rows_before) == 3
    assert journal_before["latest_seq"] >= 2
    close_client(c)
    assert k1.stop(signal.SIGTERM) == 0

    k2 = kernel_factory(sub="k")
    assert k2.state == k1.state and k2.pid != k1.pid
    c2 = k2.client("persist")
    try:
        # out:N resolves: value and .out.lines
        v = c2.call("value.get", {"ref": ref, "path": ".out.lines[-2..]"}, timeout=30)
        assert v["value"] == {
            "$": "list",
            "v": [{"$": "str", "v": "3000"}, {"$": "str", "v": "tail"}],
        }
        whole = c2.call("value.get", {"ref": ref}, timeout=30)["value"]
        assert whole["$"] == "outcome" and whole["status"] == 0 and whole["cwd"] == str(workdir)
        uri = c2.call("value.get", {"ref": r["uri"], "path": ".out.lines[0]"}, timeout=30)
        assert uri["value"] == {"$": "str", "v": "1"}
        assert c2.call("value.get", {"ref": failed["ref"], "path": ".err"}, timeout=30)[
            "value"
        ] == {"$": "str", "v": "bad\n"}
        # session cwd and exported env persisted
        assert c2.call("session.cwd", {}, timeout=10)["cwd"] == str(workdir)
        out = c2.call("exec", {"src": 'pwd; echo "$SHOAL_T_PERSIST"'}, timeout=30)
        assert out["value"]["out"]["v"] == f"{workdir}\nkept\n"
        # transcript numbering continues
        assert int(out["ref"].split(":")[1]) == int(failed["ref"].split(":")[1]) + 1
        # journal rows are still there (plus the new one)
        rows_after = c2.call("journal.query", {"session": "persist"}, timeout=10)["rows"]
        assert [row["id"] for row in rows_after[1:]] == [row["id"] for row in rows_before]
        assert rows_after[1:] == rows_before
        # blobs too
        digest = next(o["hash"] for o in rows_before[1]["outputs"] if o["kind"] == "out")
        blob = c2.call("blob.get", {"hash": digest, "offset": 0, "length": 4}, timeout=10)
        assert base64.b64decode(blob["base64"]) == b"1\n2\n"
        # durable channels: replay the old events, and seq continues without gap
        for channel, before in (
            ("journal", journal_before),
            ("session.transcript", transcript_before),
        ):
            after = c2.call("events.read", {"channel": channel}, timeout=10)
            old = [e for e in after["events"] if e["seq"] <= before["latest_seq"]]
            assert old == before["events"], channel
            new = [e for e in after["events"] if e["seq"] > before["latest_seq"]]
            assert [e["seq"] for e in new] == [before["latest_seq"] + 1], channel
            seqs = [e["seq"] for e in after["events"]]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), channel
            assert after["latest_seq"] == before["latest_seq"] + 1
        since = c2.call(
            "events.read", {"channel": "journal", "since": journal_before["latest_seq"]}, timeout=10
        )
        assert [e["payload"]["ref"] for e in since["events"]] == [out["ref"]]
    finally:
        close_client(c2)


def test_tasks_and_plans_do_not_survive(kernel_factory):
    """Documented: tasks are per kernel run; a restart forgets them (the transcript stays)."""
    k1 = kernel_factory(sub="k")
    c = k1.client("persist-tasks")
    h = c.call("exec", {"src": "echo done", "background": True}, timeout=30)
    rec = c.call("task.await", {"task": h["task"], "timeout_ms": 20_000}, timeout=30)
    close_client(c)
    k1.stop()
    k2 = kernel_factory(sub="k")
    c2 = k2.client("persist-tasks")
    try:
        err = call_err(c2, "task.get", {"task": h["task"]})
        assert err.code == ErrorCode.UNKNOWN_TASK
        got = c2.call("value.get", {"ref": rec["result_ref"], "path": ".out"}, timeout=30)
        assert got["value"] == {"$": "str", "v": "done\n"}
    finally:
        close_client(c2)
