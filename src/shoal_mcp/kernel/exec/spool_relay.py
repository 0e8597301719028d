"""Honest storage (issue 31): copy a command's output into its spool and know what was lost.

A command writing straight into its spool file meets ENOSPC or EIO itself; most ignore
it (bash's ``echo`` in a loop, a pipeline's ``tee``), the exec ends with status 0 and an
output with bytes missing was stored as complete. Nothing afterwards can tell: a failed
write leaves no trace in the file. The only sound witness is the writer, so the command
writes into a pipe and ``SpoolRelay`` writes into the spool:

- a write that fails for want of room (ENOSPC, EDQUOT) is retried while the pipe backs
  up, so the command blocks instead of losing bytes, for up to ``full_wait_s``: a disk
  that frees up in time loses nothing;
- after that, or at once for any other error (EIO), the bytes are dropped and counted,
  and later output is still written; ``loss()`` then names the first error and the
  bytes lost, which the exec's outcome reports as ``ok: false, truncated: {...}``.

No loss is ever claimed that did not happen: a count only grows when ``os.write``
raised for those very bytes.

Standard library only, no package imports: the exec supervisor (``supervise.py``, run as
``python -I -S``) is where this runs; see ``docs/decisions.md``, "Honest storage", for
the hook.
"""

from __future__ import annotations

import errno
import os
import time

RELAY_CHUNK = 256 * 1024
"""Bytes read from the command's pipe at a time (a pipe holds 64 KiB by default)."""
RETRY_S = 0.05
"""While the spool's disk is full, the write is retried this often."""
ROOM_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class SpoolRelay:
    """One output stream: the read end of the command's pipe and the spool it fills.

    Driven by the supervisor's loop: ``wants_read()`` says whether to poll the pipe,
    ``on_readable()`` moves what arrived, ``retry()`` (every ``RETRY_S`` while
    ``pending``) tries a held-back write again. ``finish()`` at the end of the tree.
    """

    def __init__(self, pipe_r: int, spool_fd: int, full_wait_s: float) -> None:
        self.pipe_r = pipe_r
        self.spool_fd = spool_fd
        self.full_wait_s = full_wait_s
        self.written = 0
        self.lost_bytes = 0
        self.reason: str | None = None  # errno name of the first write that lost bytes
        self.eof = False
        self._pending = b""
        self._full_since: float | None = None

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def wants_read(self) -> bool:
        """Poll the pipe only with nothing held back: a full disk backs the pipe up."""
        return not self.eof and not self._pending

    def on_readable(self) -> None:
        data = os.read(self.pipe_r, RELAY_CHUNK)
        if not data:
            self.eof = True
            return
        self._pending = data
        self.retry()

    def retry(self, now: float | None = None) -> None:
        """Write what is held back; on a full disk keep it (until ``full_wait_s``)."""
        while self._pending:
            try:
                n = os.write(self.spool_fd, self._pending)
            except OSError as exc:
                now = time.monotonic() if now is None else now
                if exc.errno in ROOM_ERRNOS:
                    if self._full_since is None:
                        self._full_since = now
                    if now - self._full_since < self.full_wait_s:
                        return  # held: the command blocks on its pipe meanwhile
                self._lose(exc)
                return
            self.written += n
            self._pending = self._pending[n:]
            self._full_since = None

    def _lose(self, exc: OSError) -> None:
        if self.reason is None:
            self.reason = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        self.lost_bytes += len(self._pending)
        self._pending = b""
        self._full_since = None

    def finish(self, deadline_s: float = 0.0) -> None:
        """The tree has ended: move what is left in the pipe, holding a full-disk write
        at most ``deadline_s`` more (then it is lost, and counted)."""
        end = time.monotonic() + deadline_s
        while True:
            if self._pending:
                self.retry()
                if self._pending:
                    if time.monotonic() >= end:
                        self._lose(OSError(errno.ENOSPC, "no room left"))
                        continue
                    time.sleep(RETRY_S)
                    continue
            if self.eof:
                return
            self.on_readable()

    def loss(self) -> dict | None:
        """``{"reason", "lost_bytes", "stored_bytes"}`` when bytes were lost, else None."""
        if not self.lost_bytes:
            return None
        return {"reason": self.reason, "lost_bytes": self.lost_bytes, "stored_bytes": self.written}


def truncated_outcome(outcome: dict, losses: dict[str, dict]) -> dict:
    """An exec outcome whose streams lost bytes (``{"out": loss, "err": loss}``): never
    ``ok``, with ``truncated`` naming each stream's reason and count."""
    if not losses:
        return outcome
    return {**outcome, "ok": False, "truncated": dict(sorted(losses.items()))}
