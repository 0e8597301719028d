"""Budgets, live (issue 14): event rings and channels cannot grow the kernel.

A token principal with no grants at all floods ``user.*`` channels with ~64 KiB
payloads; kernel RSS (from /proc) must stay within 64 MiB of where it started, and the
channels budget answers -32031 naming ``max_channels`` once every channel it holds is
subscribed.
"""

from __future__ import annotations

import pytest

from shoal_mcp.kernel.config.limits import CHANNEL_BYTES, CHANNELS, LIST_REPLY_BYTES
from shoal_mcp.protocol.limits import VALUE_HARD_CAP, MiB
from tests.support.budgets import token_kernel
from tests.support.procfs import rss_kib
from tests.support.wire import RawConn

QUOTA = -32031
FLOOD = 1024
PAYLOAD = {"d": "x" * (VALUE_HARD_CAP - 64)}
RSS_GROWTH_KIB = 64 * 1024


@pytest.fixture(scope="module")
def env():
    with token_kernel(prefix="shbe") as env:
        yield env


def _flood(conn: RawConn, channel: str, n: int = FLOOD) -> None:
    """Pipeline ``n`` publishes (64 in flight at most) and check every reply."""
    pending: list[int] = []
    for _ in range(n):
        pending.append(conn.send("events.publish", {"channel": channel, "payload": PAYLOAD}))
        if len(pending) >= 64:
            reply = conn.wait(pending.pop(0))
            assert "result" in reply, reply
    for msg_id in pending:
        assert "result" in conn.wait(msg_id)


def test_flooding_two_channels_keeps_rss_bounded(env) -> None:
    with env.raw("flood") as conn:
        _flood(conn, "user.warmup", 16)
        before = rss_kib(env.kernel.pid)
        _flood(conn, "user.flood-a")
        _flood(conn, "user.flood-b")
        grown = rss_kib(env.kernel.pid) - before
        assert grown <= RSS_GROWTH_KIB, f"kernel RSS grew {grown} KiB"
        # The ring kept its newest events within max_channel_bytes.
        got = conn.call("events.read", {"channel": "user.flood-a"})["result"]
        assert got["latest_seq"] == FLOOD - 1
        assert got["events"][-1]["seq"] == FLOOD - 1
        assert 1 < len(got["events"]) <= CHANNEL_BYTES // (VALUE_HARD_CAP - 64)


def test_read_pages_follow_the_cursor(env) -> None:
    # agent:wide keeps 16 MiB per ring: more than one 4 MiB reply can carry.
    with env.raw("pages", principal="agent:wide") as conn:
        _flood(conn, "user.paged", 300)
        newest = conn.call("events.read", {"channel": "user.paged"})["result"]
        assert newest["more"] is True and newest["events"][-1]["seq"] == 299
        seen: list[int] = []
        pages = 0
        params: dict = {"channel": "user.paged", "since": -1}
        for _ in range(50):
            msg = conn.call("events.read", params)
            page = msg["result"]
            assert len(conn.last_reply) <= LIST_REPLY_BYTES + 4096
            seen.extend(e["seq"] for e in page["events"])
            pages += 1
            if not page.get("more"):
                break
            params = {"channel": "user.paged", "cursor": page["cursor"]}
        ring_first = seen[0]
        assert seen == list(range(ring_first, 300))  # contiguous, oldest kept to newest
        assert pages >= 3 and ring_first > 0 and 300 - ring_first >= 16 * MiB // VALUE_HARD_CAP - 8
        bad = conn.call("events.read", {"channel": "user.paged", "cursor": "x1"})
        assert bad["error"]["code"] == -32602 and "cursor" in bad["error"]["message"]


def test_channels_budget_answers_quota_naming_the_key(env) -> None:
    with env.raw("chan") as conn:
        # Subscribed channels cannot be recycled, so the budget must refuse a new one.
        for i in range(CHANNELS):
            reply = conn.call("events.subscribe", {"channel": f"user.held-{i}"})
            assert "result" in reply, reply
            assert "result" in conn.call(
                "events.publish", {"channel": f"user.held-{i}", "payload": {"i": i}}
            )
        refused = conn.call("events.publish", {"channel": "user.one-more", "payload": {}})
        err = refused["error"]
        assert err["code"] == QUOTA and err["data"]["quota"] == "max_channels"
        assert "max_channels" in err["message"]
        # An unsubscribed channel of its own gives way instead: publishing still works.
        sub = conn.call("events.subscribe", {"channel": "user.held-0"})  # (already counted)
        assert "result" in sub
    with env.raw("chan2") as conn:  # the first connection's subscriptions are gone now
        for i in range(CHANNELS + 4):
            reply = conn.call("events.publish", {"channel": f"user.rot-{i}", "payload": {}})
            assert "result" in reply, reply


def test_a_small_channel_bytes_budget_trims_the_ring(env) -> None:
    with env.raw("small", principal="agent:small") as conn:
        _flood(conn, "user.small", 64)
        got = conn.call("events.read", {"channel": "user.small"})["result"]
        # max_channel_bytes = 1 MiB for agent:small: at most 16 events of ~64 KiB
        assert 1 <= len(got["events"]) <= MiB // (VALUE_HARD_CAP - 64)
        assert got["events"][-1]["seq"] == 63
