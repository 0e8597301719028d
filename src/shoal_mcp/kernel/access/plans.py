"""Plans: analysed commands awaiting (or granted) approval (docs/security.md, Approval flow).

Each plan lives under its (session, principal); its ref hashes (session, principal,
src, effects, cwd, env hash) to 128 bits, so two callers planning the same command
never share or overwrite a plan, and a changed cwd or env is a different plan. Only
approvers decide; a denied plan stays denied; an applied plan is never reused: the same
source planned (or requested) again gets a fresh ref (a generation in the hash).

Approver views show the source through :func:`escape_controls` (``src_display``): the
whole of it, every control character visible, so ``\r`` or ESC cannot hide a second
command behind the first.

Budgets (docs/configuration.md, Budgets): a principal keeps at most ``max_plans`` plans
holding ``max_plan_bytes`` of source in all. Storing one more first drops that
principal's finished plans (applied, denied), then its oldest pending ones; plans
waiting for or holding an approval are never dropped, so past them the store answers
-32031. A plan the policy denies outright is never kept: only its ref is remembered
(``DENIED_REFS`` of them), so asking about it still says "denied by policy".
"""

from __future__ import annotations

import base64
import binascii
import builtins
import hashlib
import hmac
import os
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import orjson

from ...protocol import uri
from ...protocol.display import escape_controls
from ...protocol.errors import ErrorCode, RpcError, invalid_params
from ...protocol.wiretext import to_wire
from ..config.limits import APPROVAL_EVENT_SRC_CHARS, PLAN_REF_HEX
from ..owner.tables import TABLES
from .budgets import over_budget

PENDING, REQUESTED, APPROVED, DENIED, APPLIED = (
    "pending",
    "requested",
    "approved",
    "denied",
    "applied",
)


@dataclass
class Plan:
    ref: str
    session: str
    principal: str
    src: str
    cwd: str
    effects: list[dict]
    reversibility: str
    verdict: str
    reasons: list[str]
    state: str = PENDING
    approved_kinds: list[str] = field(default_factory=list)
    decided_by: str | None = None
    created: float = field(default_factory=time.time)
    env_hash: str = ""
    generation: int = 0  # > 0: planned again after an apply (a fresh ref)
    requested: list[dict] = field(default_factory=list)
    """Targets the sandbox refused a run of this source (``sandbox_denied``), asked for
    besides its predicted effects: what an approval grants (access/widen.py)."""
    approved_targets: list[str] | None = None  # None: every target; else ``kind:target``s
    unconfined: bool = False  # approved as an explicit unconfined run, once
    scope: str | None = None  # "session": its targets stay granted in the session
    decided_via: str | None = None  # "client": decided through the MCP client (cap.answer)

    @property
    def uri(self) -> str:
        return uri.plan_uri(self.ref)

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "plan_ref": self.ref,
            "uri": self.uri,
            "session": self.session,
            "principal": self.principal,
            "src": self.src,
            "src_display": escape_controls(self.src),
            "cwd": self.cwd,
            "env_hash": self.env_hash,
            "effects": self.effects,
            "reversibility": self.reversibility,
            "verdict": self.verdict,
            "reasons": self.reasons,
            "state": self.state,
            "created": self.created,
        }
        if self.requested:
            out["requested"] = self.requested
        if self.approved_kinds:
            out["approved_effects"] = self.approved_kinds
        if self.approved_targets is not None:
            out["approved_targets"] = self.approved_targets
        if self.unconfined:
            out["unconfined"] = True  # shown as such: this run will not be sandboxed
        if self.decided_by:
            out["decided_by"] = self.decided_by
        if self.decided_via:
            out["decided_via"] = self.decided_via
        if self.scope:
            out["scope"] = self.scope
        return out

    def effect_kinds(self) -> set[str]:
        return {e["kind"] for e in self.effects}

    def targets(self) -> list[dict]:
        """Everything an approval of this plan can grant: predicted effects and the
        targets a sandboxed run was refused."""
        return [*self.effects, *self.requested]


REQUEST_STATE_TTL_S = 600.0
"""How long a ``cap.ask`` request state can be answered (``cap.answer``); kernel-only."""
REQUEST_STATES_KEPT = 4096
"""Unanswered request states remembered at once (oldest forgotten: answering one fails)."""
_STATE_TAG_BYTES = 16
DECISIONS = ("once", "session", "deny")

DENIED_REFS = 4096
"""Refs of policy-denied plans remembered (a ref and its owner each), oldest forgotten."""
_DROP_ORDER = (APPLIED, DENIED, PENDING)  # what gives way to a new plan, in this order


