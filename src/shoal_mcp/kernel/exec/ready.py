"""Ready shells: a bash already started, per (principal, session), waiting for its source.

Starting bash (fork, exec, the loader, locale) is most of a small exec's time.  Once a
foreground exec's reply is written, the session's next bash is started (by the thread
that wrote it, or by the owner loop without waiting for it: ``ready_start.py``) under
the principal's warm zygote (or the session's lane), with the session's cwd and
environment as they are now, reused spools and its own supervisor (a job like any
other), and blocks reading one byte from a pipe; an exec arriving while it starts
waits for it, up to ``READY_SHELL_WAIT_S``.  An exec whose cwd, environment, sandbox
spec and output cap are exactly those hands it the source (through a memfd) and the
go byte; anything else discards it (the pipe closes, bash exits) and starts cold.

Equal strings are not the same state (issue 31): when taken, a shell is also
re-validated against the files themselves, and any doubt is a cold start: the
directory bash sits in must be the one the session's cwd resolves to now (same path,
device and inode, not deleted: a cwd removed and re-created, moved aside, or a
re-pointed symlink all fail), its spool files must still be the ones it writes to
(a spool dir removed under the kernel), and the sandbox's granted paths the same
inodes its rules were made for.  No ready shell is made while ``BASH_ENV`` is set:
bash reads that file when it starts, so a ready shell would run it ahead of time (and
once more for every shell discarded unused).  Each
ready shell runs one source, so nothing passes between execs; its source runs through
``eval`` at line 1, which differs from ``bash -c`` only in the word ``eval`` instead of
``-c`` in syntax error messages.  See docs/decisions.md, "Exec round trip", second and
third pass.

Bounds: one per (principal, session), at most ``READY_SHELLS_MAX`` (least recently
made goes first), none older than ``WARM_POOL_IDLE_S``, none without a warm zygote
(so none for a principal whose ``max_tasks`` is 0), none for a source over
``MAX_ARG_BYTES``.  ``SHOAL_WARM_SHELLS=0`` turns them off with the zygotes.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..config.limits import READY_SHELL_WAIT_S, READY_SHELLS_MAX, WARM_POOL_IDLE_S
from ..owner.tables import TABLES
from .runner import (
    BASH,
    BASH_ARGV,
    STATE_FD,
    RunningCommand,
    _bytes,
    _prelude,
)
from .supervisor import Job

log = logging.getLogger(__name__)

SCRIPT_FD = 96
"""Where a ready bash reads its source (a memfd)."""
GO_FD = 97
"""The pipe a ready bash blocks on: one byte means run, EOF means exit unused."""
LOADER = (
    f"IFS= read -r -n 1 -u {GO_FD} __shoal_go || exit 0; exec {GO_FD}<&-; "
    f"IFS= read -r -d '' -u {SCRIPT_FD} __shoal_src; exec {SCRIPT_FD}<&-; SECONDS=0; "
    'eval "unset __shoal_go __shoal_src; $__shoal_src"'
)
"""After the EXIT trap, on the same first line: wait, read the source, run it."""
READY_ARGV = [_bytes(a) for a in (BASH, *BASH_ARGV[1:], _prelude(STATE_FD) + LOADER)]
"""A ready bash's argv, as its supervisor gets it."""


ReadyKey = tuple[str, str]  # (principal, session)
FileId = tuple[int, int] | None
"""(device, inode) of a path, None when it cannot be stat'ed."""


def file_ids(paths: dict[str, FileId] | list[str]) -> dict[str, FileId]:
    """(device, inode) of each path now (symlinks followed)."""
    ids: dict[str, FileId] = {}
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            ids[path] = None
            continue
        ids[path] = (st.st_dev, st.st_ino)
    return ids


def in_directory(pid: int, cwd: str) -> bool:
    """Whether process ``pid`` sits in the directory ``cwd`` names now: the same path
    after resolving symlinks, the same device and inode, and not deleted (a directory
    removed and made again may get the freed inode number back)."""
    try:
        where = os.readlink(f"/proc/{pid}/cwd")
        here = os.stat(f"/proc/{pid}/cwd")
        real = os.path.realpath(cwd)
        there = os.stat(real)
    except OSError:
        return False
    return (
        where == real
        and here.st_nlink > 0
        and (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)
    )


