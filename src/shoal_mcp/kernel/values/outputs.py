"""``$SHOAL_OUT``: a caller's earlier outputs as read-only files (docs/protocol.md, Exec).

``<state>/outputs/<principal key>/<session key>/<n>/out`` and ``/err`` are hard links to
the CAS blobs of ``out:N``. A root kernel, whose writes ignore file modes, shows them
through a read-only bind mount, ``<state>/outputs-ro`` (issue 31: the copies it made
before doubled the disk); where it may not mount: reflinks, copy-on-write clones that
share the blob's disk blocks, where the file system has them, else copies
(``output_entries.py`` makes an entry). Made for the values it owns in that session:
from the blobs finalize just stored (``prepare``: a few link calls, after the exec's
reply, or at the session's next exec if that starts first), and, for what that did not
make (a kernel restart, a root kernel's copies, an output stored elsewhere), from the
transcript when its next exec starts (``sync``). A root kernel that must copy never makes an exec wait for a large
copy: the exec starts with the entries made so far and the background makes the rest
(issue 31: the exec after a 1 GiB output waited 2.2 s). Each ``<n>/`` is built under a temporary name and
renamed into place whole, so no exec sees a half-made entry. Files and directories are read-only (0400 / 0500) so a
stray redirection cannot corrupt a stored blob; the directory holds nothing but that
principal's own outputs, so a sandbox may grant read on ``principal_dir`` without
exposing the CAS or anyone else's outputs (``principal_dir`` is the function the
sandbox rules call).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from ...protocol.errors import is_disk_full, state_dir_full
from ..access.namespaces import bind_read_only, mounted_at, unmount
from ..config.limits import OUTPUTS_EAGER_COPY_MAX, OUTPUTS_START_WAIT_S, SPARE_DIRS_STOCK
from ..owner.nowait import WouldWait, hold, waits_allowed
from ..owner.tables import TABLES
from ..store.cas import ContentStore
from ..store.db import Database
from .output_entries import DIR_MODE, EntryMaker
from .resolver import blob_hashes, trusted
from .spare_dirs import SPARE_DIR, SpareDirs

log = logging.getLogger(__name__)

SHOAL_OUT_ENV = "SHOAL_OUT"
"""The variable every exec gets: its caller's ``session_dir``."""


@functools.lru_cache(maxsize=4096)
def _key(name: str) -> str:
    """A directory name for a principal or session: stable, safe, not guessable from text."""
    return hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:24]


@functools.lru_cache(maxsize=4096)
def _dir_of(base: Path, *names: str) -> Path:
    """``base/<key of each name>``: asked for at every exec's start and end."""
    return base.joinpath(*map(_key, names))


def _stored_blobs(value: Any) -> dict[str, str]:
    """``{"out"|"err": blob hash}`` of a stored exec value's streams kept in the CAS."""
    blobs = {}
    for stream in ("out", "err"):
        node = value.get(stream) if isinstance(value, dict) else None
        hashes = blob_hashes(node)
        if len(hashes) == 1:
            blobs[stream] = hashes.pop()
    return blobs


def sync_key(principal: str, session: str) -> tuple[str, str, str]:
    """The housekeeping key of a session's background sync: queued once at a time."""
    return ("$SHOAL_OUT", principal, session)


