"""Event bus and durable event store (docs/protocol.md, Events): real threads and SQLite."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from shoal_mcp.kernel.config.limits import SUBSCRIBER_QUEUE
from shoal_mcp.kernel.events.bus import (
    CLIENT_PUBLISH_REFUSED,
    EventBus,
    EventStore,
    is_client_publishable,
    require_client_publishable,
    validate_channel,
)
from shoal_mcp.kernel.store.db import Database
from shoal_mcp.protocol.errors import ErrorCode, RpcError
from shoal_mcp.protocol.limits import EVENT_RING
from tests.support.polling import wait_until

WAIT_S = 20.0  # generous deadline for background delivery; never an assertion on speed


def delivered(predicate) -> bool:
    """Wait for in-process delivery (polled every millisecond); fails after ``WAIT_S``."""
    return bool(wait_until(predicate, WAIT_S, interval=0.001, what="delivery"))


def seqs(events):
    return [e["seq"] for e in events]


def covered(received):
    """Seqs a subscriber was told about: real events plus the ranges summaries stand for."""
    out = []
    for ev in received:
        if "dropped" in ev:
            n, s = ev["dropped"], ev["seq"]
            assert ev["payload"] == {"dropped": n, "latest_seq": s}
            out.extend(range(s - n + 1, s + 1))
        else:
            out.append(ev["seq"])
    return out


class Collector:
    def __init__(self):
        self.events = []
        self.lock = threading.Lock()

    def __call__(self, event):
        with self.lock:
            self.events.append(event)

    def snapshot(self):
        with self.lock:
            return list(self.events)


@pytest.fixture
def store(tmp_path):
    db = Database(tmp_path / "journal.sqlite3")
    s = EventStore(db)
    yield s
    s.close()
    db.close()


@pytest.fixture
def bus():
    b = EventBus()
    yield b
    b.close()


# --- sequence numbers and read ------------------------------------------------------------


def test_seq_starts_at_zero_and_rises_per_channel(bus):
    a = [bus.publish("user.a", {"i": i}) for i in range(5)]
    b = [bus.publish("task.1", {"i": i}) for i in range(3)]
    assert seqs(a) == [0, 1, 2, 3, 4]
    assert seqs(b) == [0, 1, 2]
    ev = bus.publish("user.a", {"x": 1})
    assert ev["seq"] == 5
    assert set(ev) == {"channel", "seq", "ts", "payload"}
    assert ev["channel"] == "user.a" and ev["payload"] == {"x": 1}
    assert isinstance(ev["ts"], float)
    assert bus.channels() == ["task.1", "user.a"]


def test_read_since_and_limit(bus):
    assert bus.read("user.r") == {"channel": "user.r", "events": [], "latest_seq": -1}
    for i in range(10):
        bus.publish("user.r", {"i": i})
    r = bus.read("user.r")
    assert seqs(r["events"]) == list(range(10)) and r["latest_seq"] == 9
    assert "truncated" not in r and "more" not in r
    assert seqs(bus.read("user.r", since=6)["events"]) == [7, 8, 9]  # since is exclusive
    assert seqs(bus.read("user.r", since=-1)["events"]) == list(range(10))
    assert seqs(bus.read("user.r", limit=3)["events"]) == [7, 8, 9]  # limit keeps the newest
    assert seqs(bus.read("user.r", since=2, limit=4)["events"]) == [6, 7, 8, 9]
    assert seqs(bus.read("user.r", since=2, limit=100)["events"]) == list(range(3, 10))
    assert bus.read("user.r", limit=0)["events"] == []
    assert bus.read("user.r", since=9)["events"] == []
    assert bus.read("user.r", since=50) == {"channel": "user.r", "events": [], "latest_seq": 9}


def test_ring_eviction_and_truncated(bus):
    total = EVENT_RING + 500
    for i in range(total):
        bus.publish("task.7", {"i": i})
    first = total - EVENT_RING
    r = bus.read("task.7")
    assert seqs(r["events"]) == list(range(first, total))
    assert r["latest_seq"] == total - 1 and "truncated" not in r
    r = bus.read("task.7", since=10)
    assert r["truncated"] is True
    assert seqs(r["events"]) == list(range(first, total))
    r = bus.read("task.7", since=first - 1)  # exactly the oldest retained: nothing lost
    assert "truncated" not in r and seqs(r["events"]) == list(range(first, total))
    r = bus.read("task.7", since=10, limit=5)
    assert r["truncated"] is True and seqs(r["events"]) == list(range(total - 5, total))
    # a limit larger than what one read may return is clamped (newest kept)
    assert len(bus.read("task.7", limit=10 * EVENT_RING)["events"]) == EVENT_RING


def test_durable_replay_beyond_the_ring(store):
    bus = EventBus(store)
    try:
        total = EVENT_RING + 476
        for i in range(total):
            bus.publish("journal", {"i": i})
        assert store.last_seq("journal") == total - 1
        # since + limit: the newest `limit` after since, spanning SQLite and the ring
        r = bus.read("journal", since=100, limit=1000)
        assert seqs(r["events"]) == list(range(total - 1000, total))
        assert [e["payload"]["i"] for e in r["events"]] == list(range(total - 1000, total))
        assert "truncated" not in r
        r = bus.read("journal", since=10, limit=5)
        assert seqs(r["events"]) == list(range(total - 5, total))
        # since without limit pages forward from since, oldest first
        r = bus.read("journal", since=10)
        assert seqs(r["events"]) == list(range(11, 11 + EVENT_RING)) and r["more"] is True
        r = bus.read("journal", since=r["events"][-1]["seq"])
        assert seqs(r["events"]) == list(range(11 + EVENT_RING, total)) and "more" not in r
        # all of it, from the very start
        r = bus.read("journal", since=-1)
        assert seqs(r["events"]) == list(range(EVENT_RING)) and r["more"] is True
        # non-durable twin for contrast: same history, truncated
        for i in range(total):
            bus.publish("approval", {"i": i})
        assert bus.read("approval", since=10)["truncated"] is True
    finally:
        bus.close()


def test_seq_continues_across_restart(tmp_path):
    path = tmp_path / "journal.sqlite3"
    db1 = Database(path)
    store1 = EventStore(db1)
    bus1 = EventBus(store1)
    for i in range(5):
        bus1.publish("journal", {"gen": 1, "i": i})
    for i in range(3):
        bus1.publish("session.transcript", {"gen": 1, "i": i})
    bus1.publish("user.x", {"gen": 1})
    bus1.close()
    store1.close()
    db1.close()

    db2 = Database(path)  # a restarted kernel: a new Database on the same file
    store2 = EventStore(db2)
    bus2 = EventBus(store2)
    try:
        assert bus2.read("journal")["latest_seq"] == 4
        ev = bus2.publish("journal", {"gen": 2})
        assert ev["seq"] == 5
        assert bus2.publish("session.transcript", {"gen": 2})["seq"] == 3
        assert bus2.publish("user.x", {"gen": 2})["seq"] == 0  # memory-only channel restarts
        r = bus2.read("journal", since=2)
        assert seqs(r["events"]) == [3, 4, 5]
        assert [e["payload"]["gen"] for e in r["events"]] == [1, 1, 2]
        assert seqs(bus2.read("journal", limit=2)["events"]) == [4, 5]
        assert seqs(bus2.read("journal")["events"]) == list(range(6))
        # subscribe with since across the restart seam: SQLite replay, ring, then live
        got = Collector()
        sub = bus2.subscribe("journal", 1, got)
        bus2.publish("journal", {"gen": 2})
        assert delivered(lambda: len(got.snapshot()) == 5)
        assert seqs(got.snapshot()) == [2, 3, 4, 5, 6]
        sub.close()
    finally:
        bus2.close()
        store2.close()
        db2.close()


def test_store_api_and_table(tmp_path):
    path = tmp_path / "state.sqlite3"
    other = sqlite3.connect(path)  # another component's table in the same file
    other.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, src TEXT)")
    other.execute("INSERT INTO notes (src) VALUES ('ls')")
    other.commit()
    db = Database(path)
    store = EventStore(db)
    try:
        assert store.last_seq("journal") == -1
        for i in range(5):
            store.append({"channel": "journal", "seq": i, "ts": 1.0 + i, "payload": {"i": i}})
        assert store.last_seq("journal") == 4
        assert store.last_seq("session.transcript") == -1
        assert seqs(store.since("journal", None, None)) == [0, 1, 2, 3, 4]
        assert seqs(store.since("journal", 1, None)) == [2, 3, 4]
        assert seqs(store.since("journal", 1, 2)) == [3, 4]
        assert seqs(store.since("journal", None, 2, until=2)) == [1, 2]
        assert seqs(store.page("journal", 0, 3, 2)) == [1, 2]
        assert store.since("journal", 3, None)[0] == {
            "channel": "journal",
            "seq": 4,
            "ts": 5.0,
            "payload": {"i": 4},
        }
        fresh = sqlite3.connect(path)
        assert fresh.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        fresh.close()
        assert other.execute("SELECT src FROM notes").fetchall() == [("ls",)]
        cols = [r[1] for r in other.execute("PRAGMA table_info(events)")]
        assert cols == ["channel", "seq", "ts", "payload"]
    finally:
        store.close()
        db.close()
        other.close()


# --- subscriptions ------------------------------------------------------------------------


def _publisher(bus, channel, count, started_at, started, subscribing=None):
    for i in range(count):
        bus.publish(channel, {"i": i})
        if i == started_at:
            started.set()
            if subscribing is not None:
                # Go on only once the subscriber is about to subscribe: publishing runs
                # across the seam, but cannot outrun the ring before the replay starts
                # on a loaded machine (which would make the replay lossy, not the seam).
                subscribing.wait(WAIT_S)
        if i % 64 == 0:
            time.sleep(0)  # let the subscriber threads breathe


@pytest.mark.parametrize("queue_size", [SUBSCRIBER_QUEUE, 1_000_000])
def test_subscribe_replay_live_seam_is_exact(queue_size):
    bus = EventBus(queue_size=queue_size)
    try:
        total, since = 20_000, 500
        started, subscribing = threading.Event(), threading.Event()
        t = threading.Thread(
            target=_publisher, args=(bus, "user.seam", total, 1000, started, subscribing)
        )
        t.start()
        started.wait(WAIT_S)
        got = Collector()
        subscribing.set()
        sub = bus.subscribe("user.seam", since, got)
        t.join()
        assert delivered(lambda: (got.snapshot() or [{"seq": -1}])[-1]["seq"] == total - 1)
        received = got.snapshot()
        assert covered(received) == list(range(since + 1, total))
        if queue_size > total:
            assert not any("dropped" in e for e in received)
            assert seqs(received) == list(range(since + 1, total))
        sub.close()
    finally:
        bus.close()


def test_subscribe_durable_seam_spans_store_ring_and_live(store):
    bus = EventBus(store, ring_size=64, queue_size=1_000_000)
    try:
        for i in range(300):
            bus.publish("journal", {"i": i})
        started = threading.Event()
        t = threading.Thread(target=_publisher, args=(bus, "journal", 3000, 100, started))
        t.start()
        started.wait(WAIT_S)
        got = Collector()
        sub = bus.subscribe("journal", 10, got)
        t.join()
        last = 300 + 3000 - 1
        assert delivered(lambda: (got.snapshot() or [{"seq": -1}])[-1]["seq"] == last)
        assert seqs(got.snapshot()) == list(range(11, last + 1))
        sub.close()
    finally:
        bus.close()


def test_subscribe_without_since_is_live_only(bus):
    for i in range(5):
        bus.publish("pty.3", {"i": i})
    got = Collector()
    sub = bus.subscribe("pty.3", None, got)
    bus.publish("pty.3", {"i": 5})
    assert delivered(lambda: len(got.snapshot()) == 1)
    assert seqs(got.snapshot()) == [5]
    assert sub.id.startswith("sub:") and sub.channel == "pty.3"
    sub.close()


def test_subscribe_since_ahead_of_latest_waits_for_newer(bus):
    for i in range(3):
        bus.publish("user.ahead", {"i": i})
    got = Collector()
    sub = bus.subscribe("user.ahead", 10, got)  # e.g. a cursor from a previous kernel
    for i in range(10):
        bus.publish("user.ahead", {"i": i})  # seqs 3..12
    assert delivered(lambda: len(got.snapshot()) == 2)
    time.sleep(0.02)
    assert seqs(got.snapshot()) == [11, 12]
    sub.close()


def test_subscribe_non_durable_gap_is_reported(bus):
    total = EVENT_RING + 100
    for i in range(total):
        bus.publish("task.9", {"i": i})
    got = Collector()
    sub = bus.subscribe("task.9", 49, got)
    assert delivered(lambda: len(got.snapshot()) == 1 + EVENT_RING)
    received = got.snapshot()
    gap = received[0]
    first = total - EVENT_RING
    assert gap["dropped"] == first - 50 and gap["seq"] == first - 1 and gap["truncated"] is True
    assert covered(received) == list(range(50, total))
    sub.close()


def test_slow_subscriber_never_blocks_publish_and_gets_one_summary():
    bus = EventBus()
    try:
        n = 10_000
        release, entered = threading.Event(), threading.Event()
        got = Collector()

        def blocked_sink(event):
            got(event)
            entered.set()
            release.wait()

        # free case: nobody listening (warm the channel first)
        bus.publish("user.free", {"i": -1})
        t0 = time.perf_counter()
        for i in range(n):
            bus.publish("user.free", {"i": i})
        free = time.perf_counter() - t0

        sub = bus.subscribe("user.slow", None, blocked_sink)
        bus.publish("user.slow", {"i": -1})  # seq 0: the sink is now stuck on it
        assert entered.wait(WAIT_S)
        t0 = time.perf_counter()
        for i in range(n):
            bus.publish("user.slow", {"i": i})  # seqs 1..n
        blocked = time.perf_counter() - t0

        per_free, per_blocked = free / n * 1e6, blocked / n * 1e6
        numbers = (
            f"{n} publishes: free {free * 1e3:.1f} ms ({per_free:.2f} us/publish), "
            f"blocked subscriber {blocked * 1e3:.1f} ms ({per_blocked:.2f} us/publish), "
            f"ratio {blocked / free:.2f}"
        )
        print(numbers)
        # generous bound: 5x the free cost + 50 us per publish
        assert per_blocked < 5 * per_free + 50, numbers
        assert sub.dropped_total == n - SUBSCRIBER_QUEUE, numbers

        release.set()
        total = n + 1
        assert delivered(lambda: any("dropped" in e for e in got.snapshot()))
        for i in range(5):
            bus.publish("user.slow", {"live": i})
        assert delivered(lambda: got.snapshot()[-1]["seq"] == total + 4)
        received = got.snapshot()
        summaries = [i for i, e in enumerate(received) if "dropped" in e]
        assert len(summaries) == 1
        k = summaries[0]
        summary = received[k]
        before = received[:k]
        assert len(before) <= SUBSCRIBER_QUEUE + 1
        assert seqs(before) == list(range(len(before)))
        assert summary["seq"] == total - 1
        assert summary["payload"] == {"dropped": summary["dropped"], "latest_seq": total - 1}
        assert len(before) + summary["dropped"] == total, numbers
        assert seqs(received[k + 1 :]) == list(range(total, total + 5))  # live again
        assert covered(received) == list(range(total + 5))
        sub.close()
    finally:
        bus.close()


def test_summary_precedes_next_event_that_fits():
    """Drops, then the queue drains a little and a new event fits: summary comes first."""
    bus = EventBus(queue_size=4)
    try:
        gate, entered = threading.Event(), threading.Event()
        got = Collector()

        def sink(event):
            got(event)
            if event["seq"] == 0:
                entered.set()
                gate.wait()

        sub = bus.subscribe("user.q", None, sink)
        bus.publish("user.q", {})
        assert entered.wait(WAIT_S)
        for _ in range(10):  # seqs 1..10: 1..4 queued, 5..10 dropped
            bus.publish("user.q", {})
        gate.set()
        assert delivered(lambda: len(got.snapshot()) == 6)
        received = got.snapshot()
        assert seqs(received[:5]) == [0, 1, 2, 3, 4]
        assert received[5]["dropped"] == 6 and received[5]["seq"] == 10
        bus.publish("user.q", {})
        assert delivered(lambda: len(got.snapshot()) == 7)
        assert got.snapshot()[6]["seq"] == 11 and "dropped" not in got.snapshot()[6]
        sub.close()
    finally:
        bus.close()


def test_unsubscribe_stops_delivery(bus):
    got = Collector()
    sub = bus.subscribe("user.u", None, got)
    bus.publish("user.u", {"i": 0})
    assert delivered(lambda: len(got.snapshot()) == 1)
    assert bus.unsubscribe(sub.id) is True
    assert sub.closed
    assert bus.unsubscribe(sub.id) is False
    for i in range(100):
        bus.publish("user.u", {"i": i})
    assert sub.join(WAIT_S)
    time.sleep(0.05)
    assert len(got.snapshot()) == 1


def test_close_with_a_sink_in_flight(bus):
    """close() while the sink blocks: that one call finishes, nothing is delivered after."""
    release, entered = threading.Event(), threading.Event()
    got = Collector()

    def sink(event):
        got(event)
        entered.set()
        release.wait()

    sub = bus.subscribe("user.c", None, sink)
    for i in range(10):
        bus.publish("user.c", {"i": i})
    assert entered.wait(WAIT_S)
    sub.close()  # returns at once although the sink is blocked
    assert not sub.join(0.01)
    release.set()
    assert sub.join(WAIT_S)
    assert seqs(got.snapshot()) == [0]


def test_raising_sink_closes_its_subscription(bus):
    calls, closed = [], []

    def sink(event):
        calls.append(event["seq"])
        raise BrokenPipeError("client went away")

    sub = bus.subscribe("user.boom", None, sink, on_close=closed.append)
    bus.publish("user.boom", {})
    assert delivered(lambda: sub.closed)
    assert sub.join(WAIT_S)
    assert closed == [sub]
    assert bus.subscription(sub.id) is None
    for _ in range(10):
        bus.publish("user.boom", {})
    assert calls == [0]
    # the bus is unharmed: a healthy subscriber on the same channel still works
    got = Collector()
    ok = bus.subscribe("user.boom", None, got)
    bus.publish("user.boom", {})
    assert delivered(lambda: len(got.snapshot()) == 1)
    ok.close()


def test_bus_close_stops_all_subscription_threads():
    bus = EventBus()
    release = threading.Event()
    subs = [bus.subscribe(f"user.s{i}", None, lambda e: None) for i in range(5)]
    blocked = bus.subscribe("user.blocked", None, lambda e: release.wait())
    bus.publish("user.blocked", {})
    bus.close()
    assert all(s.closed for s in [*subs, blocked])
    assert all(s.join(WAIT_S) for s in subs)
    release.set()
    assert blocked.join(WAIT_S)
    with pytest.raises(RuntimeError):
        bus.subscribe("user.s0", None, lambda e: None)
    assert bus.publish("user.s0", {})["seq"] == 0  # publishing keeps working


def test_channel_cap_evicts_idle_rings_but_keeps_numbering():
    bus = EventBus(max_channels=4)
    try:
        got = Collector()
        sub = bus.subscribe("task.0", None, got)  # subscribed: never evicted
        for n in range(1, 10):
            for i in range(3):
                bus.publish(f"task.{n}", {"i": i})
        assert len(bus.channels()) <= 4
        assert "task.0" in bus.channels() and "task.9" in bus.channels()
        r = bus.read("task.1")
        assert r == {"channel": "task.1", "events": [], "latest_seq": 2}
        assert bus.read("task.1", since=0)["truncated"] is True
        assert bus.publish("task.1", {})["seq"] == 3  # numbering continues
        bus.publish("task.0", {})
        assert delivered(lambda: len(got.snapshot()) == 1)
        sub.close()
    finally:
        bus.close()


def test_eviction_passes_over_subscribed_channels_at_the_old_end():
    bus = EventBus(max_channels=4)
    try:
        subs = [bus.subscribe(f"task.{n}", None, Collector()) for n in range(3)]
        for n in range(3, 40):  # each new channel evicts the one before it, never task.0-2
            bus.publish(f"task.{n}", {"n": n})
            assert len(bus.channels()) == 4
        assert bus.channels() == ["task.0", "task.1", "task.2", "task.39"]
        for n in range(3):  # the subscribed ones never lost their place
            assert bus.publish(f"task.{n}", {})["seq"] == 0
        subs.append(bus.subscribe("task.40", None, Collector()))
        # Every channel now has a subscriber: the table may pass the cap, nothing breaks.
        assert sorted(bus.channels()) == ["task.0", "task.1", "task.2", "task.40"]
        subs.append(bus.subscribe("task.41", None, Collector()))
        assert len(bus.channels()) == 5
        for sub in subs:
            sub.close()
    finally:
        bus.close()


# --- validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "journal",
        "session.transcript",
        "approval",
        "task.0",
        "task.12",
        "pty.3",
        "user.x",
        "user.build-log",
        "user.a.b:c@d+e=f~g_h",
    ],
)
def test_valid_channels(name):
    assert validate_channel(name) == name


@pytest.mark.parametrize(
    "name",
    [
        None,
        5,
        b"journal",
        "",
        "foo",
        "journal.x",
        "session",
        "task.",
        "task.x",
        "task.01",
        "task.-1",
        "pty.",
        "user.",
        "user",
        "user.a b",
        "user.a/b",
        "user.\n",
        "Journal",
        "user." + "x" * 300,
    ],
)
def test_invalid_channels(name, bus):
    with pytest.raises(RpcError) as exc:
        validate_channel(name)
    assert exc.value.code == ErrorCode.INVALID_PARAMS
    assert exc.value.data["field"] == "channel"
    with pytest.raises(RpcError):
        bus.publish(name, {})
    with pytest.raises(RpcError):
        bus.read(name)
    with pytest.raises(RpcError):
        bus.subscribe(name, None, lambda e: None)


def test_client_publishable():
    assert is_client_publishable("user.x")
    for name in ["journal", "session.transcript", "approval", "task.1", "pty.1", "user.", 7]:
        assert not is_client_publishable(name)
    assert require_client_publishable("user.ok") == "user.ok"
    with pytest.raises(RpcError) as exc:
        require_client_publishable("journal")
    assert exc.value.code == ErrorCode.INVALID_PARAMS
    assert exc.value.data == {"field": "channel", "reason": CLIENT_PUBLISH_REFUSED}


def test_param_validation(bus, store):
    for bad in ["1", 1.5, True, -2]:
        with pytest.raises(RpcError) as exc:
            bus.read("user.v", since=bad)
        assert exc.value.data["field"] == "since"
        with pytest.raises(RpcError):
            bus.subscribe("user.v", bad, lambda e: None)
    for bad in ["1", 1.5, False, -1]:
        with pytest.raises(RpcError) as exc:
            bus.read("user.v", limit=bad)
        assert exc.value.data["field"] == "limit"
    for bad in [[1], "x", None, 3]:
        with pytest.raises(RpcError) as exc:
            bus.publish("user.v", bad)
        assert exc.value.data["field"] == "payload"
    durable = EventBus(store)
    try:
        with pytest.raises(RpcError) as exc:
            durable.publish("journal", {"x": object()})
        assert exc.value.data["field"] == "payload"
        assert durable.publish("journal", {"x": 1})["seq"] == 0  # no seq was burnt
    finally:
        durable.close()
    assert bus.channels() == []  # nothing was created by the failed calls


def test_all_rings_together_stay_within_total_bytes() -> None:
    """[kernel] max_event_bytes: past it, least recently used unsubscribed rings go."""
    bus = EventBus(ring_bytes=64 * 1024, total_bytes=256 * 1024)
    payload = {"d": "x" * 8000}
    for n in range(40):
        for _ in range(10):
            bus.publish(f"user.total-{n}", payload)
        assert bus.held_bytes() <= 256 * 1024 + 64 * 1024
    kept = bus.channels()
    assert "user.total-39" in kept and "user.total-0" not in kept
    # an evicted channel's numbering continues
    assert bus.publish("user.total-0", payload)["seq"] == 10
