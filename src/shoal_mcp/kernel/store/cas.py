"""Content-addressed blob store: spooled output files become ``cas/ab/<blake3>``.

Ingest streams the spool once in 1 MiB blocks, computing hash, line count, UTF-8
validity and code point count together, so no blob is ever held whole in memory.
Reads go through ``mmap`` so slicers touch only the pages they need.
"""

from __future__ import annotations

import codecs
import mmap
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import blake3

from ...protocol.errors import ErrorCode, RpcError, is_disk_full, state_dir_full
from ...protocol.limits import MiB
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


class ContentStore:
    def __init__(self, root: Path, db: Database) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.db = db

    def path_of(self, digest: str) -> Path:
        return self.root / digest[:2] / digest

    def ingest(self, spool: Path) -> BlobInfo:
        """Hash ``spool`` into the store (moving it) and record its metadata."""
        hasher = blake3.blake3()
        decoder = codecs.getincrementaldecoder("utf-8")()
        size = lines = chars = 0
        utf8 = True
        last = b""
        with open(spool, "rb") as fh:
            while True:
                block = fh.read(INGEST_BLOCK)
                if not block:
                    break
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
        info = BlobInfo(hasher.hexdigest(), size, lines, chars if utf8 else None, utf8)
        target = self.path_of(info.hash)
        placed = False
        try:
            if target.exists():
                os.unlink(spool)
            else:
                target.parent.mkdir(exist_ok=True, mode=0o700)
                os.replace(spool, target)
                placed = True
            with self.db.transaction() as conn:
                conn.execute(
                    "INSERT OR IGNORE INTO blobs(hash, size, lines, chars, utf8) VALUES (?,?,?,?,?)",
                    (info.hash, info.size, info.lines, info.chars, int(info.utf8)),
                )
        except BaseException as exc:
            if placed:  # never leave a blob on disk that no row describes
                target.unlink(missing_ok=True)
            if is_disk_full(exc):
                raise state_dir_full(f"cannot store output blob: {exc.strerror}") from exc
            raise
        return info

    def info(self, digest: str) -> BlobInfo:
        rows = self.db.query("SELECT * FROM blobs WHERE hash = ?", (digest,))
        if not rows:
            raise RpcError(ErrorCode.UNKNOWN_REF, f"unknown blob {digest}", {"hash": digest})
        row = rows[0]
        return BlobInfo(row["hash"], row["size"], row["lines"], row["chars"], bool(row["utf8"]))

    def source(self, digest: str) -> FileSource:
        """A reader over one stored blob (mmap-backed)."""
        return FileSource(self.path_of(digest))

    def read_range(self, digest: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of a blob (clamped); copies only that range."""
        return self.source(digest).read_range(start, end)
