"""How clients find the one kernel of a state dir, and how sessions are named by project.

docs/configuration.md, "Discovery" and "Sessions". A running kernel holds an ``flock``
on ``<state>/kernel.lock`` for its whole life and describes itself in
``<state>/kernel.json`` (``{pid, socket, version, started}``). A client that was given
no socket reads the record and believes it only when the process at the recorded socket
is the recorded pid: a record left by a killed kernel names a socket nobody serves.
(Clients never probe the lock itself: a probe could make a starting kernel think it
lost the start race.)
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import orjson

KERNEL_LOCK = "kernel.lock"
KERNEL_RECORD = "kernel.json"
SESSION_HASH_HEX = 6
SESSION_BASE_MAX = 40
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def lock_path(state: Path) -> Path:
    return Path(state) / KERNEL_LOCK


def record_path(state: Path) -> Path:
    return Path(state) / KERNEL_RECORD


def read_record(state: Path) -> dict[str, Any] | None:
    """``kernel.json`` of the state dir, or None when absent or unreadable."""
    try:
        data = orjson.loads(record_path(state).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("socket"), str):
        return None
    return data


def pid_alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def live_record(state: Path) -> dict[str, Any] | None:
    """The record of a kernel whose process is still alive, else None.

    Clients then connect to its socket and believe it only if the peer there is that
    very pid (``SO_PEERCRED``), which a stale record or a reused pid cannot fake.
    """
    record = read_record(state)
    if record is None or not pid_alive(record.get("pid")):
        return None
    return record


def write_record(state: Path, record: dict[str, Any]) -> None:
    """Write ``kernel.json`` ``0600`` atomically (a reader never sees half a record)."""
    final = record_path(state)
    tmp = final.with_name(f".{KERNEL_RECORD}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, orjson.dumps(record, option=orjson.OPT_INDENT_2))
    finally:
        os.close(fd)
    os.replace(tmp, final)


def remove_record(state: Path, pid: int) -> None:
    """Remove ``kernel.json`` if it is still ``pid``'s (a successor's stays)."""
    record = read_record(state)
    if record is not None and record.get("pid") == pid:
        record_path(state).unlink(missing_ok=True)


def project_session(cwd: str) -> str:
    """The session name of a working directory: its base name plus a hash of the path.

    ``/home/ann/projB`` → ``projB-3f9a1c``: readable in listings, and two directories
    with the same base name (``~/a/app``, ``~/b/app``) still get different sessions.
    """
    real = os.path.realpath(cwd)
    base = _UNSAFE.sub("-", os.path.basename(real)).strip("-.") or "root"
    digest = hashlib.blake2b(os.fsencode(real), digest_size=8).hexdigest()
    return f"{base[:SESSION_BASE_MAX]}-{digest[:SESSION_HASH_HEX]}"


def project_root(cwd: str, home: str | None = None) -> str | None:
    """The project a directory belongs to, for a sandboxed agent's write grant: the git
    work tree holding ``cwd`` (its top, where ``.git`` is), else ``cwd`` itself.

    None when that would be ``/``, ``$HOME`` or an ancestor of ``$HOME``: an agent
    started in the home directory must not get all of it to write.
    """
    real = os.path.realpath(cwd)
    top = real
    for d in (real, *(str(p) for p in Path(real).parents)):
        if os.path.lexists(os.path.join(d, ".git")):
            top = d
            break
    home_real = os.path.realpath(home or os.path.expanduser("~"))
    if top == "/" or home_real == top or home_real.startswith(top.rstrip("/") + "/"):
        return None
    return top
