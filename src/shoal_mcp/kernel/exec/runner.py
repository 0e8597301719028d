"""Spawning bash for ``exec``: own session, stdin /dev/null, output to spools, supervised.

Each command runs under an exec supervisor (``supervisor.py``) that owns its whole
process tree. The child writes stdout/stderr straight into files in the spool
directory; the kernel never reads them into memory. An EXIT trap reports the final cwd and exported
environment through an extra descriptor so ``cd``/``export`` persist (docs/decisions.md, Exec).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...protocol.errors import ErrorCode, RpcError
from ...protocol.framing import write_all
from ..access.sandbox import SandboxSpec
from ..config.limits import SPOOLS_KEPT
from ..owner.tables import TABLES
from .exports import parse_report
from .supervisor import Job, Supervisor

BASH_ARGV = ["bash", "--noprofile", "--norc", "-c"]
BASH = shutil.which("bash") or "/bin/bash"
"""Resolved once: the supervisor execs a path (it does not search PATH)."""
STATE_FD = 99
"""Where bash finds the descriptor its EXIT trap writes cwd and env to; high, so a
script's own ``exec 3>…`` redirections do not clobber it."""
SOURCE_FD = 98
"""Where a source too long for argv is read from."""
MAX_ARG_BYTES = 120 * 1024
"""Longest script passed as the ``-c`` argument (Linux caps one argv string at 128 KiB);
longer sources are read by bash from a descriptor (``. /dev/fd/N``)."""


def _prelude(fd: int) -> str:
    # Kept on the same line as the user's first line so bash's line numbers match theirs.
    # Builtins only (``export -p``, not ``$(compgen -e)``): no subshell forked at the end
    # of every exec (exports.py reads it back).
    return (
        "__shoal_exit() { local __shoal_s=$?; { builtin printf '%s\\0' \"$PWD\"; "
        f"builtin export -p; }} >&{fd} 2>/dev/null; exit $__shoal_s; }}; "
        "trap __shoal_exit EXIT; "
    )


