"""The journal: one SQLite row per exec/plan/apply, queried with filters in SQL.

The `journal.query` method is in docs/protocol.md, Kernel methods.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from .db import Database

JOURNAL_QUERY_MAX = 1000
JOURNAL_QUERY_DEFAULT = 50


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
        kinds = sorted({e.get("kind", "") for e in entry.effects})
        with self.db.transaction() as conn:
            cur = conn.execute(
                """INSERT INTO journal(ts, duration_ms, session, principal, cwd, src, head, kind,
                   effects, effect_kinds, status, ok, ref, outputs)
                   VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)""",
                (
                    entry.ts,
                    entry.duration_ms,
                    entry.session,
                    entry.principal,
                    entry.cwd,
                    entry.src,
                    command_head(entry.src),
                    entry.kind,
                    orjson.dumps(entry.effects).decode(),
                    "," + ",".join(kinds) + ",",
                    entry.status,
                    None if entry.ok is None else int(entry.ok),
                    entry.ref,
                    orjson.dumps(entry.outputs).decode(),
                ),
            )
            row_id = cur.lastrowid
        assert row_id is not None  # an INSERT always sets it
        return self.get(row_id)

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
    }
    return {k: v for k, v in out.items() if v is not None}
