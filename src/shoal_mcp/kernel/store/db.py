"""The kernel's SQLite database (WAL): blobs, transcript, journal, session state.

One connection per thread (sqlite3 objects are not shared across threads); every
connection sets WAL and a busy timeout so readers never block the writer.  Writers of
this process queue on one ``WriteQueue`` (transactions here, durable events in
``events/store.py``) before SQLite's write lock: see its docstring.
"""

from __future__ import annotations

import itertools
import logging
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ...protocol.errors import state_db_locked, state_dir_full
from ..config.limits import DB_WRITE_WAIT_S, HOUSEKEEPER_EXIT_WAIT_S, WAL_CHECKPOINT_EVERY
from ..owner.nowait import WouldWait, take_now, waits_allowed
from ..owner.tables import TABLES, TableSlots
from .housekeeper import Housekeeper

log = logging.getLogger(__name__)

_CHECKPOINT_KEY = ("database", "checkpoint")

SCHEMA = """
CREATE TABLE IF NOT EXISTS blobs (
    hash TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    lines INTEGER NOT NULL,
    chars INTEGER,            -- code points when the blob is valid UTF-8, else NULL
    utf8 INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS transcript (
    session TEXT NOT NULL,
    n INTEGER NOT NULL,
    principal TEXT NOT NULL,
    ts REAL NOT NULL,
    value TEXT NOT NULL,      -- tagged JSON; blobs referenced by hash
    PRIMARY KEY (session, n)
);
CREATE TABLE IF NOT EXISTS journal (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    duration_ms REAL,
    session TEXT NOT NULL,
    principal TEXT NOT NULL,
    cwd TEXT,
    src TEXT NOT NULL,
    head TEXT,
    kind TEXT NOT NULL,       -- exec | plan | apply | denied | approval_required
    effects TEXT NOT NULL,    -- JSON list of effect kinds+targets
    effect_kinds TEXT NOT NULL,  -- ",kind1,kind2," for SQL filtering
    status INTEGER,
    ok INTEGER,
    ref TEXT,
    outputs TEXT NOT NULL,    -- JSON list of {kind, hash, len}
    state TEXT,               -- exec rows: running | done | lost | failed (NULL: done)
    spool TEXT,               -- a running exec's spool files (JSON), for crash recovery
    error TEXT                -- why finalizing failed / what recovery found
);
CREATE INDEX IF NOT EXISTS journal_ts ON journal(ts);
CREATE INDEX IF NOT EXISTS journal_principal ON journal(principal);
CREATE TABLE IF NOT EXISTS sessions (
    name TEXT PRIMARY KEY,
    cwd TEXT NOT NULL,        -- BLOB of the exact bytes (TEXT in shoal 0.1)
    env TEXT NOT NULL         -- BLOB of NUL-separated NAME=value (JSON TEXT in shoal 0.1)
);
CREATE INDEX IF NOT EXISTS journal_running ON journal(state) WHERE state = 'running';
CREATE TABLE IF NOT EXISTS session_overlays (  -- a sandboxed principal's own changes
    session TEXT NOT NULL,
    principal TEXT NOT NULL,
    cwd BLOB,                 -- NULL: the session's cwd
    sets BLOB NOT NULL,       -- NUL-separated NAME=value set on top of the session's env
    unsets BLOB NOT NULL,     -- NUL-separated names removed from it
    PRIMARY KEY (session, principal)
);
-- a search across runs in every session walks outputs newest first (values/find.py)
CREATE INDEX IF NOT EXISTS transcript_ts ON transcript(ts, session, n);
"""

MIGRATIONS = {
    "journal": (("state", "TEXT"), ("spool", "TEXT"), ("error", "TEXT")),
}
"""Columns added since shoal 0.1 (``ALTER TABLE … ADD COLUMN`` when missing)."""


_WAIT_MS = int(DB_WRITE_WAIT_S * 1000)


class _Connection(sqlite3.Connection):
    """A connection that remembers its busy timeout (``_set_busy``)."""

    busy_ms = _WAIT_MS


