"""The exec supervisor: a per-(principal, sandbox) zygote that forks a supervisor per job
(or, without a sandbox, per run of a session's jobs: a lane).

    python -I -S supervise.py CTRL_FD

Standard library only (and cheap builtins: ``_socket``, ``_signal``, ``marshal``), so
it starts in ~10 ms; the kernel side is ``supervisor.py``, the design is in
docs/architecture.md (Processes) and docs/decisions.md (Exec processes).

Protocol on the ``CTRL_FD`` stream socket (a socketpair with the kernel); a frame is a
4-byte big-endian length and a :mod:`marshal` payload:

1. kernel → frame *spec*: ``SandboxSpec.to_bytes()``, or empty for no sandbox.  The
   zygote confines itself once (``sandbox.confine_process``: no_new_privs, private
   network, no capabilities, seccomp); each job's supervisor adds the Landlock rules
   (``sandbox.restrict_files``) with that job's spool paths.  Everything below
   inherits both.
2. kernel → frame *job* ``{"argv", "cwd", "env", "fds", "cap", "write", "full_wait",
   "grace"}`` (``write``: the spool paths, added to the sandbox's write rules for this
   job; ``full_wait``: seconds a write to a full disk is held before its bytes count as
   lost; ``grace``: seconds between a terminate's SIGTERM and its SIGKILL) with, as SCM_RIGHTS, the job's own control socket, the stdout and stderr
   spools, then the extra descriptors to put at the numbers in ``fds``.  Any number of jobs, one after
   another; the zygote forks a supervisor for each (a fork costs far less than a new
   interpreter) and goes on waiting.  EOF: no more jobs; the zygote exits once the
   running ones (each on its own socket) have ended, reaping their supervisors.

On a job's socket, the forked supervisor — a child subreaper, so every orphan of its
tree is reparented to it, ``setsid`` or not — answers:

3. ``b"pid N\\n"``: the command (bash) started, in its own session and process group.
4. ``b"exit WSTATUS CAPPED[ LOSS…]\\n"`` once bash exited and every other process of the
   tree is dead and reaped: after it, nothing writes the spools.  Then it exits.  A
   ``LOSS`` word ``out|err:ERRNO:LOST:STORED`` names a stream that lost bytes.
5. A job whose frame says ``"stay"`` (only ever sent to a zygote without a sandbox)
   makes its supervisor a *lane*: after ``exit`` it waits on the same socket for the
   kernel's next job of that session, a ``0`` byte then a job frame with its spools and
   extra descriptors (no socket: this one goes on), and runs it as above; EOF instead
   ends it.  Bytes other than ``0`` that arrive between jobs are signals sent too late
   for the job that ended: dropped.  A lane saves a fork of the zygote and an exit per
   exec.  It takes no next job once a command changed what the next tree would inherit
   from it (``_inherited``).  A sandboxed job never stays, because its supervisor's
   confinement is the job's own (a SysV IPC namespace per job, Landlock rules bound to
   that job's spool inodes).

The command never holds a spool: its stdout and stderr are pipes this supervisor
copies into the spools (``spool_relay.py``), the one witness of a write a full or
failing disk refused, and no descriptor to a stored output outlives the job.

A byte the kernel sends on the job's socket is a signal for the command's process
group, except ``TERMINATE`` (255): SIGCONT and SIGTERM to the group now, and the whole
tree killed ``grace`` seconds later unless it has ended by then. The grace is timed
here, so the kernel's cancel is one write and no kernel thread waits it out.

EOF on the job's socket (the kernel cancelled, exited or was SIGKILLed: its end closes
with it) kills the whole tree at once.  So does stdout + stderr passing ``cap`` bytes
(``CAPPED`` = 1; the spools are cut back to ``cap``).  A sandbox that cannot be applied
is reported like ``sandbox_run.py``: the message on the job's stderr, status 125.
"""

import _signal
import _socket
import marshal
import os
import select
import sys
import time

_PR_SET_CHILD_SUBREAPER = 36
_SANDBOX_FAILED = 125
_EXEC_FAILED = 126
_NOT_FOUND = 127
_MAX_FDS = 8
_STOP_SIGNALS = {_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP}
TERMINATE = 255  # not a signal number: SIGTERM now, the tree killed after the grace
_SANDBOX_ENV: dict = {}
_COMMAND_POLICY: "tuple | None" = None  # set by _batch(): the policy a command runs with


