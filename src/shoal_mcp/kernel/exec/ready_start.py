"""Starting a ready shell's bash (``ready.py``): its files, its job, its answer.

A ready shell is a job like any other under the principal's warm zygote (or the
session's lane): a bash that waits on its go pipe, with reused spools, a memfd for its
state report and one for its source. ``ShellOrder.prepare`` starts one and waits for its
supervisor's answer (a thread's refill); ``ShellOrder.send`` only sends it, and the owner
loop reads the answer when the job's socket is readable (``ShellStart.finish``), so
the loop never waits for a process to be scheduled.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..access.sandbox import SandboxSpec
from ..config.limits import ENCODED_ENV_CACHED_MAX, READY_SHELLS_MAX
from .ready import GO_FD, READY_ARGV, SCRIPT_FD, ReadyShell, file_ids
from .runner import STATE_FD, _bytes, take_spools
from .supervisor import Job, Lane, Supervisor, start_timeout


class Spares(Protocol):
    """Where a ready shell's supervisor may be asked to make a spare ``$SHOAL_OUT``
    directory (values/spare_dirs.py ``SpareDirs``)."""

    def wanted(self) -> bytes | None: ...

    def made(self, path: bytes) -> None: ...


@dataclass(frozen=True)
class ShellOrder:
    """What a session's ready shell is started with: its cwd and environment, its spool
    directory, the zygote it goes under, its sandbox and output cap, the principal that
    owns its spools, and where its supervisor may make a spare ``$SHOAL_OUT``
    directory."""

    cwd: str
    env: dict[str, str]
    spool_dir: Path
    supervisor: Supervisor
    sandbox: SandboxSpec | None
    max_output_bytes: int
    owner: str = ""
    spares: Spares | None = None

    def prepare(self, lane: Lane | None = None) -> ReadyShell:
        """Start the bash and wait for its start (OSError if it did not); on ``lane``
        (the session's last exec's supervisor) when it can take it, else forked (also
        when the lane turns out to be gone)."""
        start = self.send(lane)
        try:
            return start.finish(start.job.line(start_timeout(start.on_lane)))
        except LaneGone:
            return self.prepare()

    def send(self, lane: Lane | None = None) -> ShellStart:
        """``prepare`` without waiting for the start (the owner loop): the bash is sent to
        ``lane`` or the zygote; its start is answered on ``ShellStart.job``'s socket.
        An unconfined supervisor also makes a spare ``$SHOAL_OUT`` directory of
        ``spares`` first (a sandbox's may not write there)."""
        files = _ShellFiles.make(self.cwd, self.env, self.spool_dir, self.owner)
        spares = self.spares if self.sandbox is None else None
        path = spares.wanted() if spares is not None else None
        try:
            job, on_lane = self.supervisor.send(
                *files.job_args(self.max_output_bytes),
                write=files.writable(self.sandbox),
                stay=True,  # a bash that runs nothing before its go byte: safe on any lane
                lane=lane,
                mkdir=path,
            )
        except BaseException:
            files.abandon()
            raise
        finally:
            files.sent()
        spare = (spares, path) if spares is not None and path is not None else None
        return ShellStart(files, self.supervisor, job, on_lane, self.sandbox,
                          self.max_output_bytes, spare)  # fmt: skip


def _encode_env(items: tuple[tuple[str, str], ...]) -> dict[bytes, bytes]:
    return {_bytes(k): _bytes(v) for k, v in items}


_encoded_env = functools.lru_cache(maxsize=READY_SHELLS_MAX)(_encode_env)
"""A session's environment as bytes, shared by its ready shells (read only: the job
frame is marshalled from it). A session's env rarely changes between execs, and
encoding its few dozen variables was a measurable share of each refill; only small
ones are kept (``ENCODED_ENV_CACHED_MAX``), so the cache stays small."""


@dataclass
class _ShellFiles:
    """A ready shell's files: its spools, its state and source memfds, its go pipe."""

    cwd: str
    env: dict[str, str]
    passed: list[int]  # given to its supervisor with the job: closed here once sent
    paths: list[Path]  # its spools
    state_fd: int = -1
    script_fd: int = -1
    go_w: int = -1

    @classmethod
    def make(cls, cwd: str, env: dict[str, str], spool_dir: Path, owner: str) -> _ShellFiles:
        if env.get("BASH_ENV"):
            raise OSError("BASH_ENV is set: a ready shell would read it before its exec")
        files = cls(cwd, env, [], [])
        try:
            take_spools(spool_dir, files.passed, files.paths, owner)  # reused, like a cold spawn's
            files.state_fd = os.memfd_create("shoal-state", os.MFD_CLOEXEC)
            files.script_fd = os.memfd_create("shoal-src", os.MFD_CLOEXEC)
            go_r, files.go_w = os.pipe2(os.O_CLOEXEC)
            files.passed += [files.state_fd, files.script_fd, go_r]
        except BaseException:
            files.abandon()
            files.sent()
            raise
        return files

    def job_args(
        self, cap: int
    ) -> tuple[list[bytes], bytes, dict[bytes, bytes], list[int], list[int], int]:
        """``Supervisor.run``/``send``'s positional arguments."""
        items = tuple(self.env.items())
        small = sum(map(len, self.env.values())) <= ENCODED_ENV_CACHED_MAX
        env = _encoded_env(items) if small else _encode_env(items)
        return (READY_ARGV, _bytes(self.cwd), env, self.passed, [STATE_FD, SCRIPT_FD, GO_FD], cap)

    def writable(self, sandbox: SandboxSpec | None) -> list[bytes]:
        """The paths it may write besides its grants: its spools, in a sandbox."""
        return [_bytes(str(p)) for p in self.paths] if sandbox is not None else []

    def sent(self) -> None:
        """The job went (or failed to): our copies of what it was given are closed."""
        kept = (self.state_fd, self.script_fd, self.go_w)
        for fd in self.passed:
            if fd not in kept:
                os.close(fd)
        self.passed = []

    def abandon(self) -> None:
        """No shell after all: its spools and the fds kept for it go."""
        for p in self.paths:
            p.unlink(missing_ok=True)
        for fd in (self.state_fd, self.script_fd, self.go_w):
            if fd >= 0:
                os.close(fd)
        self.state_fd = self.script_fd = self.go_w = -1

    def shell(self, job: Job, sandbox: SandboxSpec | None, cap: int) -> ReadyShell:
        """The ready shell of ``job`` once started (OSError if it could not start)."""
        spec_bytes = sandbox.to_bytes() if sandbox is not None else b""
        # The paths it may change: a write grant replaced under it would make "Permission
        # denied" inside its own grant.  (Not every read rule: a default agent reads "/**",
        # split around the kernel's directories into hundreds of rules to stat per take.)
        granted = [] if sandbox is None else [*sandbox.write, *sandbox.delete]
        if job.own_pids:
            granted.append(self.cwd)  # its cwd, by the inode it names now (see still_valid)
        paths = self.paths
        shell = ReadyShell(
            self.cwd, dict(self.env), spec_bytes, cap, job, paths[0], paths[1], self.state_fd,
            self.script_fd, self.go_w, files=file_ids([*map(str, paths), *granted]),
        )  # fmt: skip
        if job.exit is not None:  # it could not start (sandbox not applied, exec failed)
            shell.discard()
            raise OSError("the ready shell did not start")
        return shell


class LaneGone(OSError):
    """The lane a ready shell was sent to was gone or stopped: nothing ran there."""


@dataclass
class ShellStart:
    """A ready shell's bash sent to its supervisor, its start not answered yet."""

    files: _ShellFiles
    zygote: Supervisor
    job: Job
    on_lane: bool
    sandbox: SandboxSpec | None
    cap: int
    spare: tuple[Spares, bytes] | None = None  # asked of its supervisor (ShellOrder.send)

    def finish(self, line: bytes | None) -> ReadyShell:
        """The shell, with its start's answer ``line`` (None: EOF or no answer in time);
        OSError when it did not start (its files are gone then)."""
        try:
            started = self.zygote.answered(self.job, line, lane=self.on_lane)
        except BaseException:
            self.files.abandon()
            raise
        if started is None:  # a lane that was gone: nothing ran
            self.job.close()
            self.files.abandon()
            raise LaneGone("the session's lane did not start its next shell")
        if self.spare is not None:  # made before the start it answered
            spares, path = self.spare
            spares.made(path)
        return self.files.shell(started, self.sandbox, self.cap)