def _set_busy(conn: sqlite3.Connection, ms: int) -> None:
    """The owner loop's BEGINs run with no busy timeout (``WouldWait`` instead), and
    setting it costs a statement, so it is set only when it changes: to 0 by the loop's
    ``_begin``, back to ``_WAIT_MS`` when a thread that may wait leases the connection."""
    if getattr(conn, "busy_ms", _WAIT_MS) != ms:
        conn.execute(f"PRAGMA busy_timeout = {ms}")
        conn.busy_ms = ms  # type: ignore[attr-defined]  # a _Connection (Database._connect)


class StoreCorrupt(Exception):
    """The database fails its integrity check (or was truncated); the kernel refuses to start.

    The message names the file and the way out (``shoal doctor --repair``).
    """

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(
            f"database {path} is damaged ({reason}); the kernel will not use it. "
            f"Run `shoal doctor --repair` to move it aside and start a fresh one "
            f"(stored outputs in cas/ stay on disk)."
        )
        self.path = path
        self.reason = reason


class WriteQueue:
    """One writer at a time in this process, waiting here rather than in SQLite.

    SQLite's busy handler polls for a held write lock with sleeps of 1, 2, 5 … up to
    100 ms, and keeps sleeping after the lock is free.  Under load (32 facades) that was
    most of the kernel's tail: a transaction's BEGIN waited 12 ms at p90, 82 ms at p99,
    up to 456 ms, for locks held about 0.1 ms.  Here a writer wakes as soon as the one
    before it is done.  Re-entrant: a thread that writes again through another
    connection while it holds the turn gets SQLite's own busy answer, as before, instead
    of waiting on itself.  Other processes (the CLI's doctor) still meet the busy handler.
    Inside ``no_wait()`` (the owner loop) a turn held by another thread is ``WouldWait``.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()

    @contextmanager
    def turn(self, wait_s: float) -> Iterator[None]:
        """Hold the write turn; ``database is locked`` (SQLite's words) after ``wait_s``."""
        if not waits_allowed():
            take_now(self._lock)
        elif not self._lock.acquire(timeout=wait_s):
            raise sqlite3.OperationalError("database is locked")
        try:
            yield
        finally:
            self._lock.release()


class Database:
    """A bounded pool of connections to one SQLite file, leased per operation.

    A connection is leased by the calling thread for one ``transaction()`` or
    ``query()`` (re-entrant on that thread) and then returned to the pool, so the
    kernel's short-lived call and task threads never leave connections (and their file
    descriptors and page caches) behind. At most ``MAX_OPEN`` are open at once (a
    caller waits for a free one: leases last one statement or one short transaction,
    and SQLite has one writer anyway), which also bounds the db fds SQLite keeps open
    for reuse after a close while other connections hold locks on the file.

    Inside ``no_wait()`` (the owner loop, owner/nowait.py) nothing here waits: no free
    connection, the write turn held in this process or the write lock held by another
    process is ``WouldWait``, raised before anything was written. ``claim()`` takes the
    write lock ahead of a transaction that must not meet a wait once it is due (an
    exec's ``running`` row right after its spawn).
    """

    MAX_OPEN = 8

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.writers = WriteQueue()  # the one write turn: transactions and durable events
        self.housekeeper = Housekeeper()  # the store's chores no caller waits for
        # Created 0600 before SQLite opens it; its -wal/-shm files copy the mode.
        os.close(os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600))
        self._local = threading.local()
        self._idle: list[sqlite3.Connection] = []
        self._leased: set[sqlite3.Connection] = set()
        # Connections leased or being opened (at most MAX_OPEN).
        self._slots = TableSlots(self.MAX_OPEN)
        self._closed = False
        self._commits = itertools.count(1)  # next() is atomic: no lock for a heuristic
        with self.lease() as conn:
            self._check(conn)
            _migrate_before(conn)
            conn.executescript(SCHEMA)  # executescript manages its own transaction

    def _check(self, conn: sqlite3.Connection) -> None:
        """``PRAGMA quick_check`` at start: a damaged file is refused, never half used."""
        try:
            rows = conn.execute("PRAGMA quick_check").fetchall()
        except sqlite3.DatabaseError as exc:
            raise StoreCorrupt(self.path, str(exc)) from exc
        problems = [str(r[0]) for r in rows if str(r[0]) != "ok"]
        if problems:
            raise StoreCorrupt(self.path, "; ".join(problems[:3]))

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path,
            timeout=DB_WRITE_WAIT_S,
            isolation_level=None,
            check_same_thread=False,
            factory=_Connection,
        )
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA wal_autocheckpoint=0")  # the housekeeper's (_committed)
        except sqlite3.Error:
            conn.close()
            raise
        conn.row_factory = sqlite3.Row
        return conn

    def _committed(self) -> None:
        """Every ``WAL_CHECKPOINT_EVERY`` commits, a checkpoint on the housekeeper: it
        copies the log into the database file off every caller's path (a PASSIVE one:
        it never blocks a writer, and leaves for the next what readers still need)."""
        if next(self._commits) % WAL_CHECKPOINT_EVERY == 0:
            self.housekeeper.submit(self.checkpoint, _CHECKPOINT_KEY)

    def checkpoint(self) -> None:
        try:
            with self.lease() as conn:
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except (sqlite3.Error, WouldWait) as exc:
            log.debug("WAL checkpoint not done now: %s", exc)

    @contextmanager
    def lease(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection for the block: its current one when it has one (the
        block joins what it is doing, a transaction included), else one from the pool."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:  # nested use on the same thread shares the lease
            yield conn
            return
        with TABLES:
            if not self._slots.take_locked(None if waits_allowed() else 0):
                raise WouldWait()
            conn = self._idle.pop() if self._idle else None
            if conn is not None:
                self._leased.add(conn)
        if conn is None:
            try:
                conn = _translate(self._connect)
            except BaseException:
                self._slots.give_back()
                raise
            with TABLES:
                self._leased.add(conn)
        self._local.conn = conn
        try:
            if waits_allowed():  # the loop left it without a busy timeout (_begin)
                _set_busy(conn, _WAIT_MS)
            yield conn
        finally:
            self._local.conn = None
            with TABLES:
                self._leased.discard(conn)
                keep = not self._closed and not conn.in_transaction
                if keep:
                    self._idle.append(conn)
                    self._slots.give_back_locked()
            if not keep:
                conn.close()  # before its slot is free: MAX_OPEN bounds the open files
                self._slots.give_back()

    def conn(self) -> sqlite3.Connection:
        """The connection this thread currently leases (only inside an operation)."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            raise RuntimeError("Database.conn() outside transaction()/query()")
        return conn

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE … COMMIT, so read-modify-write sequences are atomic.

        A failed COMMIT (e.g. the disk is full) rolls back, so the connection goes back
        to the pool without a write lock; SQLITE_FULL becomes a clean -32603.
        """
        with self.lease() as conn, _locked_translated(), self.writers.turn(DB_WRITE_WAIT_S):
            if getattr(self._local, "claimed", None) is conn:
                self._local.claimed = None  # its BEGIN is the claim's
            else:
                self._begin(conn)
            try:
                yield conn
                _translate(conn.execute, "COMMIT")
            except BaseException as exc:
                if conn.in_transaction:
                    try:
                        conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                if _is_full(exc):  # an INSERT in the body hit the full disk
                    raise state_dir_full(str(exc)) from exc
                raise
            self._committed()

    @contextmanager
    def claim(self) -> Iterator[None]:
        """Inside ``no_wait()``: the write turn and lock taken now, for this thread's next
        ``transaction()`` in the block, or ``WouldWait``; unused, it is let go with
        nothing written. Outside ``no_wait()`` a no-op: that transaction waits its turn."""
        if waits_allowed():
            yield
            return
        with self.lease() as conn, self.writers.turn(DB_WRITE_WAIT_S):
            self._begin(conn)
            self._local.claimed = conn
            try:
                yield
            finally:
                self._local.claimed = None
                if conn.in_transaction:  # not used, or its transaction failed
                    conn.execute("ROLLBACK")

    def _begin(self, conn: sqlite3.Connection) -> None:
        """BEGIN IMMEDIATE: waiting for another process's write lock up to the busy
        timeout, or (inside ``no_wait()``) ``WouldWait`` at once."""
        if waits_allowed():
            _translate(conn.execute, "BEGIN IMMEDIATE")
            return
        _set_busy(conn, 0)  # left so until a thread that may wait leases it (lease)
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if _is_locked(exc):
                raise WouldWait() from exc
            _translate(_reraise, exc)

    def query(self, sql: str, params: tuple | list = ()) -> list[sqlite3.Row]:
        with self.lease() as conn:
            return _translate(lambda: conn.execute(sql, params).fetchall())

    def close(self) -> None:
        """Close the idle connections; a leased one closes when its lease ends.  The
        chores already handed to the housekeeper run first (for up to
        ``HOUSEKEEPER_EXIT_WAIT_S``).

        Closing a connection another thread is executing on crashes the interpreter
        (the sqlite3 module does not guard it), so leased connections are never
        closed from here — ``lease`` sees ``_closed`` and closes them on return.
        """
        self.housekeeper.close(HOUSEKEEPER_EXIT_WAIT_S)
        with TABLES:
            self._closed = True
            conns = list(self._idle)
            self._idle.clear()
        for conn in conns:
            try:
                conn.close()
            except sqlite3.Error:
                pass


def _migrate_before(conn: sqlite3.Connection) -> None:
    """Add the columns newer code needs to tables an older kernel created."""
    for table, columns in MIGRATIONS.items():
        have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
        if not have:
            continue  # a fresh database: SCHEMA creates it whole
        for name, decl in columns:
            if name not in have:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {decl}")


def check_not_truncated(path: Path, evidence: list[Path]) -> None:
    """Refuse an empty database file when the state dir shows it once held data.

    SQLite takes a zero-length file as a fresh, valid database; without this a truncated
    journal would silently start empty while ``cas/`` and the ref counter remember more.
    """
    try:
        if os.stat(path).st_size:
            return
    except FileNotFoundError:
        return  # never created, or moved aside by `shoal doctor --repair`: start fresh
    for place in evidence:
        if _holds_data(place):
            raise StoreCorrupt(path, f"the file is empty (0 bytes) but {place} holds earlier state")


def _holds_data(place: Path) -> bool:
    try:
        if place.is_dir():
            return any(place.iterdir())
        return place.stat().st_size > 0
    except OSError:
        return False


_SQLITE_FULL = 13


_SQLITE_BUSY = 5


def _translate(func, *args):
    """Run ``func``; a full disk (SQLITE_FULL) or a write lock held past the wait
    (SQLITE_BUSY) becomes RpcError -32603 with a reason, not "internal error"."""
    try:
        return func(*args)
    except sqlite3.OperationalError as exc:
        if _is_full(exc):
            raise state_dir_full(str(exc)) from exc
        if _is_locked(exc):
            raise state_db_locked(DB_WRITE_WAIT_S) from exc
        raise


def _reraise(exc: BaseException) -> None:
    raise exc


@contextmanager
def _locked_translated() -> Iterator[None]:
    """``_translate`` for a block: the write queue's own wait gives up in SQLite's words."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        if _is_locked(exc):
            raise state_db_locked(DB_WRITE_WAIT_S) from exc
        raise


def _is_locked(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and (
        getattr(exc, "sqlite_errorcode", None) == _SQLITE_BUSY or "database is locked" in str(exc)
    )


def _is_full(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and (
        getattr(exc, "sqlite_errorcode", None) == _SQLITE_FULL or "disk is full" in str(exc)
    )
