"""The kernel's database writers queue in the process, not in SQLite's busy handler
(store/db.py ``WriteQueue``): a transaction and a durable event on the same file take
turns, a writer waits no longer than its bound, and every write lands.

Real SQLite files on a temporary dir; the timing of SQLite's busy handler is not
asserted (no wall clock in tests), only who reaches SQLite when.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from shoal_mcp.kernel.events.store import EventStore
from shoal_mcp.kernel.store.db import Database, WriteQueue
from tests.support.polling import wait_until

WAIT_S = 10.0


def test_a_durable_event_waits_its_turn_outside_sqlite(tmp_path: Path) -> None:
    db = Database(tmp_path / "journal.sqlite3")
    store = EventStore(db)
    statements: list[str] = []
    opened: list[sqlite3.Connection] = []
    connect = db._connect

    def traced() -> sqlite3.Connection:  # the pool's connections opened from here on
        conn = connect()
        conn.set_trace_callback(statements.append)
        opened.append(conn)
        return conn

    db._connect = traced  # type: ignore[method-assign]
    inserted = threading.Event()

    def publish() -> None:
        store.append({"channel": "journal", "seq": 0, "ts": 1.0, "payload": {"n": 1}})
        inserted.set()

    try:
        with db.transaction() as conn:
            conn.execute("INSERT INTO sessions(name, cwd, env) VALUES ('s', '/', '')")
            writer = threading.Thread(target=publish)
            writer.start()
            # The writer leased a connection (this transaction holds the pool's other)...
            wait_until(lambda: len(opened) == 1, WAIT_S, what="the writer's connection")
            # ... and is queued: it has not reached SQLite (where it would poll the write
            # lock with sleeps of up to 100 ms).
            assert not inserted.wait(0.3)
            assert not any(s.startswith(("BEGIN", "INSERT")) for s in statements)
        assert inserted.wait(WAIT_S)  # its turn came when the transaction committed
        writer.join(WAIT_S)
        assert [e["payload"] for e in store.since("journal", None, None)] == [{"n": 1}]
        assert db.query("SELECT name FROM sessions")[0]["name"] == "s"
    finally:
        store.close()
        db.close()


def test_transactions_of_many_threads_all_land(tmp_path: Path) -> None:
    db = Database(tmp_path / "journal.sqlite3")
    store = EventStore(db)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(40):
                with db.transaction() as conn:
                    conn.execute(
                        "INSERT INTO sessions(name, cwd, env) VALUES (?, '/', '')", (f"{t}-{i}",)
                    )
                store.append({"channel": f"user.t{t}", "seq": i, "ts": 1.0, "payload": {"i": i}})
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert errors == []
        assert db.query("SELECT count(*) AS n FROM sessions")[0]["n"] == 8 * 40
        assert all(store.last_seq(f"user.t{t}") == 39 for t in range(8))
    finally:
        store.close()
        db.close()


def test_a_writer_past_its_wait_gets_sqlites_answer() -> None:
    queue = WriteQueue()
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with queue.turn(WAIT_S):
            held.set()
            release.wait(WAIT_S)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(WAIT_S)
        with pytest.raises(sqlite3.OperationalError, match="database is locked"), queue.turn(0.05):
            pass
    finally:
        release.set()
        holder.join(WAIT_S)
    with queue.turn(0.05):  # free again
        pass


def test_the_turn_is_reentrant_on_one_thread() -> None:
    """A thread already writing meets SQLite's own answer, as before, not a self-wait."""
    queue = WriteQueue()
    outcome: list[str] = []

    def other_thread() -> None:
        try:
            with queue.turn(0.05):
                outcome.append("got the turn")
        except sqlite3.OperationalError as exc:
            outcome.append(str(exc))

    with queue.turn(0.05), queue.turn(0.05):
        th = threading.Thread(target=other_thread)
        th.start()
        th.join(WAIT_S)
    assert outcome == ["database is locked"]  # still one writer at a time across threads
    other_thread()
    assert outcome[-1] == "got the turn"
