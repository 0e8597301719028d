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
import fcntl
import os
import time

RELAY_CHUNK = 1 << 20
"""Bytes moved from the command's pipe at a time (the pipe is asked to hold as many)."""
RETRY_S = 0.05
"""While the spool's disk is full, the write is retried this often."""
ROOM_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_F_SETPIPE_SZ = 1031
_SPLICE_F_NONBLOCK = 2


def output_pipe() -> tuple[int, int]:
    """A pipe for one output stream (read end, write end), as large as allowed: fewer
    wakeups, and a command blocked on a full disk has a MiB in flight, not 64 KiB."""
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        fcntl.fcntl(r, _F_SETPIPE_SZ, RELAY_CHUNK)
    except OSError:
        pass  # over pipe-max-size or the user's pipe pages: the default size works
    os.set_blocking(r, False)
    return r, w


class SpoolRelay:
    """One output stream: the read end of the command's pipe and the spool it fills.

    Driven by the supervisor's loop: ``wants_read()`` says whether to poll the pipe,
    ``on_readable()`` moves what arrived, ``retry()`` (every ``RETRY_S`` while
    ``pending``) tries a held-back write again. ``finish()`` at the end of the tree.

    Bytes move with ``splice`` (no copy through this process); a write the disk has no
    room for leaves them in the pipe, so holding back costs nothing. Where the spool
    cannot take a splice (EINVAL: a device, some file systems) the relay reads and
    writes instead, holding the refused bytes itself.
    """

    def __init__(self, pipe_r: int, spool_fd: int, full_wait_s: float) -> None:
        self.pipe_r = pipe_r
        self.spool_fd = spool_fd
        self.full_wait_s = full_wait_s
        self.written = 0
        self.lost_bytes = 0
        self.reason: str | None = None  # errno name of the first write that lost bytes
        self.eof = False
        self._splice = True
        self._held_in_pipe = False
        self._pending = b""  # read/write mode: the bytes a full disk refused
        self._full_since: float | None = None

    @property
    def pending(self) -> bool:
        return self._held_in_pipe or bool(self._pending)

    def wants_read(self) -> bool:
        """Poll the pipe only with nothing held back: a full disk backs the pipe up."""
        return not self.eof and not self.pending

    def on_readable(self) -> None:
        self._move()

    def retry(self, now: float | None = None) -> None:
        """Write what is held back; on a full disk keep it (until ``full_wait_s``)."""
        if self.pending:
            self._move(now)

    def _move(self, now: float | None = None) -> None:
        """Move one chunk from the pipe (or the held bytes) into the spool."""
        if self._pending:
            self._write_pending(now)
            return
        if self._splice:
            try:
                n = os.splice(self.pipe_r, self.spool_fd, RELAY_CHUNK, flags=_SPLICE_F_NONBLOCK)
            except BlockingIOError:
                self._held_in_pipe = False  # nothing to move (yet)
                return
            except OSError as exc:
                if exc.errno == errno.EINVAL:
                    self._splice = False  # the spool takes no splice: copy instead
                    self._held_in_pipe = False
                    self._move(now)
                    return
                self._held_in_pipe = True
                self._refused(exc, now)
                return
            self._moved(n)
            return
        try:
            data = os.read(self.pipe_r, RELAY_CHUNK)
        except BlockingIOError:
            return
        if not data:
            self.eof = True
            return
        self._pending = data
        self._write_pending(now)

    def _write_pending(self, now: float | None) -> None:
        while self._pending:
            try:
                n = os.write(self.spool_fd, self._pending)
            except OSError as exc:
                self._refused(exc, now)
                return
            self.written += n
            self._pending = self._pending[n:]
            self._full_since = None

    def _moved(self, n: int) -> None:
        self._held_in_pipe = False
        if n == 0:
            self.eof = True
            return
        self.written += n
        self._full_since = None

    def _refused(self, exc: OSError, now: float | None) -> None:
        """A write failed: hold the bytes while a full disk may free up, else lose them."""
        if exc.errno in ROOM_ERRNOS:
            now = time.monotonic() if now is None else now
            if self._full_since is None:
                self._full_since = now
            if now - self._full_since < self.full_wait_s:
                return  # held: the command blocks on its pipe meanwhile
        self._lose(exc)

    def _lose(self, exc: OSError) -> None:
        """Drop the held bytes (one pipe chunk in splice mode) and count them."""
        if self.reason is None:
            self.reason = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        if self._pending:
            self.lost_bytes += len(self._pending)
            self._pending = b""
        elif self._held_in_pipe:
            try:
                dropped = os.read(self.pipe_r, RELAY_CHUNK)
            except BlockingIOError:
                dropped = None
            if dropped == b"":
                self.eof = True
            elif dropped:
                self.lost_bytes += len(dropped)
        self._held_in_pipe = False
        # The disk stays judged full: the next refusal loses at once, with no new wait.

    def finish(self, deadline_s: float = 0.0) -> None:
        """The tree has ended: move what is left in the pipe, holding a full-disk write
        at most ``deadline_s`` more (then it is lost, and counted). Never waits for a
        writer: one that escaped the tree cannot hold the job open."""
        end = time.monotonic() + deadline_s
        while not self.eof:
            before = (self.written, self.lost_bytes, self.pending)
            if self.pending:
                self.retry()
                if self.pending:
                    if time.monotonic() >= end:
                        self._lose(OSError(errno.ENOSPC, "no room left"))
                    else:
                        time.sleep(RETRY_S)
                    continue
            else:
                self._move()
            if (self.written, self.lost_bytes, self.pending) == before and not self.eof:
                return  # the pipe is empty and a writer is still open: nothing more now

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


class JobOutput:
    """A job's stdout and stderr as pipes (the exec supervisor's side): the command gets
    the write ends, a ``SpoolRelay`` per stream moves what arrives into the spool."""

    def __init__(self, full_wait_s: float) -> None:
        self.out_r, self.out_w = output_pipe()
        self.err_r, self.err_w = output_pipe()
        self.full_wait_s = full_wait_s
        self.relays: list = []

    def start(self, out: int, err: int) -> None:
        """The command holds the write ends now; this process only reads."""
        os.close(self.out_w)
        os.close(self.err_w)
        self.relays = [
            SpoolRelay(self.out_r, out, self.full_wait_s),
            SpoolRelay(self.err_r, err, self.full_wait_s),
        ]

    def abandon(self) -> None:
        """Nothing started: close all four ends."""
        for fd in (self.out_r, self.out_w, self.err_r, self.err_w):
            os.close(fd)

    def watched(self) -> list:
        return [r.pipe_r for r in self.relays if r.wants_read()]

    def held(self) -> bool:
        return any(r.pending for r in self.relays)

    def move(self, ready: list) -> None:
        for r in self.relays:
            if r.pipe_r in ready:
                r.on_readable()
            elif r.pending:
                r.retry()

    def copied(self) -> int:
        return sum(r.written for r in self.relays)

    def finish(self) -> bytes:
        """After the tree is dead: what is left in the pipes, then close them; the loss
        words of the ``exit`` line (`` out:ENOSPC:LOST:STORED``), empty when none."""
        words = b""
        for name, r in zip((b"out", b"err"), self.relays, strict=True):
            r.finish(self.full_wait_s)
            os.close(r.pipe_r)
            loss = r.loss()
            if loss is not None:
                words += b" %s:%s:%d:%d" % (
                    name,
                    str(loss["reason"]).encode(),
                    loss["lost_bytes"],
                    loss["stored_bytes"],
                )
        return words
