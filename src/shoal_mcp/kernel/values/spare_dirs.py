"""Empty directories made ahead of time for ``$SHOAL_OUT`` entries.

Every exec's entry ``<n>/`` is a new directory. On ext4 a ``mkdir`` allocates and
journals a directory block: about 120 µs on the machines we measure, where renaming a
directory takes 8 µs and a hard link 4 µs. It was the costliest system call of an exec's
finalize, and it ran on the owner loop. So the housekeeper makes a stock of empty
directories under ``<outputs>/.spare`` (never inside anyone's ``$SHOAL_OUT``: a sandbox
is granted its principal's directory only), and an entry renames one into place; when
the stock is empty an entry makes its directory itself, as before.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
from collections import deque
from collections.abc import Callable, Hashable
from pathlib import Path

SPARE_DIR = ".spare"
"""Under the outputs root, beside ``.copies``: where the stock waits."""

_REFILL_KEY = ("$SHOAL_OUT", "spare dirs")
"""The housekeeping key of a refill: queued once at a time."""

Submit = Callable[[Callable[[], None], Hashable], None]


class SpareDirs:
    """A stock of ``stock`` empty directories (mode 0700) in ``where``, refilled through
    ``submit`` (the housekeeper's) whenever it falls under half.

    The names are kept in a deque: ``take`` (the owner loop or a worker) and the refill
    (the housekeeper) each make one atomic append or pop, and a name is renamed away by
    the one caller that popped it."""

    def __init__(self, where: Path, stock: int, submit: Submit) -> None:
        self.where = where
        self.stock = stock
        self._submit = submit
        self._names: deque[str] = deque()
        # Unique to this kernel: leftovers of an earlier one are adopted, never clashed with.
        self._token = secrets.token_hex(4)
        self._serial = itertools.count()
        self._adopted = False

    def take(self, dest: str) -> bool:
        """Move a spare to ``dest`` (not there, or an empty directory); False when none
        is left or the rename failed, and the caller makes ``dest`` itself."""
        try:
            name = self._names.popleft()
        except IndexError:
            self._refill_soon()
            return False
        try:
            os.rename(os.path.join(self.where, name), dest)
        except FileNotFoundError:  # removed under us (the outputs tree was cleared)
            return False
        except OSError:  # ``dest`` is in the way: the caller's own path handles that
            self._names.appendleft(name)
            return False
        finally:
            if len(self._names) < self.stock // 2:
                self._refill_soon()
        return True

    def available(self) -> int:
        return len(self._names)

    def _refill_soon(self) -> None:
        self._submit(self.refill, _REFILL_KEY)

    def refill(self) -> None:
        """Make spares up to the stock (the housekeeper's chore); a failure (a full disk)
        leaves the stock as it is, and entries make their own directories."""
        with contextlib.suppress(OSError):
            self.where.mkdir(mode=0o700, parents=True, exist_ok=True)
            if not self._adopted:
                self._adopted = True
                self._adopt()
            while len(self._names) < self.stock:
                name = f"{self._token}-{next(self._serial)}"
                os.mkdir(os.path.join(self.where, name), 0o700)
                self._names.append(name)

    def _adopt(self) -> None:
        """Empty directories an earlier kernel made and never used join the stock."""
        with os.scandir(self.where) as found:
            leftovers = [e.path for e in found if e.is_dir(follow_symlinks=False)]
        for path in leftovers[: self.stock]:
            with contextlib.suppress(OSError), os.scandir(path) as inside:
                if next(inside, None) is None:
                    os.chmod(path, 0o700)
                    self._names.append(os.path.basename(path))