@dataclass
class ReadyShell:
    """One started bash waiting for its source, and what it was started with."""

    cwd: str
    env: dict[str, str]
    spec_bytes: bytes
    cap: int
    job: Job
    out_path: Path
    err_path: Path
    state_fd: int
    script_fd: int
    go_fd: int
    made: float = field(default_factory=time.monotonic)
    files: dict[str, FileId] = field(default_factory=dict)
    """Spools and granted paths as they were when the shell started (``file_ids``)."""
    dropper: Callable[[ReadyShell], None] | None = None
    """Who waits for a discarded shell's end and then calls ``remove_files`` (the warm
    pool's keeper); None: ``discard`` does, on the caller's thread."""

    def matches(self, cwd: str, env: dict[str, str], spec_bytes: bytes, cap: int) -> bool:
        return self.job.exit is None and (cwd, env, spec_bytes, cap) == (
            self.cwd,
            self.env,
            self.spec_bytes,
            self.cap,
        )

    def still_valid(self) -> bool:
        """The files under the strings are still those the shell started with: its
        working directory is what the cwd resolves to now, its spools and the sandbox's
        granted paths the same inodes. Any doubt (an unreadable /proc entry) is False."""
        if self.env.get("BASH_ENV") or self.job.pid is None:
            return False
        if self.job.own_pids:
            # A sandboxed bash's pid is its own namespace's: its /proc entry is not ours
            # to read.  Its cwd is checked by path and inode (in ``files``) instead, and
            # the zygote's view by ``Supervisor.fresh``.
            return file_ids(self.files) == self.files
        return in_directory(self.job.pid, self.cwd) and file_ids(self.files) == self.files

    def start(self, src: str) -> RunningCommand | None:
        """Run ``src`` in it; None when it is gone (then it was discarded)."""
        started, started_ns = time.time(), time.monotonic_ns()
        try:
            os.pwrite(self.script_fd, _bytes(src), 0)  # its offset stays 0 for bash's read
            os.write(self.go_fd, b"g")
        except (OSError, UnicodeEncodeError):  # the cold path reports a bad source
            self.discard()
            return None
        os.close(self.go_fd)
        os.close(self.script_fd)
        self.go_fd = self.script_fd = -1
        return RunningCommand(
            src,
            self.cwd,
            self.job,
            self.out_path,
            self.err_path,
            self.state_fd,
            started=started,
            started_ns=started_ns,
        )

    def discard(self) -> None:
        """Unused: bash reads EOF and exits, its tree is killed; its end is reaped and
        its files removed by the ``dropper``, off the caller's thread."""
        for fd in (self.go_fd, self.script_fd):
            if fd >= 0:
                os.close(fd)
        self.go_fd = self.script_fd = -1
        self.job.kill()
        if self.dropper is not None:
            self.dropper(self)
            return
        self.job.wait()
        self.remove_files()

    def remove_files(self) -> None:
        """After the job's end: its spools and its state memfd go."""
        for path in (self.out_path, self.err_path):
            path.unlink(missing_ok=True)
        if self.state_fd >= 0:
            os.close(self.state_fd)
            self.state_fd = -1


