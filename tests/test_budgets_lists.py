"""Budgets, live (issue 14): lists page instead of failing "result too large".

``journal.query``, ``plan.list``, ``task.list`` and ``events.read`` stream rows into a
reply of at most ``LIST_REPLY_BYTES`` and answer ``more`` with a ``cursor`` that the
same method continues from; the human's ``shoal plans`` and ``shoal journal`` follow it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from shoal_mcp.kernel.config.limits import LIST_REPLY_BYTES, SRC_INLINE_CHARS
from shoal_mcp.protocol.limits import SRC_MAX_CHARS
from tests.support.budgets import token_kernel
from tests.support.kernel import child_env
from tests.support.procfs import vm_hwm_kib
from tests.support.wire import RawConn

ENVELOPE = 4096
BIG_PLANS = 20


@pytest.fixture(scope="module")
def env():
    with token_kernel(prefix="shbl") as env:
        yield env


def _pipeline(conn: RawConn, calls: list[tuple[str, dict]]) -> list[dict]:
    replies, pending = [], []
    for method, params in calls:
        pending.append(conn.send(method, params))
        if len(pending) >= 16:
            replies.append(conn.wait(pending.pop(0), timeout=120))
    replies.extend(conn.wait(i, timeout=120) for i in pending)
    return replies


def _follow(conn: RawConn, method: str, params: dict, key: str) -> list[dict]:
    rows: list[dict] = []
    page = conn.call(method, params, timeout=120)["result"]
    while True:
        assert len(conn.last_reply) <= LIST_REPLY_BYTES + ENVELOPE
        rows.extend(page[key])
        if not page.get("more"):
            return rows
        page = conn.call(method, {**params, "cursor": page["cursor"]}, timeout=120)["result"]


def _shoal(env, *args: str) -> subprocess.CompletedProcess:
    environ = child_env(
        {"SHOAL_SOCKET": str(env.kernel.socket), "SHOAL_STATE_DIR": str(env.kernel.state)}
    )
    return subprocess.run(
        [sys.executable, "-c", "from shoal_mcp.cli import run; run()", *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_journal_query_of_1000_long_rows_pages(env) -> None:
    with env.raw("journal-rows") as conn:
        srcs = [f"echo {i:04d}{'z' * (SRC_INLINE_CHARS + 100)}" for i in range(1000)]
        for reply in _pipeline(conn, [("exec", {"src": s, "mode": "plan"}) for s in srcs]):
            assert "result" in reply, reply
        hwm0 = vm_hwm_kib(env.kernel.pid)
        first = conn.call("journal.query", {"limit": 1000}, timeout=120)
        page = first["result"]
        assert page["more"] is True and page["cursor"] and page["count"] < 1000
        assert len(conn.last_reply) <= LIST_REPLY_BYTES + ENVELOPE
        # Building the page stays within a few replies' worth of memory (the issue saw
        # 195 MiB for this query); rows past the budget are never read (paging.py).
        assert vm_hwm_kib(env.kernel.pid) - hwm0 <= 8 * LIST_REPLY_BYTES // 1024
        rows = _follow(conn, "journal.query", {"limit": 1000}, "rows")
        ids = [r["id"] for r in rows]
        assert len(rows) >= 1000 and ids == sorted(ids, reverse=True)
        assert len(set(ids)) == len(ids)
        bad = conn.call("journal.query", {"cursor": "-3"})
        assert bad["error"]["code"] == -32602 and "cursor" in bad["error"]["message"]


def test_twenty_big_plans_list_and_show_for_the_human(env) -> None:
    with env.raw("big-plans", principal=None) as conn:
        calls = [
            ("exec", {"src": f"echo {chr(97 + i)}{'p' * (SRC_MAX_CHARS - 10)}", "mode": "plan"})
            for i in range(BIG_PLANS)
        ]
        for reply in _pipeline(conn, calls):
            assert reply["result"]["verdict"] == "allow", reply
        first = conn.call("plan.list", {"all": True}, timeout=120)["result"]
        assert first["more"] is True
        plans = _follow(conn, "plan.list", {"all": True}, "plans")
        big = [p for p in plans if len(p["src"]) > SRC_INLINE_CHARS]
        assert len(big) == BIG_PLANS and len({p["plan_ref"] for p in big}) == BIG_PLANS
        assert all(len(p["src"]) == SRC_MAX_CHARS - 4 for p in big)  # whole, never cut
    shown = _shoal(env, "plans", "--json")
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert shown.stdout.count('"plan_ref"') >= BIG_PLANS
    journal = _shoal(env, "journal", "--limit", "100")
    assert journal.returncode == 0, journal.stderr[-2000:]
    assert "chars]" in journal.stdout  # long sources show their head and length


def test_task_list_pages(env) -> None:
    with env.raw("tasks-page", principal=None) as conn:
        src = f"true {'t' * (SRC_MAX_CHARS - 10)}"
        for reply in _pipeline(conn, [("exec", {"src": src, "background": True})] * 6):
            assert "result" in reply, reply
        tasks = _follow(conn, "task.list", {}, "tasks")
        assert len(tasks) >= 6
        numbers = [int(t["task"].split(":")[1]) for t in tasks]
        assert numbers == sorted(set(numbers))
