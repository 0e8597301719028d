"""Starting a task: the ``max_tasks`` quota, the spawn, the ``running`` journal row.

Every exec, foreground or background, is a running task within ``max_tasks``; the quota
is checked here, once, for ``exec`` and ``plan.apply`` alike.
"""

from __future__ import annotations

import os
from pathlib import Path

from ...protocol.errors import ErrorCode, RpcError, state_db_locked
from ..access.guard import Guard
from ..access.identity import Principal
from ..owner.nowait import WouldWait
from ..store.sessions import Session, SessionTable
from ..values.service import ValueService
from .calls import Caller
from .escalation import RunGrants
from .finalize import Finalizer
from .launch import Launcher
from .tasks import Task, TaskManager


class CancelledBeforeStart(RpcError):
    """-32020 for a call cancelled before its command was spawned: nothing ran."""

    def __init__(self) -> None:
        super().__init__(
            ErrorCode.TASK_CONTROL,
            "cancelled before it started: nothing ran",
            {"cancelled": True, "started": False},
        )


class TaskStarter:
    """Takes a ``max_tasks`` slot, launches, journals and registers one task."""

    def __init__(
        self,
        *,
        sessions: SessionTable,
        guard: Guard,
        tasks: TaskManager,
        values: ValueService,
        finalizer: Finalizer,
        launcher: Launcher,
        spool_dir: Path,
    ) -> None:
        self.sessions = sessions
        self.guard = guard
        self.tasks = tasks
        self.values = values
        self.finalizer = finalizer
        self.launcher = launcher
        self.spool_dir = spool_dir

    def start(
        self,
        who: Principal,
        src: str,
        effects: list[dict],
        background: bool,
        caller: Caller,
        grants: RunGrants | None = None,
        stdin_fd: int | None = None,
    ) -> Task:
        """Spawn in the session's state as it is now, write the ``running`` journal row,
        start the task; the task remembers that state (its delta is computed from it).

        A call cancelled before its spawn spawns nothing (-32020): one that waited (for
        its ready shell, behind a slow kernel) would otherwise start late, to be killed
        at once. One arriving during the spawn SIGKILLs it right after (no grace)."""
        session = self.sessions.get_or_create(who.session)
        cwd, env = self._usable_state(session, who.principal)
        # $SHOAL_OUT/<n>/out|err: the caller's earlier outputs, read-only (values/outputs.py);
        # readable inside the sandbox too.
        outputs = str(self.values.outputs.sync(who.principal, who.session))
        # A slot of the principal's max_tasks is held from the check until the task is
        # in the table (guard.reserved): parallel calls cannot overshoot, and the spawn
        # runs outside any lock, so they do not queue behind it.
        with self.guard.reserved(
            who.principal, "max_tasks", lambda: self.tasks.running_count(who.principal)
        ):
            self.spool_dir.mkdir(parents=True, exist_ok=True, mode=0o700)  # removed under us?
            if caller.cancelled():
                raise CancelledBeforeStart()
            with self.finalizer.claim_begin():  # the row cannot wait once the command runs
                run, start_env = self.launcher.launch(who, src, cwd, env, outputs, grants, stdin_fd)
                try:
                    journal_id = self.finalizer.begin(who.principal, who.session, run, effects)
                except WouldWait as exc:  # not under the claim; never taken as "not started"
                    run.terminate()
                    run.discard()
                    raise state_db_locked(0) from exc
                except BaseException:
                    run.terminate()
                    run.discard()
                    raise
            return self.tasks.start(
                who.session,
                who.principal,
                src,
                run,
                background,
                effects,
                journal_id=journal_id,
                start_state=(cwd, start_env),
            )

    def _usable_state(self, session: Session, principal: str) -> tuple[str, dict[str, str]]:
        """The session's (cwd, env) as ``principal`` sees it; a cwd that vanished falls
        back to ``$HOME`` (the session's, else the kernel's), persisted (in the overlay
        whose cwd it was), with a warning in the next outcome."""
        cwd, env = session.snapshot(principal)
        if os.path.isdir(cwd):
            return cwd, env
        home = env.get("HOME") or os.path.expanduser("~")
        if not os.path.isdir(home):
            home = "/"
        own = principal if principal in session.overlays else None
        self.sessions.set_cwd(
            session,
            home,
            f"session cwd {cwd!r} no longer exists; this exec ran in {home!r}",
            principal=own,
        )
        return session.snapshot(principal)