_libc = None


def _subreaper() -> None:
    """Make this process a child subreaper (not inherited over fork: set per job)."""
    import ctypes

    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_CHILD_SUBREAPER failed")


def _recv_exact(sock: "_socket.socket", n: int, fds: list) -> bytes:
    buf = b""
    while len(buf) < n:
        data, anc, _flags, _addr = sock.recvmsg(n - len(buf), _socket.CMSG_SPACE(4 * _MAX_FDS))
        for level, kind, payload in anc:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                usable = len(payload) - len(payload) % 4
                fds.extend(
                    int.from_bytes(payload[i : i + 4], sys.byteorder) for i in range(0, usable, 4)
                )
        if not data:
            raise EOFError
        buf += data
    return buf


def _recv_frame(sock: "_socket.socket", fds: list) -> object:
    size = int.from_bytes(_recv_exact(sock, 4, fds), "big")
    return marshal.loads(_recv_exact(sock, size, fds)) if size else b""


def _descendants(root: int, spare: "set | frozenset" = frozenset()) -> list:
    """Pids whose parent chain leads to ``root`` (from /proc; gone ones are skipped),
    leaving out ``spare`` and everything below them."""
    parent = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        parent[int(entry)] = int(fields[1])
    found = []
    for pid in parent:
        p, seen = pid, 0
        while p in parent and seen < 4096 and p not in spare:
            p, seen = parent[p], seen + 1
            if p == root:
                found.append(pid)
                break
    return found


