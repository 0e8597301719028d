"""Errors that say what happened (issue 31, "unclear errors"), live.

A path into a pruned output named the tombstone's fields ("no field 'out'"); it now
answers -32004 with the pruning's message, like the whole ref does. And gc's size limit
prunes the oldest outputs by storing order, whatever the wall clock said.
"""

from __future__ import annotations

import sqlite3

import pytest

from shoal_mcp.protocol.errors import ErrorCode, RpcError
from tests.support.kernel import close_client, running_kernel


def test_a_path_into_a_pruned_output_says_it_was_pruned():
    with running_kernel(prefix="shve-") as k:
        c = k.client("pruned")
        try:
            ran = c.call("exec", {"src": "seq 1 1000"}, timeout=60)
            report = c.call("store.gc", {"max_bytes": 0, "dry_run": False}, timeout=60)
            assert report["refs"] == ["pruned:out:1"], report
            for path in (".out", ".out.lines[0]", ".err", ".status"):
                with pytest.raises(RpcError) as err:
                    c.call("value.get", {"ref": ran["ref"], "path": path}, timeout=60)
                assert err.value.code == ErrorCode.UNKNOWN_REF
                assert "was removed by shoal gc" in err.value.message
                assert "no field" not in err.value.message
                assert err.value.data["gc_removed"] and path.startswith(err.value.data["path"])
        finally:
            close_client(c)


def test_gc_max_size_prunes_by_storing_order_after_the_clock_stepped_back():
    """Issue 31: after the wall clock stepped back, `gc --max-size` pruned the newest
    outputs (ordered by ts); it goes by storing order now."""
    with running_kernel(prefix="shgc-") as k:
        c = k.client("clock")
        try:
            older = c.call("exec", {"src": "seq 1 2000"}, timeout=60)
            newer = c.call("exec", {"src": "seq 1 3000"}, timeout=60)
            db = sqlite3.connect(k.state / "journal.sqlite3", isolation_level=None)
            try:  # the newer output was stored while the clock read a day earlier
                db.execute(
                    "UPDATE transcript SET ts = ts - 86400 WHERE session = ? AND n = ?",
                    ("clock", int(newer["ref"].split(":")[1])),
                )
            finally:
                db.close()
            newer_bytes = newer["value"]["out"]["bytes"]
            report = c.call("store.gc", {"max_bytes": newer_bytes, "dry_run": False}, timeout=60)
            assert report["refs"] == [f"clock:{older['ref']}"], report
            kept = c.call("value.get", {"ref": newer["ref"], "path": ".out.lines[-1]"}, timeout=60)
            assert kept["value"]["v"] == "3000"
        finally:
            close_client(c)
