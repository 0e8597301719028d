"""Empty directories made ahead of time for ``$SHOAL_OUT`` entries, by exec supervisors.

Every exec's entry ``<n>/`` is a new directory, made on the owner loop after the reply.
A ``mkdir`` allocates an inode and a directory block: 30 to 120 µs of CPU on the ext4
we measure, where renaming a directory takes 8 µs. The loop is what every agent waits
on, so the directories are made elsewhere: a session's next ready shell is sent to an
exec supervisor anyway (``exec/refill.py``), and that frame also asks it to make one
empty directory under ``<outputs>/.spare`` before it starts the bash. Once its answer
is read the directory is there, and an entry renames one into place; with none left,
an entry makes its own, as before.

Made by a supervisor, not by a thread of the kernel: a kernel thread making them was
tried (the housekeeper) and cost the loop as much in GIL hand-offs as it saved
(docs/decisions.md, "Less for the loop per exec"). A sandboxed supervisor is never
asked (its Landlock rules do not let it write there). ``.spare`` is never inside
anyone's ``$SHOAL_OUT``: a sandbox is granted its principal's directory only.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
from collections import deque
from pathlib import Path

SPARE_DIR = ".spare"
"""Under the outputs root, beside ``.copies``: where the stock waits."""


class SpareDirs:
    """Up to ``stock`` empty directories (mode 0700) in ``where``.

    ``wanted`` names a directory for a supervisor to make, ``made`` adds it once its
    answer says it was (a rename of a missing one just fails), ``take`` moves one into
    place. The names are a deque: ``take`` (the owner loop, or the housekeeper's sync
    of a root kernel that copies) and ``made`` each make one atomic pop or append."""

    def __init__(self, where: Path, stock: int) -> None:
        self.where = where
        self.stock = stock
        self._names: deque[str] = deque()
        # Unique to this kernel: an earlier kernel's names are adopted, never clashed with.
        self._token = secrets.token_hex(4)
        self._serial = itertools.count()
        self._ready = False

    def wanted(self) -> bytes | None:
        """A path for a supervisor to ``mkdir`` (0700), or None when the stock is full
        or its directory cannot be made."""
        if len(self._names) >= self.stock:
            return None
        if not self._ready:
            try:
                self._prepare()
            except OSError:
                return None
        return os.fsencode(os.path.join(self.where, f"{self._token}-{next(self._serial)}"))

    def made(self, path: bytes) -> None:
        """The supervisor asked to make ``path`` answered: it is there (or, if its
        ``mkdir`` failed, the ``take`` that meets it fails and its caller makes one)."""
        self._names.append(os.path.basename(os.fsdecode(path)))

    def take(self, dest: str) -> bool:
        """Move a spare to ``dest`` (not there, or an empty directory); False when none
        is left or the rename failed, and the caller makes ``dest`` itself."""
        while True:
            try:
                name = self._names.popleft()
            except IndexError:
                return False
            try:
                os.rename(os.path.join(self.where, name), dest)
                return True
            except FileNotFoundError:  # its mkdir failed, or it was removed: the next one
                continue
            except OSError:  # ``dest`` is in the way: the caller's own path handles that
                self._names.appendleft(name)
                return False

    def available(self) -> int:
        return len(self._names)

    def _prepare(self) -> None:
        """Once: the directory, and the empty spares an earlier kernel left, adopted."""
        self.where.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._ready = True
        with os.scandir(self.where) as found:
            leftovers = [e.path for e in found if e.is_dir(follow_symlinks=False)]
        for path in leftovers[: self.stock]:
            with contextlib.suppress(OSError), os.scandir(path) as inside:
                if next(inside, None) is None:
                    os.chmod(path, 0o700)
                    self._names.append(os.path.basename(path))