class Tree:
    """The command's process tree below this (subreaper) process."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.status: int | None = None  # bash's wait status, once reaped

    def reap(self, block: bool = False) -> bool:
        """Reap every exited child; True when no child is left at all."""
        while True:
            try:
                pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
            except ChildProcessError:
                return True
            if pid == 0:
                return False
            if pid == self.pid:
                self.status = status
            block = False

    def kill_all(self) -> None:
        """SIGKILL every descendant until none is left (orphans come back to us)."""
        try:
            os.killpg(self.pid, 9)
        except OSError:
            pass
        me = os.getpid()
        while not self.reap():
            for pid in _descendants(me):
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass
            if self.reap(block=True):
                return


def _start(job: dict, out: int, err: int, extra: list) -> int:
    """Start the command in its own session; its pid, or raise OSError (nothing ran).

    ``posix_spawn`` (vfork-like) returns once the program is exec'd, so the pid leads
    its own group when reported and a cancel sent at once reaches it.  The cwd is set
    on this process around the spawn: posix_spawn has no chdir action here.
    """
    actions = [(os.POSIX_SPAWN_DUP2, out, 1), (os.POSIX_SPAWN_DUP2, err, 2)]
    actions += [(os.POSIX_SPAWN_DUP2, fd, t) for fd, t in zip(extra, job["fds"], strict=False)]
    policy = {} if _COMMAND_POLICY is None else {"scheduler": _COMMAND_POLICY}  # see _batch
    os.chdir(job["cwd"])
    try:
        return os.posix_spawn(
            job["argv"][0],
            job["argv"],
            job["env"],
            file_actions=actions,
            setsid=True,
            setsigmask=(),  # the stop signals blocked here are open again in the command
            setsigdef=(_signal.SIGXFSZ,),  # ignored here only (see _job)
            **policy,  # type: ignore[arg-type]
        )
    finally:
        os.chdir("/")


def _cut(out: int, err: int, cap: int) -> bool:
    """Cut the spools back to ``cap`` bytes in all (stdout first); True if they passed it."""
    out_size, err_size = os.fstat(out).st_size, os.fstat(err).st_size
    if out_size + err_size <= cap:
        return False
    keep_out = min(out_size, cap)
    os.ftruncate(out, keep_out)
    os.ftruncate(err, min(err_size, cap - keep_out))
    return True


_RELAY: list = []


def _relay_module():
    """``spool_relay`` (standard library only), imported once per zygote."""
    if not _RELAY:
        here = os.path.abspath(__file__)
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(here)))))
        from shoal_mcp.kernel.exec import spool_relay

        _RELAY.append(spool_relay)
    return _RELAY[0]


def _run(sock: "_socket.socket", wake_r: int, job: dict, out: int, err: int, extra: list) -> tuple:
    """Run one job to the end of its whole tree: (wait status, capped, loss words, alive).

    ``alive`` is False once the kernel closed the socket: this supervisor exits then.
    Bytes the kernel sends on the socket are signals for the command's process group
    (a job in a pid namespace: the kernel cannot name its pids itself), or TERMINATE.
    """
    if job.get("mkdir"):  # a spare $SHOAL_OUT directory for the kernel (values/spare_dirs.py)
        try:
            os.mkdir(job["mkdir"], 0o700)
        except OSError:
            pass  # the kernel's rename of it fails, and it makes its own
    output = _relay_module().JobOutput(job.get("full_wait") or 0.0)
    try:
        pid = _start(job, output.out_w, output.err_w, extra)
    except OSError as e:
        output.abandon()
        os.write(
            err, b"shoal: cannot start the command: " + str(e).encode(errors="replace") + b"\n"
        )
        code = _NOT_FOUND if isinstance(e, FileNotFoundError) else _EXEC_FAILED
        return code << 8, False, b"", True
    finally:
        for fd in extra:
            os.close(fd)
    output.start(out, err)
    tree = Tree(pid)
    sock.sendall(b"pid %d\n" % pid)
    cap = job.get("cap") or 0
    capped = False
    alive = True
    ctrl = sock.fileno()
    kill_at = None  # set by TERMINATE: when the grace ends
    while True:
        timeout = _relay_module().RETRY_S if output.held() else None  # a full disk: retry
        if kill_at is not None:
            left = max(0.0, kill_at - time.monotonic())
            timeout = left if timeout is None else min(timeout, left)
        ready, _, _ = select.select([ctrl, wake_r, *output.watched()], [], [], timeout)
        if wake_r in ready:
            _drain(wake_r)
            tree.reap()
            if tree.status is not None:
                break
        if ctrl in ready:
            signals = sock.recv(64)
            if not signals:
                alive = False  # the kernel cancelled, exited or died: nothing may outlive it
                break
            for sig in signals:
                if sig == TERMINATE:
                    _signal_group(pid, (_signal.SIGCONT, _signal.SIGTERM))  # stopped: CONT
                    if kill_at is None:
                        kill_at = time.monotonic() + job["grace"]
                else:
                    _signal_group(pid, (sig,))
        output.move(ready)
        if cap and output.copied() > cap:
            capped = True
            break
        if kill_at is not None and time.monotonic() >= kill_at:
            break  # the grace is over: the whole tree is killed below
    tree.kill_all()
    lost = output.finish()
    if cap:
        capped = _cut(out, err, cap) or capped
    return (tree.status if tree.status is not None else 9), capped, lost, alive


def _signal_group(pid: int, signals: tuple) -> None:
    for sig in signals:
        try:
            os.killpg(pid, sig)
        except OSError:
            pass


_SANDBOX: dict = {}  # the zygote's spec and Landlock ABI, once confined


def _confine(spec_bytes: bytes) -> "str | None":
    """Confine this zygote to the spec; the reason it failed, or None.

    With a view (namespaces), the zygote moves into the namespaces and becomes their
    init (``sandbox.enter_namespaces``; the process that started stays behind as a relay)
    and keeps the user namespace's capabilities, not dumpable, to give each job a SysV
    IPC namespace of its own; each job's supervisor then drops them and confines itself
    (``sandbox.JobConfinement``).  Without one: everything but the file rules now, those
    per job with the job's spool paths (``sandbox.confine_process``)."""
    try:
        here = os.path.abspath(__file__)
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(here)))))
        from shoal_mcp.kernel.access import namespaces, sandbox

        spec = sandbox.SandboxSpec.from_bytes(spec_bytes)
        if spec.view is not None:
            sandbox.enter_namespaces(spec, init=False)
            namespaces.set_dumpable(False)
            _SANDBOX["jobs"] = sandbox.JobConfinement(spec)
            abi = 0
        else:
            abi, _netns = sandbox.confine_process(spec)
        _SANDBOX.update(module=sandbox, spec=spec, abi=abi)
        _SANDBOX_ENV.update({k.encode(): v.encode() for k, v in spec.environ().items()})
    except OSError as e:
        return str(e)
    return None


