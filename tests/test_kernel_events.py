"""Event channels over the live socket (docs/protocol.md, Events): publish rules, read windows,
subscriptions with replay then live delivery, unsubscribe, and a slow subscriber that
must never block publishers."""

from __future__ import annotations

import time

import pytest

from shoal_mcp.kernel.config.limits import SUBSCRIBER_QUEUE
from shoal_mcp.protocol.errors import ErrorCode
from tests.support.kernel import close_client
from tests.support.results import call_err
from tests.support.wire import RawConn

FIGURES: dict[str, float] = {}


@pytest.fixture
def ec(kernel):
    c = kernel.client("events")
    yield c
    close_client(c)


@pytest.fixture
def raw(kernel):
    conns: list[RawConn] = []

    def make(session: str = "events-raw") -> RawConn:
        c = RawConn(kernel.socket)
        conns.append(c)
        assert "result" in c.call("session.attach", {"session": session})
        return c

    yield make
    for c in conns:
        c.close()


def publish(c, channel: str, payload: dict) -> int:
    return c.call("events.publish", {"channel": channel, "payload": payload}, timeout=10)["seq"]


@pytest.mark.parametrize(
    "channel", ["journal", "session.transcript", "approval", "task.1", "pty.1"]
)
def test_only_user_channels_are_publishable(ec, channel):
    err = call_err(ec, "events.publish", {"channel": channel, "payload": {"x": 1}})
    assert err.code == ErrorCode.INVALID_PARAMS
    assert err.data["field"] == "channel"


@pytest.mark.parametrize("channel", ["bogus", "user.", "user", "task.x", "task.01", "", "user.a b"])
def test_bad_channel_names(ec, channel):
    for method in ("events.publish", "events.read", "events.subscribe"):
        err = call_err(ec, method, {"channel": channel})
        assert err.code == ErrorCode.INVALID_PARAMS, (method, channel)
        assert err.data["field"] == "channel"


def test_publish_shapes(ec):
    assert publish(ec, "user.shape", {"a": 1}) == 0
    assert publish(ec, "user.shape", {}) == 1
    assert ec.call("events.publish", {"channel": "user.shape"}, timeout=10)["seq"] == 2
    err = call_err(ec, "events.publish", {"channel": "user.shape", "payload": [1, 2]})
    assert err.code == ErrorCode.INVALID_PARAMS and err.data["field"] == "payload"
    err = call_err(
        ec, "events.publish", {"channel": "user.shape", "payload": {"big": "x" * 70_000}}
    )
    assert err.code == ErrorCode.INVALID_PARAMS and err.data["field"] == "payload"


def test_read_since_and_limit(ec):
    ch = "user.readwin"
    for i in range(10):
        assert publish(ec, ch, {"i": i}) == i
    every = ec.call("events.read", {"channel": ch}, timeout=10)
    assert [e["seq"] for e in every["events"]] == list(range(10))
    assert every["latest_seq"] == 9
    e0 = every["events"][0]
    assert set(e0) == {"channel", "seq", "ts", "payload"} and e0["payload"] == {"i": 0}
    since = ec.call("events.read", {"channel": ch, "since": 6}, timeout=10)["events"]
    assert [e["seq"] for e in since] == [7, 8, 9]  # exclusive
    newest = ec.call("events.read", {"channel": ch, "limit": 3}, timeout=10)["events"]
    assert [e["seq"] for e in newest] == [7, 8, 9]  # limit keeps the newest
    window = ec.call("events.read", {"channel": ch, "since": 2, "limit": 4}, timeout=10)["events"]
    assert [e["seq"] for e in window] == [6, 7, 8, 9]
    assert ec.call("events.read", {"channel": ch, "since": 9}, timeout=10)["events"] == []
    empty = ec.call("events.read", {"channel": "user.never-published"}, timeout=10)
    assert empty["events"] == [] and empty["latest_seq"] == -1


