"""The kernel's handle on an exec supervisor process (``supervise.py``).

A :class:`Supervisor` is started (optionally inside a sandbox spec), then runs jobs one
at a time: :meth:`Supervisor.run` hands over the command's argv, cwd, env, its spool
descriptors and an output cap, and returns a :class:`Job` with the command's pid.
:meth:`Job.wait` returns once the whole process tree is gone.  :meth:`Job.kill` closes
our end of the control socket, which makes the supervisor SIGKILL the tree and exit
(so does the kernel dying).  A job of a zygote without a sandbox may be started to
*stay*: kept by its consumer (``Job.keep_lane``), its supervisor outlives the job as a
:class:`Lane` that takes the session's next job itself (``run(lane=…)``), one fork and
one exit fewer per exec (supervise.py, protocol step 5).  See docs/architecture.md,
Processes.
"""

from __future__ import annotations

import marshal
import os
import select
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..access.sandbox import SandboxSpec
from ..config.limits import (
    CANCEL_GRACE_S,
    LANE_START_TIMEOUT_S,
    SPOOL_FULL_WAIT_S,
    SUPERVISOR_START_TIMEOUT_S,
)
from ..owner.tables import TABLES
from .supervise import TERMINATE

SUPERVISE = Path(__file__).with_name("supervise.py")


class SupervisorError(OSError):
    """The supervisor could not be started or did not take its job."""


@dataclass(frozen=True)
class Exit:
    """How a supervised command ended: its raw wait status, whether it was stopped for
    passing the output cap, and what its streams lost to a full or failing disk
    (``{"out"|"err": {"reason", "lost_bytes", "stored_bytes"}}``, empty for none)."""

    wstatus: int
    capped: bool = False
    lost: dict[str, dict[str, object]] = field(default_factory=dict)

    @property
    def returncode(self) -> int:
        """Like ``Popen.returncode``: the exit status, or -N for signal N."""
        if os.WIFSIGNALED(self.wstatus):
            return -os.WTERMSIG(self.wstatus)
        if os.WIFEXITED(self.wstatus):
            return os.WEXITSTATUS(self.wstatus)
        return -9


def _frame(payload: bytes | dict[str, object]) -> bytes:
    data = b"" if payload == b"" else marshal.dumps(payload)  # type: ignore[arg-type]
    return len(data).to_bytes(4, "big") + data


