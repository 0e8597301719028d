"""How one ``$SHOAL_OUT/<n>`` entry is made from the CAS blobs of ``out:N``.

``values/outputs.py`` decides which entries are due and when; this module makes one:
``<n>/out`` and ``<n>/err`` as hard links to the blobs, or, for a root kernel that could
not mount the outputs read-only (root ignores file modes, so a hard link would let ``>>``
rewrite a stored blob), as copies kept once per blob and session.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from ..store.cas import ContentStore
from .spare_dirs import SpareDirs

COPIES_DIR = ".copies"
"""A root kernel's copies of blobs, linked into entries (never inside a ``$SHOAL_OUT``)."""
DIR_MODE = 0o500
FILE_MODE = 0o400
# Read-only for the owner alone: every reader (the kernel, the caller's commands, their
# sandbox) runs as the kernel's uid, and the state dir stays private (docs/security.md).


class EntryMaker:
    """Makes entries under ``root`` (the kernel's writable outputs tree)."""

    def __init__(self, root: Path, cas: ContentStore, copies: Callable[[], bool]) -> None:
        self.root = root
        self.cas = cas
        self._copies = copies  # True: a root kernel without the read-only mount
        self.clones = False  # a reflink worked here: a root kernel's "copies" are free
        self.spares: SpareDirs | None = None  # directories made ahead (spare_dirs.py)

    def make(self, target: Path, n: int, blobs: dict[str, str]) -> None:
        """Entry ``target/<n>`` holding ``blobs`` (``{"out"|"err": hash}``); ``target`` is
        writable for us. Built under a temporary name and renamed into place whole, so no
        exec sees a half-made entry; one an earlier kernel left is completed in place.

        Each step is tried first and its rare failure handled (a leftover part, an entry
        already there): this runs after every exec, and the checks it made first were
        half of its system calls."""
        where = os.fspath(target)
        part = os.path.join(where, f".{n}.part")  # not a number: never taken for an entry
        if self.spares is None or not self.spares.take(part):
            try:
                os.mkdir(part, 0o700)
            except FileExistsError:  # cut short by a crash or a full disk
                os.chmod(part, 0o700)
                shutil.rmtree(part)
                os.mkdir(part, 0o700)
        self._fill(part, blobs)
        os.chmod(part, DIR_MODE)
        entry = os.path.join(where, str(n))
        try:
            os.rename(part, entry)  # over an empty directory too
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            os.chmod(part, 0o700)
            shutil.rmtree(part)
            os.chmod(entry, 0o700)
            self._fill(entry, blobs)
            os.chmod(entry, DIR_MODE)

    def drop_unlinked_copies(self, target: Path) -> None:
        """A root kernel's copies that no entry of ``target`` links any more (a link
        count of 1: only the copy) hold a pruned output's bytes: delete them."""
        copies = self.root / COPIES_DIR / target.parent.name / target.name
        try:
            names = list(copies.iterdir())
        except (FileNotFoundError, NotADirectoryError):
            return
        for copy in names:
            try:
                if copy.stat().st_nlink == 1:
                    copy.unlink()
            except FileNotFoundError:
                pass

    def _fill(self, entry: str, blobs: dict[str, str]) -> None:
        for stream, digest in blobs.items():
            self._link(digest, os.path.join(entry, stream), entry)

    def _copy_of(self, entry: str, digest: str) -> Path:
        """Where a root kernel keeps its one copy of blob ``digest`` for the session of
        ``entry``: outside every ``$SHOAL_OUT`` (under ``root/.copies/<principal>/<session>``),
        so no listing shows it twice."""
        session_dir = Path(entry).parent
        return self.root / COPIES_DIR / session_dir.parent.name / session_dir.name / digest

    def _link(self, digest: str, name: str, entry: str) -> None:
        """``name`` becomes blob ``digest``'s bytes; nothing when the blob is gone (gc
        pruned it) or ``name`` is there already (an entry completed in place)."""
        blob = self.cas.path_of(digest)
        if not self._copies():
            try:
                # A hard link shares the blob's mode: CAS blobs never change, read-only.
                os.chmod(blob, FILE_MODE)
                os.link(blob, name)
                return
            except (FileNotFoundError, FileExistsError):
                return
            except OSError:
                pass  # another file system or no hard links: a copy
        if os.path.exists(name) or not blob.exists():
            return
        # root ignores file modes: a hard link would let `>>` rewrite the CAS blob itself,
        # so a root kernel exposes a copy, one per blob and session, hard-linked into each
        # entry with those bytes (a new file per exec was most of this sync's cost). A
        # root write through one entry changes that session's other entries of the same
        # bytes, never the stored output (a sandbox makes them read-only too).
        copy = self._copy_of(entry, digest)
        if not copy.exists():
            copy.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.clones = _copy(blob, copy)
        try:
            os.link(copy, name)
        except OSError:
            _copy(blob, Path(name))  # too many links to one file: this entry gets its own


def _copy(blob: Path, name: Path) -> bool:
    """Copied under a temporary name, then renamed: a copy cut short (a full disk) is
    never left where the next sync would take it for complete. A reflink (``FICLONE``:
    btrfs, XFS, bcachefs…) when the file system has them: True then (no bytes copied;
    a write to the clone never reaches the blob)."""
    part = name.with_name(name.name + ".part")
    try:
        with open(blob, "rb") as src, open(part, "wb") as dst:
            cloned = _reflink(src.fileno(), dst.fileno())
            if not cloned:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
        os.chmod(part, FILE_MODE)
        os.replace(part, name)
        return cloned
    finally:
        part.unlink(missing_ok=True)


FICLONE = 0x40049409
"""ioctl(dest, FICLONE, src): dest shares src's blocks, copy-on-write (linux/fs.h)."""


def _reflink(src_fd: int, dst_fd: int) -> bool:
    try:
        fcntl.ioctl(dst_fd, FICLONE, src_fd)
        return True
    except OSError:  # EOPNOTSUPP (ext4, tmpfs), EXDEV, EINVAL: copy the bytes instead
        return False