@dataclass
class RunningCommand:
    """A supervised bash whose output is being written to spool files.

    ``job`` is its run under a supervisor (``supervisor.py``), which owns the process
    tree: ``pid`` is bash's, which leads its own session and process group; the tree
    is gone once :meth:`wait` returns.
    """

    src: str
    cwd: str
    job: Job
    out_path: Path
    err_path: Path
    state_fd: int
    """The EXIT trap's report: a memfd, not a file in the spool dir (creating and deleting
    a file per exec made ext4's inode allocator the kernel's top CPU cost)."""
    started: float = field(default_factory=time.time)
    started_ns: int = field(default_factory=time.monotonic_ns)
    finished_ns: int | None = None
    cancelled: bool = False
    returncode: int | None = None
    output_capped: bool = False
    """Stopped for passing ``max_output_bytes`` (the spools hold exactly the cap)."""
    output_lost: dict[str, dict[str, object]] = field(default_factory=dict)
    """Bytes a full or failing disk refused, per stream (``spool_relay.SpoolRelay.loss``)."""

    @property
    def pid(self) -> int:
        return self.job.pid if self.job.pid is not None else 0

    def wait(self, timeout: float | None = None, wake: int | None = None) -> int | None:
        """Wait for the command's end; the returncode, or None when ``timeout`` elapsed
        (or the fd ``wake`` became readable) first.  On return with a code every
        process of the tree is dead: the spools are final."""
        end = self.job.wait(timeout, wake)
        if end is None:
            return None
        if self.finished_ns is None:
            self.finished_ns = time.monotonic_ns()
        self.output_capped = end.capped
        self.output_lost = end.lost
        self.returncode = end.returncode
        return self.returncode

    def check_exit(self) -> int | None:
        """The returncode if the exit report has arrived, else None: reads what the
        report socket holds and never waits (for a watcher told it is readable)."""
        return self.wait(0)

    def output_sizes(self) -> tuple[int, int]:
        return _size(self.out_path), _size(self.err_path)

    def signal_group(self, sig: int) -> bool:
        return self.job.signal_group(sig)

    def begin_terminate(self, *, at_once: bool = False) -> None:
        """Ask the supervisor to end the command, and return at once: SIGTERM to bash's
        group, then, ``CANCEL_GRACE_S`` later unless the tree has ended, SIGKILL to the
        whole tree, setsid'd and nohup'd descendants included. The supervisor times the
        grace; whoever watches the task reads the exit. ``at_once``: the SIGKILL now,
        without a SIGTERM."""
        self.cancelled = True
        if at_once or not self.job.terminate():
            self.job.kill()

    def terminate(self) -> None:
        """``begin_terminate`` and wait for the end, for a command nobody else watches;
        leaves no zombie."""
        self.begin_terminate()
        self.wait()

    def read_state(self) -> tuple[str, dict[str, str]] | None:
        """The (cwd, exported env) the EXIT trap wrote, or None if it never ran."""
        if self.state_fd < 0:
            return None
        size = os.fstat(self.state_fd).st_size
        chunks = []
        offset = 0
        while offset < size:
            chunk = os.pread(self.state_fd, size - offset, offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
        return parse_report(b"".join(chunks))

    def state_stat(self) -> os.stat_result | None:
        """The report's size and when it was last written; None once discarded."""
        return os.fstat(self.state_fd) if self.state_fd >= 0 else None

    def discard_state(self) -> None:
        fd, self.state_fd = self.state_fd, -1
        if fd >= 0:
            os.close(fd)

    @property
    def reaped(self) -> bool:
        """The supervisor reported the whole tree gone: nothing writes the spools now."""
        return self.job.reported

    def discard(self) -> None:
        """Remove the spools and the report (nothing of this exec is stored)."""
        for path in (self.out_path, self.err_path):
            path.unlink(missing_ok=True)
        self.discard_state()


class SpoolBin:
    """Empty spool files for the next execs of one spool dir.

    A finished exec's spool whose blob was already stored (the same output again, an
    empty stderr) is kept here instead of deleted, and the next spawn or ready shell takes
    it (emptied as it opens it) instead of creating a file: ext4 inode allocation under
    create/delete churn was the kernel's top CPU cost.  Only spools of a tree its
    supervisor reported reaped are kept (nothing can still write them); at most
    ``SPOOLS_KEPT``.
    """

    def __init__(self, spool_dir: Path) -> None:
        self.spool_dir = spool_dir
        self._free: list[Path] = []  # a kernel table (TABLES)

    def take(self, suffix: str) -> tuple[int, Path]:
        """An open (write) descriptor on an empty spool, and its path."""
        while True:
            with TABLES:
                path = self._free.pop() if self._free else None
            if path is None:
                fd, name = tempfile.mkstemp(prefix="run-", suffix=suffix, dir=self.spool_dir)
                return fd, Path(name)
            try:
                return _emptied(path), path
            except OSError:
                continue  # removed under us (spool dir cleaned): take another

    def give_back(self, path: Path) -> None:
        """Keep ``path`` (already ingested) for reuse, or delete it; it is emptied when
        taken, not here (off the path of the exec that gives it back)."""
        with TABLES:
            if len(self._free) < SPOOLS_KEPT:
                self._free.append(path)
                return
        path.unlink(missing_ok=True)


def _emptied(path: Path) -> int:
    """A write descriptor on ``path`` emptied, through a descriptor of its own.

    ext4 (``auto_da_alloc``) flushes a file truncated to zero and then written when the
    last descriptor open at the truncation is closed: had the command's own descriptor
    truncated it, its close at the end of the exec would start a writeback (about 150
    µs, measured, on the exec's critical path). Closing the truncating descriptor
    first, while nothing is written yet, leaves nothing to flush."""
    flags = os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW
    os.close(os.open(path, flags | os.O_TRUNC))
    return os.open(path, flags)


def take_spools(spool_dir: Path, fds: list[int], paths: list[Path], owner: str) -> None:
    """A job's stdout and stderr spools from ``owner``'s bin of ``spool_dir``, appended to
    ``fds`` and ``paths`` as each is taken (a caller's cleanup then sees a pair taken
    halfway)."""
    spools = spool_bin(spool_dir, owner)
    for suffix in (".out", ".err"):
        fd, path = spools.take(suffix)
        fds.append(fd)
        paths.append(path)


_BINS: dict[tuple[Path, str], SpoolBin] = {}  # a kernel table (TABLES)


def spool_bin(spool_dir: Path, owner: str) -> SpoolBin:
    """``owner``'s bin of ``spool_dir`` (spawn takes, finalize gives back).  One per
    principal: a spool is never reused for another principal's output, so whatever one
    principal could still do to a file it once wrote never reaches another's."""
    with TABLES:
        found = _BINS.get((spool_dir, owner))
        if found is None:
            found = _BINS[(spool_dir, owner)] = SpoolBin(spool_dir)
        return found


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def spawn(
    src: str,
    cwd: str,
    env: dict[str, str],
    spool_dir: Path,
    *,
    sandbox: SandboxSpec | None = None,
    max_output_bytes: int = 0,
    supervisor: Supervisor | None = None,
    owner: str = "",
) -> RunningCommand:
    """Start ``bash -c src`` under a supervisor, stdout/stderr going to fresh spools.

    ``supervisor`` is the pool's warm zygote for this principal and ``sandbox``;
    without it one is started here for this job alone (cold).  ``max_output_bytes``
    (0: none) caps stdout + stderr.  ``owner``: the principal, whose spool bin is used.
    """
    if not os.path.isdir(cwd):
        raise RpcError(
            ErrorCode.RAISED,
            f"session cwd {cwd!r} no longer exists",
            {"cwd": cwd, "hint": "exec 'cd /some/dir' in a new session or recreate the directory"},
        )
    fds: list[int] = []
    paths: list[Path] = []
    state_fd = -1
    try:
        take_spools(spool_dir, fds, paths, owner)
        state_fd = os.memfd_create("shoal-state", os.MFD_CLOEXEC)
        fds.append(state_fd)
        script = _prelude(STATE_FD) + src
        targets = [STATE_FD]
        if len(script.encode("utf-8", "surrogatepass")) > MAX_ARG_BYTES:
            # Too long for one argv string (E2BIG): bash reads the source from an
            # inherited descriptor of an already unlinked file instead.
            # Sandboxed, it lives in the private temp dir: bash reopens it by path, and
            # the spool dir (in the kernel's state dir) is outside every sandbox.
            src_dir = sandbox.tmpdir if sandbox is not None and sandbox.tmpdir else spool_dir
            src_fd, src_name = tempfile.mkstemp(prefix="run-", suffix=".src", dir=src_dir)
            fds.append(src_fd)
            os.unlink(src_name)
            write_all(src_fd, src.encode("utf-8", "surrogatepass"))
            os.lseek(src_fd, 0, os.SEEK_SET)
            targets.append(SOURCE_FD)
            script = _prelude(STATE_FD) + f". /dev/fd/{SOURCE_FD}"
        cold = supervisor is None
        if supervisor is None:
            supervisor = Supervisor(sandbox.to_bytes() if sandbox is not None else b"")
        started_ns = time.monotonic_ns()
        job = supervisor.run(
            [_bytes(a) for a in (BASH, *BASH_ARGV[1:], script)],
            _bytes(cwd),
            {_bytes(k): _bytes(v) for k, v in env.items()},
            fds,
            targets,
            max_output_bytes,
            write=[_bytes(str(p)) for p in paths[:2]] if sandbox is not None else [],
            last=cold,
        )
    except (OSError, UnicodeEncodeError) as exc:
        for p in paths:
            p.unlink(missing_ok=True)
        if state_fd >= 0:
            os.close(state_fd)
        raise RpcError(
            ErrorCode.INTERNAL, f"cannot spawn bash: {exc}", {"reason": str(exc)}
        ) from exc
    finally:
        for fd in fds:
            if fd != state_fd:
                os.close(fd)
    return RunningCommand(src, cwd, job, paths[0], paths[1], state_fd, started_ns=started_ns)
