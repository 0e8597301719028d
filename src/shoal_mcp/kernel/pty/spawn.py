"""Starting a program on a new pseudoterminal (docs/protocol.md, PTYs), below its supervisor.

Owns `spawn` (openpty, winsize, the supervisor's pipes), the `execvp`-like `cmd` lookup
and `-32023` errors. No PTY bookkeeping here: `pty.PtyManager` validates the request, calls
`spawn` and owns the supervisor, master fd and control pipe afterwards.

* **Spawning.** `os.openpty()` + `subprocess.Popen` of the PTY supervisor (`supervise.py`,
  a fresh `python -I -S`) with the slave as fds 0/1/2 and `start_new_session=True`. The
  supervisor is a child subreaper: it forks the program into a new session whose
  controlling terminal is the slave (the program leads its own process group: pgid ==
  pid), resets every signal disposition and the signal mask, and execs it. So the
  multi-threaded kernel never runs Python code between fork and exec (no `preexec_fn`).
  It reports `started PID` (or why the program could not start: `-32023`) on a status
  pipe. It kills the program's whole tree (`&`, `setsid`, `nohup` included) when the
  program exits, or when the kernel closes the control pipe (`pty.close`, kernel exit) or
  dies (the pipe's write end closes with it). It ends with the program's own status, so
  `Spawned.proc.returncode` is the program's. Costs ~20 ms per `open`.
* **Sandbox.** For a confined principal the kernel passes a `SandboxSpec`; the supervisor
  applies it (plus this terminal's own slave device) in the program's process after the
  signal reset and before the exec, so the program and everything it starts (`less`'s
  `!cmd`, a shell) are confined (docs/security.md). A spec that cannot be applied is a
  `-32023`. The supervisor itself stays unconfined: it runs no caller code.
* **Environment.** The caller passes the complete environment (session env + overrides);
  `TERM=xterm-256color` is always set, because the emulator is what it is. `COLUMNS` and
  `LINES` are *removed*, not set: ncurses lets them override the window size ioctl, so a
  program would never see a resize. The size is the tty's winsize (`TIOCSWINSZ`).
  `cmd` is resolved like `execvp` against the given env's `PATH` (relative entries and
  relative paths against `cwd`); argv[0] is `cmd` as given.
"""

from __future__ import annotations

import fcntl
import os
import select
import struct
import subprocess
import sys
import termios
import time
from typing import NamedTuple

from ...protocol.errors import ErrorCode, RpcError
from ..access.sandbox import RUNNER, SandboxSpec
from ..config.limits import CANCEL_GRACE_S, PTY_SPAWN_TIMEOUT_S, PTY_TERM

__all__ = ["spawn"]

# The program runs below its own supervisor (a child subreaper); see supervise.py.
_SUPERVISOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "supervise.py")
_STARTED = "started "


class Spawned(NamedTuple):
    """A started PTY program: its supervisor, the terminal and the program's pid."""

    proc: subprocess.Popen
    """The supervisor. It ends after the program's whole tree, with the program's status."""
    master: int
    """The terminal's master side, non-blocking."""
    pid: int
    """The program: leader of the terminal's session and of its own process group."""
    ctrl: int
    """Write end of the supervisor's control pipe. Closing it (or the kernel dying)
    makes the supervisor kill the program's whole tree."""


# Where `shoal_mcp` is imported from: the trampoline puts it on sys.path (it runs -I -S).
_PACKAGE_ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(RUNNER))))
)


def _winsize(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _spawn_error(cmd: str, reason: str) -> RpcError:
    return RpcError(
        ErrorCode.PTY_SPAWN,
        f"pty spawn failed: {cmd[:200]}: {reason}",
        {"cmd": cmd[:200], "reason": reason},
    )


def _resolve(cmd: str, env: dict[str, str], cwd: str) -> str:
    """execvp's lookup, against the given env's PATH and relative to `cwd`."""
    if "/" in cmd:
        candidates = [os.path.join(cwd, cmd)]
    else:
        path = env.get("PATH", os.defpath)
        candidates = [os.path.join(cwd, d or ".", cmd) for d in path.split(os.pathsep)]
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.normpath(c)
    raise _spawn_error(cmd, "command not found or not executable")


def _read_status(fd: int) -> str | None:
    """What the supervisor wrote until EOF: ``started PID`` or why the program did not
    start; None if it wrote nothing."""
    chunks: list[bytes] = []
    deadline = time.monotonic() + PTY_SPAWN_TIMEOUT_S
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return "timed out waiting for the program to start"
        if not poller.poll(left * 1000):
            continue
        data = os.read(fd, 4096)
        if not data:
            break
        chunks.append(data)
    text = b"".join(chunks).decode("utf-8", "replace")
    return text or None


def spawn(
    cmd: str,
    args: list[str],
    cols: int,
    rows: int,
    env: dict[str, str],
    cwd: str,
    *,
    sandbox: SandboxSpec | None = None,
) -> Spawned:
    """Start `cmd` on a new terminal of `cols` x `rows`, below its own supervisor.

    The arguments are already validated (`PtyManager.open`); raises `-32023` if the program
    cannot be started. The master is non-blocking; it and `ctrl` are owned by the caller.
    With `sandbox`, the program is confined (plus this terminal's own device) before its
    exec, so it and everything it starts (`less`'s `!cmd`, a shell) are confined.
    """
    if not os.path.isdir(cwd):
        raise _spawn_error(cmd, f"cwd {cwd!r} is not a directory")
    path = _resolve(cmd, env, cwd)

    child_env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}
    child_env["TERM"] = PTY_TERM
    lc_ctype = "=" + child_env["LC_CTYPE"] if "LC_CTYPE" in child_env else "-"

    master, slave = os.openpty()
    status_r, status_w = os.pipe()
    ctrl_r, ctrl_w = os.pipe()
    spec_fd: int | None = None
    try:
        if sandbox is not None:
            spec = sandbox.plus(devices=(os.path.realpath(os.ttyname(slave)),))
            spec_fd = os.memfd_create("shoal-sandbox-spec")
            os.write(spec_fd, spec.to_bytes())  # a memfd takes a whole write at once
            os.lseek(spec_fd, 0, os.SEEK_SET)
        _winsize(master, cols, rows)
        attrs = termios.tcgetattr(slave)
        attrs[0] |= getattr(termios, "IUTF8", 0)
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        os.set_blocking(master, False)
        passed = (status_w, ctrl_r) if spec_fd is None else (status_w, ctrl_r, spec_fd)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-I",
                "-S",
                _SUPERVISOR,
                str(status_w),
                str(ctrl_r),
                "-" if spec_fd is None else str(spec_fd),
                _PACKAGE_ROOT,
                lc_ctype,
                path,
                cmd,
                *args,
            ],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=cwd,
            env=child_env,
            start_new_session=True,  # out of the kernel's group: its signals are not ours
            pass_fds=passed,
        )
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        for fd in (master, status_r, ctrl_w):
            os.close(fd)
        raise _spawn_error(cmd, str(e)) from None
    finally:
        for fd in (slave, status_w, ctrl_r):
            os.close(fd)
        if spec_fd is not None:
            os.close(spec_fd)
    try:
        status = _read_status(status_r)
    finally:
        os.close(status_r)
    if status is not None and status.startswith(_STARTED):
        return Spawned(proc, master, int(status[len(_STARTED) :]), ctrl_w)
    os.close(ctrl_w)  # the supervisor kills whatever it started, then exits
    try:
        proc.wait(timeout=CANCEL_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    os.close(master)
    raise _spawn_error(cmd, status or "the program's supervisor ended without starting it")
