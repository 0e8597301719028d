"""The exec service: gate → spawn → wait → finalize → result, for ``exec`` and ``plan.apply``.

One place owns running a command for a principal. ``exec`` asks the policy gate first;
``plan.apply`` checks the stored plan instead; both then go through ``_start`` (the
``max_tasks`` quota is checked there, once) and ``_wait`` (the caller's wait budget).
When a command exits, ``TaskManager`` hands it to ``finalize`` (``finalize.py``), which
stores ``out:N`` and its journal row; ``result`` shapes the reply.

The service knows nothing of sockets: the RPC layer passes a ``Caller`` that says
whether the caller hung up and whether a cancel overtook the spawn.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from ...protocol import uri
from ...protocol.errors import ErrorCode, RpcError
from ..access import widen
from ..access.guard import Guard
from ..access.identity import Principal
from ..access.plans import APPLIED, APPROVED, Plan, PlanBudget, PlanStore, plan_ref
from ..access.sandbox import SandboxSpec
from ..config.limits import STDERR_DENIALS_BYTES, STDERR_TAIL_BYTES
from ..effects import analyzer
from ..net.bridge import PROXY_ENV_NAMES
from ..store.sessions import Session, SessionTable
from ..values.outputs import SHOAL_OUT_ENV
from ..values.service import ValueService
from .calls import Caller, Judgement, RunOptions
from .escalation import Escalation, RunGrants
from .finalize import Finalizer
from .pool import WarmPool
from .ready import ReadyShell, prepare
from .runner import MAX_ARG_BYTES, RunningCommand, spawn
from .stdin import StdinSupervisor, open_stdin_fifo
from .tasks import Task, TaskManager

DISCONNECT_POLL_S = 0.25
"""How often a foreground exec checks that its caller is still connected."""


class ExecService:
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
        self.sessions = sessions
        self.guard = guard
        self.plans = plans
        self.tasks = tasks
        self.values = values
        self.spool_dir = spool_dir
        self.pool = pool  # warm supervisors (docs/architecture.md, Processes)
        self._starting: dict[str, int] = {}  # principal -> spawns past the quota check
        self.finalizer = finalizer  # also writes the journal rows of plans and refusals
        self.escalation = Escalation(guard, plans)  # denials asked for, approvals granted

    # -- analysis and the gate ------------------------------------------------------------

    def analyze(self, who: Principal, src: str) -> tuple[analyzer.Analysis, str, str]:
        """Effects of ``src`` in the caller's session as it is now, that cwd and env hash."""
        cwd, env, env_hash = self.sessions.get_or_create(who.session).state(who.principal)
        return analyzer.analyze(src, cwd, env.get("HOME")), cwd, env_hash

    def _judge(self, who: Principal, src: str) -> Judgement:
        """``analyze``, and the policy's verdict on those effects."""
        analysis, cwd, env_hash = self.analyze(who, src)
        verdict = self.guard.evaluate(
            who.principal, analysis.effects, analysis.reversibility, self.project_of(who)
        )
        return Judgement(analysis, cwd, env_hash, verdict)

    def evaluate(self, who: Principal, src: str) -> tuple[Plan, Any]:
        """The plan ``src`` would be for the caller, and the policy's verdict on it."""
        return self._plan_of(who, src, self._judge(who, src))

    def _plan_of(self, who: Principal, src: str, judged: Judgement) -> tuple[Plan, Any]:
        analysis, cwd, env_now, verdict = judged
        ref = plan_ref(who.session, who.principal, src, analysis.effects, cwd, env_now)
        plan = Plan(
            ref,
            who.session,
            who.principal,
            src,
            cwd,
            analysis.effects,
            analysis.reversibility,
            verdict.verdict,
            list(verdict.reasons),
            env_hash=env_now,
        )
        return plan, verdict

    def plan(self, who: Principal, src: str) -> dict:
        """``exec mode=plan``: analyse, store, journal; nothing is spawned."""
        plan, _ = self.evaluate(who, src)
        plan = self.plans.put(plan, self._plan_budget(who))
        denied = False if plan.verdict == "deny" else None  # journaled by hash and head only
        self.finalizer.journal_plan(who, plan, "plan", plan.ref, ok=denied)
        return plan.record()

    def _plan_budget(self, who: Principal) -> PlanBudget:
        policy = self.guard.for_principal(who.principal)
        return PlanBudget(policy.budget("max_plans"), policy.budget("max_plan_bytes"))

    def explain(self, who: Principal, src: str) -> dict:
        """What ``plan`` would say, without storing anything."""
        plan, _ = self.evaluate(who, src)
        out = plan.record()
        for stored_only in ("plan_ref", "uri", "state", "created"):
            out.pop(stored_only, None)
        return out

    def gate(self, who: Principal, src: str) -> list[dict]:
        """allow → the effects; ask → -32011 with a stored plan; deny → -32010."""
        judged = self._judge(who, src)
        if judged.verdict.verdict == "allow":  # the common case needs no plan (nor its ref)
            return judged.analysis.effects
        plan, verdict = self._plan_of(who, src, judged)
        if verdict.verdict == "deny":
            self.finalizer.journal_plan(who, plan, "denied", None, ok=False)
            raise RpcError(
                ErrorCode.DENIED,
                "denied by policy",
                {"effects": plan.effects, "reasons": plan.reasons},
            )
        plan = self.plans.put(plan, self._plan_budget(who))
        self.finalizer.journal_plan(who, plan, "approval_required", plan.ref, ok=False)
        raise RpcError(
            ErrorCode.APPROVAL_REQUIRED,
            # Agents reach the kernel through MCP or directly: name both spellings.
            "approval required: request it (MCP: shoal_cap_request; kernel: cap.request) "
            "with this plan_ref, then run it once approved (shoal_apply; plan.apply)",
            {
                "plan_ref": plan.ref,
                "uri": plan.uri,
                "effects": plan.effects,
                "reasons": plan.reasons,
            },
        )

    # -- running --------------------------------------------------------------------------

    def run(self, who: Principal, src: str, opts: RunOptions, caller: Caller) -> dict:
        """``exec mode=run``: the gate, then start and wait."""
        started = time.time()
        effects = self.gate(who, src)
        return self._start_and_wait(who, src, effects, opts, caller, started)

    def apply(self, who: Principal, ref: str, opts: RunOptions, caller: Caller) -> dict:
        """``plan.apply``: run exactly the stored source of the caller's own plan, once."""
        plan = self.plans.get_own(ref, who.session, who.principal)
        self._check_applicable(who, plan)
        previous = self.plans.claim(plan)  # atomic: concurrent applies run it once
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
                self.plans.unclaim(plan, previous)  # refused or cancelled before it started
            raise
        finally:
            if grants.extra is not None and not opts.background:
                widen.remove_unused(grants.extra.created)

    def _check_applicable(self, who: Principal, plan: Plan) -> None:
        if plan.state == "denied":
            raise RpcError(ErrorCode.DENIED, f"{plan.ref} was denied", {"plan_ref": plan.ref})
        if plan.state == APPLIED:
            raise RpcError(
                ErrorCode.DENIED, f"{plan.ref} was already applied", {"plan_ref": plan.ref}
            )
        if plan.state != APPROVED:
            # Re-evaluate now: policy may allow it outright (or have changed).
            _, verdict = self.evaluate(who, plan.src)
            if verdict.verdict == "deny":
                raise RpcError(
                    ErrorCode.DENIED,
                    "denied by policy",
                    {"plan_ref": plan.ref, "reasons": list(verdict.reasons)},
                )
            if verdict.verdict != "allow":
                raise RpcError(
                    ErrorCode.APPROVAL_REQUIRED,
                    "approval required",
                    {
                        "plan_ref": plan.ref,
                        "uri": plan.uri,
                        "effects": plan.effects,
                        "state": plan.state,
                    },
                )
            return
        # The approval covers the plan's cwd and env (its hash): if the session moved since
        # (cd, export PATH=..., HOME), the same source would run other things.
        analysis, cwd, env_now = self.analyze(who, plan.src)
        if cwd != plan.cwd or env_now != plan.env_hash or analysis.effects != plan.effects:
            raise RpcError(
                ErrorCode.APPROVAL_REQUIRED,
                "the session's cwd or environment changed since this plan was approved; "
                "plan it again",
                {
                    "plan_ref": plan.ref,
                    "uri": plan.uri,
                    "effects": analysis.effects,
                    "cwd": cwd,
                    "plan_cwd": plan.cwd,
                    "env_hash": env_now,
                    "plan_env_hash": plan.env_hash,
                    "state": plan.state,
                },
            )

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
            task = self._start(who, src, effects, opts.background, caller, grants, stdin_fd)
        finally:
            if stdin_fd is not None:
                os.close(stdin_fd)  # the command holds its own copy now
        if opts.background:
            return task_handle(task)
        # A foreground exec is watched (and finalized) on this thread, which then writes
        # the reply: no waiter thread, no hand-off. Whenever this thread stops watching
        # before the end, the task gets a waiter thread of its own.
        try:
            if caller.spawned(task):
                self.tasks.cancel(task, at_once=True)  # a cancel overtook the spawn
            waited = self._wait(task, opts.timeout_ms, caller)
        except BaseException:
            self.tasks.watch_in_background(task)
            raise
        if not waited:
            self.tasks.watch_in_background(task)
            # Past the wait budget, or the caller hung up (nobody will read the reply): the
            # command keeps running as a listed task, visible in task.list and cancellable,
            # instead of an unlisted process nobody can name.
            self._detach(who, task)
            return task_handle(task, timed_out=True)
        try:
            return self.result(who, task, opts, started)
        finally:
            caller.after_reply(lambda: self._after_exec(who, task))

    def _after_exec(self, who: Principal, task: Task) -> None:
        """A foreground exec's housekeeping, done once its reply is on its way."""
        # $SHOAL_OUT/<n> for this output: made in the background, not at the next exec's
        # start (which only waits if it is not done).
        self.values.outputs.schedule(who.principal, who.session)
        if task.result is not None:  # not after an output that could not be stored
            self._refill(who)
        # A finished foreground exec is never named again (its value is out:N in the
        # transcript): drop the task record so the kernel's memory stays flat.
        self.tasks.forget(task)

    def _start(
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
        env = {**env, SHOAL_OUT_ENV: outputs}
        # Every exec, foreground or background, is a running task within max_tasks. The
        # check takes a slot under the principal's lock, so parallel calls cannot
        # overshoot; the spawn itself runs outside it, so they do not queue behind it.
        lock = self.guard.quota_lock(who.principal, "max_tasks")
        with lock:
            self._check_task_quota(who)
            self._starting[who.principal] = self._starting.get(who.principal, 0) + 1
        try:
            self.spool_dir.mkdir(parents=True, exist_ok=True, mode=0o700)  # removed under us?
            if caller.cancelled():
                raise CancelledBeforeStart()
            run, start_env = self._launch(who, src, cwd, env, outputs, grants, stdin_fd)
            try:
                journal_id = self.finalizer.begin(who.principal, who.session, run, effects)
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
        finally:
            with lock:
                left = self._starting.pop(who.principal) - 1
                if left:
                    self._starting[who.principal] = left

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

    def project_of(self, who: Principal) -> tuple[str, ...]:
        """The project roots of ``who``'s session (what ``{project}`` grants name)."""
        return self.sessions.get_or_create(who.session).project

    def _sandbox_for(
        self, who: Principal, outputs: str, grants: RunGrants | None = None
    ) -> SandboxSpec | None:
        """The OS sandbox spec ``who``'s processes run in (None: not confined), with
        read access to ``outputs`` ($SHOAL_OUT), the session's grants and this run's
        approved ones; the spawn and the warm zygote's key both follow it, so a grant
        change (or another session's outputs) is another zygote."""
        if grants is not None and grants.unconfined:
            return None
        extra = self.escalation.session_grants(who)
        if grants is not None and grants.extra is not None:
            extra = extra.plus(grants.extra)
        return self.guard.sandbox_spec(
            who.principal,
            also_read=(outputs, *extra.read),
            also_write=extra.write,
            project=self.project_of(who),
            session=who.session,
            net_extra=extra.net,
        )

    def _confined_env(self, who: Principal, env: dict[str, str]) -> dict[str, str]:
        """A sandboxed principal's processes see only the env it may read, no secrets
        (``PrincipalPolicy.confined_env``); $SHOAL_OUT and TMPDIR are its own."""
        kept = self.guard.for_principal(who.principal).confined_env(env)
        for own in (SHOAL_OUT_ENV, "TMPDIR", *PROXY_ENV_NAMES):
            if own in env:
                kept[own] = env[own]
        return kept

    def warm_up(self, who: Principal) -> None:
        """Start ``who``'s warm supervisor in the background (session.attach calls this)."""
        if self.pool is not None:
            outputs = str(self.values.outputs.session_dir(who.principal, who.session))
            spec = self._sandbox_for(who, outputs)
            self.pool.prestart(who.principal, spec.to_bytes() if spec is not None else b"")

    def _launch(
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
        also the env the command got (TMPDIR of its sandbox included)."""
        sandbox = self._sandbox_for(who, outputs, grants)
        spec_bytes = b""
        if sandbox is not None:
            spec_bytes = sandbox.to_bytes()
            # TMPDIR (the private temp dir) is part of the state the exec starts from, so a
            # state report echoing it is no change of the agent's (nothing to refuse).
            env = self._confined_env(who, {**env, **sandbox.environ()})
        warm = self.pool.take(who.principal, spec_bytes) if self.pool is not None else None
        cap = self.guard.for_principal(who.principal).max_output_bytes
        ready = self.pool.ready if self.pool is not None else None
        supervisor: Any = warm
        if stdin_fd is not None:
            # A ready shell's stdin is /dev/null already: this one gets the FIFO, placed at
            # descriptor 0 through the supervisor's own extra-descriptor mechanism.
            supervisor = StdinSupervisor(warm, spec_bytes, stdin_fd)
        elif warm is not None and ready is not None and _short(src):
            shell = ready.take((who.principal, who.session), cwd, env, spec_bytes, cap)
            started = shell.start(src) if shell is not None else None
            if started is not None:
                return started, env
        run = spawn(
            src,
            cwd,
            env,
            self.spool_dir,
            sandbox=sandbox,
            max_output_bytes=cap,
            supervisor=supervisor,  # a Supervisor, or one wrapped to add stdin
            owner=who.principal,
        )
        return run, env  # the env bash got: the state the exec's delta is measured from

    def _refill(self, who: Principal) -> None:
        """Start the session's next bash now, with its state as it is after this exec
        (ready.py); the next exec uses it if nothing changed meanwhile."""
        ready = self.pool.ready if self.pool is not None else None
        if ready is None:
            return

        def make() -> ReadyShell | None:
            assert self.pool is not None
            cwd, env = self.sessions.get_or_create(who.session).snapshot(who.principal)
            if not os.path.isdir(cwd):
                return None
            outputs = str(self.values.outputs.session_dir(who.principal, who.session))
            env = {**env, SHOAL_OUT_ENV: outputs}
            sandbox = self._sandbox_for(who, outputs)
            spec_bytes = b""
            if sandbox is not None:
                spec_bytes = sandbox.to_bytes()
                env = self._confined_env(who, {**env, **sandbox.environ()})
            zygote = self.pool.take(who.principal, spec_bytes)
            if zygote is None:
                return None
            cap = self.guard.for_principal(who.principal).max_output_bytes
            return prepare(
                cwd,
                env,
                self.spool_dir,
                zygote,
                sandbox=sandbox,
                max_output_bytes=cap,
                owner=who.principal,
            )

        ready.refill((who.principal, who.session), make)

    def _wait(self, task: Task, timeout_ms: int | None, caller: Caller) -> bool:
        """Watch ``task`` on this thread within the budget; False when the budget ran out
        or the caller left (the task is then still running, or finishing)."""
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
        while True:
            step = DISCONNECT_POLL_S
            if deadline is not None:
                step = min(step, max(0.0, deadline - time.monotonic()))
            if self.tasks.watch(task, step):
                return True
            if caller.gone() or (deadline is not None and time.monotonic() >= deadline):
                return False

    def _detach(self, who: Principal, task: Task) -> None:
        """A foreground exec outlived its wait: it becomes a listed task (it already
        counts toward max_tasks, like every running exec)."""
        self.tasks.detach(task)

    def _check_task_quota(self, who: Principal) -> None:
        """Caller holds the principal's max_tasks lock: running tasks plus spawns under way."""
        current = self.tasks.running_count(who.principal) + self._starting.get(who.principal, 0)
        self.guard.check_quota(who.principal, "max_tasks", current)

    # -- the reply ------------------------------------------------------------------------

    def result(self, who: Principal, task: Task, opts: RunOptions, started: float) -> dict:
        """``{ref, uri, value, render, elapsed_ms}``; ``stmt`` position raises on failure."""
        if task.result is None:
            err = task.error or {
                "code": int(ErrorCode.INTERNAL),
                "message": "task ended without a result",
            }
            raise RpcError(err["code"], err["message"], err.get("data"))
        stored = task.result.get("value")
        if stored is not None:
            # The outcome this exec just stored, straight from memory: no transcript read
            # and JSON decode between finalize and the reply.
            sel = self.values.stored(task.result["ref"], task.result["uri"], stored)
        else:
            sel = self.values.select(who, task.result["ref"], "", None)
        result = {
            "ref": sel.ref,
            "uri": sel.base_uri,
            "value": self.values.encode(sel, opts.elide),
            "render": self.values.render(sel, opts.elide),
            "elapsed_ms": round((time.time() - started) * 1000, 3),
        }
        if not task.result["ok"]:
            self._explain_denials(who, task, result)
        if opts.position == "stmt" and not task.result["ok"]:
            raise self._raised(who, task, result)
        return result

    def _explain_denials(self, who: Principal, task: Task, result: dict) -> None:
        """A sandboxed run that failed because the sandbox refused something: say what
        (``sandbox_denied``), and the one call that asks for it (escalation.py)."""
        if not self.guard.isolated(who.principal) or task.start_state is None:
            return
        assert task.result is not None
        err = self.values.select(who, task.result["ref"], ".err", None).node
        tail = err.read(max(0, err.size - STDERR_DENIALS_BYTES))
        home = task.start_state[1].get("HOME") or os.path.expanduser("~")
        result.update(
            self.escalation.explain(
                who,
                task.src,
                self.analyze(who, task.src),
                home,
                tail,
                self.project_of(who),
                lambda plan: self.plans.put(plan, self._plan_budget(who)),
                exec_id=task.journal_id,
            )
        )

    def _raised(self, who: Principal, task: Task, result: dict) -> RpcError:
        """-32002 for a failed command in statement position, with a bounded stderr tail."""
        assert task.result is not None
        err = self.values.select(who, task.result["ref"], ".err", None).node
        tail = err.read(max(0, err.size - STDERR_TAIL_BYTES)).decode("utf-8", "replace")
        status = task.result["status"]
        cancelled = " (cancelled)" if task.state == "cancelled" else ""
        if task.result.get("truncated"):
            cancelled += "; its output lost bytes to a full or failing disk (see truncated)"
        return RpcError(
            ErrorCode.RAISED,
            f"command failed with exit status {status}{cancelled}",
            {
                "ref": result["ref"],
                "uri": result["uri"],
                "status": status,
                "stderr_tail": tail,
                "render": result["render"],
                **({"output_capped": True} if task.result.get("output_capped") else {}),
                **{k: task.result[k] for k in ("truncated",) if k in task.result},
                **{k: result[k] for k in ("sandbox_denied", "ask") if k in result},
            },
        )


class CancelledBeforeStart(RpcError):
    """-32020 for a call cancelled before its command was spawned: nothing ran."""

    def __init__(self) -> None:
        super().__init__(
            ErrorCode.TASK_CONTROL,
            "cancelled before it started: nothing ran",
            {"cancelled": True, "started": False},
        )


def _short(src: str) -> bool:
    """A source the cold path would pass as ``-c`` (longer ones are read from a file)."""
    limit = MAX_ARG_BYTES - 4096  # room for the prelude
    return len(src) * 4 < limit or len(src.encode("utf-8", "surrogatepass")) < limit


def task_handle(task: Task, **extra: Any) -> dict:
    """What a background (or timed-out) exec returns: the task's names."""
    return {"task": task.ref, "uri": uri.task_uri(task.id), "events": task.channel, **extra}