class ReadyShells:
    """At most one ready shell per (principal, session); see the module docstring."""

    def __init__(
        self,
        *,
        max_shells: int = READY_SHELLS_MAX,
        idle_s: float = WARM_POOL_IDLE_S,
        dropper: Callable[[ReadyShell], None] | None = None,
    ):
        self.max_shells = max_shells
        self.idle_s = idle_s
        self.dropper = dropper  # given to each shell made here (ReadyShell.dropper)
        self._shells: OrderedDict[ReadyKey, ReadyShell] = OrderedDict()
        self._making: set[ReadyKey] = set()
        # Notified when a make ended (its shell or none); the table itself is TABLES'.
        self._made = threading.Condition(TABLES)
        self._waiters: dict[ReadyKey, list[Callable[[], None]]] = {}  # when_made callbacks
        self._closed = False
        self.hits = 0
        self.misses = 0
        self.on_lanes = 0  # started on the last exec's supervisor (supervisor.Lane)
        self.waited_for = 0  # execs on the owner loop that waited for their shell's start

    def take(
        self,
        key: ReadyKey,
        cwd: str,
        env: dict[str, str],
        spec_bytes: bytes,
        cap: int,
        *,
        wait: bool = True,
    ) -> ReadyShell | None:
        """The key's shell if it was started with exactly this state, else None.

        A shell still starting is waited for, up to ``READY_SHELL_WAIT_S``: its start is
        well under way, a cold start would begin from nothing (back-to-back execs).
        ``wait=False`` (the owner loop): None at once, with nothing counted or discarded,
        unless the shell is there and fits (the take on a thread then decides)."""
        deadline = time.monotonic() + READY_SHELL_WAIT_S
        with TABLES:
            if not wait:
                there = self._shells.get(key)
                if there is None or not there.matches(cwd, env, spec_bytes, cap):
                    return None
            while key in self._making and key not in self._shells:
                left = deadline - time.monotonic()
                if left <= 0 or not self._made.wait(left):
                    break
            shell = self._shells.pop(key, None)
            stale = self._expired()
        for old in stale:
            old.discard()
        if shell is None:
            self.misses += 1
            return None
        if not (shell.matches(cwd, env, spec_bytes, cap) and shell.still_valid()):
            self.misses += 1
            shell.discard()
            return None
        self.hits += 1
        return shell

    def when_made(self, key: ReadyKey, then: Callable[[], None]) -> bool:
        """For a caller that must not wait (the owner loop): True when the key's shell
        is being made, and ``then()`` is called once that make has ended (with its shell
        or none, on the thread that made it); False when no make is under way (then
        ``then`` is never called)."""
        with TABLES:
            if self._closed or key not in self._making or key in self._shells:
                return False
            self._waiters.setdefault(key, []).append(then)
            self.waited_for += 1
            return True

    def _ended(self, key: ReadyKey) -> None:
        """A make (or a reservation) of ``key`` ended: its waiters are told, outside the
        table lock (caller does not hold it)."""
        with TABLES:
            waiters = self._waiters.pop(key, [])
        for then in waiters:
            try:
                then()
            except Exception:  # noqa: BLE001 - a waiter's failure is its own
                log.exception("a ready-shell waiter failed")

    def reserve(self, key: ReadyKey) -> bool:
        """Say that the key's next shell is coming (``refill(reserved=True)`` after the
        exec's reply): from now on a take waits for it, as for one being made. Before
        the reply, so the caller's next exec cannot arrive first and start cold. True:
        reserved, and the caller must refill or ``release``."""
        with TABLES:
            if self._closed or key in self._making or key in self._shells:
                return False
            self._making.add(key)
            return True

    def release(self, key: ReadyKey) -> None:
        """A reservation with no refill after all (the exec's output was not stored)."""
        with TABLES:
            self._making.discard(key)
            self._made.notify_all()
        self._ended(key)

    def refill(
        self, key: ReadyKey, make: Callable, *, reserved: bool = False, later: bool = False
    ) -> None:
        """Start the key's next shell with ``make()`` (a callable returning a ReadyShell
        or None), unless one is ready or being made (``reserved``: by this caller); on
        this thread (the exec service calls it once its reply is written, so no thread
        is started for it). ``later`` (the owner loop): ``make(done)`` starts it and
        calls ``done(shell or None)`` once, when its start is answered."""
        with TABLES:
            stale = self._expired()
            if reserved:
                busy = self._closed
            else:
                busy = self._closed or key in self._making or key in self._shells
                if not busy:
                    self._making.add(key)
        for old in stale:
            old.discard()
        if busy:
            if reserved:
                self.release(key)
            return
        try:
            if later:
                make(lambda shell: self._made_one(key, shell))
                return
            shell = make()
        except Exception as exc:  # noqa: BLE001 - the next exec simply starts cold
            log.debug("ready shell for %s not started: %s", key, exc)
            shell = None
        self._made_one(key, shell)

    def _made_one(self, key: ReadyKey, shell: ReadyShell | None) -> None:
        """A make of ``key`` ended, with its shell or none."""
        if shell is not None:
            shell.dropper = self.dropper
        with TABLES:
            self._making.discard(key)
            self._made.notify_all()
            if shell is None:
                drop = []
            elif self._closed:
                drop = [shell]
            else:
                drop = [s for s in (self._shells.pop(key, None),) if s is not None]
                self._shells[key] = shell
                while len(self._shells) > self.max_shells:
                    drop.append(self._shells.popitem(last=False)[1])
        for old in drop:
            old.discard()
        self._ended(key)

    def _expired(self) -> list[ReadyShell]:
        """Shells unused for ``idle_s`` (caller holds ``TABLES``): taken out."""
        now = time.monotonic()
        old = [k for k, s in self._shells.items() if now - s.made > self.idle_s]
        return [self._shells.pop(k) for k in old]

    def close(self) -> None:
        """Kernel exit: every ready shell is discarded; none is made any more."""
        with TABLES:
            self._closed = True
            shells = list(self._shells.values())
            self._shells.clear()
            waiting = list(self._waiters)
        for key in waiting:
            self._ended(key)
        for shell in shells:
            shell.discard()  # killed now: the zygotes close next and wait for their jobs

    def __len__(self) -> int:
        with TABLES:
            return len(self._shells)