def test_subscribe_replays_then_goes_live_then_unsubscribes(ec, raw):
    ch = "user.sub"
    for i in range(3):
        publish(ec, ch, {"i": i})
    sub = raw()
    reply = sub.call("events.subscribe", {"channel": ch, "since": 0})
    sub_id = reply["result"]["subscription"]
    assert reply["result"]["channel"] == ch
    got = [sub.recv(10) for _ in range(2)]  # replay: seq 1, 2
    for i in (3, 4):
        publish(ec, ch, {"i": i})
    got += [sub.recv(10) for _ in range(2)]  # live: seq 3, 4
    for msg in got:
        assert msg["method"] == "event" and "id" not in msg
        assert msg["params"]["channel"] == ch
    assert [m["params"]["seq"] for m in got] == [1, 2, 3, 4]
    assert [m["params"]["payload"]["i"] for m in got] == [1, 2, 3, 4]
    # unsubscribe stops delivery
    off = sub.call("events.unsubscribe", {"subscription": sub_id})
    assert off["result"] == {"subscription": sub_id, "closed": True}
    publish(ec, ch, {"i": 5})
    time.sleep(0.3)
    pong = sub.call("ping")  # anything queued would arrive before this answer
    assert pong["result"]["pong"] is True
    assert not any(
        f.startswith(b'{"jsonrpc":"2.0","method":"event"') and b'"i":5' in f for f in sub.raw_frames
    )
    err = sub.call("events.unsubscribe", {"subscription": sub_id})
    assert err["error"]["code"] == ErrorCode.INVALID_PARAMS


def test_subscribe_live_only(ec, raw):
    ch = "user.liveonly"
    publish(ec, ch, {"old": True})
    sub = raw()
    sub.call("events.subscribe", {"channel": ch})
    publish(ec, ch, {"new": True})
    msg = sub.recv(10)
    assert msg["params"]["seq"] == 1 and msg["params"]["payload"] == {"new": True}


def test_subscribe_to_durable_journal_channel(ec, raw):
    sub = raw("events-journal")
    before = ec.call("events.read", {"channel": "journal"}, timeout=10)["latest_seq"]
    sub.call("events.subscribe", {"channel": "journal", "since": before})
    r = ec.call("exec", {"src": "echo journaled"}, timeout=30)
    msg = sub.recv(10)
    assert msg["params"]["channel"] == "journal"
    assert msg["params"]["seq"] == before + 1
    assert msg["params"]["payload"]["ref"] == r["ref"]
    assert msg["params"]["payload"]["session"] == "events"


def test_slow_subscriber_never_blocks_publisher(kernel, raw):
    ch = "user.slow"
    n_events = 10_000
    slow = raw("events-slow")
    slow.call("events.subscribe", {"channel": ch})
    # The slow subscriber now reads nothing while another connection publishes.
    pub = kernel.client("events-publisher")
    payload = {"pad": "p" * 1000}
    try:
        t0 = time.monotonic()
        for i in range(n_events):
            assert (
                pub.call(
                    "events.publish", {"channel": ch, "payload": {**payload, "i": i}}, timeout=10
                )["seq"]
                == i
            )
        elapsed = time.monotonic() - t0
    finally:
        close_client(pub)
    rate = n_events / elapsed
    FIGURES["publish_rate_per_s"] = rate
    print(f"\n{n_events} publishes with a stalled subscriber: {elapsed:.2f} s ({rate:.0f}/s)")
    # Now the slow subscriber reads everything it was sent.
    real: list[dict] = []
    summaries: list[dict] = []
    while True:
        msg = slow.recv(30)
        params = msg["params"]
        if "dropped" in params:
            summaries.append(params)
        else:
            real.append(params)
        covered = len(real) + sum(s["dropped"] for s in summaries)
        if covered >= n_events:
            break
    print(
        f"slow subscriber got {len(real)} events + {len(summaries)} summary "
        f"(dropped {sum(s['dropped'] for s in summaries)})"
    )
    assert summaries, "overflow must be reported"
    for s in summaries:
        assert s["channel"] == ch
        assert s["payload"] == {"dropped": s["dropped"], "latest_seq": s["seq"]}
        assert s["dropped"] > 0
    # a seq-contiguous stream when each summary stands for seqs s-n+1 .. s
    expect = 0
    for params in sorted(real + summaries, key=lambda p: p["seq"]):
        if "dropped" in params:
            assert params["seq"] - params["dropped"] + 1 == expect
            expect = params["seq"] + 1
        else:
            assert params["seq"] == expect
            assert params["payload"]["i"] == expect
            expect += 1
    assert expect == n_events
    assert summaries[-1]["payload"]["latest_seq"] == n_events - 1
    assert len(real) >= SUBSCRIBER_QUEUE  # at least the queue's worth got through
    # and the connection still works afterwards
    assert slow.call("ping")["result"]["pong"] is True
