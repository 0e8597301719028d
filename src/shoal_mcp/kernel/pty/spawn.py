"""Starting a program on a new pseudoterminal (docs/protocol.md, PTYs): the spawn trampoline.

Owns `spawn` (openpty, winsize, the trampoline, the exec status pipe), the `execvp`-like
`cmd` lookup and `-32023` errors. No PTY bookkeeping here: `pty.PtyManager` validates the
request, calls `spawn` and owns the process and master fd afterwards.

* **Spawning.** `os.openpty()` + `subprocess.Popen` with the slave as fds 0/1/2 and
  `start_new_session=True` (own session and process group; pgid == pid). The slave becomes
  the child's *controlling terminal* through a tiny trampoline (`python -I -S -c …`) that
  runs `ioctl(0, TIOCSCTTY)`, resets every signal disposition and the signal mask to the
  defaults (a kernel started with SIGINT ignored must not hand that on, or Ctrl-C would be
  dead), undoes the interpreter's C-locale coercion of `LC_CTYPE`, and `execve`s the program
  — so the multi-threaded kernel never runs Python code between fork and exec (no
  `preexec_fn`; CPython's C fork/exec path, vfork-capable, is used). Exec failures come
  back through a close-on-exec status pipe and raise `-32023`. The trampoline costs ~15 ms
  per `open`.
* **Sandbox.** For a confined principal the kernel passes a `SandboxSpec`; the trampoline
  applies it (plus this terminal's own slave device) after the signal reset and before
  the exec, so the program and everything it starts (`less`'s `!cmd`, a shell) are
  confined (docs/security.md). A spec that cannot be applied is a `-32023`.
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

from ...protocol.errors import ErrorCode, RpcError
from ...protocol.limits import CANCEL_GRACE_S, PTY_SPAWN_TIMEOUT_S, PTY_TERM
from ..access.sandbox import RUNNER, SandboxSpec

__all__ = ["spawn"]

# Runs between fork and exec instead of a preexec_fn; see the module docstring.
_TRAMPOLINE = """\
import os, sys, fcntl, signal, termios
w = int(sys.argv[1])
try:
    os.set_inheritable(w, False)
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    for s in signal.valid_signals():
        if s not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(s, signal.SIG_DFL)
            except (OSError, ValueError):
                pass
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    if sys.argv[2] != "-":
        sys.path.insert(0, sys.argv[3])
        from shoal_mcp.kernel.access import sandbox
        spec_fd, data = int(sys.argv[2]), b""
        while chunk := os.read(spec_fd, 65536):
            data += chunk
        os.close(spec_fd)
        spec = sandbox.SandboxSpec.from_bytes(data)
        sandbox.apply(spec)
        os.environ.update(spec.environ())
    lc = sys.argv[4]
    if lc[:1] == "=":
        os.environ["LC_CTYPE"] = lc[1:]
    else:
        os.environ.pop("LC_CTYPE", None)
    os.execve(sys.argv[5], sys.argv[6:], os.environ)
except BaseException as e:
    os.write(w, f"{type(e).__name__}: {e}".encode("utf-8", "replace")[:2000])
    os._exit(127)
"""


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
    """None once the trampoline exec'd (EOF, nothing written), else its error text."""
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
) -> tuple[subprocess.Popen, int]:
    """Start `cmd` on a new terminal of `cols` x `rows`; return the process and the master fd.

    The arguments are already validated (`PtyManager.open`); raises `-32023` if the program
    cannot be started. The master is non-blocking and owned by the caller. With `sandbox`,
    the trampoline applies it (plus this terminal's own device) before the exec, so the
    program and everything it starts (`less`'s `!cmd`, a shell) are confined.
    """
    if not os.path.isdir(cwd):
        raise _spawn_error(cmd, f"cwd {cwd!r} is not a directory")
    path = _resolve(cmd, env, cwd)

    child_env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}
    child_env["TERM"] = PTY_TERM
    lc_ctype = "=" + child_env["LC_CTYPE"] if "LC_CTYPE" in child_env else "-"

    master, slave = os.openpty()
    status_r, status_w = os.pipe()
    spec_fd: int | None = None
    try:
        if sandbox is not None:
            spec = sandbox.plus(devices=(os.path.realpath(os.ttyname(slave)),))
            spec_fd = os.memfd_create("shoal-sandbox-spec")
            os.write(spec_fd, spec.to_bytes())  # a memfd takes a whole write at once
            os.lseek(spec_fd, 0, os.SEEK_SET)
        box = ["-", "-"] if spec_fd is None else [str(spec_fd), _PACKAGE_ROOT]
        _winsize(master, cols, rows)
        attrs = termios.tcgetattr(slave)
        attrs[0] |= getattr(termios, "IUTF8", 0)
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        os.set_blocking(master, False)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-I",
                "-S",
                "-c",
                _TRAMPOLINE,
                str(status_w),
                *box,
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
            start_new_session=True,
            pass_fds=(status_w,) if spec_fd is None else (status_w, spec_fd),
        )
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        os.close(master)
        os.close(status_r)
        raise _spawn_error(cmd, str(e)) from None
    finally:
        os.close(slave)
        os.close(status_w)
        if spec_fd is not None:
            os.close(spec_fd)
    try:
        failure = _read_status(status_r)
    finally:
        os.close(status_r)
    if failure is not None:
        try:
            proc.wait(timeout=CANCEL_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.close(master)
        raise _spawn_error(cmd, failure)
    return proc, master
