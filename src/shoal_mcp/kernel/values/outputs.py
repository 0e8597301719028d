"""``$SHOAL_OUT``: a caller's earlier outputs as read-only files (docs/protocol.md, Exec).

``<state>/outputs/<principal key>/<session key>/<n>/out`` and ``/err`` are hard links to
the CAS blobs of ``out:N`` (copies when the kernel runs as root, whose writes ignore
file modes), made when an exec of that principal starts (only for the
values it owns in that session). Files and directories are read-only (0444 / 0555) so a
stray redirection cannot corrupt a stored blob; the directory holds nothing but that
principal's own outputs, so a sandbox may grant read on ``principal_dir`` without
exposing the CAS or anyone else's outputs (``principal_dir`` is the function the
sandbox rules call).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import orjson

from ...protocol.errors import is_disk_full, state_dir_full
from ..store.cas import ContentStore
from ..store.db import Database
from .resolver import blob_hashes, trusted

SHOAL_OUT_ENV = "SHOAL_OUT"
"""The variable every exec gets: its caller's ``session_dir``."""
DIR_MODE = 0o555
FILE_MODE = 0o444


def _key(name: str) -> str:
    """A directory name for a principal or session: stable, safe, not guessable from text."""
    return hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:24]


class SharedOutputs:
    def __init__(self, root: Path, cas: ContentStore, db: Database) -> None:
        self.root = Path(root)
        self.cas = cas
        self.db = db
        self._synced: dict[tuple[str, str], int] = {}  # (principal, session) -> last n linked
        self._lock = threading.Lock()

    def principal_dir(self, principal: str) -> Path:
        """Everything ``$SHOAL_OUT`` can show ``principal`` (read rules of its sandbox)."""
        return self.root / _key(principal)

    def session_dir(self, principal: str, session: str) -> Path:
        return self.principal_dir(principal) / _key(session)

    def sync(self, principal: str, session: str) -> Path:
        """Link every output of ``principal`` in ``session`` not linked yet; the directory.

        A full disk is the usual "state dir full" error (the exec could not spool either).
        """
        target = self.session_dir(principal, session)
        with self._lock:
            last = self._synced.get((principal, session))
            if last is None:
                last = self._existing(target)
            rows = self.db.query(
                "SELECT n, value FROM transcript WHERE session = ? AND principal = ? AND n > ?"
                " ORDER BY n",
                (session, principal, last),
            )
            if rows or not target.exists():
                try:
                    self._writable(target, lambda: self._link_rows(target, rows))
                except OSError as exc:
                    if is_disk_full(exc):
                        raise state_dir_full(f"cannot fill $SHOAL_OUT: {exc.strerror}") from exc
                    raise
            if rows:
                last = int(rows[-1]["n"])
            self._synced[(principal, session)] = last
        return target

    def remove(self, principal: str, session: str, numbers: list[int]) -> int:
        """Delete the entries ``<n>`` of pruned outputs (``store.gc``); how many went.

        Under the sync lock, so a sync never finds its directory made read-only again
        halfway. A hard link would keep a pruned blob's bytes alive (and readable)."""
        target = self.session_dir(principal, session)
        removed = 0
        with self._lock:
            if not target.is_dir():
                return 0
            os.chmod(target, 0o700)
            try:
                for n in numbers:
                    entry = target / str(n)
                    if not entry.is_dir():
                        continue
                    os.chmod(entry, 0o700)
                    shutil.rmtree(entry)
                    removed += 1
            finally:
                os.chmod(target, DIR_MODE)
        return removed

    def _existing(self, target: Path) -> int:
        if not target.is_dir():
            return 0
        return max((int(p.name) for p in target.iterdir() if p.name.isdigit()), default=0)

    def _writable(self, target: Path, work: Any) -> None:
        """Run ``work`` with ``target`` (and its parents up to root) writable for us."""
        for d in (self.root, target.parent):
            d.mkdir(mode=0o700, exist_ok=True)
        target.mkdir(mode=0o700, exist_ok=True)
        os.chmod(target, 0o700)
        try:
            work()
        finally:
            os.chmod(target, DIR_MODE)
            os.chmod(target.parent, DIR_MODE | 0o200)  # the kernel adds sessions

    def _link_rows(self, target: Path, rows: list) -> None:
        for row in rows:
            value = trusted(orjson.loads(row["value"]))
            blobs = {}
            for stream in ("out", "err"):
                node = value.get(stream) if isinstance(value, dict) else None
                hashes = blob_hashes(node)
                if len(hashes) == 1:
                    blobs[stream] = hashes.pop()
            if not blobs:  # no output stored (an error, a value pruned by gc): no entry
                continue
            entry = target / str(row["n"])
            entry.mkdir(mode=0o700, exist_ok=True)
            for stream, digest in blobs.items():
                self._link(self.cas.path_of(digest), entry / stream)
            os.chmod(entry, DIR_MODE)

    @staticmethod
    def _link(blob: Path, name: Path) -> None:
        if name.exists() or not blob.exists():
            return
        os.chmod(blob, FILE_MODE)  # CAS blobs never change: read-only for everyone
        if os.geteuid() != 0:
            try:
                os.link(blob, name)
                return
            except OSError:
                pass  # another file system or no hard links: a copy
        # root ignores file modes: a hard link would let `>>` rewrite the CAS blob itself,
        # so a root kernel exposes copies (a sandbox makes them read-only too).
        # Copied under a temporary name, then renamed: a copy cut short (a full disk) is
        # never left where the next sync would take it for complete.
        part = name.with_name(name.name + ".part")
        try:
            with open(blob, "rb") as src, open(part, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
            os.chmod(part, FILE_MODE)
            os.replace(part, name)
        finally:
            part.unlink(missing_ok=True)