@dataclass(frozen=True, slots=True)
class PlanBudget:
    """A principal's ``max_plans`` and ``max_plan_bytes``."""

    max_plans: int
    max_bytes: int


def plan_ref(
    session: str,
    principal: str,
    src: str,
    effects: list[dict],
    cwd: str = "",
    env_hash: str = "",
    generation: int = 0,
) -> str:
    # to_wire: a non-UTF-8 cwd or effect target (a path) hashes by its exact bytes.
    material = orjson.dumps(to_wire([session, principal, src, effects, cwd, env_hash, generation]))
    return "plan:" + hashlib.blake2b(material, digest_size=PLAN_REF_HEX // 2).hexdigest()


def _ref_of(plan: Plan, generation: int) -> str:
    return plan_ref(
        plan.session, plan.principal, plan.src, plan.effects, plan.cwd, plan.env_hash, generation
    )


class PlanStore:
    def __init__(self) -> None:
        self._by_owner: dict[tuple[str, str], dict[str, Plan]] = {}
        self._denied: OrderedDict[str, tuple[str, str]] = OrderedDict()  # ref -> owner
        self._held: dict[str, list[int]] = {}  # principal -> [plans, source bytes]
        # Request states (cap.ask / cap.answer): HMAC-tagged with this kernel process's own
        # key, so a state outlives neither the kernel nor its single use (the nonce below).
        self._state_key = os.urandom(32)
        self._states: OrderedDict[str, float] = OrderedDict()  # nonce -> expiry

    # -- request states: a human's answer that comes back through the MCP client --------

    def mint_state(self, plan: Plan, now: float | None = None) -> tuple[str, float]:
        """(an authenticated, single-use request state for ``plan``, its expiry time).

        Bound to the plan's ref, session and principal; only ``redeem_state`` by that same
        (session, principal), once, before the expiry, gives the ref back.
        """
        expires = (now or time.time()) + REQUEST_STATE_TTL_S
        nonce = secrets.token_hex(12)
        body = orjson.dumps([plan.ref, plan.session, plan.principal, nonce, round(expires, 3)])
        with TABLES:
            self._states[nonce] = expires
            while len(self._states) > REQUEST_STATES_KEPT:
                self._states.popitem(last=False)
        state = base64.urlsafe_b64encode(self._state_tag(body) + body).decode().rstrip("=")
        return state, expires

    def redeem_state(self, state: str, session: str, principal: str) -> str:
        """The plan ref ``state`` was minted for; raises -32010 for a state that is forged,
        expired, already used, or presented by another session or principal."""
        try:
            raw = base64.urlsafe_b64decode(state + "=" * (-len(state) % 4))
            tag, body = raw[:_STATE_TAG_BYTES], raw[_STATE_TAG_BYTES:]
            if not hmac.compare_digest(tag, self._state_tag(body)):
                raise ValueError("tag")
            ref, s_session, s_principal, nonce, expires = orjson.loads(body)
        except (binascii.Error, ValueError, TypeError, orjson.JSONDecodeError):
            raise _bad_state("not a request state this kernel gave out") from None
        if (s_session, s_principal) != (session, principal):
            raise _bad_state("minted for another session or principal")
        with TABLES:
            known = self._states.pop(nonce, None)
        if known is None:
            raise _bad_state("already answered (a request state is single-use) or forgotten")
        if time.time() > expires:
            raise _bad_state("expired; call the tool again for a fresh one")
        return str(ref)

    def _state_tag(self, body: bytes) -> bytes:
        return hmac.new(self._state_key, body, hashlib.sha256).digest()[:_STATE_TAG_BYTES]

    def put(self, plan: Plan, budget: PlanBudget | None = None) -> Plan:
        """Store ``plan``; an existing plan with the same ref (same owner) is kept, unless
        it was applied: then ``plan`` is stored under a fresh ref (next generation).

        A plan whose verdict is ``deny`` is not stored (its ref is remembered). With a
        ``budget``, older plans of the principal give way first; -32031 when none can.
        """
        with TABLES:
            store = self._by_owner.setdefault((plan.session, plan.principal), {})
            existing = store.get(plan.ref)
            while existing is not None and existing.state == APPLIED:
                plan.generation = existing.generation + 1
                plan.ref = _ref_of(plan, plan.generation)
                existing = store.get(plan.ref)
            if existing is not None:
                return existing
            if plan.verdict == "deny":
                self._denied[plan.ref] = (plan.session, plan.principal)
                self._denied.move_to_end(plan.ref)
                while len(self._denied) > DENIED_REFS:
                    self._denied.popitem(last=False)
                return plan
            if budget is not None:
                self._make_room_locked(plan, budget)
            store[plan.ref] = plan
            held = self._held.setdefault(plan.principal, [0, 0])
            held[0] += 1
            held[1] += _src_bytes(plan)
            return plan

    def _make_room_locked(self, plan: Plan, budget: PlanBudget) -> None:
        held = self._held.get(plan.principal, [0, 0])
        size = _src_bytes(plan)

        def fits() -> bool:
            return held[0] + 1 <= budget.max_plans and held[1] + size <= budget.max_bytes

        if size > budget.max_bytes:
            raise over_budget("max_plan_bytes", budget.max_bytes, f"a {size}-byte source")
        for state in _DROP_ORDER:
            if fits():
                return
            for victim in sorted(self._owned_locked(plan.principal), key=lambda p: p.created):
                if fits():
                    return
                if victim.state == state:
                    self._drop_locked(victim)
        if not fits():
            key, limit = (
                ("max_plans", budget.max_plans)
                if held[0] + 1 > budget.max_plans
                else ("max_plan_bytes", budget.max_bytes)
            )
            raise over_budget(
                key, limit, f"{plan.principal} holds {held[0]} plans awaiting approval"
            )

    def _owned_locked(self, principal: str) -> list[Plan]:
        return [p for (_, pr), st in self._by_owner.items() if pr == principal for p in st.values()]

    def _drop_locked(self, plan: Plan) -> None:
        store = self._by_owner.get((plan.session, plan.principal), {})
        if store.pop(plan.ref, None) is not None:
            held = self._held[plan.principal]
            held[0] -= 1
            held[1] -= _src_bytes(plan)

    def held(self, principal: str) -> tuple[int, int]:
        """(plans, source bytes) ``principal`` has stored."""
        with TABLES:
            count, size = self._held.get(principal, [0, 0])
        return count, size

    def renew(self, plan: Plan) -> Plan:
        """A fresh plan (new ref, pending) for an applied plan's source, to request again."""
        fresh = Plan(
            plan.ref,
            plan.session,
            plan.principal,
            plan.src,
            plan.cwd,
            plan.effects,
            plan.reversibility,
            plan.verdict,
            list(plan.reasons),
            env_hash=plan.env_hash,
            generation=plan.generation,
        )
        return self.put(fresh)

    def get_own(self, ref: str, session: str, principal: str) -> Plan:
        ref = _norm(ref)
        with TABLES:
            plan = self._by_owner.get((session, principal), {}).get(ref)
            denied = self._denied.get(ref) == (session, principal)
        if plan is None:
            if denied:
                raise _denied_by_policy(ref)
            raise RpcError(ErrorCode.UNKNOWN_PLAN, f"unknown plan {ref}", {"plan_ref": ref})
        return plan

    def find(self, ref: str) -> Plan:
        """Any owner's plan (for approvers)."""
        ref = _norm(ref)
        with TABLES:
            for store in self._by_owner.values():
                if ref in store:
                    return store[ref]
            denied = ref in self._denied
        if denied:
            raise _denied_by_policy(ref)
        raise RpcError(ErrorCode.UNKNOWN_PLAN, f"unknown plan {ref}", {"plan_ref": ref})

    def list(
        self, session: str | None, principal: str | None, state: str | None = None
    ) -> list[Plan]:
        with TABLES:
            plans = [
                p
                for (s, pr), store in self._by_owner.items()
                if (session is None or s == session) and (principal is None or pr == principal)
                for p in store.values()
            ]
        return sorted(
            (p for p in plans if state is None or p.state == state),
            key=lambda p: (p.created, p.ref),
        )

    def claim(self, plan: Plan) -> str:
        """Mark ``plan`` applied, atomically, so concurrent applies run it once; returns
        the state it had. Denied and applied plans raise -32010."""
        with TABLES:
            if plan.state == DENIED:
                raise RpcError(ErrorCode.DENIED, f"{plan.ref} was denied", {"plan_ref": plan.ref})
            if plan.state == APPLIED:
                raise RpcError(
                    ErrorCode.DENIED, f"{plan.ref} was already applied", {"plan_ref": plan.ref}
                )
            previous, plan.state = plan.state, APPLIED
            return previous

    def unclaim(self, plan: Plan, previous: str) -> None:
        """Undo ``claim`` when nothing was started (e.g. the task quota refused it)."""
        with TABLES:
            if plan.state == APPLIED:
                plan.state = previous

    @staticmethod
    def request(plan: Plan) -> None:
        if plan.state == DENIED:
            raise RpcError(ErrorCode.DENIED, f"{plan.ref} was denied", {"plan_ref": plan.ref})
        if plan.verdict == "deny":
            raise RpcError(
                ErrorCode.DENIED,
                f"{plan.ref} is denied by policy; approval cannot override it",
                {"plan_ref": plan.ref, "reasons": plan.reasons},
            )
        if plan.state in (PENDING,):
            plan.state = REQUESTED

    @staticmethod
    def decide(
        plan: Plan,
        approver: str,
        approve: bool,
        kinds: builtins.list[str] | None,
        *,
        targets: builtins.list[str] | None = None,
        unconfined: bool = False,
        scope: str = "once",
    ) -> None:
        """Approve or deny ``plan``.  ``targets`` (``kind:target`` strings): approve only
        these of its targets (the rest stay refused by the sandbox); ``unconfined``: run
        it once without the sandbox (the only way to approve a plan whose targets the
        analysis cannot name); ``scope`` ``"session"``: its targets stay granted to the
        principal in the session until revoked."""
        if plan.state == DENIED:
            raise RpcError(
                ErrorCode.DENIED, f"{plan.ref} was denied and stays denied", {"plan_ref": plan.ref}
            )
        if plan.state == APPLIED:
            raise RpcError(
                ErrorCode.DENIED, f"{plan.ref} was already applied", {"plan_ref": plan.ref}
            )
        if not approve:
            plan.state = DENIED
            plan.decided_by = approver
            return
        if plan.verdict == "deny":  # deny beats ask beats allow: no approval overrides the policy
            raise RpcError(
                ErrorCode.DENIED,
                f"{plan.ref} is denied by policy; approval cannot override it",
                {"plan_ref": plan.ref, "reasons": plan.reasons},
            )
        needed = plan.effect_kinds()
        granted = set(kinds) if kinds is not None else needed
        missing = needed - granted
        if missing:
            raise invalid_params(
                "effects", f"must cover every plan effect kind; missing {sorted(missing)}"
            )
        named = {f"{e.get('kind')}:{e.get('target')}" for e in plan.targets()}
        if targets is not None and not set(targets) <= named:
            raise invalid_params(
                "targets", f"not targets of this plan: {sorted(set(targets) - named)[:10]}"
            )
        opaque = "opaque" in needed and not plan.requested
        if opaque and not unconfined:
            raise invalid_params(
                "unconfined",
                "this plan does things the analysis cannot name (opaque): it can only be "
                "approved as an explicit unconfined run (unconfined: true)",
            )
        plan.approved_kinds = sorted(granted & needed) if needed else []
        plan.approved_targets = sorted(targets) if targets is not None else None
        plan.unconfined = unconfined
        plan.scope = scope if scope == "session" else None
        plan.state = APPROVED
        plan.decided_by = approver


def answer(plan: Plan, principal: str, decision: str) -> None:
    """Record the human's ``decision`` (``once``, ``session``, ``deny``) on ``plan``, as
    relayed by the plan owner's MCP client (``cap.answer``): an approval grants exactly
    the plan's targets, for its one apply or for the session (``PlanStore.decide``)."""
    PlanStore.decide(
        plan,
        principal,
        decision != "deny",
        None,
        scope="session" if decision == "session" else "once",
    )
    plan.decided_via = "client"


def _bad_state(why: str) -> RpcError:
    return RpcError(
        ErrorCode.DENIED, f"request state refused: {why}", {"field": "request_state", "reason": why}
    )


def _denied_by_policy(ref: str) -> RpcError:
    return RpcError(
        ErrorCode.DENIED,
        f"{ref} is denied by policy; approval cannot override it",
        {"plan_ref": ref},
    )


def _src_bytes(plan: Plan) -> int:
    return len(plan.src.encode("utf-8", "surrogatepass"))


def _norm(ref: str) -> str:
    try:
        return uri.plan_ref_of(ref)
    except uri.BadName:
        return ref  # not found either way


def plan_display(src: str, limit: int = APPROVAL_EVENT_SRC_CHARS) -> str:
    """:func:`escape_controls` of ``src`` for a bounded view (an event): past ``limit``
    characters it ends in a marker saying how many more there are, never a silent cut."""
    shown = escape_controls(src)
    if len(shown) <= limit:
        return shown
    return shown[:limit] + f" …[+{len(shown) - limit} more characters: plan.get shows all]"
