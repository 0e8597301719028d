"""Named sessions: live cwd and exported environment, persisted in SQLite."""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass, field

import orjson

from .db import Database

# Variables bash maintains itself; capturing them would drift on every exec.
VOLATILE_ENV = frozenset({"_", "SHLVL", "OLDPWD", "PWD", "SHOAL_OUT"})  # SHOAL_OUT: per exec


@dataclass
class Session:
    name: str
    cwd: str
    env: dict[str, str]
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def env_hash(self) -> str:
        blob = orjson.dumps(self.env, option=orjson.OPT_SORT_KEYS)
        return hashlib.blake2b(blob, digest_size=8).hexdigest()

    def snapshot(self) -> tuple[str, dict[str, str]]:
        with self.lock:
            return self.cwd, dict(self.env)


class SessionTable:
    def __init__(self, db: Database, base_env: dict[str, str] | None = None) -> None:
        self.db = db
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._base_env = {
            k: v for k, v in (base_env or dict(os.environ)).items() if k not in VOLATILE_ENV
        }

    def get_or_create(self, name: str, cwd: str | None = None) -> Session:
        with self._lock:
            session = self._sessions.get(name)
            if session is not None:
                return session
            rows = self.db.query("SELECT cwd, env FROM sessions WHERE name = ?", (name,))
            if rows:
                session = Session(name, rows[0]["cwd"], orjson.loads(rows[0]["env"]))
            else:
                start = cwd if cwd and os.path.isdir(cwd) else os.path.expanduser("~")
                session = Session(name, start, dict(self._base_env))
                self._save(session)
            self._sessions[name] = session
            return session

    def get(self, name: str) -> Session | None:
        with self._lock:
            return self._sessions.get(name)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._sessions)

    def apply(self, session: Session, cwd: str, env: dict[str, str]) -> None:
        """Adopt the cwd and exported env a foreground exec left behind."""
        with session.lock:
            session.cwd = cwd
            kept = {k: v for k, v in session.env.items() if k in VOLATILE_ENV}
            session.env = {**{k: v for k, v in env.items() if k not in VOLATILE_ENV}, **kept}
        self._save(session)

    def _save(self, session: Session) -> None:
        with self.db.transaction() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO sessions(name, cwd, env) VALUES (?,?,?)",
                (session.name, session.cwd, orjson.dumps(session.env).decode()),
            )
