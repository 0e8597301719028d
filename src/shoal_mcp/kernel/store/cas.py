"""Content-addressed blob store: spooled output files become ``cas/ab/<blake3>``.

Ingest streams the spool once in 1 MiB blocks, computing hash, line count, UTF-8
validity and code point count together, so no blob is ever held whole in memory.
Reads go through ``mmap`` so slicers touch only the pages they need.
"""

from __future__ import annotations

import codecs
import itertools
import mmap
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import blake3

from ...protocol.errors import ErrorCode, RpcError, is_disk_full, state_dir_full
from ...protocol.limits import MiB
from ...protocol.lru import Lru
from ..config.limits import (
    BLOB_INFOS_REMEMBERED,
    SMALL_BLOB_KEPT,
    VERIFIED_BLOBS_REMEMBERED,
    VERIFY_REPORT_MAX,
)
from .db import Database

INGEST_BLOCK = 1 * MiB
SCAN_BLOCK = 1 * MiB
"""Block size for scans that must not map a whole blob (line lookups, counts)."""


@dataclass(frozen=True, slots=True)
class BlobInfo:
    hash: str
    size: int
    lines: int
    chars: int | None  # None when not valid UTF-8
    utf8: bool

    def node(self) -> dict:
        """The tagged node that stands for this blob inside stored values."""
        return {"$": "blob", "hash": self.hash}


class BlobSource(Protocol):
    """Something a TextBlob can read: a CAS blob or a live spool file."""

    def open(self) -> AbstractContextManager[bytes | mmap.mmap]: ...

    def read_range(self, start: int, end: int) -> bytes: ...

    def blocks(
        self, start: int, end: int, backward: bool = False
    ) -> Iterator[tuple[int, bytes]]: ...


class FileSource:
    """A stored blob or a running task's growing spool.

    Reads and scans use pread in bounded blocks; ``open()`` maps the file for the
    slicers, which touch only the pages near what they look for.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @contextmanager
    def open(self) -> Iterator[bytes | mmap.mmap]:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError as exc:
            raise RpcError(
                ErrorCode.UNKNOWN_REF, f"{self.path.name} is no longer available"
            ) from exc
        try:
            if os.fstat(fd).st_size == 0:
                yield b""
                return
            with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as mm:
                yield mm
        finally:
            os.close(fd)

    def read_range(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` via pread: nothing stays mapped, so RSS stays flat."""
        start = max(0, start)
        length = max(0, end - start)
        fd = self._fd()
        try:
            parts = []
            while length > 0:
                data = os.pread(fd, min(length, SCAN_BLOCK), start)
                if not data:
                    break
                parts.append(data)
                start += len(data)
                length -= len(data)
            return b"".join(parts)
        finally:
            os.close(fd)

    def blocks(self, start: int, end: int, backward: bool = False) -> Iterator[tuple[int, bytes]]:
        """``(offset, bytes)`` blocks of ``[start, end)`` in order (or reversed), via pread."""
        fd = self._fd()
        try:
            if backward:
                pos = end
                while pos > start:
                    lo = max(start, pos - SCAN_BLOCK)
                    yield lo, os.pread(fd, pos - lo, lo)
                    pos = lo
            else:
                pos = start
                while pos < end:
                    data = os.pread(fd, min(SCAN_BLOCK, end - pos), pos)
                    if not data:
                        return
                    yield pos, data
                    pos += len(data)
        finally:
            os.close(fd)

    @contextmanager
    def open_fd(self) -> Iterator[int]:
        """A read-only fd of the file for the caller's own preads (closed on exit)."""
        fd = self._fd()
        try:
            yield fd
        finally:
            os.close(fd)

    def _fd(self) -> int:
        try:
            return os.open(self.path, os.O_RDONLY)
        except FileNotFoundError as exc:
            raise RpcError(
                ErrorCode.UNKNOWN_REF, f"{self.path.name} is no longer available"
            ) from exc

    def info(self) -> BlobInfo:
        """Metadata computed now (the file may still be growing)."""
        size = os.stat(self.path).st_size if self.path.exists() else 0
        lines = count_newlines(self, 0, size)
        if size and self.read_range(size - 1, size) != b"\n":
            lines += 1
        return BlobInfo(hash="", size=size, lines=lines, chars=None, utf8=True)


def count_newlines(source: BlobSource, start: int, end: int) -> int:
    """Newlines in ``[start, end)``, counted in pread blocks (memchr speed, flat memory)."""
    return sum(block.count(b"\n") for _, block in source.blocks(start, end))


