"""The kernel's state and its services: sessions, exec, values, tasks, events, journal.

``Kernel`` is transport-free: the socket server calls into it, tests can too.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import __version__
from ..protocol.errors import ErrorCode, RpcError, is_disk_full, state_dir_full
from ..protocol.framing import BACKEND
from ..protocol.limits import DURABLE_CHANNELS
from ..protocol.paths import ensure_private_dir, local_principal
from .access.guard import Guard
from .access.identity import Principal, owner_key
from .access.plans import Plan, PlanStore, plan_ref
from .effects import analyzer as effects_mod
from .events.bus import EventBus, EventStore
from .exec.runner import RunningCommand, spawn
from .exec.tasks import Task, TaskManager
from .pty.manager import PtyManager
from .store.cas import ContentStore
from .store.db import Database
from .store.journal import Journal, JournalEntry
from .store.sessions import Session, SessionTable
from .store.transcript import TranscriptStore
from .values.elision import ElideOptions
from .values.resolver import Resolver
from .values.service import ValueService

log = logging.getLogger(__name__)


@dataclass
class KernelConfig:
    socket: Path
    state_dir: Path
    policy_path: Path | None = None
    require_token: bool = False


class Kernel:
    def __init__(self, config: KernelConfig) -> None:
        self.config = config
        self.started = time.time()
        state = ensure_private_dir(config.state_dir)
        self.spool_dir = ensure_private_dir(state / "spool")
        self.db = Database(state / "journal.sqlite3")
        self.cas = ContentStore(state / "cas", self.db)
        self.sessions = SessionTable(self.db)
        self.transcript = TranscriptStore(self.db)
        self.journal = Journal(self.db)
        self.event_store = EventStore(str(state / "journal.sqlite3"))
        self.events = EventBus(self.event_store)
        self.tasks = TaskManager(self.events, self._finalize)
        self.resolver = Resolver(self.cas)
        self.values = ValueService(
            self.transcript, self.tasks, self.resolver, self.journal_read_all
        )
        self.local_principal = local_principal()
        self.guard = Guard(state, config.policy_path, self.local_principal, config.require_token)
        self.plans = PlanStore()
        self.ptys = PtyManager(on_screen_change=self._pty_event)
        self._quota_locks: dict[tuple[str, str], threading.Lock] = {}
        self._quota_guard = threading.Lock()
        self._subscriptions: dict[str, set[str]] = {}  # principal -> live subscription ids
        self.connection_count: Callable[[], int] = lambda: 0  # the socket server installs its own
        self._clean_spool()

    def _clean_spool(self) -> None:
        for leftover in self.spool_dir.glob("run-*"):
            leftover.unlink(missing_ok=True)

    def info(self) -> dict[str, Any]:
        return {"version": __version__, "framing_backend": BACKEND, "pid": os.getpid()}

    def _pty_event(self, pty_id: str, payload: dict) -> None:
        self.events.publish("pty." + pty_id.split(":")[-1], payload)

    def stop_work(self, drain_s: float) -> bool:
        """Kernel exit, first half: close PTYs, kill tasks and store their results."""
        self.ptys.close_all()
        return self.tasks.shutdown(drain_s)

    def close(self) -> None:
        """Kernel exit, second half: close the event bus and the databases."""
        self.events.close()
        self.event_store.close()
        self.db.close()

    # -- exec -------------------------------------------------------------------------

    def start_exec(
        self,
        who: Principal,
        session: Session,
        src: str,
        background: bool,
        effects: list[dict] | None = None,
    ) -> Task:
        cwd, env = session.snapshot()
        if not background:
            run = spawn(src, cwd, env, self.spool_dir)
            return self.tasks.start(who.session, who.principal, src, run, background, effects or [])
        # Check and start as one step per principal, so parallel calls cannot overshoot max_tasks.
        with self.quota_lock(who.principal, "max_tasks"):
            self.check_task_quota(who)
            run = spawn(src, cwd, env, self.spool_dir)
            return self.tasks.start(who.session, who.principal, src, run, background, effects or [])

    def detach_task(self, who: Principal, task: Task) -> None:
        """A foreground exec outlived its wait: it becomes a listed task within max_tasks.

        Over the quota it is cancelled and -32031 raised instead, so timed-out (or
        abandoned) foreground calls cannot pile up running commands past the quota.
        """
        with self.quota_lock(who.principal, "max_tasks"):
            try:
                self.check_task_quota(who)
            except RpcError:
                if not task.done.is_set():
                    try:
                        self.tasks.cancel(task)
                    except RpcError:
                        pass  # it finished meanwhile
                raise
            self.tasks.detach(task)

    # -- access, policy, plans ------------------------------------------------------------

    def authenticate(self, token: str | None) -> str:
        return self.guard.authenticate(token)

    def caps_for(self, principal: str) -> dict:
        return self.guard.caps(principal)

    def env_readable(self, principal: str):
        return self.guard.for_principal(principal).env_readable

    def parse(self, src: str) -> dict:
        return effects_mod.parse_summary(src)

    def analyze(self, who: Principal, src: str) -> tuple[effects_mod.Analysis, str]:
        session = self.sessions.get_or_create(who.session)
        cwd, env = session.snapshot()
        return effects_mod.analyze(src, cwd, env.get("HOME")), cwd

    def evaluate(self, who: Principal, src: str) -> tuple[Plan, Any]:
        analysis, cwd = self.analyze(who, src)
        verdict = self.guard.for_principal(who.principal).evaluate(
            analysis.effects, analysis.reversibility
        )
        ref = plan_ref(who.session, who.principal, src, analysis.effects)
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
        )
        return plan, verdict

    def plan(self, who: Principal, src: str) -> dict:
        """exec mode=plan: analyse, store, journal; nothing is spawned."""
        plan, _ = self.evaluate(who, src)
        plan = self.plans.put(plan)
        self.journal.record(
            JournalEntry(
                session=who.session,
                principal=who.principal,
                cwd=plan.cwd,
                src=src,
                kind="plan",
                effects=plan.effects,
                ref=plan.ref,
            )
        )
        return plan.record()

    def gate_exec(self, who: Principal, src: str) -> list[dict]:
        """exec mode=run: allow → the effects; ask → -32011 with a stored plan; deny → -32010."""
        plan, verdict = self.evaluate(who, src)
        if verdict.verdict == "allow":
            return plan.effects
        if verdict.verdict == "deny":
            self._journal_refusal(who, plan, "denied", None)
            raise RpcError(
                ErrorCode.DENIED,
                "denied by policy",
                {"effects": plan.effects, "reasons": plan.reasons},
            )
        plan = self.plans.put(plan)
        self._journal_refusal(who, plan, "approval_required", plan.ref)
        raise RpcError(
            ErrorCode.APPROVAL_REQUIRED,
            "approval required: call cap.request, then plan.apply once approved",
            {
                "plan_ref": plan.ref,
                "uri": plan.uri,
                "effects": plan.effects,
                "reasons": plan.reasons,
            },
        )

    def _journal_refusal(self, who: Principal, plan: Plan, kind: str, ref: str | None) -> None:
        """An exec that policy stopped still gets its journal row: operators see attempts."""
        self.journal.record(
            JournalEntry(
                session=who.session,
                principal=who.principal,
                cwd=plan.cwd,
                src=plan.src,
                kind=kind,
                effects=plan.effects,
                ok=False,
                ref=ref,
            )
        )

    def check_task_quota(self, who: Principal) -> None:
        self.guard.check_quota(who.principal, "max_tasks", self.tasks.running_count(who.principal))

    def check_subscription_quota(self, who: Principal, current: int) -> None:
        """max_subscriptions counts the principal's subscriptions on every connection."""
        with self._quota_guard:
            total = len(self._subscriptions.get(who.principal, ()))
        self.guard.check_quota(who.principal, "max_subscriptions", max(current, total))

    def track_subscription(self, principal: str, sub_id: str, live: bool) -> None:
        with self._quota_guard:
            ids = self._subscriptions.setdefault(principal, set())
            if live:
                ids.add(sub_id)
            else:
                ids.discard(sub_id)

    def quota_lock(self, principal: str, what: str) -> threading.Lock:
        """Serialises one principal's check-then-create for quota ``what``."""
        with self._quota_guard:
            return self._quota_locks.setdefault((principal, what), threading.Lock())

    def pty_count(self, principal: str) -> int:
        """Open PTYs of ``principal`` across all its sessions (max_ptys is per principal)."""
        return sum(
            1 for p in self.ptys.list(None) if p.get("owner", "").split("\x00", 1)[-1] == principal
        )

    def can_see_all_tasks(self, principal: str) -> bool:
        return self.guard.for_principal(principal).tasks_read == "all"

    def journal_read_all(self, principal: str) -> bool:
        return self.guard.for_principal(principal).journal_read == "all"

    def check_blob_access(self, who: Principal, digest: str) -> None:
        """A blob is readable by principals whose journal rows (or policy) reach it."""
        if self.journal_read_all(who.principal):
            return
        rows = self.db.query(
            "SELECT 1 FROM journal WHERE principal = ? AND outputs LIKE ? LIMIT 1",
            (who.principal, f"%{digest}%"),
        )
        if not rows:
            raise RpcError(ErrorCode.UNKNOWN_REF, f"unknown blob {digest}", {"hash": digest})

    def check_channel_access(self, who: Principal, channel: str) -> None:
        """task.N / pty.N only for their owners; journal and approval per policy."""
        kind, _, num = channel.partition(".")
        if kind == "task":
            self.tasks.get(
                num, who.session, who.principal, see_all=self.can_see_all_tasks(who.principal)
            )
        elif kind == "pty":
            if not any(p["pty_id"] == f"pty:{num}" for p in self.ptys.list(owner_key(who))):
                raise RpcError(
                    ErrorCode.UNKNOWN_PTY, f"unknown pty pty:{num}", {"pty_id": f"pty:{num}"}
                )
        elif channel in DURABLE_CHANNELS and not self.journal_read_all(who.principal):
            raise RpcError(
                ErrorCode.DENIED, f"{channel} events need journal_read = all", {"channel": channel}
            )
        elif channel == "approval" and not self.guard.for_principal(who.principal).approver:
            raise RpcError(
                ErrorCode.DENIED, "approval events are for approvers", {"channel": channel}
            )

    def _finalize(self, task: Task) -> dict[str, Any]:
        """Ingest the spools, store ``out:N``, journal it; runs once per task."""
        run: RunningCommand = task.run
        code = run.proc.returncode
        try:
            full = self._spool_full(run)
            if full:
                raise state_dir_full(full)
            out_info = self.cas.ingest(run.out_path)
            err_info = self.cas.ingest(run.err_path)
        except BaseException as exc:
            # Output that did not fit is incomplete: drop this run's spools so the
            # space comes back and the kernel keeps serving (docs/decisions.md, Exec).
            for path in (run.out_path, run.err_path, run.state_path):
                path.unlink(missing_ok=True)
            if is_disk_full(exc):
                raise state_dir_full(f"cannot store output: {exc.strerror}") from exc
            raise
        state = run.read_state()
        run.discard_state()
        dur_ns = (run.finished_ns or time.monotonic_ns()) - run.started_ns
        outcome: dict[str, Any] = {"$": "outcome"}
        if code is not None and code < 0:
            outcome["status"] = 128 - code
            outcome["signal"] = signal.Signals(-code).name
        else:
            outcome["status"] = code
        outcome.update(
            ok=outcome["status"] == 0 and not run.cancelled,
            out=out_info.node(),
            err=err_info.node(),
            dur_ns=dur_ns,
            pid=run.pid,
            cmd=run.src,
            cwd=run.cwd,
        )
        n = self.transcript.append(task.session, task.principal, outcome)
        ref = f"out:{n}"
        if state is not None and not task.listed:
            session = self.sessions.get_or_create(task.session)
            self.sessions.apply(session, state[0], state[1])
        outputs = [
            {"kind": "out", "hash": out_info.hash, "len": out_info.size},
            {"kind": "err", "hash": err_info.hash, "len": err_info.size},
        ]
        row = self.journal.record(
            JournalEntry(
                session=task.session,
                principal=task.principal,
                cwd=run.cwd,
                src=run.src,
                status=outcome["status"],
                ok=outcome["ok"],
                ref=ref,
                outputs=outputs,
                duration_ms=dur_ns / 1e6,
                effects=task.effects,
            )
        )
        self.events.publish(
            "journal",
            {
                "id": row["id"],
                "session": task.session,
                "principal": task.principal,
                "head": row.get("head", ""),
                "ok": outcome["ok"],
                "ref": ref,
            },
        )
        self.events.publish(
            "session.transcript", {"session": task.session, "ref": ref, "ok": outcome["ok"]}
        )
        return {
            "ref": ref,
            "uri": f"shoal://out/{n}",
            "ok": outcome["ok"],
            "status": outcome["status"],
            "stored": {"out_len": out_info.size, "err_len": err_info.size},
        }

    def _spool_full(self, run: RunningCommand) -> str | None:
        """Why ``run``'s spooled output is incomplete for lack of room, or None.

        The child's writes fail inside bash where the kernel cannot see them, so look
        at the result: a file system left with no free block, or a spool that reached
        this process's RLIMIT_FSIZE (the child was stopped by SIGXFSZ / EFBIG).
        """
        try:
            st = os.statvfs(self.spool_dir)
        except OSError:
            return None
        free = st.f_bfree if os.geteuid() == 0 else st.f_bavail
        sizes = run.output_sizes()
        if free == 0:
            return (
                f"no space left on device while spooling output ({sizes[0]} bytes stdout, "
                f"{sizes[1]} bytes stderr written before it filled); the partial output was discarded"
            )
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY and max(sizes) >= limit:
            return (
                f"output reached the file size limit (RLIMIT_FSIZE {limit} bytes); "
                "the partial output was discarded"
            )
        return None

    def exec_result(self, who: Principal, task: Task, elide: ElideOptions, started: float) -> dict:
        """``{ref, uri, value, render, elapsed_ms}`` for a finished task."""
        assert task.result is not None
        sel = self.values.select(who, task.result["ref"], "", None)
        return {
            "ref": sel.ref,
            "uri": sel.base_uri,
            "value": self.values.encode(sel, elide),
            "render": self.values.render(sel, elide),
            "elapsed_ms": round((time.time() - started) * 1000, 3),
        }


__all__ = ["Kernel", "KernelConfig", "Principal", "owner_key"]
