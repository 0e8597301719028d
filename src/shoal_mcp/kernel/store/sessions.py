"""Named sessions: live cwd and exported environment, persisted in SQLite.

A session changes only by a *delta* (``StateDelta``: what one exec changed relative to
the state it started from), applied under the session's lock, so concurrent execs never
undo each other (docs/decisions.md, Session state). Paths and values are bytes-clean:
in memory they are ``surrogateescape`` strings, on disk a BLOB of the exact bytes.
"""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

import orjson

from ...protocol.wiretext import from_bytes, to_bytes
from .db import Database
from .envlimits import repaired_env

# Variables bash maintains itself (or, PS1/PS2, unsets in every non-interactive shell),
# and SHOAL_OUT (set per exec);
# capturing them would drift on every exec.
VOLATILE_ENV = frozenset({"_", "SHLVL", "OLDPWD", "PWD", "PS1", "PS2", "SHOAL_OUT"})
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class StateDelta:
    """What one exec changed: a new cwd (or None), variables set, variables unset."""

    cwd: str | None = None
    set: Mapping[str, str] = field(default_factory=dict)
    unset: frozenset[str] = frozenset()

    @property
    def empty(self) -> bool:
        return self.cwd is None and not self.set and not self.unset

    def applied_to(self, cwd: str, env: Mapping[str, str]) -> tuple[str, dict[str, str]]:
        new_env = {k: v for k, v in env.items() if k not in self.unset}
        new_env.update(self.set)
        return (self.cwd if self.cwd is not None else cwd), new_env


def diff(
    start_cwd: str, start_env: Mapping[str, str], end_cwd: str, end_env: Mapping[str, str]
) -> StateDelta:
    """The delta from (start_cwd, start_env) to what an exec reported at its end."""
    changed = {k: v for k, v in end_env.items() if k not in VOLATILE_ENV and start_env.get(k) != v}
    # Bash never lists (``compgen -e``) names that are not identifiers (``A-B``, exported
    # functions' ``BASH_FUNC_f%%``) and cannot unset them: their absence is not an unset.
    gone = frozenset(
        k
        for k in start_env
        if k not in end_env and k not in VOLATILE_ENV and _IDENTIFIER.fullmatch(k)
    )
    return StateDelta(end_cwd if end_cwd != start_cwd else None, changed, gone)


@dataclass
class Session:
    name: str
    cwd: str
    env: dict[str, str]
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    warnings: list[str] = field(default_factory=list, repr=False)
    """Said once, in the next exec's outcome (e.g. the cwd vanished)."""
    _hashed: tuple[dict[str, str], str] | None = field(default=None, repr=False)
    """``env`` and its digest: every exec's gate asks for it, and ``env`` is only ever
    replaced whole (``SessionTable.adopt``), never changed in place."""

    def env_hash(self) -> str:
        with self.lock:
            return self._env_hash_locked()

    def _env_hash_locked(self) -> str:
        # Holding the dict itself (not its id) means a new env can never pass for it.
        if self._hashed is None or self._hashed[0] is not self.env:
            self._hashed = (self.env, env_digest(self.env))
        return self._hashed[1]

    def snapshot(self) -> tuple[str, dict[str, str]]:
        with self.lock:
            return self.cwd, dict(self.env)

    def state(self) -> tuple[str, dict[str, str], str]:
        """``snapshot`` and the env's digest, as of one moment."""
        with self.lock:
            return self.cwd, dict(self.env), self._env_hash_locked()

    def take_warnings(self) -> list[str]:
        with self.lock:
            out, self.warnings = self.warnings, []
            return out


def env_digest(env: Mapping[str, str]) -> str:
    """The env hash ``session.attach``/``session.env`` report; bytes-clean (a value that is
    not UTF-8 hashes by its exact bytes), so it never fails the way JSON encoding would."""
    return hashlib.blake2b(encode_env(env), digest_size=8).hexdigest()


def encode_env(env: Mapping[str, str]) -> bytes:
    """``NAME=value\\0`` per variable, sorted, exact bytes (the stored form)."""
    return b"".join(to_bytes(k) + b"=" + to_bytes(v) + b"\0" for k, v in sorted(env.items()))


def decode_env(raw: bytes | str) -> dict[str, str]:
    """The stored env: NUL-separated bytes, or the JSON text of shoal 0.1."""
    if isinstance(raw, str):
        return orjson.loads(raw)
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep:
            env[from_bytes(name)] = from_bytes(value)
    return env


def decode_cwd(raw: bytes | str) -> str:
    return raw if isinstance(raw, str) else from_bytes(raw)


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
                # A session stored before exports were bounded may hold an env no program
                # can start with: repaired here, said in its next outcome (envlimits.py).
                env, repaired = repaired_env(decode_env(rows[0]["env"]))
                session = Session(name, decode_cwd(rows[0]["cwd"]), env, warnings=repaired)
            else:
                start = cwd if cwd and os.path.isdir(cwd) else os.path.expanduser("~")
                session = Session(name, start, dict(self._base_env))
                with self.db.transaction() as conn:
                    self.save_in(conn, name, session.cwd, session.env)
            self._sessions[name] = session
            return session

    def get(self, name: str) -> Session | None:
        with self._lock:
            return self._sessions.get(name)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._sessions)

    def apply(self, session: Session, cwd: str, env: dict[str, str]) -> None:
        """Adopt ``cwd`` and ``env`` whole (volatile names excepted): the delta from now."""
        with session.lock:
            delta = diff(session.cwd, session.env, cwd, env)
            with self.db.transaction() as conn:
                new = self.stage(conn, session, delta)
            self.adopt(session, new)

    def stage(
        self, conn: sqlite3.Connection, session: Session, delta: StateDelta
    ) -> tuple[str, dict[str, str]]:
        """Write ``session`` with ``delta`` applied inside the caller's transaction; the
        new state, for ``adopt`` once that transaction committed. Hold ``session.lock``
        from here to ``adopt``: that is what serialises deltas per session."""
        new_cwd, new_env = delta.applied_to(session.cwd, session.env)
        self.save_in(conn, session.name, new_cwd, new_env)
        return new_cwd, new_env

    @staticmethod
    def adopt(session: Session, state: tuple[str, dict[str, str]]) -> None:
        with session.lock:
            session.cwd, session.env = state[0], state[1]

    def set_cwd(self, session: Session, cwd: str, warning: str) -> None:
        """Move ``session`` to ``cwd`` (its own vanished), warning in the next outcome."""
        with session.lock:
            with self.db.transaction() as conn:
                new = self.stage(conn, session, StateDelta(cwd=cwd))
            self.adopt(session, new)
            session.warnings.append(warning)

    @staticmethod
    def save_in(conn: sqlite3.Connection, name: str, cwd: str, env: Mapping[str, str]) -> None:
        conn.execute(
            "INSERT OR REPLACE INTO sessions(name, cwd, env) VALUES (?,?,?)",
            (name, to_bytes(cwd), encode_env(env)),
        )
