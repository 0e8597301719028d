"""The exec gate: the policy's decision on a command before anything is launched.

``exec`` asks ``ExecGate.gate`` (allow → run; ask → a stored plan and -32011; deny →
-32010), ``exec mode=plan`` and ``plan.explain`` ask what the plan would be, and
``plan.apply`` asks ``check_applicable`` whether a stored plan may run now. Every
decision is made on the effects of the source in the caller's session as it is now
(its cwd and env hash). Launching is the exec service's business, not the gate's.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from ...protocol.errors import ErrorCode, RpcError
from ..effects import analyzer
from ..owner.nowait import WouldWait, waits_allowed
from ..store.sessions import SessionTable
from .guard import Guard
from .identity import Principal
from .plans import APPLIED, APPROVED, Plan, PlanBudget, PlanStore, plan_ref


class PlanJournal(Protocol):
    """Where a plan, or an exec the policy stopped, gets its journal row."""

    def journal_plan(
        self, who: Principal, plan: Plan, kind: str, ref: str | None, ok: bool | None
    ) -> None: ...


class Judgement(NamedTuple):
    """What the gate decides on: ``src``'s effects where the session is, and the verdict."""

    analysis: analyzer.Analysis
    cwd: str
    env_hash: str
    verdict: Any


class ExecGate:
    """Policy, approval and plan-budget decisions for one principal's command."""

    def __init__(
        self, *, sessions: SessionTable, guard: Guard, plans: PlanStore, journal: PlanJournal
    ) -> None:
        self.sessions = sessions
        self.guard = guard
        self.plans = plans
        self.journal = journal

    def analyze(self, who: Principal, src: str) -> tuple[analyzer.Analysis, str, str]:
        """Effects of ``src`` in the caller's session as it is now, that cwd and env hash."""
        cwd, env, env_hash = self.sessions.get_or_create(who.session).state(who.principal)
        return analyzer.analyze(src, cwd, env.get("HOME")), cwd, env_hash

    def project_of(self, who: Principal) -> tuple[str, ...]:
        """The project roots of ``who``'s session (what ``{project}`` grants name)."""
        return self.sessions.get_or_create(who.session).project

    def plan_budget(self, who: Principal) -> PlanBudget:
        """How many plans (and plan bytes) ``who`` may keep stored."""
        policy = self.guard.for_principal(who.principal)
        return PlanBudget(policy.budget("max_plans"), policy.budget("max_plan_bytes"))

    def evaluate(self, who: Principal, src: str) -> tuple[Plan, Any]:
        """The plan ``src`` would be for the caller, and the policy's verdict on it."""
        return self._plan_of(who, src, self._judge(who, src))

    def plan(self, who: Principal, src: str) -> dict:
        """``exec mode=plan``: analyse, store, journal; nothing is spawned."""
        plan, _ = self.evaluate(who, src)
        plan = self.plans.put(plan, self.plan_budget(who))
        denied = False if plan.verdict == "deny" else None  # journaled by hash and head only
        self.journal.journal_plan(who, plan, "plan", plan.ref, ok=denied)
        return plan.record()

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
        if not waits_allowed():  # the owner loop: a plan and a journal row are a worker's
            raise WouldWait()
        plan, verdict = self._plan_of(who, src, judged)
        if verdict.verdict == "deny":
            self.journal.journal_plan(who, plan, "denied", None, ok=False)
            raise RpcError(
                ErrorCode.DENIED,
                "denied by policy",
                {"effects": plan.effects, "reasons": plan.reasons},
            )
        plan = self.plans.put(plan, self.plan_budget(who))
        self.journal.journal_plan(who, plan, "approval_required", plan.ref, ok=False)
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

    def check_applicable(self, who: Principal, plan: Plan) -> None:
        """``plan.apply``'s gate: the stored plan is approved for the session as it is now,
        or the policy allows it outright now; else -32010 or -32011."""
        if plan.state == "denied":
            raise RpcError(ErrorCode.DENIED, f"{plan.ref} was denied", {"plan_ref": plan.ref})
        if plan.state == APPLIED:
            raise RpcError(
                ErrorCode.DENIED, f"{plan.ref} was already applied", {"plan_ref": plan.ref}
            )
        if plan.state != APPROVED:
            self._check_allowed_now(who, plan)
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

    def _check_allowed_now(self, who: Principal, plan: Plan) -> None:
        """An unapproved plan: re-evaluate now, since policy may allow it outright (or
        have changed)."""
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

    def _judge(self, who: Principal, src: str) -> Judgement:
        """``analyze``, and the policy's verdict on those effects."""
        analysis, cwd, env_hash = self.analyze(who, src)
        verdict = self.guard.evaluate(
            who.principal, analysis.effects, analysis.reversibility, self.project_of(who)
        )
        return Judgement(analysis, cwd, env_hash, verdict)

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
