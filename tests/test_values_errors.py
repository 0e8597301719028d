"""Errors that say what happened (issue 31, "unclear errors"), live.

A path into a pruned output named the tombstone's fields ("no field 'out'"); it now
answers -32004 with the pruning's message, like the whole ref does.
"""

from __future__ import annotations

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
