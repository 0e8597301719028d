"""Launching a principal's command: a ready shell, a warm zygote, or a cold supervisor.

The fastest path that fits is taken: a ready bash already started with exactly this
state (``ready.py``), else a fork of the principal's warm zygote (``pool.py``), else a
cold supervisor (``runner.py``). The env and sandbox come from ``LaunchSetup``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..access.guard import Guard
from ..access.identity import Principal
from ..owner.nowait import WouldWait, waits_allowed
from .escalation import RunGrants
from .pool import WarmPool
from .prepare import LaunchSetup
from .runner import MAX_ARG_BYTES, RunningCommand, spawn
from .stdin import StdinSupervisor


class Launcher:
    """Starts bash for a principal under its warm supervisor when there is one."""

    def __init__(
        self, *, guard: Guard, setup: LaunchSetup, spool_dir: Path, pool: WarmPool | None
    ) -> None:
        self.guard = guard
        self.setup = setup
        self.spool_dir = spool_dir
        self.pool = pool  # warm supervisors (docs/architecture.md, Processes)

    def warm_up(self, who: Principal, outputs: str) -> None:
        """Start ``who``'s warm supervisor in the background, keyed by its sandbox spec."""
        if self.pool is not None:
            spec = self.setup.sandbox_for(who, outputs)
            self.pool.prestart(who.principal, spec.to_bytes() if spec is not None else b"")

    def launch(
        self,
        who: Principal,
        src: str,
        cwd: str,
        env: dict[str, str],
        outputs: str,
        grants: RunGrants | None = None,
        stdin_fd: int | None = None,
    ) -> tuple[RunningCommand, dict[str, str]]:
        """Under the principal's warm zygote when there is one, else a cold supervisor;
        also the env the command got (TMPDIR of its sandbox included). Inside
        ``no_wait()`` (the owner loop): in a ready shell that can start at once, else
        ``WouldWait`` with nothing started."""
        prepared = self.setup.prepare(who, env, outputs, grants)
        env, spec_bytes = prepared.env, prepared.spec_bytes
        cap = self.guard.for_principal(who.principal).max_output_bytes
        ready = self.pool.ready if self.pool is not None else None
        warm = self.pool.take(who.principal, spec_bytes) if self.pool is not None else None
        supervisor: Any = warm
        if stdin_fd is not None:
            # A ready shell's stdin is /dev/null already: this one gets the FIFO, placed at
            # descriptor 0 through the supervisor's own extra-descriptor mechanism.
            supervisor = StdinSupervisor(warm, spec_bytes, stdin_fd)
        elif warm is not None and ready is not None and _short(src):
            # On the owner loop a shell still being made is not waited for (None at once).
            shell = ready.take(
                (who.principal, who.session), cwd, env, spec_bytes, cap, wait=waits_allowed()
            )
            started = shell.start(src) if shell is not None else None
            if started is not None:
                return started, env
        if not waits_allowed():
            raise WouldWait()  # a fork or a cold start: a worker's to wait for
        run = spawn(
            src,
            cwd,
            env,
            self.spool_dir,
            sandbox=prepared.sandbox,
            max_output_bytes=cap,
            supervisor=supervisor,  # a Supervisor, or one wrapped to add stdin
            owner=who.principal,
        )
        return run, env  # the env bash got: the state the exec's delta is measured from


def _short(src: str) -> bool:
    """A source the cold path would pass as ``-c`` (longer ones are read from a file)."""
    limit = MAX_ARG_BYTES - 4096  # room for the prelude
    return len(src) * 4 < limit or len(src.encode("utf-8", "surrogatepass")) < limit
