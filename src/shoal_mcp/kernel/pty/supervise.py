"""The PTY program supervisor: a child subreaper between the kernel and a PTY's program.

    python -I -S supervise.py STATUS_FD CTRL_FD SPEC_FD|- PACKAGE_ROOT LC_CTYPE PATH ARGV...

Started by ``spawn.py`` (the kernel side) with the terminal's slave as fds 0/1/2, in a
session of its own.  It is what the exec supervisor (``kernel/exec/supervise.py``) is to
an exec, and reuses its tree helpers (``Tree``, ``_drain``, ``_subreaper``, ``_wakeup_pipe``):

1. It becomes a child subreaper, so every orphan of the program's tree (``&``,
   ``setsid``, ``nohup``) is reparented to it instead of to init.
2. It forks the program: the child starts a new session, makes the slave its controlling
   terminal (``TIOCSCTTY``), resets every signal disposition and the signal mask (a
   kernel started with SIGINT ignored must not hand that on, or Ctrl-C would be dead),
   applies the sandbox spec read from ``SPEC_FD`` (Landlock for token principals), undoes
   the interpreter's C-locale coercion of ``LC_CTYPE`` and ``execve``s ``PATH``.  The
   kernel, multi-threaded, never runs Python between fork and exec: this process is a
   fresh single-threaded interpreter.
3. On ``STATUS_FD`` it writes ``started PID`` once the program was exec'd, or the reason
   it could not be, then closes it.  It puts /dev/null on its own 0/1/2, so only the
   program's tree holds the terminal.
4. It waits for (a) the program to exit or (b) EOF on ``CTRL_FD``, a pipe whose write end
   only the kernel holds: the kernel closed the PTY, exited or was SIGKILLed.  Either
   way it SIGKILLs the whole tree below it and reaps it, then ends with the program's
   own status: the same exit code, or death by the same signal (no core file), so the
   kernel reads the program's status from this process like from the program itself.

Standard library only, plus the two shoal modules above (both import nothing else).
"""

import _signal as signal  # not `signal`: its enums cost ~6 ms at every open
import os
import resource
import select
import sys

_STARTED = b"started "
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
_EXEC_FAILED = 127


def _program(
    err_w: int, spec: "object | None", lc_ctype: str, path: str, argv: "list[str]"
) -> None:
    """In the forked child: become the terminal's session, confine, exec (never returns)."""
    try:
        import fcntl
        import termios

        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        for s in signal.valid_signals():
            if s not in (signal.SIGKILL, signal.SIGSTOP):
                try:
                    signal.signal(s, signal.SIG_DFL)
                except (OSError, ValueError):
                    pass
        signal.set_wakeup_fd(-1)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        if spec is not None:
            from shoal_mcp.kernel.access import sandbox

            sandbox.apply(spec)  # type: ignore[arg-type]
            os.environ.update(spec.environ())  # type: ignore[attr-defined]
        if lc_ctype[:1] == "=":
            os.environ["LC_CTYPE"] = lc_ctype[1:]
        else:
            os.environ.pop("LC_CTYPE", None)
        os.execve(path, argv, os.environ)
    except BaseException as e:  # noqa: BLE001 - the forked child must never return
        os.write(err_w, f"{type(e).__name__}: {e}".encode("utf-8", "replace")[:2000])
    os._exit(_EXEC_FAILED)


def _read_all(fd: int, ctrl: int) -> "bytes | None":
    """Everything on ``fd`` until EOF; None if the kernel gave up first (EOF on ``ctrl``)."""
    data = b""
    while True:
        ready, _, _ = select.select([fd, ctrl], [], [])
        if fd in ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                return data
            data += chunk
        elif not os.read(ctrl, 64):
            return None


def _end_like(status: int) -> None:
    """Exit with the program's wait status: its exit code, or death by its signal."""
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        os._exit(code)
    sig = -code
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if sig != signal.SIGKILL:
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
    except (OSError, ValueError):
        pass
    os._exit(128 + sig)  # a signal that does not end a process cannot be a death signal


def main(args: "list[str]") -> None:
    status_w, ctrl = int(args[0]), int(args[1])
    spec_arg, root, lc_ctype, path, argv = args[2], args[3], args[4], args[5], args[6:]
    for fd in (status_w, ctrl):
        os.set_inheritable(fd, False)  # the program must not hold the kernel's pipes
    try:
        sys.path.insert(0, root)
        from shoal_mcp.kernel.exec.supervise import Tree, _drain, _subreaper, _wakeup_pipe

        spec = None
        if spec_arg != "-":
            from shoal_mcp.kernel.access import sandbox

            spec_fd, data = int(spec_arg), b""
            while chunk := os.read(spec_fd, 65536):
                data += chunk
            os.close(spec_fd)
            spec = sandbox.SandboxSpec.from_bytes(data)
        # Only the control pipe says stop (SIGKILL aside); the program gets an empty mask.
        signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        wake_r = _wakeup_pipe()
        _subreaper()
        err_r, err_w = os.pipe()
    except BaseException as e:  # noqa: BLE001 - reported to the kernel as a spawn failure
        os.write(status_w, f"supervisor: {type(e).__name__}: {e}".encode("utf-8", "replace"))
        os._exit(_EXEC_FAILED)
    pid = os.fork()
    if pid == 0:
        _program(err_w, spec, lc_ctype, path, argv)
    os.close(err_w)
    tree = Tree(pid)
    failure = _read_all(err_r, ctrl)
    os.close(err_r)
    if failure is None or failure:
        os.write(status_w, failure or b"the kernel gave up waiting")
        tree.kill_all()
        os._exit(_EXEC_FAILED)
    os.write(status_w, _STARTED + b"%d\n" % pid)
    os.close(status_w)
    # From here on only the program's tree holds the terminal (and the cwd).
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    os.chdir("/")
    try:
        while tree.status is None:
            ready, _, _ = select.select([ctrl, wake_r], [], [])
            if wake_r in ready:
                _drain(wake_r)
                tree.reap()
            if ctrl in ready and not os.read(ctrl, 64):
                break  # the kernel closed the PTY, exited or died: nothing may outlive it
    finally:
        tree.kill_all()
    _end_like(tree.status if tree.status is not None else signal.SIGKILL)


if __name__ == "__main__":
    main(sys.argv[1:])
