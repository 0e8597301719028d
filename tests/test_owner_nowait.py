"""Work the owner loop does at once or not at all (owner/nowait.py, store/db.py).

Inside ``no_wait()`` nothing waits: a lock another thread holds, the database's write
turn held in this process, or its write lock held by another connection (as another
process would) is ``WouldWait``, raised before anything was written, and the same work
then succeeds where waiting is allowed. ``Database.claim`` takes the write lock ahead
of a transaction that must not meet a wait once it is due. Real SQLite files on a
temporary dir; no wall clock is asserted.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from shoal_mcp.kernel.owner.nowait import WouldWait, hold, no_wait, waits_allowed
from shoal_mcp.kernel.store.db import Database
from tests.support.polling import wait_until

WAIT_S = 10.0


@pytest.fixture
def db(tmp_path: Path):
    database = Database(tmp_path / "journal.sqlite3")
    try:
        yield database
    finally:
        database.close()


def _insert(db: Database, name: str) -> None:
    with db.transaction() as conn:
        conn.execute("INSERT INTO sessions(name, cwd, env) VALUES (?, '/', '')", (name,))


def _names(db: Database) -> list[str]:
    return [r["name"] for r in db.query("SELECT name FROM sessions ORDER BY name")]


def _held_elsewhere(held: Callable[[], AbstractContextManager]):
    """A thread inside ``held()`` until the returned event is set."""
    taken, release = threading.Event(), threading.Event()

    def holder() -> None:
        with held():
            taken.set()
            release.wait(WAIT_S)

    thread = threading.Thread(target=holder)
    thread.start()
    assert taken.wait(WAIT_S)
    return release, thread


def test_the_mode_is_per_thread_and_nests() -> None:
    seen: list[bool] = []
    with no_wait():
        assert not waits_allowed()
        with no_wait():
            assert not waits_allowed()
        assert not waits_allowed()  # still inside the outer block
        other = threading.Thread(target=lambda: seen.append(waits_allowed()))
        other.start()
        other.join(WAIT_S)
    assert waits_allowed() and seen == [True]


def test_hold_waits_outside_and_refuses_inside_while_another_thread_holds() -> None:
    lock = threading.Lock()
    release, thread = _held_elsewhere(lambda: lock)
    try:
        with no_wait(), pytest.raises(WouldWait), hold(lock):
            pytest.fail("entered a lock another thread holds")
    finally:
        release.set()
        thread.join(WAIT_S)
    with no_wait(), hold(lock):  # free now: taken at once
        assert lock.locked()
    assert not lock.locked()


def test_another_connections_write_lock_is_wouldwait_and_nothing_is_written(db, tmp_path) -> None:
    other = sqlite3.connect(tmp_path / "journal.sqlite3", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # as another process would hold it
    try:
        with no_wait(), pytest.raises(WouldWait):
            _insert(db, "on-the-loop")
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert _names(db) == []
    _insert(db, "on-a-worker")  # the same write where waiting is allowed
    with no_wait():
        _insert(db, "free-again")  # and at once on the loop, now the lock is free
    assert _names(db) == ["free-again", "on-a-worker"]


def test_a_worker_still_waits_on_a_connection_the_loop_used_without_a_busy_timeout(
    db, tmp_path
) -> None:
    with no_wait():
        _insert(db, "on-the-loop")  # its connection is left with no busy timeout
    other = sqlite3.connect(
        tmp_path / "journal.sqlite3", isolation_level=None, check_same_thread=False
    )
    other.execute("BEGIN IMMEDIATE")
    let_go = threading.Timer(0.3, lambda: other.execute("ROLLBACK"))
    let_go.start()
    try:
        _insert(db, "on-a-worker")  # the same pooled connection: waits, does not fail
    finally:
        let_go.join()
        other.close()
    assert _names(db) == ["on-a-worker", "on-the-loop"]


def test_the_write_turn_held_by_another_thread_is_wouldwait(db) -> None:
    release, thread = _held_elsewhere(lambda: db.writers.turn(WAIT_S))
    try:
        with no_wait(), pytest.raises(WouldWait):
            _insert(db, "refused")
    finally:
        release.set()
        thread.join(WAIT_S)
    assert _names(db) == []


def test_no_free_connection_is_wouldwait(db) -> None:
    leased: list[threading.Event] = []
    threads = []
    ready = threading.Barrier(Database.MAX_OPEN + 1)

    def lease() -> None:
        done = threading.Event()
        leased.append(done)
        with db.lease():
            ready.wait(WAIT_S)
            done.wait(WAIT_S)

    for _ in range(Database.MAX_OPEN):
        threads.append(threading.Thread(target=lease))
        threads[-1].start()
    ready.wait(WAIT_S)  # every connection is leased by another thread
    try:
        with no_wait(), pytest.raises(WouldWait):
            db.query("SELECT 1")
    finally:
        for done in leased:
            done.set()
        for t in threads:
            t.join(WAIT_S)
    assert db.query("SELECT 1 AS one")[0]["one"] == 1


def test_leases_past_the_pool_wait_and_each_is_woken_by_a_lease_given_back(db) -> None:
    """Off the loop a lease waits for a free connection (a condition of TABLES), and two
    leases given back in a row wake two waiters: none is left waiting beside a free one."""
    release = threading.Event()
    ready = threading.Barrier(Database.MAX_OPEN + 1)
    answers: list[int] = []

    def hold() -> None:
        with db.lease():
            ready.wait(WAIT_S)
            release.wait(WAIT_S)

    def ask() -> None:
        answers.append(db.query("SELECT 7")[0][0])

    holders = [threading.Thread(target=hold) for _ in range(Database.MAX_OPEN)]
    for t in holders:
        t.start()
    ready.wait(WAIT_S)  # the pool is empty: every connection is leased
    askers = [threading.Thread(target=ask) for _ in range(3)]
    for t in askers:
        t.start()
    wait_until(lambda: db._slots.waiting == 3, timeout=WAIT_S, what="three waiting leases")
    assert answers == []
    release.set()
    for t in holders + askers:
        t.join(WAIT_S)
    assert answers == [7, 7, 7]
    assert db._slots.held == 0 and db._slots.waiting == 0


def test_a_claim_is_taken_now_and_used_by_the_next_transaction(db, tmp_path) -> None:
    other = sqlite3.connect(tmp_path / "journal.sqlite3", isolation_level=None, timeout=0)
    try:
        with no_wait(), db.claim():
            # The write lock is ours from here: another writer is refused at once...
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("BEGIN IMMEDIATE")
            _insert(db, "claimed")  # ...and this transaction meets no wait
            assert _names(db) == ["claimed"]  # committed at its own end
            _insert(db, "after")  # a second one begins on its own (free: at once)
        other.execute("BEGIN IMMEDIATE")  # let go with the block
        other.execute("ROLLBACK")
    finally:
        other.close()
    assert _names(db) == ["after", "claimed"]


def test_an_unused_claim_writes_nothing_and_lets_go(db, tmp_path) -> None:
    with no_wait(), db.claim():
        pass
    other = sqlite3.connect(tmp_path / "journal.sqlite3", isolation_level=None, timeout=0)
    try:
        other.execute("BEGIN IMMEDIATE")  # free again
        other.execute("ROLLBACK")
    finally:
        other.close()
    _insert(db, "later")
    assert _names(db) == ["later"]


def test_a_claim_refused_at_once_while_another_connection_writes(db, tmp_path) -> None:
    other = sqlite3.connect(tmp_path / "journal.sqlite3", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with no_wait(), pytest.raises(WouldWait), db.claim():
            pytest.fail("claimed a write lock another connection holds")
    finally:
        other.execute("ROLLBACK")
        other.close()
    with no_wait(), db.claim():  # the turn and the connection were given back
        _insert(db, "claimed later")
    assert _names(db) == ["claimed later"]


def test_outside_no_wait_a_claim_takes_nothing(db, tmp_path) -> None:
    other = sqlite3.connect(tmp_path / "journal.sqlite3", isolation_level=None, timeout=0)
    try:
        with db.claim():
            other.execute("BEGIN IMMEDIATE")  # nothing was taken ahead
            other.execute("ROLLBACK")
    finally:
        other.close()