def _restrict_files(job: dict) -> None:
    """In a job's supervisor: in namespaces, the whole confinement of the job's tree;
    else the spec's Landlock rules plus this job's own spools (``> /dev/stdout``
    reopens the spool by path)."""
    sandbox = _SANDBOX["module"]
    spec = _SANDBOX["spec"]
    if spec.view is not None:
        _SANDBOX["jobs"].apply()
        return
    data = spec.to_dict()
    data["write"] = [*data["write"], *(p.decode("utf-8", "surrogateescape") for p in job["write"])]
    sandbox.restrict_files(sandbox.SandboxSpec.from_dict(data), _SANDBOX["abi"])


def _wakeup_pipe() -> int:
    """SIGCHLD wakes ``select`` through a pipe; returns its read end."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    old = _signal.set_wakeup_fd(wake_w)
    if old != -1:
        os.close(old)
    _signal.signal(_signal.SIGCHLD, lambda *_: None)
    return wake_r


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 256):
            pass
    except BlockingIOError:
        pass


def _job(job: dict, fds: list, failure: "str | None") -> None:
    """In the forked supervisor: run one job on its own socket, report, exit; a lane
    (``stay``) runs the session's next jobs on that socket first."""
    sock = _socket.socket(fileno=fds[0])
    out, err, extra = fds[1], fds[2], fds[3:]
    try:
        # A spool past RLIMIT_FSIZE must fail the relay's write (EFBIG, counted as lost),
        # not kill this supervisor before it reports.
        _signal.signal(_signal.SIGXFSZ, _signal.SIG_IGN)
        wake_r = _wakeup_pipe()
        _subreaper()
        if failure is None and _SANDBOX:
            _restrict_files(job)
    except OSError as e:
        failure = str(e)
    if failure is not None:
        os.write(err, b"shoal sandbox: " + failure.encode(errors="replace") + b"\n")
        _close_spools(out, err)
        sock.sendall(b"exit %d 0\n" % (_SANDBOX_FAILED << 8))
        return
    inherited = _inherited() if job.get("stay") else None
    while True:
        job["env"].update(_SANDBOX_ENV)
        status, capped, lost, alive = _run(sock, wake_r, job, out, err, extra)
        _close_spools(out, err)
        sock.sendall(b"exit %d %d%s\n" % (status, int(capped), lost))
        if not (alive and job.get("stay")) or _SANDBOX or _inherited() != inherited:
            return
        following = _next_job(sock)
        if following is None:
            return
        job, fds = following
        out, err, extra = fds[0], fds[1], fds[2:]


def _inherited() -> tuple:
    """What a job's tree inherits from this supervisor that a command could change from
    outside (``prlimit``, ``renice``, ``taskset``, ``choom``, a cgroup move, ``ptrace``
    on ``$PPID``): a lane that finds any of it changed after a job takes no other, so
    nothing of one exec reaches the next."""
    found: list = [os.getpriority(os.PRIO_PROCESS, 0), frozenset(os.sched_getaffinity(0))]
    for name in ("limits", "oom_score_adj", "cgroup"):
        found.append(_proc_file(name))
    status = _proc_file("status")
    found += (
        [None]
        if status is None
        else [line for line in status.splitlines() if line.startswith(b"TracerPid:")]
    )
    return tuple(found)


def _proc_file(name: str) -> "bytes | None":
    """``/proc/self/<name>`` read with plain ``os.read``: it runs after every job of a
    lane, and a buffered ``open`` costs five more system calls per file."""
    try:
        fd = os.open(f"/proc/self/{name}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks: list = []
        while True:
            chunk = os.read(fd, 8192)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)


def _next_job(sock: "_socket.socket") -> "tuple | None":
    """A lane between jobs: the next job and its descriptors (spools, then extras), or
    None at EOF or on a frame that is not one."""
    while True:
        fds: list = []
        try:
            marker = _recv_exact(sock, 1, fds)
            if marker != b"\0":  # a signal for the job that ended
                for fd in fds:
                    os.close(fd)
                continue
            job = _recv_frame(sock, fds)
        except (EOFError, OSError):
            job = None
        for fd in fds:  # SCM_RIGHTS descriptors arrive inheritable; only dup2 targets may be
            os.set_inheritable(fd, False)
        if not isinstance(job, dict) or len(fds) < 2:
            for fd in fds:
                os.close(fd)
            return None
        return job, fds


