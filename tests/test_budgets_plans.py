"""Budgets, live (issue 14): plans and their journal rows cannot grow the kernel.

A token principal with no grants plans (and runs) a 1 MiB source over and over: kernel
RSS (from /proc) stays within 64 MiB of where it started and the journal database within
16 MiB, since denied plans are not kept and a long source is journaled once by hash. A
principal with ``max_plans = 4`` / ``max_plan_bytes = 2 MiB`` is refused with -32031
naming the key once every plan it holds awaits approval.
"""

from __future__ import annotations

import pytest

from shoal_mcp.kernel.config.limits import SRC_INLINE_CHARS
from shoal_mcp.protocol.limits import SRC_MAX_CHARS, MiB
from tests.support.budgets import token_kernel
from tests.support.procfs import rss_kib
from tests.support.wire import RawConn

QUOTA, DENIED = -32031, -32010
BIG_SRC = "uname " + "x" * (SRC_MAX_CHARS - 8)  # not a builtin: outside every grant
RSS_GROWTH_KIB = 64 * 1024
JOURNAL_GROWTH = 16 * MiB


# What is measured here is memory and the journal, not CPU fairness: unthrottled, the
# 150 analyses of a 1 MiB source take seconds instead of minutes at 100 ms/s.
UNTHROTTLED = '\n[principal."agent:flood"]\nungranted = "deny"\nmax_cpu_ms_per_s = 0\n'


@pytest.fixture(scope="module")
def env():
    with token_kernel(prefix="shbp", extra_policy=UNTHROTTLED) as env:
        yield env


def _journal_bytes(env) -> int:
    return sum(p.stat().st_size for p in env.kernel.state.glob("journal.sqlite3*"))


def _pipeline(conn: RawConn, method: str, params: dict, n: int) -> list[dict]:
    """``n`` calls, 8 in flight at most; every reply."""
    replies, pending = [], []
    for _ in range(n):
        pending.append(conn.send(method, params))
        if len(pending) >= 8:
            replies.append(conn.wait(pending.pop(0), timeout=120))
    replies.extend(conn.wait(i, timeout=120) for i in pending)
    return replies


def _all_plans(conn: RawConn) -> list[dict]:
    """Every page of plan.list (a plan of ~0.5 MiB source is a ~2 MiB record)."""
    plans: list[dict] = []
    params: dict = {}
    while True:
        page = conn.call("plan.list", params)["result"]
        plans.extend(page["plans"])
        if not page.get("more"):
            return plans
        params = {"cursor": page["cursor"]}


def test_planning_a_big_source_150_times_is_bounded(env) -> None:
    with env.raw("plan-flood") as conn:
        assert "result" in conn.call("exec", {"src": "echo warm", "mode": "plan"})
        rss0, journal0 = rss_kib(env.kernel.pid), _journal_bytes(env)
        for reply in _pipeline(conn, "exec", {"src": BIG_SRC, "mode": "plan"}, 150):
            assert reply["result"]["verdict"] == "deny", reply
        rss_grown = rss_kib(env.kernel.pid) - rss0
        journal_grown = _journal_bytes(env) - journal0
        assert rss_grown <= RSS_GROWTH_KIB, f"RSS grew {rss_grown} KiB"
        assert journal_grown <= JOURNAL_GROWTH, f"journal grew {journal_grown} bytes"
        # A denied plan is not kept, yet asking about it still says why.
        ref = reply["result"]["plan_ref"]
        assert conn.call("cap.request", {"plan_ref": ref})["error"]["code"] == DENIED
        # The journal row carries a head of the source and where the whole one is.
        rows = conn.call("journal.query", {"limit": 3})["result"]["rows"]
        assert rows[0]["src_len"] == len(BIG_SRC) and len(rows[0]["src"]) == SRC_INLINE_CHARS
        assert BIG_SRC.startswith(rows[0]["src"]) and rows[0]["src_hash"] == rows[1]["src_hash"]


def test_denied_execs_of_a_big_source_are_bounded(env) -> None:
    with env.raw("run-flood") as conn:
        rss0, journal0 = rss_kib(env.kernel.pid), _journal_bytes(env)
        for reply in _pipeline(conn, "exec", {"src": BIG_SRC + " y"}, 50):
            assert reply["error"]["code"] == DENIED, reply
        assert rss_kib(env.kernel.pid) - rss0 <= RSS_GROWTH_KIB
        assert _journal_bytes(env) - journal0 <= JOURNAL_GROWTH


DISTINCT_DENIED = 40
"""Distinct ~1 MiB denied sources: stored once each, they were ~40 MiB of journal."""


def test_distinct_denied_sources_are_journaled_by_hash_and_head(env) -> None:
    """Issue 31: every distinct denied plan or exec kept its whole 1 MiB source."""
    with env.raw("distinct-flood") as conn:
        journal0 = _journal_bytes(env)
        for i in range(DISTINCT_DENIED // 2):
            src = f"uname {i:06d} " + "x" * (SRC_MAX_CHARS - 16)
            planned = conn.call("exec", {"src": src, "mode": "plan"})
            assert planned["result"]["verdict"] == "deny", planned
            assert conn.call("exec", {"src": src + "y"})["error"]["code"] == DENIED
        grown = _journal_bytes(env) - journal0
        assert grown <= JOURNAL_GROWTH, f"journal grew {grown} bytes"
        rows = conn.call("journal.query", {"limit": 2})["result"]["rows"]
        assert {r["kind"] for r in rows} == {"plan", "denied"}
        for row in rows:
            assert row["src_stored"] is False and row["src_len"] > SRC_INLINE_CHARS
            assert len(row["src"]) == SRC_INLINE_CHARS and row["src"].startswith("uname 0000")


def test_plan_budgets_answer_quota_naming_the_key(env) -> None:
    with env.raw("plan-budget", principal="agent:small") as conn:
        # max_plan_bytes = 2 MiB: two ~1 MiB plans awaiting approval fill it.
        for letter in "ab":
            got = conn.call(
                "exec", {"src": f"cat {letter * (SRC_MAX_CHARS // 2 + 9)}", "mode": "plan"}
            )
            assert "result" in conn.call("cap.request", {"plan_ref": got["result"]["plan_ref"]})
        big = conn.call("exec", {"src": "cat " + "c" * (SRC_MAX_CHARS - 8), "mode": "plan"})
        assert big["error"]["code"] == QUOTA and big["error"]["data"]["quota"] == "max_plan_bytes"
        assert "max_plan_bytes" in big["error"]["message"]
        refs = []
        for i in range(6):  # pending plans give way to newer ones: no error
            got = conn.call("exec", {"src": f"cat /etc/hostname{i}", "mode": "plan"})
            assert got["result"]["verdict"] == "ask", got
            refs.append(got["result"]["plan_ref"])
        listed = [p["plan_ref"] for p in _all_plans(conn)]
        assert len(listed) == 4 and listed[-2:] == refs[-2:]  # max_plans = 4: newest kept
        for ref in refs[-2:]:  # awaiting approval: these are never dropped
            assert "result" in conn.call("cap.request", {"plan_ref": ref})
        refused = conn.call("exec", {"src": "cat /etc/hostname-more", "mode": "plan"})
        err = refused["error"]
        assert err["code"] == QUOTA and err["data"]["quota"] == "max_plans"
        # An ask-verdict exec stores a plan too, and is refused the same way.
        refused = conn.call("exec", {"src": "cat /etc/hostname-run"})
        assert refused["error"]["data"]["quota"] == "max_plans"
