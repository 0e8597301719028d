"""The exec service: gate → start → wait → finalize → reply, for ``exec`` and ``plan.apply``.

A thin coordinator over the parts that do the work: the policy gate
(``access/exec_gate.py``), the start of a task within ``max_tasks`` (``start.py``), the
launch with one env/sandbox preparation (``launch.py``, ``prepare.py``), the wait on
the calling thread (``wait.py``), the reply (``reply.py``) and the ready-shell refill
once it is written (``refill.py``). When a command exits, ``TaskManager`` hands it to
``finalize`` (``finalize.py``), which stores ``out:N`` and its journal row.

The service knows nothing of sockets: the RPC layer passes a ``Caller`` that says
whether the caller hung up and whether a cancel overtook the spawn.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ...protocol.errors import ErrorCode, RpcError
from ..access import widen
from ..access.exec_gate import ExecGate
from ..access.guard import Guard
from ..access.identity import Principal
from ..access.plans import APPROVED, PlanStore
from ..owner.nowait import waits_allowed
from ..store.sessions import SessionTable
from ..values.service import ValueService
from .calls import Caller, RunOptions
from .escalation import Escalation, RunGrants
from .finalize import Finalizer
from .launch import Launcher
from .pool import WarmPool
from .prepare import LaunchSetup
from .refill import ShellRefill
from .reply import ExecReply, task_handle
from .start import CancelledBeforeStart, TaskStarter
from .stdin import open_stdin_fifo
from .tasks import Task, TaskManager
from .wait import wait_for


class ExecService:
    """Runs a principal's command from the gate to its reply."""

    def __init__(
        self,
        *,
        sessions: SessionTable,
        guard: Guard,
        plans: PlanStore,
        tasks: TaskManager,
        values: ValueService,
        finalizer: Finalizer,
        spool_dir: Path,
        pool: WarmPool | None = None,
    ) -> None:
        self.tasks = tasks
        self.values = values
        # The finalizer also writes the journal rows of plans and refusals.
        self.exec_gate = ExecGate(sessions=sessions, guard=guard, plans=plans, journal=finalizer)
        self.escalation = Escalation(guard, plans)  # denials asked for, approvals granted
        setup = LaunchSetup(guard, self.escalation, sessions)
        self.launcher = Launcher(guard=guard, setup=setup, spool_dir=spool_dir, pool=pool)
        self.starter = TaskStarter(
            sessions=sessions,
            guard=guard,
            tasks=tasks,
            values=values,
            finalizer=finalizer,
            launcher=self.launcher,
            spool_dir=spool_dir,
        )
        self.refill = ShellRefill(
            sessions=sessions,
            guard=guard,
            values=values,
            setup=setup,
            spool_dir=spool_dir,
            pool=pool,
        )
        self.reply = ExecReply(values=values, gate=self.exec_gate, escalation=self.escalation)

    # -- the gate's answers, for the RPC methods --------------------------------------------

    def plan(self, who: Principal, src: str) -> dict:
        """``exec mode=plan``: analyse, store, journal; nothing is spawned."""
        return self.exec_gate.plan(who, src)

    def explain(self, who: Principal, src: str) -> dict:
        """What ``plan`` would say, without storing anything."""
        return self.exec_gate.explain(who, src)

    def gate(self, who: Principal, src: str) -> list[dict]:
        """allow → the effects; ask → -32011 with a stored plan; deny → -32010."""
        return self.exec_gate.gate(who, src)

    def project_of(self, who: Principal) -> tuple[str, ...]:
        """The project roots of ``who``'s session (what ``{project}`` grants name)."""
        return self.exec_gate.project_of(who)

    def warm_up(self, who: Principal) -> None:
        """Start ``who``'s warm supervisor in the background (session.attach calls this)."""
        outputs = str(self.values.outputs.session_dir(who.principal, who.session))
        self.launcher.warm_up(who, outputs)

    # -- running --------------------------------------------------------------------------

    def run(self, who: Principal, src: str, opts: RunOptions, caller: Caller) -> dict:
        """``exec mode=run``: the gate, then start and wait."""
        started = time.time()
        effects = self.exec_gate.gate(who, src)
        return self._start_and_wait(who, src, effects, opts, caller, started)

    def apply(self, who: Principal, ref: str, opts: RunOptions, caller: Caller) -> dict:
        """``plan.apply``: run exactly the stored source of the caller's own plan, once."""
        plans = self.exec_gate.plans
        plan = plans.get_own(ref, who.session, who.principal)
        self.exec_gate.check_applicable(who, plan)
        previous = plans.claim(plan)  # atomic: concurrent applies run it once
        # What the approval grants this one run (access/widen.py), or an explicit
        # unconfined run.
        grants = RunGrants(
            self.escalation.for_apply(
                who, plan, self.project_of(who), approved=previous == APPROVED
            ),
            unconfined=previous == APPROVED and plan.unconfined,
        )
        try:
            return self._start_and_wait(
                who, plan.src, plan.effects, opts, caller, time.time(), grants
            )
        except RpcError as exc:
            if exc.code == ErrorCode.QUOTA or isinstance(exc, CancelledBeforeStart):
                plans.unclaim(plan, previous)  # refused or cancelled before it started
            raise
        finally:
            if grants.extra is not None and not opts.background:
                widen.remove_unused(grants.extra.created)

    def _start_and_wait(
        self,
        who: Principal,
        src: str,
        effects: list[dict],
        opts: RunOptions,
        caller: Caller,
        started: float,
        grants: RunGrants | None = None,
    ) -> dict:
        stdin_fd = open_stdin_fifo(opts.stdin) if opts.stdin else None
        try:
            task = self.starter.start(who, src, effects, opts.background, caller, grants, stdin_fd)
        finally:
            if stdin_fd is not None:
                os.close(stdin_fd)  # the command holds its own copy now
        if opts.background:
            return task_handle(task)
        # A foreground exec is watched (and finalized) on this thread, which then writes
        # the reply: no waiter thread, no hand-off. Whenever this thread stops watching
        # before the end, the task gets a waiter thread of its own.
        try:
            self._watched(task, caller)
            waited = wait_for(self.tasks, task, opts.timeout_ms, caller)
        except BaseException:
            self.unwatch(task)
            raise
        if not waited:
            return self.let_go(task)
        return self.answer(who, task, opts, started, caller)

    # -- a foreground exec in steps, for a caller that watches it itself (the owner loop) --

    def start_foreground(self, who: Principal, src: str, caller: Caller) -> tuple[Task, float]:
        """``exec mode=run`` up to its spawn: the gate, then the start; the task and when
        the call began. Inside ``no_wait()`` (the owner loop): in a ready shell at once,
        else ``WouldWait`` with nothing started (the loop then runs the call on a worker)."""
        started = time.time()
        effects = self.exec_gate.gate(who, src)
        task = self.starter.start(who, src, effects, False, caller)
        self._watched(task, caller)
        return task, started

    def finish_watched(self, task: Task) -> None:
        """A foreground exec its caller watched has exited: finalized here. Inside
        ``no_wait()`` (the owner loop) all it may wait for is taken first, or
        ``WouldWait`` with nothing done (then a worker finishes it)."""
        with self.starter.finalizer.claim(task):
            self.tasks.finish_watched(task)

    def _watched(self, task: Task, caller: Caller) -> None:
        task.run.job.keep_lane = True  # its supervisor may start the session's next shell
        if caller.spawned(task):
            self.tasks.cancel(task, at_once=True)  # a cancel overtook the spawn

    def let_go(self, task: Task) -> dict:
        """The caller stopped watching before the end (its wait budget ran out, it hung
        up, or the watch failed): the command keeps running as a listed task, visible in
        task.list and cancellable, instead of an unlisted process nobody can name. It
        already counts toward max_tasks, like every running exec. Its handle, for a
        caller still there."""
        self.unwatch(task)
        self.tasks.detach(task)
        return task_handle(task, timed_out=True)

    def unwatch(self, task: Task) -> None:
        """Its caller stops watching: the background watcher takes it to its end."""
        task.run.job.drop_lane()
        self.tasks.watch_in_background(task)

    def answer(
        self, who: Principal, task: Task, opts: RunOptions, started: float, caller: Caller
    ) -> dict:
        """The reply of a foreground exec finalized by its caller's watch."""
        # The session's next shell is made after the reply; said before it, so that the
        # caller's next exec waits for that shell instead of starting cold.
        reserved = task.result is not None and self.refill.reserve(who)
        try:
            return self.reply.result(who, task, opts, started)
        finally:
            caller.after_reply(lambda: self._after_exec(who, task, reserved))

    def _after_exec(self, who: Principal, task: Task, reserved: bool = False) -> None:
        """A foreground exec's housekeeping, done once its reply is on its way."""
        lane = task.run.job.take_lane()  # its supervisor, waiting for a next job
        # First the session's next shell: its next exec waits for it.
        if task.result is None:  # an output that could not be stored: no next shell
            if reserved:
                self.refill.release(who)
            if lane is not None:
                lane.close()
        elif waits_allowed():
            self.refill.refill(who, lane, reserved=reserved)
        else:  # the owner loop: sent now, its start read when it is answered
            self.refill.refill_soon(who, lane, reserved=reserved)
        task.make_output_entry()
        # A finished foreground exec is never named again (its value is out:N in the
        # transcript): drop the task record so the kernel's memory stays flat.
        self.tasks.forget(task)