def _close_spools(out: int, err: int) -> None:
    """Close this supervisor's spool descriptors before reporting the end: once the
    kernel hears ``exit`` it may unlink the spools, and an unlinked file held open here
    would keep its blocks (a full disk would stay full until this process exits)."""
    os.close(out)
    os.close(err)


def _batch() -> None:
    """This zygote and every supervisor forked from it run as ``SCHED_BATCH``: the same
    share of the CPU, but their wake-ups (a job's frame, a lane asked for the session's
    next shell) do not preempt the kernel's owner loop, which every agent waits on
    (docs/decisions.md, "Foreground execs on the owner loop"). The command itself is
    spawned back in ``SCHED_OTHER``: what it runs is scheduled as it always was."""
    global _COMMAND_POLICY
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError):
        return  # not Linux, or refused: nothing changes
    _COMMAND_POLICY = (os.SCHED_OTHER, os.sched_param(0))


def main(args: list) -> int:
    _batch()
    zsock = _socket.socket(fileno=int(args[0]))
    os.set_inheritable(zsock.fileno(), False)
    # Only the socket says stop (or SIGKILL).  Blocked, not ignored: the command gets
    # an empty mask at spawn, and ignored signals would stay ignored over exec.
    _signal.pthread_sigmask(_signal.SIG_BLOCK, _STOP_SIGNALS)
    wake_r = _wakeup_pipe()
    fds: list = []
    try:
        spec_bytes = _recv_frame(zsock, fds)
    except EOFError:
        return 0
    failure = _confine(spec_bytes) if spec_bytes else None  # type: ignore[arg-type]
    _relay_module()  # before any job: a confined job's supervisor imports nothing
    _subreaper()  # also loads ctypes once, so each forked supervisor has it

    ctrl = zsock.fileno()
    jobs: set = set()  # pids of the job supervisors this zygote forked and has not reaped
    while True:
        ready, _, _ = select.select([wake_r] if ctrl < 0 else [ctrl, wake_r], [], [])
        if wake_r in ready:
            _drain(wake_r)
            if _reap_jobs(jobs) and ctrl < 0:
                return 0
        if ctrl < 0 or ctrl not in ready:
            continue
        fds = []
        try:
            job = _recv_frame(zsock, fds)
        except EOFError:
            # The kernel is done with this zygote: stay the parent (and reaper) of the
            # running jobs' supervisors until they end, so none is left to init.
            zsock.close()
            ctrl = -1
            if _reap_jobs(jobs):
                return 0
            continue
        for fd in fds:  # SCM_RIGHTS descriptors arrive inheritable; only dup2 targets may be
            os.set_inheritable(fd, False)
        if len(fds) < 3:
            for fd in fds:
                os.close(fd)
            continue
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(ctrl)
                os.close(wake_r)
                _job(job, fds, failure)  # type: ignore[arg-type]
            except BaseException:  # noqa: BLE001 - a forked child must never return here
                code = 1
            os._exit(code)
        jobs.add(pid)
        for fd in fds:
            os.close(fd)


def _reap_jobs(jobs: set) -> bool:
    """Reap exited children; True when none is left.

    The zygote is a subreaper too: if a job's supervisor is killed (only SIGKILL can:
    ``kill -9 $PPID`` from the command), its tree is reparented here and killed.
    """
    lost = False
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            break
        if pid in jobs:
            jobs.discard(pid)
            lost = lost or status != 0
        else:
            lost = True  # an orphan of a dead job supervisor
    if lost:
        me = os.getpid()
        while True:
            victims = _descendants(me, spare=jobs)
            if not victims:
                break
            for pid in victims:
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass
            for pid in victims:
                try:
                    os.waitpid(pid, 0)  # ours (reparented) once its parent died
                except ChildProcessError:
                    pass
    return not jobs


if __name__ == "__main__":
    os._exit(main(sys.argv[1:]))