class Supervisor:
    """One zygote process; forks a supervisor per job (unless it runs on a lane), any
    number concurrently."""

    def __init__(self, spec_bytes: bytes = b"") -> None:
        self.spec_bytes = spec_bytes
        # Its jobs run in a pid namespace of their own: their pids mean nothing here, so
        # signals go through each job's socket (supervise.py) instead of kill(2).
        view = SandboxSpec.from_bytes(spec_bytes).view if spec_bytes else None
        self.own_pids = view is not None
        # The directories its view bound: replaced since (rm -r, mv, a new mkdir), the
        # view would show the old ones (or read-only nothing); see fresh().
        self._bound = tuple(view["write"] + view["reveal"]) if view is not None else ()
        self._stamp = _identities(self._bound)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock = ours
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(SUPERVISE), str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
                close_fds=True,
                cwd="/",
                env={},
            )
        except OSError as exc:
            ours.close()
            raise SupervisorError(exc.errno, f"cannot start the exec supervisor: {exc}") from exc
        finally:
            theirs.close()
        self.closed = False
        self.jobs = 0
        self._send = threading.Lock()  # one frame at a time from any number of threads
        try:
            # A spec is a few KiB: it fits the socket buffer, so this never waits for the
            # child's start-up (which is what a warm zygote takes off the exec path).
            self.sock.sendall(_frame(spec_bytes))
        except OSError:
            self.closed = True  # died at once

    @property
    def pid(self) -> int:
        return self.proc.pid

    def fresh(self) -> bool:
        """Every path its namespaced view bound is still the same file or directory."""
        return not self._bound or _identities(self._bound) == self._stamp

    def alive(self) -> bool:
        return not self.closed and self.proc.poll() is None

    def run(
        self,
        argv: list[bytes],
        cwd: bytes,
        env: dict[bytes, bytes],
        fds: list[int],
        targets: list[int],
        cap: int,
        *,
        write: list[bytes] | None = None,
        last: bool = False,
        stay: bool = False,
        lane: Lane | None = None,
    ) -> Job:
        """Start a job: stdout, stderr, then extras in ``fds`` (placed at ``targets`` in
        the command).  The :class:`Job` has the command's pid once it started.

        ``write``: paths this job may also write in the sandbox (its spools).
        ``last``: a one-job (cold) zygote, told at once that no job follows; the job
        closes (reaps) it when it ends.
        ``stay``: its supervisor may become a lane (only without a sandbox).
        ``lane``: a lane of this zygote's to run the job on instead of a new fork; one
        that is not this zygote's or has ended is closed, and the zygote forks as ever."""
        job, on_lane = self.send(
            argv, cwd, env, fds, targets, cap, write=write, last=last, stay=stay, lane=lane
        )
        if on_lane:
            started = self._started(job, lane=True)
            if started is not None:
                return started
            job.close()  # nothing ran there: forked afresh
            if lane is not None:
                lane.used = False
            job, _ = self.send(argv, cwd, env, fds, targets, cap, write=write, stay=stay)
        started = self._started(job)
        assert started is not None  # only a lane's start can come back empty
        return started

    def send(
        self,
        argv: list[bytes],
        cwd: bytes,
        env: dict[bytes, bytes],
        fds: list[int],
        targets: list[int],
        cap: int,
        *,
        write: list[bytes] | None = None,
        last: bool = False,
        stay: bool = False,
        lane: Lane | None = None,
        mkdir: bytes | None = None,
    ) -> tuple[Job, bool]:
        """``run`` up to the start, without waiting for it: the job, and whether it went
        to ``lane`` (True) or to this zygote. Its start is read from its socket next:
        ``answered(job, line, lane=…)`` (the owner loop reads it when it is readable).
        ``mkdir``: a directory the supervisor makes before the job starts (a spare for
        ``$SHOAL_OUT``, values/spare_dirs.py); it is there once the start is answered."""
        owner = self if last else None
        stay = stay and not self.spec_bytes and not last
        frame = _frame(
            {
                "argv": argv,
                "cwd": cwd,
                "env": env,
                "fds": targets,
                "cap": cap,
                "write": write or [],
                "full_wait": SPOOL_FULL_WAIT_S,
                "grace": CANCEL_GRACE_S,
                "stay": stay,
                "mkdir": mkdir or b"",
            }
        )
        if lane is not None:
            job = lane.send(self, frame, fds) if stay else None
            lane.close()  # taken by the job, or of no use: the lane's supervisor exits
            if job is not None:
                return job, True
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        job = Job(ours, owner, own_pids=self.own_pids, stays=stay)
        try:
            with self._send:
                self.jobs += 1
                socket.send_fds(self.sock, [frame], [theirs.fileno(), *fds])
                if last:
                    self.closed = True
                    self.sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            self.closed = True
            job.close()
            raise SupervisorError(exc.errno, f"exec supervisor is gone: {exc}") from exc
        finally:
            theirs.close()
        return job, False

    def _started(self, job: Job, *, lane: bool = False) -> Job | None:
        """``job`` once its supervisor said how the start went (waited for here)."""
        return self.answered(job, job.line(start_timeout(lane)), lane=lane)

    def answered(self, job: Job, line: bytes | None, *, lane: bool = False) -> Job | None:
        """``job`` with its start's answer ``line`` (None: EOF, or none within
        ``start_timeout``); on a ``lane``, None when its supervisor is gone or did not
        answer: a lane only ever starts a ready shell's bash, which runs nothing before
        its go byte, so the caller forks one afresh instead."""
        job.zygote = self
        if line is not None and line.startswith(b"pid "):
            job.pid = int(line[4:])
            return job
        if line is not None and line.startswith(b"exit "):
            job.finish(line)  # nothing ran (sandbox not applied, exec failed)
            return job
        if lane:  # gone, or stopped by the last job (kill -STOP $PPID): not used again
            job.kill()
            return None
        if job.eof:
            # Its supervisor was killed before it could report (the command killed its
            # parent at once); the zygote, a subreaper too, kills what it left.
            job.finish(b"exit 9 0", reported=False)
            return job
        job.kill()
        job.close()
        raise SupervisorError(0, "exec supervisor did not start the command")

    def stop_taking(self) -> None:
        """No more jobs: the zygote exits once its running jobs ended (``close`` waits
        for that and reaps it)."""
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self, timeout: float | None = None) -> None:
        """No more jobs: the zygote exits once its running jobs ended; reap it then.

        Blocks until then (or ``timeout``: then it is left to exit on its own): call it
        where waiting is fine (a job's end, kernel exit).
        """
        self.stop_taking()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        self.sock.close()


