"""The egress journal: one row per connection attempt, with the exec it belongs to.

Rows live in the kernel's database (table ``egress``, created here, beside the
``journal``): when, principal, session, ``exec_id`` (the journal row of the exec the
connection was attributed to, or NULL), host, port, the address used, allowed or
refused, why, bytes each way.  Refusals are also kept in memory, a few per principal
(:data:`~.limits.REFUSALS_KEPT`), for the failed exec's ``sandbox_denied``.
"""

from __future__ import annotations

import collections
import functools
import time
from dataclasses import dataclass
from typing import Any

from ..owner.tables import TABLES
from .limits import REFUSALS_KEPT

SCHEMA = """
CREATE TABLE IF NOT EXISTS egress (
  id INTEGER PRIMARY KEY,
  ts REAL NOT NULL,
  principal TEXT NOT NULL,
  session TEXT NOT NULL,
  exec_id INTEGER,
  ambiguous INTEGER NOT NULL DEFAULT 0,
  host TEXT NOT NULL,
  port INTEGER NOT NULL,
  address TEXT,
  protocol TEXT NOT NULL,
  allowed INTEGER NOT NULL,
  why TEXT NOT NULL,
  bytes_up INTEGER NOT NULL DEFAULT 0,
  bytes_down INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS egress_exec ON egress(exec_id);
"""
_COLUMNS = (
    "ts", "principal", "session", "exec_id", "ambiguous", "host", "port", "address",
    "protocol", "allowed", "why", "bytes_up", "bytes_down",
)  # fmt: skip


@dataclass
class Attempt:
    """One connection attempt as the proxy saw it (a row of ``egress``)."""

    principal: str
    session: str
    exec_id: int | None
    ambiguous: bool
    host: str
    port: int
    protocol: str
    allowed: bool = False
    why: str = ""
    address: str | None = None
    bytes_up: int = 0
    bytes_down: int = 0
    ts: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {c: getattr(self, c) for c in _COLUMNS}


class EgressLog:
    """Writes attempts to the database (any thread) and remembers recent refusals."""

    def __init__(self, db: Any) -> None:
        self.db = db
        with db.transaction() as conn:
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
        self._refused: dict[int, collections.deque[Attempt]] = {}
        self._order: collections.deque[int] = collections.deque()

    def record(self, attempt: Attempt) -> None:
        """Remember a refusal (at once, for the exec's reply) and write the row."""
        self.remember(attempt)
        self.write(attempt)

    def write_later(self, attempt: Attempt) -> None:
        """The row written on the store's housekeeping thread, after the chores already
        given to it: the proxy's loop never waits for the database (an exiting kernel
        writes what was given before it closes the database)."""
        self.db.housekeeper.submit(functools.partial(self.write, attempt))

    def write(self, attempt: Attempt) -> None:
        attempt.ts = attempt.ts or time.time()
        row = attempt.to_dict()
        row["allowed"], row["ambiguous"] = int(attempt.allowed), int(attempt.ambiguous)
        with self.db.transaction() as conn:
            conn.execute(
                f"INSERT INTO egress ({', '.join(_COLUMNS)}) "
                f"VALUES ({', '.join('?' * len(_COLUMNS))})",
                [row[c] for c in _COLUMNS],
            )

    def remember(self, attempt: Attempt) -> None:
        """A refusal attributed to an exec, kept for its ``sandbox_denied``."""
        if attempt.allowed or attempt.exec_id is None:
            return
        with TABLES:
            kept = self._refused.get(attempt.exec_id)
            if kept is None:
                kept = self._refused[attempt.exec_id] = collections.deque(maxlen=REFUSALS_KEPT)
                self._order.append(attempt.exec_id)
                while len(self._order) > REFUSALS_KEPT:
                    self._refused.pop(self._order.popleft(), None)
            kept.append(attempt)

    def refused(self, exec_id: int | None) -> list[Attempt]:
        """The refusals attributed to this exec (most recent last)."""
        if exec_id is None:
            return []
        with TABLES:
            return list(self._refused.get(exec_id, ()))

    def query(
        self, *, exec_id: int | None = None, principal: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """Rows, newest first, by exec and/or principal."""
        where: list[str] = []
        params: list[object] = []
        if exec_id is not None:
            where.append("exec_id = ?")
            params.append(exec_id)
        if principal is not None:
            where.append("principal = ?")
            params.append(principal)
        sql = "SELECT id, " + ", ".join(_COLUMNS) + " FROM egress"
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = self.db.query(sql + " ORDER BY id DESC LIMIT ?", (*params, limit))
        out = []
        for r in rows:
            d = dict(r)
            d["allowed"], d["ambiguous"] = bool(d["allowed"]), bool(d["ambiguous"])
            out.append(d)
        return out
