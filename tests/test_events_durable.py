"""Durable events in the caller's transaction (events/durable.py): an exec's finalize
commits its ``journal`` and ``session.transcript`` events with the rest, in one commit.
In-process, on a real SQLite file shared by the journal's pool and the event store."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from shoal_mcp.kernel.events.bus import EventBus
from shoal_mcp.kernel.events.durable import DurableBatch
from shoal_mcp.kernel.events.store import EventStore
from shoal_mcp.kernel.store.db import Database


@pytest.fixture()
def world(tmp_path: Path):
    db = Database(tmp_path / "db.sqlite3")
    store = EventStore(db)
    bus = EventBus(store)
    yield db, store, bus
    bus.close()
    store.close()
    db.close()


def _read_elsewhere(store: EventStore, channel: str) -> list[dict]:
    """The store read by another thread (this one's reads share its transaction's connection)."""
    seen: list[dict] = []
    reader = threading.Thread(target=lambda: seen.extend(store.since(channel, None, None)))
    reader.start()
    reader.join(30)
    assert not reader.is_alive()
    return seen


def test_staged_events_are_stored_with_the_transaction_and_then_delivered(world):
    db, store, bus = world
    batch = DurableBatch(bus)
    try:
        with db.transaction() as conn:
            batch.stage(conn, "journal", {"id": 1})
            batch.stage(conn, "session.transcript", {"ref": "out:1"})
            batch.stage(conn, "journal", {"id": 2})  # one channel twice: one lock, two seqs
            assert _read_elsewhere(store, "journal") == []  # not committed: not seen
        published = batch.publish()
    finally:
        batch.release()
    assert [(e["channel"], e["seq"]) for e in published] == [
        ("journal", 0),
        ("session.transcript", 0),
        ("journal", 1),
    ]
    assert [e["payload"] for e in store.since("journal", None, None)] == [{"id": 1}, {"id": 2}]
    assert [e["payload"] for e in bus.read("journal")["events"]] == [{"id": 1}, {"id": 2}]
    assert bus.publish("journal", {"id": 3})["seq"] == 2  # the next seq follows


def test_a_rolled_back_batch_uses_no_seq_and_leaves_no_row(world):
    db, store, bus = world
    batch = DurableBatch(bus)
    with pytest.raises(RuntimeError), db.transaction() as conn:
        batch.stage(conn, "journal", {"id": 1})
        raise RuntimeError("finalize failed after staging")
    batch.release()
    assert store.since("journal", None, None) == []
    assert bus.read("journal")["events"] == []
    assert bus.publish("journal", {"id": 2})["seq"] == 0  # the store stays gap-free
    assert [e["seq"] for e in store.since("journal", None, None)] == [0]


def test_a_publisher_waits_for_a_staged_batch_and_follows_it(world):
    """Publish takes the write turn before the channel's lock, as a batch's transaction
    does: a publisher that comes while a batch is staged waits, then takes the next seq
    (the opposite order could deadlock)."""
    db, store, bus = world
    batch = DurableBatch(bus)
    started = threading.Event()
    seqs: list[int] = []

    def publisher() -> None:
        started.set()
        seqs.append(bus.publish("journal", {"from": "publisher"})["seq"])

    with db.transaction() as conn:
        batch.stage(conn, "journal", {"from": "batch"})
        thread = threading.Thread(target=publisher)
        thread.start()
        started.wait(10)
        assert seqs == []  # still waiting for the turn
    batch.publish()
    thread.join(30)
    assert not thread.is_alive()
    assert seqs == [1]
    assert [e["payload"]["from"] for e in store.since("journal", None, None)] == [
        "batch",
        "publisher",
    ]


def test_a_publish_inside_this_threads_transaction_commits_with_it(world):
    """The thread's connection is in a transaction already (Database leases one per
    thread): the event's row goes into it, with no second BEGIN, and commits with it."""
    db, store, bus = world
    with db.transaction() as conn:
        conn.execute("INSERT INTO sessions(name, cwd, env) VALUES ('s', '/', '')")
        assert bus.publish("journal", {"id": 1})["seq"] == 0
        assert _read_elsewhere(store, "journal") == []  # not committed yet
    assert [e["payload"] for e in _read_elsewhere(store, "journal")] == [{"id": 1}]
    assert db.query("SELECT name FROM sessions")[0]["name"] == "s"


def test_only_durable_channels_are_staged(world):
    db, _store, bus = world
    batch = DurableBatch(bus)
    with db.transaction() as conn, pytest.raises(ValueError):
        batch.stage(conn, "user.notes", {"x": 1})
    batch.release()
    memory_only = EventBus()
    with pytest.raises(ValueError):
        memory_only.durable_channel("journal")
