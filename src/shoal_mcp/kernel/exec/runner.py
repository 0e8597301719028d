"""Spawning bash for ``exec``: own process group, stdin /dev/null, output to spools.

The child writes stdout/stderr straight into files in the spool directory; the kernel
never reads them into memory. An EXIT trap reports the final cwd and exported
environment through an extra descriptor so ``cd``/``export`` persist (docs/decisions.md, Exec).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...protocol.errors import ErrorCode, RpcError
from ...protocol.framing import write_all
from ...protocol.limits import CANCEL_GRACE_S
from ..access.sandbox import SandboxSpec, runner_argv

BASH_ARGV = ["bash", "--noprofile", "--norc", "-c"]
MAX_ARG_BYTES = 120 * 1024
"""Longest script passed as the ``-c`` argument (Linux caps one argv string at 128 KiB);
longer sources are read by bash from a descriptor (``. /dev/fd/N``)."""


def _prelude(fd: int) -> str:
    # Kept on the same line as the user's first line so bash's line numbers match theirs.
    return (
        "__shoal_exit() { local __shoal_s=$?; { printf '%s\\0' \"$PWD\"; "
        'for __shoal_n in $(compgen -e); do printf \'%s=%s\\0\' "$__shoal_n" "${!__shoal_n}"; '
        f"done; }} >&{fd} 2>/dev/null; exit $__shoal_s; }}; trap __shoal_exit EXIT; "
    )


@dataclass
class RunningCommand:
    """A spawned bash whose output is being written to spool files."""

    src: str
    cwd: str
    proc: subprocess.Popen
    out_path: Path
    err_path: Path
    state_path: Path
    started: float = field(default_factory=time.time)
    started_ns: int = field(default_factory=time.monotonic_ns)
    finished_ns: int | None = None
    cancelled: bool = False
    # A pidfd becomes readable when the child exits: waiting with a timeout then wakes
    # at the exit itself, where Popen.wait(timeout) would poll with growing sleeps.
    pidfd: int | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        opener = getattr(os, "pidfd_open", None)  # Linux 5.3+; elsewhere Popen polls
        if opener is not None:
            try:
                self.pidfd = opener(self.proc.pid)
            except OSError:
                self.pidfd = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for exit; the returncode, or None when ``timeout`` elapsed first."""
        pidfd = self.pidfd
        if self.proc.returncode is None and timeout is not None and pidfd is not None:
            try:
                ready, _, _ = select.select([pidfd], [], [], timeout)
            except (OSError, ValueError):  # another waiter reaped it and closed the pidfd
                ready = [pidfd]
            if not ready:
                return None
            timeout = None  # exited: the reap below does not block
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        if self.finished_ns is None:
            self.finished_ns = time.monotonic_ns()
        self._close_pidfd()
        return code

    def _close_pidfd(self) -> None:
        fd, self.pidfd = self.pidfd, None
        if fd is not None:
            os.close(fd)

    def output_sizes(self) -> tuple[int, int]:
        return _size(self.out_path), _size(self.err_path)

    def signal_group(self, sig: int) -> bool:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def terminate(self, grace: float = CANCEL_GRACE_S) -> None:
        """SIGTERM the whole group, SIGKILL after ``grace``; leaves no zombie."""
        self.cancelled = True
        self.signal_group(signal.SIGCONT)  # a stopped group cannot act on TERM
        self.signal_group(signal.SIGTERM)
        if self.wait(grace) is None:
            self.signal_group(signal.SIGKILL)
            self.wait()
        # Stragglers that ignored TERM (or were forked by the script) go too.
        self.signal_group(signal.SIGKILL)

    def read_state(self) -> tuple[str, dict[str, str]] | None:
        """The (cwd, exported env) the EXIT trap wrote, or None if it never ran."""
        try:
            raw = self.state_path.read_bytes()
        except FileNotFoundError:
            return None
        parts = raw.split(b"\0")
        if len(parts) < 2 or not parts[0]:
            return None
        cwd = parts[0].decode("utf-8", "surrogateescape")
        env: dict[str, str] = {}
        for item in parts[1:]:
            name, sep, value = item.partition(b"=")
            if sep:
                env[name.decode("utf-8", "surrogateescape")] = value.decode(
                    "utf-8", "surrogateescape"
                )
        return cwd, env

    def discard_state(self) -> None:
        try:
            os.unlink(self.state_path)
        except FileNotFoundError:
            pass


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def spawn(
    src: str,
    cwd: str,
    env: dict[str, str],
    spool_dir: Path,
    *,
    sandbox: SandboxSpec | None = None,
) -> RunningCommand:
    """Start ``bash -c src`` with stdout/stderr going to fresh spool files.

    With ``sandbox``, bash starts under ``sandbox_run.py``, which applies the spec in the
    fresh child before exec (no ``preexec_fn`` in the threaded kernel); the exec's own
    stdout/stderr spool files are added to its writable paths (``> /dev/stdout``)."""
    if not os.path.isdir(cwd):
        raise RpcError(
            ErrorCode.RAISED,
            f"session cwd {cwd!r} no longer exists",
            {"cwd": cwd, "hint": "exec 'cd /some/dir' in a new session or recreate the directory"},
        )
    fds = []
    paths = []
    try:
        for suffix in (".out", ".err", ".state"):
            fd, name = tempfile.mkstemp(prefix="run-", suffix=suffix, dir=spool_dir)
            fds.append(fd)
            paths.append(Path(name))
        out_fd, err_fd, state_fd = fds
        script = _prelude(state_fd) + src
        pass_fds = [state_fd]
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
            pass_fds.append(src_fd)
            script = _prelude(state_fd) + f". /dev/fd/{src_fd}"
        argv = [*BASH_ARGV, script]
        if sandbox is not None:
            spec_fd = _spec_fd(sandbox.plus(write=(str(paths[0]), str(paths[1]))))
            fds.append(spec_fd)
            pass_fds.append(spec_fd)
            argv = runner_argv(spec_fd, argv, env=env)
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out_fd,
            stderr=err_fd,
            pass_fds=tuple(pass_fds),
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        for p in paths:
            p.unlink(missing_ok=True)
        raise RpcError(
            ErrorCode.INTERNAL, f"cannot spawn bash: {exc}", {"reason": str(exc)}
        ) from exc
    finally:
        for fd in fds:
            os.close(fd)
    return RunningCommand(src, cwd, proc, paths[0], paths[1], paths[2])


def _spec_fd(spec: SandboxSpec) -> int:
    """A descriptor holding the spec for the supervisor (a memfd: no size limit, no file)."""
    fd = os.memfd_create("shoal-sandbox-spec")  # close-on-exec; pass_fds hands it to the child
    try:
        write_all(fd, spec.to_bytes())
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd
