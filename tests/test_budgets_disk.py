"""Budgets, live (issue 14): the state dir budget answers before the disk is full.

A kernel with ``[kernel] max_state_bytes`` of 2 MiB runs an exec whose output takes the
state dir past it; the next exec, plan and apply are refused with -32031 naming
``kernel.max_state_bytes`` (and saying how to free room), and the state dir stays near
the budget.
"""

from __future__ import annotations

import pytest

from shoal_mcp.protocol.limits import MiB
from tests.support.budgets import token_kernel

QUOTA = -32031
BUDGET = 2 * MiB


@pytest.fixture(scope="module")
def env():
    with token_kernel("shbd", f"max_state_bytes = {BUDGET}") as env:
        yield env


def _state_bytes(env) -> int:
    """Disk bytes of the state dir's files: each inode once (a root kernel's $SHOAL_OUT
    entries are hard links to the stored blobs, also shown through a read-only mount)."""
    sizes = {}
    for p in env.kernel.state.rglob("*"):
        if p.is_file():
            st = p.stat()
            sizes[(st.st_dev, st.st_ino)] = st.st_size
    return sum(sizes.values())


def test_exec_plan_and_apply_are_refused_past_the_state_budget(env) -> None:
    with env.raw("disk", principal=None) as conn:
        assert "result" in conn.call("exec", {"src": "echo fits"})
        planned = conn.call("exec", {"src": "echo later", "mode": "plan"})["result"]
        filled = conn.call("exec", {"src": f"head -c {3 * MiB} /dev/zero"})
        assert "result" in filled, filled  # checked before it ran: it may still finish
        for params in (
            {"src": "echo one more"},
            {"src": "echo a plan", "mode": "plan"},
        ):
            err = conn.call("exec", params)["error"]
            assert err["code"] == QUOTA and err["data"]["quota"] == "kernel.max_state_bytes"
            assert "shoal gc" in err["message"] and err["data"]["used"] > BUDGET
        err = conn.call("plan.apply", {"plan_ref": planned["plan_ref"]})["error"]
        assert err["data"]["quota"] == "kernel.max_state_bytes"
        # reads still work: the budget stops growth, not use
        assert "result" in conn.call("journal.query", {"limit": 5})
        assert _state_bytes(env) <= BUDGET + 4 * MiB


def test_min_free_bytes_refuses_when_the_disk_is_nearly_full() -> None:
    # More free space than any disk has: every exec is refused as "disk nearly full".
    with (
        token_kernel("shbf", f"min_free_bytes = {1 << 60}") as env,
        env.raw("free", principal=None) as conn,
    ):
        err = conn.call("exec", {"src": "echo x"})["error"]
        assert err["code"] == QUOTA and err["data"]["quota"] == "kernel.min_free_bytes"
        assert err["data"]["free"] < 1 << 60