class SharedOutputs:
    def __init__(
        self,
        root: Path,
        cas: ContentStore,
        db: Database,
        last_allocated: Callable[[str], int | None] | None = None,
    ) -> None:
        self.root = Path(root)
        self.cas = cas
        self.db = db
        # The session's last out:N handed out by this kernel: when the sync is past it,
        # there is nothing to look up (most exec starts).
        self._last_allocated = last_allocated
        self._synced: dict[tuple[str, str], int] = {}  # (principal, session) -> last n linked
        # Stored outputs whose entries are not made yet: (principal, session) -> n -> blobs.
        self._prepared: dict[tuple[str, str], dict[int, dict[str, str]]] = {}
        # One lock per (principal, session): syncs of different sessions never wait for
        # each other (one kernel-wide lock was a third of the kernel's time under load).
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        # _locks and _prepared are kernel tables (TABLES): finalize (on the owner loop too)
        # adds to _prepared without waiting for a session's lock, which a copy may hold.
        self.entries = EntryMaker(self.root, cas, self._copies)
        self.entries.spares = SpareDirs(self.root / SPARE_DIR, SPARE_DIRS_STOCK)
        self.room: Callable[[], bool] = lambda: True  # the kernel's state budget (app.py)
        self.view: Path | None = None  # a root kernel's read-only mount of ``root``

    def protect(self) -> None:
        """A root kernel: show ``$SHOAL_OUT`` through a read-only bind mount of ``root``
        (``<state>/outputs-ro``), where root's own writes fail (EROFS), so entries can be
        hard links to the CAS blobs instead of copies. Where mounting is not allowed
        (a container without CAP_SYS_ADMIN) the copies stay (``_link``)."""
        if os.geteuid() != 0:
            return
        view = self.root.with_name(self.root.name + "-ro")
        self.root.mkdir(mode=0o700, exist_ok=True)
        view.mkdir(mode=0o500, exist_ok=True)
        if mounted_at(str(view)):  # left by a kernel that did not stop cleanly
            with contextlib.suppress(OSError):
                unmount(str(view))
        try:
            bind_read_only(str(self.root), str(view))
        except OSError as exc:
            log.info("$SHOAL_OUT stays copies: cannot mount it read-only (%s)", exc)
            return
        self.view = view

    def close(self) -> None:
        """Kernel exit: take the read-only mount down."""
        view, self.view = self.view, None
        if view is not None:
            with contextlib.suppress(OSError):
                unmount(str(view))

    def _copies(self) -> bool:
        """A root kernel without the read-only mount: root ignores file modes, so an
        entry must be a copy (a hard link would let ``>>`` rewrite the CAS blob)."""
        return os.geteuid() == 0 and self.view is None

    def _lock_of(self, principal: str, session: str) -> threading.Lock:
        with TABLES:
            return self._locks.setdefault((principal, session), threading.Lock())

    def principal_dir(self, principal: str) -> Path:
        """Everything ``$SHOAL_OUT`` can show ``principal`` (read rules of its sandbox)."""
        return _dir_of(self.view or self.root, principal)

    def session_dir(self, principal: str, session: str) -> Path:
        """``$SHOAL_OUT`` of ``principal`` in ``session`` (through the read-only mount)."""
        return _dir_of(self.view or self.root, principal, session)

    def _own_dir(self, principal: str, session: str) -> Path:
        """The same directory where this kernel writes it."""
        return _dir_of(self.root, principal, session)

    def schedule(self, principal: str, session: str) -> None:
        """Sync ``session`` soon, as one of the store's chores: off the exec's critical
        path (a root kernel copies each output, about a fifth of an exec's kernel time)."""
        self.db.housekeeper.submit(
            functools.partial(self._sync_eagerly, principal, session),
            sync_key(principal, session),
        )

    def prepare(
        self, principal: str, session: str, n: int, blobs: dict[str, str]
    ) -> Callable[[], None]:
        """``out:N`` was just stored with ``blobs`` (``{"out"|"err": hash}``); the call
        that makes its entry (finalize's caller runs it after the reply).

        Whichever comes first makes the entry from these blobs, with no transcript
        lookup: that call, or the session's next ``sync`` (a caller quick enough to start
        its next exec before the call ran). A root kernel that copies leaves it to the
        background (``schedule``), never on the exec's path."""
        if blobs and self._copies() and not self.entries.clones:
            return functools.partial(self.schedule, principal, session)
        with TABLES:
            self._prepared.setdefault((principal, session), {})[n] = blobs
        return functools.partial(self._make_prepared, principal, session)

    def _make_prepared(self, principal: str, session: str) -> None:
        try:
            with hold(self._lock_of(principal, session)):
                self._link_prepared(principal, session, self._synced.get((principal, session)))
        except WouldWait:
            pass  # on the owner loop, while a sync holds the session: left prepared, the
            # session's next sync (an exec's start) makes it

    def _link_prepared(self, principal: str, session: str, last: int | None) -> int | None:
        """Make the session's prepared entries past ``last`` (the caller holds its lock);
        the last n up to which every entry is now made.

        Entries are never required here: a failure is logged and the next ``sync``, which
        reads the transcript, makes what is missing. A session this kernel has not synced
        yet (``last`` None) is left to its first sync, which reads the transcript."""
        key = (principal, session)
        with TABLES:
            prepared = self._prepared.pop(key, {})
        if last is None:
            return None
        target = self._own_dir(principal, session)
        for n, blobs in sorted(prepared.items()):
            if n <= last:
                continue
            if blobs:
                try:
                    self._writable(target, functools.partial(self.entries.make, target, n, blobs))
                except OSError:
                    log.warning("$SHOAL_OUT entry %d not made now", n, exc_info=True)
                    continue
            if last == n - 1:  # every entry up to n is made: the next sync has nothing to do
                last = n
        self._synced[key] = last
        return last

    def _sync_eagerly(self, principal: str, session: str) -> None:
        """A background sync (a housekeeping chore), large copies included."""
        try:
            self.sync(principal, session, eager=True)
        except Exception:  # noqa: BLE001 - the next exec's own sync reports it
            log.warning("background $SHOAL_OUT sync failed", exc_info=True)

    def sync(self, principal: str, session: str, *, eager: bool = False) -> Path:
        """Link every output of ``principal`` in ``session`` not linked yet; the directory.

        ``eager`` (the background sync): every entry, large copies included. An exec's
        start (not eager) on a root kernel that copies takes only the entries up to the
        first output over ``OUTPUTS_EAGER_COPY_MAX`` and leaves the rest to the
        background, and does not wait for a background sync holding the session.
        A full disk is the usual "state dir full" error (the exec could not spool either).
        """
        target = self._own_dir(principal, session)
        shown = self.session_dir(principal, session)
        lock = self._lock_of(principal, session)
        if not eager and self._copies() and target.exists():
            # The background may be copying a large output under this lock: the exec
            # starts now with what is there (lazy), never behind the copy.
            if not lock.acquire(timeout=OUTPUTS_START_WAIT_S if waits_allowed() else 0):
                return shown
            lock.release()
        with hold(lock):  # on the owner loop: WouldWait while a background sync holds it
            last = self._link_prepared(principal, session, self._synced.get((principal, session)))
            if last is None:
                last = self._existing(target)
            elif self._up_to_date(session, last) and target.exists():
                return shown
            rows = self.db.query(
                "SELECT n, value FROM transcript WHERE session = ? AND principal = ? AND n > ?"
                " ORDER BY n",
                (session, principal, last),
            )
            if rows and self._copies() and not self.entries.clones:
                # A root kernel that copies: large outputs are left to the background, which
                # copies them only while the state dir has room (no copy for an exec
                # refused for disk use, or one that would make the state dir go over).
                if not eager:
                    small = self._small_first(rows)
                    if len(small) < len(rows):
                        self.schedule(principal, session)
                    rows = small
                elif not self.room():
                    rows = self._small_first(rows)
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
        return shown

    def _up_to_date(self, session: str, last: int) -> bool:
        newest = self._last_allocated(session) if self._last_allocated is not None else None
        return newest is not None and newest <= last

    def remove(self, principal: str, session: str, numbers: list[int]) -> int:
        """Delete the entries ``<n>`` of pruned outputs (``store.gc``); how many went.

        Under the session's sync lock, so a sync never finds its directory made read-only again
        halfway. A hard link would keep a pruned blob's bytes alive (and readable)."""
        target = self._own_dir(principal, session)
        removed = 0
        with self._lock_of(principal, session):
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
            self.entries.drop_unlinked_copies(target)
        return removed

    def _small_first(self, rows: list) -> list:
        """The leading rows whose outputs are each at most ``OUTPUTS_EAGER_COPY_MAX``."""
        for i, row in enumerate(rows):
            for digest in _stored_blobs(trusted(orjson.loads(row["value"]))).values():
                try:
                    size = os.stat(self.cas.path_of(digest)).st_size
                except OSError:
                    continue
                if size > OUTPUTS_EAGER_COPY_MAX:
                    return rows[:i]
        return rows

    def _existing(self, target: Path) -> int:
        if not target.is_dir():
            return 0
        return max((int(p.name) for p in target.iterdir() if p.name.isdigit()), default=0)

    def _writable(self, target: Path, work: Any) -> None:
        """Run ``work`` with ``target`` writable for us (made first, with its parents up to
        root, when it is not there yet: the first output of a session)."""
        try:
            os.chmod(target, 0o700)
        except FileNotFoundError:
            for d in (self.root, target.parent, target):
                d.mkdir(mode=0o700, exist_ok=True)
            os.chmod(target.parent, DIR_MODE | 0o200)  # the kernel adds sessions
            os.chmod(target, 0o700)
        try:
            work()
        finally:
            os.chmod(target, DIR_MODE)

    def _link_rows(self, target: Path, rows: list) -> None:
        for row in rows:
            blobs = _stored_blobs(trusted(orjson.loads(row["value"])))
            if blobs:  # no output stored (an error, a value pruned by gc): no entry
                self.entries.make(target, int(row["n"]), blobs)