class StoredBlob(FileSource):
    """A CAS blob read only while it still is what was recorded.

    Every open checks the file's length against the recorded size (a blob that grew,
    shrank or was truncated is refused); the first access to a file (a map, or a
    ranged read) also checks its blake3 hash, remembered per file identity (inode,
    mtime, size) so later reads cost nothing. A mismatch is -32006 corrupted, never data (docs/decisions.md,
    Crash consistency).
    """

    def __init__(self, store: ContentStore, info: BlobInfo) -> None:
        super().__init__(store.path_of(info.hash))
        self.store = store
        self.info_ = info
        self._small: bytes | None = None  # a small blob's bytes, once read and checked

    def _small_bytes(self) -> bytes | None:
        """The whole blob when it is at most ``SMALL_BLOB_KEPT`` bytes (read and checked
        once: a reply reads the same small output several times), else None."""
        if self.info_.size > SMALL_BLOB_KEPT:
            return None
        if self.info_.size == 0:
            # The empty blob's bytes are known without its file (most execs' stderr).
            return b""
        if self._small is None:
            fd = self._fd()
            try:
                self._small = os.pread(fd, self.info_.size, 0)
            finally:
                os.close(fd)
        return self._small

    def read_range(self, start: int, end: int) -> bytes:
        small = self._small_bytes()
        if small is None:
            return super().read_range(start, end)
        start = max(0, start)
        return small[start : max(start, end)]

    def blocks(self, start: int, end: int, backward: bool = False) -> Iterator[tuple[int, bytes]]:
        small = self._small_bytes()
        if small is None:
            yield from super().blocks(start, end, backward)
            return
        # One block (a small blob is under SCAN_BLOCK), as the file reads would give it.
        start = max(0, start)
        if start < end and (backward or start < len(small)):
            yield start, small[start:end]

    def _fd(self) -> int:
        fd = super()._fd()
        try:
            st = os.fstat(fd)
            self._check_size(st)
            self.store.verify_hash(fd, st, self.info_)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _check_size(self, st: os.stat_result) -> None:
        if st.st_size != self.info_.size:
            raise corrupted(
                self.info_.hash,
                f"stored file is {st.st_size} bytes, recorded {self.info_.size}",
            )

    @contextmanager
    def open(self) -> Iterator[bytes | mmap.mmap]:
        small = self._small_bytes()
        if small is not None:
            yield small
            return
        fd = self._fd()
        try:
            st = os.fstat(fd)
            if st.st_size == 0:
                yield b""
                return
            with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as mm:
                yield mm
        finally:
            os.close(fd)


def corrupted(digest: str, reason: str) -> RpcError:
    return RpcError(
        ErrorCode.CORRUPTED,
        f"stored output {digest[:16]}… is corrupted: {reason}",
        {"hash": digest, "reason": reason, "hint": "run `shoal doctor --verify`"},
    )


