"""The journal: one SQLite row per exec/plan/apply, queried with filters in SQL.

The `journal.query` method is in docs/protocol.md, Kernel methods.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from ...protocol.limits import JOURNAL_ERROR_MAX_CHARS
from ...protocol.wiretext import text_or_bytes, to_wire
from .db import Database

JOURNAL_QUERY_MAX = 1000
JOURNAL_QUERY_DEFAULT = 50

RUNNING = "running"
DONE = "done"
LOST = "lost"
FAILED = "failed"
"""An exec row's ``state``: spawned; finished and stored; the kernel died while it ran
(what it had spooled is kept as a partial output); finalizing failed (``error`` says why)."""


@dataclass
class JournalEntry:
    session: str
    principal: str
    cwd: str
    src: str
    kind: str = "exec"
    effects: list[dict] = field(default_factory=list)
    status: int | None = None
    ok: bool | None = None
    ref: str | None = None
    outputs: list[dict] = field(default_factory=list)
    duration_ms: float | None = None
    ts: float = field(default_factory=time.time)
    state: str | None = None
    error: str | None = None


def command_head(src: str) -> str:
    """The first command word of ``src`` (skipping assignments), for filtering."""
    for token in src.strip().split():
        if (
            "=" in token
            and not token.startswith(("=", "-"))
            and token.split("=", 1)[0].isidentifier()
        ):
            continue
        return token.strip("();{}&|")[:128]
    return ""


class Journal:
    def __init__(self, db: Database) -> None:
        self.db = db

    def record(self, entry: JournalEntry) -> dict:
        with self.db.transaction() as conn:
            row_id = self.insert_in(conn, entry)
        return self.get(row_id)

    def insert_in(
        self,
        conn: sqlite3.Connection,
        entry: JournalEntry,
        state: str | None = None,
        spool: dict | None = None,
    ) -> int:
        """Insert ``entry`` inside the caller's transaction; its row id."""
        kinds = sorted({e.get("kind", "") for e in entry.effects})
        cur = conn.execute(
            """INSERT INTO journal(ts, duration_ms, session, principal, cwd, src, head, kind,
               effects, effect_kinds, status, ok, ref, outputs, state, spool)
               VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)""",
            (
                entry.ts,
                entry.duration_ms,
                entry.session,
                entry.principal,
                text_or_bytes(entry.cwd),
                entry.src,
                command_head(entry.src),
                entry.kind,
                orjson.dumps(to_wire(entry.effects)).decode(),
                "," + ",".join(kinds) + ",",
                entry.status,
                None if entry.ok is None else int(entry.ok),
                entry.ref,
                orjson.dumps(entry.outputs).decode(),
                state,
                None if spool is None else orjson.dumps(spool).decode(),
            ),
        )
        assert cur.lastrowid is not None
        return cur.lastrowid

    # -- an exec's two rows: ``running`` at its start, its end (docs/decisions.md) ------

    def begin(self, entry: JournalEntry, spool: dict) -> int:
        """The ``running`` row of an exec just spawned (its spool files, for recovery)."""
        with self.db.transaction() as conn:
            return self.insert_in(conn, entry, state=RUNNING, spool=spool)

    def finish_in(self, conn: sqlite3.Connection, row_id: int | None, entry: JournalEntry) -> int:
        """The exec's end, inside the finalize transaction: its running row becomes ``done``
        (a row is inserted when there was none)."""
        if row_id is None:
            return self.insert_in(conn, entry, state=DONE)
        conn.execute(
            """UPDATE journal SET duration_ms = ?, status = ?, ok = ?, ref = ?, outputs = ?,
               state = ?, spool = NULL, error = ? WHERE id = ?""",
            (
                entry.duration_ms,
                entry.status,
                None if entry.ok is None else int(entry.ok),
                entry.ref,
                orjson.dumps(entry.outputs).decode(),
                entry.state or DONE,
                entry.error,
                row_id,
            ),
        )
        return row_id

    def fail(self, row_id: int | None, error: str, duration_ms: float | None = None) -> None:
        """Finalizing failed: the row says so (``failed``, ok false, the reason); best effort."""
        if row_id is None:
            return
        with self.db.transaction() as conn:
            conn.execute(
                "UPDATE journal SET state = ?, ok = 0, error = ?, duration_ms = ?, spool = NULL "
                "WHERE id = ?",
                (FAILED, error[:JOURNAL_ERROR_MAX_CHARS], duration_ms, row_id),
            )

    def running_rows(self) -> list[sqlite3.Row]:
        """Rows left ``running`` by a kernel that did not finish them (a crash)."""
        return self.db.query("SELECT * FROM journal WHERE state = ?", (RUNNING,))

    def get(self, row_id: int) -> dict:
        rows = self.db.query("SELECT * FROM journal WHERE id = ?", (row_id,))
        return _row(rows[0])

    def query(
        self,
        *,
        since: float | None = None,
        until: float | None = None,
        principal: str | None = None,
        head: str | None = None,
        ok: bool | None = None,
        effects: list[str] | None = None,
        session: str | None = None,
        limit: int = JOURNAL_QUERY_DEFAULT,
        visible_to: str | None = None,
    ) -> list[dict]:
        """Newest-first rows matching every filter; ``limit`` applies after filtering.

        ``visible_to`` restricts to one principal's rows (policy ``journal_read = own``).
        """
        where: list[str] = []
        args: list[Any] = []
        # ts is REAL: bind floats, so a JSON integer past 64 bits cannot overflow SQLite.
        if since is not None:
            where.append("ts >= ?")
            args.append(float(since))
        if until is not None:
            where.append("ts <= ?")
            args.append(float(until))
        if principal is not None:
            where.append("principal = ?")
            args.append(principal)
        if visible_to is not None:
            where.append("principal = ?")
            args.append(visible_to)
        if head is not None:
            where.append("head = ?")
            args.append(head)
        if ok is not None:
            where.append("ok = ?")
            args.append(int(ok))
        if session is not None:
            where.append("session = ?")
            args.append(session)
        for kind in effects or ():
            where.append("effect_kinds LIKE ?")
            args.append(f"%,{kind},%")
        sql = "SELECT * FROM journal"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT ?"
        args.append(max(1, min(limit, JOURNAL_QUERY_MAX)))
        return [_row(r) for r in self.db.query(sql, args)]


def _row(r) -> dict:
    out = {
        "id": r["id"],
        "ts": r["ts"],
        "duration_ms": r["duration_ms"],
        "session": r["session"],
        "principal": r["principal"],
        "cwd": r["cwd"],
        "src": r["src"],
        "head": r["head"],
        "kind": r["kind"],
        "effects": orjson.loads(r["effects"]),
        "status": r["status"],
        "ok": None if r["ok"] is None else bool(r["ok"]),
        "ref": r["ref"],
        "outputs": orjson.loads(r["outputs"]),
        "state": r["state"],
        "error": r["error"],
    }
    return {k: v for k, v in out.items() if v is not None}
