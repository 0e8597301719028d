"""The kernel's SQLite database (WAL): blobs, transcript, journal, session state.

One connection per thread (sqlite3 objects are not shared across threads); every
connection sets WAL and a busy timeout so readers never block the writer.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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
    kind TEXT NOT NULL,       -- exec | plan | apply
    effects TEXT NOT NULL,    -- JSON list of effect kinds+targets
    effect_kinds TEXT NOT NULL,  -- ",kind1,kind2," for SQL filtering
    status INTEGER,
    ok INTEGER,
    ref TEXT,
    outputs TEXT NOT NULL     -- JSON list of {kind, hash, len}
);
CREATE INDEX IF NOT EXISTS journal_ts ON journal(ts);
CREATE INDEX IF NOT EXISTS journal_principal ON journal(principal);
CREATE TABLE IF NOT EXISTS sessions (
    name TEXT PRIMARY KEY,
    cwd TEXT NOT NULL,
    env TEXT NOT NULL
);
"""


class Database:
    """Thread-local connections to one SQLite file."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        self.conn().executescript(SCHEMA)  # executescript manages its own transaction

    def conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.row_factory = sqlite3.Row
            self._local.conn = conn
            with self._all_lock:
                self._all.append(conn)
        return conn

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE … COMMIT, so read-modify-write sequences are atomic."""
        conn = self.conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def query(self, sql: str, params: tuple | list = ()) -> list[sqlite3.Row]:
        return self.conn().execute(sql, params).fetchall()

    def close(self) -> None:
        with self._all_lock:
            for conn in self._all:
                try:
                    conn.close()
                except sqlite3.Error:
                    pass
            self._all.clear()