def scan_file(path: Path) -> BlobInfo:
    """Hash, length, lines and characters of the file at ``path``, in one pass."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size < INGEST_BLOCK:  # most outputs: one read of their size (a byte more: EOF)
            data = os.read(fd, size + 1)
            if len(data) <= size:
                return _scan_whole(data)
            blocks: Iterator[bytes] = itertools.chain((data,), _blocks(fd))  # it grew
        else:
            blocks = _blocks(fd)
        return _scan_blocks(blocks)
    finally:
        os.close(fd)


def _blocks(fd: int) -> Iterator[bytes]:
    while block := os.read(fd, INGEST_BLOCK):
        yield block


def _scan_whole(data: bytes) -> BlobInfo:
    lines = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    try:
        chars: int | None = len(data.decode("utf-8"))
    except UnicodeDecodeError:
        chars = None
    return BlobInfo(blake3.blake3(data).hexdigest(), len(data), lines, chars, chars is not None)


def _scan_blocks(blocks: Iterator[bytes]) -> BlobInfo:
    hasher = blake3.blake3()
    decoder = codecs.getincrementaldecoder("utf-8")()
    size = lines = chars = 0
    utf8 = True
    last = b""
    for block in blocks:
        hasher.update(block)
        size += len(block)
        lines += block.count(b"\n")
        last = block[-1:]
        if utf8:
            try:
                chars += len(decoder.decode(block))
            except UnicodeDecodeError:
                utf8 = False
    if utf8:
        try:
            chars += len(decoder.decode(b"", final=True))
        except UnicodeDecodeError:
            utf8 = False
    if size and last != b"\n":
        lines += 1
    return BlobInfo(hasher.hexdigest(), size, lines, chars if utf8 else None, utf8)


def hash_fd(fd: int) -> str:
    hasher = blake3.blake3()
    pos = 0
    while True:
        block = os.pread(fd, INGEST_BLOCK, pos)
        if not block:
            return hasher.hexdigest()
        hasher.update(block)
        pos += len(block)


@dataclass(frozen=True, slots=True)
class Placed:
    """A spool hashed and moved into the store, not yet recorded in the database."""

    info: BlobInfo
    new_file: bool  # this call created the file (undo removes it)


class ContentStore:
    def __init__(self, root: Path, db: Database) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.db = db
        # Files whose hash was checked, by identity (hash, inode, mtime, size).
        self._verified: Lru[tuple, None] = Lru(VERIFIED_BLOBS_REMEMBERED)
        # Recorded metadata of recently used blobs: a blob never changes under its hash,
        # and each reply reads the info of the blobs it shows (a query each, before).
        self._infos: Lru[str, BlobInfo] = Lru(BLOB_INFOS_REMEMBERED)
        # The store's generation: a blob placed for a value being stored is pinned from
        # before its file is looked up until its row is committed (``release``), and gc
        # deletes only under this lock, only what is neither pinned nor referenced.
        # Re-entrant: a finalize on the owner loop takes it first, across its pins and
        # releases (exec/finalize.py ``claim``): gc may hold it while it waits to write.
        self.generation = threading.RLock()
        self._pins: dict[str, int] = {}

    def path_of(self, digest: str) -> Path:
        return self.root.joinpath(digest[:2], digest)

    def ingest(self, spool: Path) -> BlobInfo:
        """Hash ``spool`` into the store (moving it) and record its metadata."""
        placed = self.place(spool)
        try:
            with self.db.transaction() as conn:
                self.record_in(conn, placed.info)
        except BaseException as exc:
            self.unplace(placed)
            if is_disk_full(exc):
                raise state_dir_full(f"cannot store output blob: {exc.strerror}") from exc
            raise
        finally:
            self.release(placed)
        return placed.info

    def place(self, spool: Path, recycle: Callable[[Path], None] | None = None) -> Placed:
        """Hash ``spool`` (one streaming pass) and move it to ``cas/ab/<hash>``.

        A spool whose blob is already stored is removed, or handed to ``recycle`` (the
        exec spools are reused: creating and deleting a file per exec is costly).

        The blob stays pinned (gc keeps it) until the caller ``release``s it, once the
        value referencing it is committed or given up."""
        info = scan_file(spool)
        target = self.path_of(info.hash)
        self._pin(info.hash)
        try:
            return self._place_pinned(spool, info, target, recycle)
        except BaseException:
            self._unpin(info.hash)
            raise

    def _place_pinned(
        self, spool: Path, info: BlobInfo, target: Path, recycle: Callable[[Path], None] | None
    ) -> Placed:
        try:
            try:
                stored_size: int | None = os.stat(target).st_size
            except FileNotFoundError:
                stored_size = None
            if stored_size == info.size:
                if recycle is not None:
                    recycle(spool)
                else:
                    os.unlink(spool)
                return Placed(info, False)
            # Missing dirs are recreated (someone removed cas/ under a live kernel); a
            # same-hash file of the wrong size is damaged, and this good copy replaces it.
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.replace(spool, target)
            # Just hashed from these very bytes: the first read need not hash it again.
            self._remember(info.hash, os.stat(target))
        except OSError as exc:
            if is_disk_full(exc):
                raise state_dir_full(f"cannot store output blob: {exc.strerror}") from exc
            raise
        return Placed(info, True)

    @staticmethod
    def record_in(conn: sqlite3.Connection, info: BlobInfo) -> None:
        """The blob's row, inside the caller's transaction."""
        conn.execute(
            "INSERT OR IGNORE INTO blobs(hash, size, lines, chars, utf8) VALUES (?,?,?,?,?)",
            (info.hash, info.size, info.lines, info.chars, int(info.utf8)),
        )

    def _pin(self, digest: str) -> None:
        with self.generation:
            self._pins[digest] = self._pins.get(digest, 0) + 1

    def _unpin(self, digest: str) -> None:
        with self.generation:
            left = self._pins.get(digest, 0) - 1
            if left > 0:
                self._pins[digest] = left
            else:
                self._pins.pop(digest, None)

    def release(self, placed: Placed) -> None:
        """The value that references ``placed`` is committed (or given up): gc may judge
        the blob by its references again."""
        self._unpin(placed.info.hash)

    def delete_unreferenced(self, digest: str, referenced: Callable[[str], bool]) -> bool:
        """Delete a blob (row and file) unless it is pinned or ``referenced(digest)``,
        both judged under the store's generation lock, so no value being stored now can
        come to reference a deleted blob (``store.gc``). True when it was deleted."""
        with self.generation:
            if self._pins.get(digest) or referenced(digest):
                return False
            with self.db.transaction() as conn:
                conn.execute("DELETE FROM blobs WHERE hash = ?", (digest,))
            self.forget_info(digest)
            self.path_of(digest).unlink(missing_ok=True)
        return True

    def unplace(self, placed: Placed) -> None:
        """Undo ``place`` after the recording transaction failed: never leave a blob on
        disk that no row describes (a file that was there before stays)."""
        if placed.new_file and not self.db.query(
            "SELECT 1 FROM blobs WHERE hash = ?", (placed.info.hash,)
        ):
            self.path_of(placed.info.hash).unlink(missing_ok=True)

    def info(self, digest: str) -> BlobInfo:
        found = self._infos.get(digest)
        if found is not None:
            return found
        rows = self.db.query("SELECT * FROM blobs WHERE hash = ?", (digest,))
        if not rows:
            raise RpcError(ErrorCode.UNKNOWN_REF, f"unknown blob {digest}", {"hash": digest})
        row = rows[0]
        info = BlobInfo(row["hash"], row["size"], row["lines"], row["chars"], bool(row["utf8"]))
        self.remember_info(info)
        return info

    def remember_info(self, info: BlobInfo) -> None:
        """``info`` is recorded (its transaction committed): later lookups need no query."""
        self._infos.put(info.hash, info)

    def forget_info(self, digest: str) -> None:
        """The blob's row was deleted (``store.gc``)."""
        self._infos.discard(digest)

    def source(self, digest: str) -> StoredBlob:
        """A reader over one stored blob (mmap-backed), checked against its record."""
        return StoredBlob(self, self.info(digest))

    def read_range(self, digest: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of a blob (clamped); copies only that range."""
        return self.source(digest).read_range(start, end)

    # -- verification ---------------------------------------------------------------------

    def verify_hash(self, fd: int, st: os.stat_result, info: BlobInfo) -> None:
        """Hash the open blob unless this very file (inode, mtime, size) was checked."""
        key = (info.hash, st.st_ino, st.st_mtime_ns, st.st_size)
        if key in self._verified:
            return
        actual = hash_fd(fd)
        if actual != info.hash:
            raise corrupted(info.hash, f"content hashes to {actual[:16]}…")
        self._remember(info.hash, st)

    def _remember(self, digest: str, st: os.stat_result) -> None:
        self._verified.put((digest, st.st_ino, st.st_mtime_ns, st.st_size), None)

    def verify_all(self, references: Iterable[tuple[str, str]] = ()) -> dict:
        """Every recorded blob checked (length and hash), and every blob a stored value
        references (``(ref, hash)`` pairs) recorded: ``shoal doctor --verify``."""
        checked = 0
        bad: list[dict] = []
        damaged = 0
        recorded: set[str] = set()
        for row in self.db.query("SELECT hash, size FROM blobs ORDER BY hash"):
            checked += 1
            recorded.add(row["hash"])
            reason = self._check_file(row["hash"], row["size"])
            if reason is not None:
                damaged += 1
                if len(bad) < VERIFY_REPORT_MAX:
                    bad.append({"hash": row["hash"], "reason": reason})
        dangling = 0
        for ref, digest in references:
            if digest in recorded:
                continue
            dangling += 1
            if len(bad) < VERIFY_REPORT_MAX:
                bad.append({"hash": digest, "ref": ref, "reason": "referenced but not stored"})
        return {"checked": checked, "corrupted": damaged, "dangling": dangling, "bad": bad}

    def _check_file(self, digest: str, size: int) -> str | None:
        try:
            fd = os.open(self.path_of(digest), os.O_RDONLY)
        except FileNotFoundError:
            return "missing"
        try:
            actual_size = os.fstat(fd).st_size
            if actual_size != size:
                return f"stored file is {actual_size} bytes, recorded {size}"
            actual = hash_fd(fd)
            return None if actual == digest else f"content hashes to {actual[:16]}…"
        finally:
            os.close(fd)
