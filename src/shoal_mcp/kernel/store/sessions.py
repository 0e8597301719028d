"""Named sessions: live cwd and exported environment, persisted in SQLite.

A session changes only by a *delta* (``StateDelta``: what one exec changed relative to
the state it started from), applied under the session's lock, so concurrent execs never
undo each other (docs/decisions.md, Session state). Paths and values are bytes-clean:
in memory they are ``surrogateescape`` strings, on disk a BLOB of the exact bytes.

A sandboxed principal's deltas do not change the session for the others: they go to
its own *overlay* (one ``StateDelta`` per principal, composed with each new delta), and
that principal sees the session through it.  So an agent's ``cd`` into its temp dir or
``export GIT_CONFIG_…`` never reaches the human's next command in the same session; the
human sees overlays (``kernel.status``) and takes one over with ``session.adopt``.
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
from ..owner.tables import TABLES
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

    def then(self, later: StateDelta) -> StateDelta:
        """This delta followed by ``later``, as one delta."""
        sets = {k: v for k, v in self.set.items() if k not in later.unset}
        sets.update(later.set)
        unset = frozenset((self.unset | later.unset) - set(later.set))
        return StateDelta(later.cwd if later.cwd is not None else self.cwd, sets, unset)

    def to_row(self) -> tuple[bytes | None, bytes, bytes]:
        """(cwd, set, unset) as stored: exact bytes, NUL-separated."""
        return (
            None if self.cwd is None else to_bytes(self.cwd),
            encode_env(self.set),
            b"".join(to_bytes(k) + b"\0" for k in sorted(self.unset)),
        )

    @classmethod
    def from_row(cls, cwd: bytes | None, sets: bytes, unset: bytes) -> StateDelta:
        names = frozenset(from_bytes(k) for k in unset.split(b"\0") if k)
        return cls(None if cwd is None else decode_cwd(cwd), decode_env(sets), names)


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


@dataclass(frozen=True)
class Staged:
    """A session change written in a transaction, applied in memory by ``adopt`` once it
    committed: the session's new (cwd, env), or a principal's new overlay."""

    state: tuple[str, dict[str, str]] | None = None
    principal: str | None = None
    overlay: StateDelta | None = None


@dataclass
class Session:
    name: str
    cwd: str
    env: dict[str, str]
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    warnings: list[str] = field(default_factory=list, repr=False)
    """Said once, in the next exec's outcome (e.g. the cwd vanished)."""
    project: tuple[str, ...] = ()
    """The project's root directories, as the last attaching MCP client gave them (its
    roots, else the git work tree it started in): a ``{project}`` grant's directories."""
    _hashed: tuple[dict[str, str], str] | None = field(default=None, repr=False)
    """``env`` and its digest: every exec's gate asks for it, and ``env`` is only ever
    replaced whole (``SessionTable.adopt``), never changed in place."""
    overlays: dict[str, StateDelta] = field(default_factory=dict, repr=False)
    """Sandboxed principals' own changes (the module docstring), by principal."""

    def env_hash(self, principal: str | None = None) -> str:
        with self.lock:
            if principal in self.overlays:
                return env_digest(self._view(principal)[1])
            return self._env_hash_locked()

    def _view(self, principal: str | None) -> tuple[str, dict[str, str]]:
        """The state ``principal`` sees (caller holds the lock)."""
        overlay = self.overlays.get(principal) if principal is not None else None
        if overlay is None:
            return self.cwd, dict(self.env)
        return overlay.applied_to(self.cwd, self.env)

    def _env_hash_locked(self) -> str:
        # Holding the dict itself (not its id) means a new env can never pass for it.
        if self._hashed is None or self._hashed[0] is not self.env:
            self._hashed = (self.env, env_digest(self.env))
        return self._hashed[1]

    def snapshot(self, principal: str | None = None) -> tuple[str, dict[str, str]]:
        """(cwd, env) as ``principal`` sees them (through its overlay, if it has one)."""
        with self.lock:
            return self._view(principal)

    def state(self, principal: str | None = None) -> tuple[str, dict[str, str], str]:
        """``snapshot`` and the env's digest, as of one moment."""
        with self.lock:
            if principal in self.overlays:
                cwd, env = self._view(principal)
                return cwd, env, env_digest(env)
            return self.cwd, dict(self.env), self._env_hash_locked()

    def overlay_summary(self) -> list[dict[str, object]]:
        """What each sandboxed principal changed for itself only (``kernel.status``)."""
        with self.lock:
            return [
                {
                    "principal": p,
                    "cwd": o.cwd,
                    "set": sorted(o.set),
                    "unset": sorted(o.unset),
                }
                for p, o in sorted(self.overlays.items())
            ]

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
        self._sessions: dict[str, Session] = {}  # a kernel table (TABLES)
        self._base_env = {
            k: v for k, v in (base_env or dict(os.environ)).items() if k not in VOLATILE_ENV
        }

    def get_or_create(self, name: str, cwd: str | None = None) -> Session:
        # A loaded session is never dropped, so finding one is one table read. Loading
        # takes no lock across the database: two threads that load the same session at
        # once both read it and the table keeps the first copy; two that create it meet
        # in the write transaction, where the second finds the first's row and loads it.
        with TABLES:
            session = self._sessions.get(name)
        if session is not None:
            return session
        query = "SELECT cwd, env FROM sessions WHERE name = ?"
        rows = self.db.query(query, (name,))
        if not rows:
            with self.db.transaction() as conn:
                rows = conn.execute(query, (name,)).fetchall()
                if not rows:
                    start = cwd if cwd and os.path.isdir(cwd) else os.path.expanduser("~")
                    session = Session(name, start, dict(self._base_env))
                    self.save_in(conn, name, session.cwd, session.env)
        if session is None:
            session = self._load(name, rows[0])
        with TABLES:
            return self._sessions.setdefault(name, session)

    def _load(self, name: str, row: sqlite3.Row) -> Session:
        """The stored session ``name`` from its ``sessions`` row and its overlays."""
        # A session stored before exports were bounded may hold an env no program can
        # start with: repaired here, said in its next outcome (envlimits.py).
        env, repaired = repaired_env(decode_env(row["env"]))
        session = Session(name, decode_cwd(row["cwd"]), env, warnings=repaired)
        for overlay in self.db.query(
            "SELECT principal, cwd, sets, unsets FROM session_overlays WHERE session = ?",
            (name,),
        ):
            session.overlays[overlay["principal"]] = StateDelta.from_row(
                overlay["cwd"], overlay["sets"], overlay["unsets"]
            )
        return session

    def get(self, name: str) -> Session | None:
        """The loaded session ``name``, if it is."""
        with TABLES:
            return self._sessions.get(name)

    def names(self) -> list[str]:
        with TABLES:
            return sorted(self._sessions)

    def overlays(self) -> dict[str, list[dict[str, object]]]:
        """Each loaded session's overlays (``Session.overlay_summary``), where it has any."""
        with TABLES:
            sessions = list(self._sessions.values())
        return {s.name: o for s in sessions if (o := s.overlay_summary())}

    def apply(self, session: Session, cwd: str, env: dict[str, str]) -> None:
        """Adopt ``cwd`` and ``env`` whole (volatile names excepted): the delta from now."""
        with session.lock:
            delta = diff(session.cwd, session.env, cwd, env)
            with self.db.transaction() as conn:
                new = self.stage(conn, session, delta)
            self.adopt(session, new)

    def stage(
        self,
        conn: sqlite3.Connection,
        session: Session,
        delta: StateDelta,
        principal: str | None = None,
    ) -> Staged:
        """Write ``session`` with ``delta`` applied inside the caller's transaction; the
        new state, for ``adopt`` once that transaction committed. Hold ``session.lock``
        from here to ``adopt``: that is what serialises deltas per session.

        ``principal``: a sandboxed principal's delta, which goes to its overlay only."""
        if principal is not None:
            overlay = session.overlays.get(principal, StateDelta()).then(delta)
            conn.execute(
                "INSERT OR REPLACE INTO session_overlays(session, principal, cwd, sets, unsets)"
                " VALUES (?,?,?,?,?)",
                (session.name, principal, *overlay.to_row()),
            )
            return Staged(principal=principal, overlay=overlay)
        new_cwd, new_env = delta.applied_to(session.cwd, session.env)
        self.save_in(conn, session.name, new_cwd, new_env)
        return Staged(state=(new_cwd, new_env))

    @staticmethod
    def adopt(session: Session, staged: Staged | tuple[str, dict[str, str]]) -> None:
        with session.lock:
            if isinstance(staged, tuple):
                staged = Staged(state=staged)
            if staged.principal is not None:
                assert staged.overlay is not None
                session.overlays[staged.principal] = staged.overlay
            elif staged.state is not None:
                session.cwd, session.env = staged.state

    def take_over(self, session: Session, principal: str) -> StateDelta | None:
        """Apply ``principal``'s overlay to the session for everyone, and drop it
        (``session.adopt``: a human's explicit choice); the overlay, or None."""
        with session.lock:
            overlay = session.overlays.get(principal)
            if overlay is None:
                return None
            with self.db.transaction() as conn:
                staged = self.stage(conn, session, overlay)
                conn.execute(
                    "DELETE FROM session_overlays WHERE session = ? AND principal = ?",
                    (session.name, principal),
                )
            self.adopt(session, staged)
            del session.overlays[principal]
            return overlay

    def set_cwd(
        self, session: Session, cwd: str, warning: str, principal: str | None = None
    ) -> None:
        """Move ``session`` (or ``principal``'s overlay) to ``cwd`` (its own vanished),
        warning in the next outcome."""
        with session.lock:
            with self.db.transaction() as conn:
                new = self.stage(conn, session, StateDelta(cwd=cwd), principal)
            self.adopt(session, new)
            session.warnings.append(warning)

    @staticmethod
    def save_in(conn: sqlite3.Connection, name: str, cwd: str, env: Mapping[str, str]) -> None:
        conn.execute(
            "INSERT OR REPLACE INTO sessions(name, cwd, env) VALUES (?,?,?)",
            (name, to_bytes(cwd), encode_env(env)),
        )