def start_timeout(lane: bool) -> float:
    """How long a job's start may take to be answered: a lane's bash is started by a
    supervisor already running, a zygote's by a fork."""
    return LANE_START_TIMEOUT_S if lane else SUPERVISOR_START_TIMEOUT_S


def _losses(words: list[bytes]) -> dict[str, dict[str, object]]:
    """The ``exit`` line's loss words (``out:ENOSPC:LOST:STORED``) as a dict."""
    lost: dict[str, dict[str, object]] = {}
    for word in words:
        stream, reason, n_lost, n_stored = word.decode("ascii", "replace").split(":")
        lost[stream] = {"reason": reason, "lost_bytes": int(n_lost), "stored_bytes": int(n_stored)}
    return lost


def _identities(paths: tuple[str, ...]) -> tuple[tuple[int, int] | None, ...]:
    out: list[tuple[int, int] | None] = []
    for path in paths:
        try:
            st = os.stat(path)
            out.append((st.st_dev, st.st_ino))
        except OSError:
            out.append(None)
    return tuple(out)


class Job:
    """One command under its own forked supervisor: its pid, and its end once the tree
    is gone.  ``TABLES`` orders ``exit`` against kill/signal calls."""

    def __init__(
        self,
        sock: socket.socket,
        owner: Supervisor | None = None,
        *,
        own_pids: bool = False,
        stays: bool = False,
        zygote: Supervisor | None = None,
    ) -> None:
        self.sock = sock
        self.owner = owner  # a one-job zygote to reap once the job ended
        self.own_pids = own_pids  # pid is in the job's own pid namespace (a sandbox's)
        self.stays = stays  # its supervisor waits for a next job after this one (a lane)
        self.zygote = zygote  # whose lane it is (set by Supervisor._started)
        self.keep_lane = False  # its consumer takes the lane once the job ended
        self.pid: int | None = None
        self.exit: Exit | None = None
        self.reported = False  # the supervisor itself reported the end (tree reaped)
        self.eof = False
        self._reading = threading.Lock()  # one reader of the report at a time (may wait)
        # Its state fields are a kernel table (TABLES); what is done under it never waits:
        # the bytes to the supervisor go with MSG_DONTWAIT.
        self._buf = b""

    def line(self, timeout: float | None, wake: int | None = None) -> bytes | None:
        """The next report line; None at EOF (``eof`` set), when ``timeout`` ran out, or
        when the fd ``wake`` became readable first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        watched: list[socket.socket | int] = [self.sock] if wake is None else [self.sock, wake]
        # Told it is readable (timeout 0, the owner loop): read without a select first.
        flags = socket.MSG_DONTWAIT if timeout == 0 and wake is None else 0
        while b"\n" not in self._buf:
            if not flags:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                ready, _, _ = select.select(watched, [], [], remaining)
                if self.sock not in ready:
                    return None
            try:
                data = self.sock.recv(4096, flags)
            except (BlockingIOError, InterruptedError):
                if flags:
                    return None  # no whole line yet
                raise
            except ConnectionResetError:
                # The supervisor exited with bytes of ours unread (a lane that ended
                # because its last job changed it): the same as EOF.
                data = b""
            if not data:
                self.eof = True
                return None
            self._buf += data
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def finish(self, line: bytes, *, reported: bool = True) -> None:
        _, status, capped, *losses = line.split()
        with TABLES:
            self.exit = Exit(int(status), capped == b"1", _losses(losses))
            self.reported = reported
            lane = reported and self.stays and self.keep_lane
        if not lane:  # else the socket waits for take_lane or drop_lane
            self.close()

    def close(self) -> None:
        self.sock.close()
        owner, self.owner = self.owner, None
        if owner is not None:
            owner.close()  # it exits right after this job's supervisor did

    def take_lane(self) -> Lane | None:
        """Once the job ended: its supervisor, waiting for the session's next job (the
        caller runs one on it or closes it); None when it is not waiting."""
        with TABLES:
            kept = self.reported and self.stays and self.keep_lane and self.zygote is not None
            self.keep_lane = False
        if not kept or self.exit is None:
            return None
        assert self.zygote is not None
        return Lane(self.sock, self.zygote)

    def drop_lane(self) -> None:
        """Nobody will take the lane: the supervisor exits once the job ended (now, when
        it already has)."""
        with TABLES:
            kept = self.exit is not None and self.reported and self.stays and self.keep_lane
            self.keep_lane = False
        if kept:
            self.sock.close()

    def wait(self, timeout: float | None = None, wake: int | None = None) -> Exit | None:
        """The command's end (every process of its tree reaped); None on timeout, or
        once ``wake`` is readable (see ``line``)."""
        if self.exit is not None:
            return self.exit
        if not self._reading.acquire(timeout=-1 if timeout is None else timeout):
            return None
        try:
            if self.exit is not None:
                return self.exit
            line = self.line(timeout, wake)
            while line is not None and not line.startswith(b"exit "):
                line = self.line(timeout, wake)
            if line is not None:
                self.finish(line)
            elif self.eof:
                self._lost()
        finally:
            self._reading.release()
        return self.exit

    def _lost(self) -> None:
        """The supervisor died without its report (only SIGKILL does that): the command's
        group goes too; descendants that left it may survive (docs/decisions.md)."""
        with TABLES:
            if self.pid is not None and not self.own_pids:
                try:
                    os.killpg(self.pid, 9)
                except OSError:
                    pass
            # (in a pid namespace its init, the zygote, kills what the job left)
            self.exit = Exit(9)
        self.close()

    def kill(self) -> None:
        """Kill the whole tree now (EOF on the job's socket), unless it already ended."""
        with TABLES:
            if self.exit is None:
                self.stays = False  # its supervisor exits after the tree: no lane
                try:
                    self.sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

    def terminate(self) -> bool:
        """SIGTERM the group now and let the supervisor kill the tree when the job's
        grace is over (``supervise.TERMINATE``); False if the job is not running."""
        with TABLES:
            if self.exit is not None or self.pid is None:
                return False
            try:
                self.sock.send(bytes((TERMINATE,)), socket.MSG_DONTWAIT)
            except OSError:  # closed (the job is ending), or its buffer full (wedged)
                return False
            return True

    def signal_group(self, sig: int) -> bool:
        """Signal the command's process group while the job runs."""
        with TABLES:
            if self.exit is not None or self.pid is None:
                return False
            try:
                if self.own_pids:
                    self.sock.send(bytes((sig,)), socket.MSG_DONTWAIT)  # supervise.py signals it
                else:
                    os.killpg(self.pid, sig)
            except (ProcessLookupError, PermissionError):
                return False
            except OSError:  # closed (the job is ending), or its buffer full (wedged)
                return False
            return True


class Lane:
    """A job's supervisor after the job, waiting on its socket for the next job of the
    same session (supervise.py, protocol step 5); owned by whoever took it."""

    def __init__(self, sock: socket.socket, zygote: Supervisor) -> None:
        self._sock: socket.socket | None = sock
        self.zygote = zygote
        self.used = False  # a job was started on it

    def send(self, zygote: Supervisor, frame: bytes, fds: list[int]) -> Job | None:
        """Hand the job of ``frame`` to this lane (its start is answered on the job's
        socket); None when this lane cannot take it (another zygote's, already used, its
        supervisor gone), and then nothing was sent."""
        sock = self._sock
        if sock is None or zygote is not self.zygote or not zygote.alive():
            return None
        try:
            socket.send_fds(sock, [b"\0" + frame], fds)
        except OSError:
            return None
        self._sock = None  # the job's now
        self.used = True
        return Job(sock, own_pids=zygote.own_pids, stays=True)

    def close(self) -> None:
        """Not used (any more): its supervisor reads EOF and exits."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
