"""explain, plan.get / list / apply, cap.request, cap.decide, cap.ask, cap.answer,
grants.list / revoke."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ....protocol.errors import ErrorCode, RpcError, invalid_params
from ....protocol.params import (
    CAP_ANSWER,
    CAP_ASK,
    CAP_DECIDE,
    CAP_REQUEST,
    EXPLAIN,
    GRANTS_REVOKE,
    NONE,
    PLAN_APPLY,
    PLAN_GET,
    PLAN_LIST,
)
from ...access.plans import APPLIED, APPROVED, Plan, PlanStore, answer, plan_display
from ...exec.calls import RunOptions
from ..paging import bounded_page
from ..registry import method

if TYPE_CHECKING:
    from ..call import Call


@method("explain", EXPLAIN)
def explain(call: Call, params: dict) -> dict:
    return call.kernel.exec.explain(call.who, params["src"])


@method("plan.get", PLAN_GET)
def plan_get(call: Call, params: dict) -> dict:
    return _visible_plan(call, params["plan_ref"]).record()


@method("plan.list", PLAN_LIST)
def plan_list(call: Call, params: dict) -> dict:
    kernel = call.kernel
    approver = kernel.guard.for_principal(call.who.principal).approver
    if params.get("all") and approver:
        plans = kernel.plans.list(None, None, params.get("state"))
    else:
        plans = kernel.plans.list(call.who.session, call.who.principal, params.get("state"))
    if "cursor" in params:
        after = _plan_cursor(params["cursor"])
        plans = [p for p in plans if (p.created, p.ref) > after]
    page = bounded_page(plans, Plan.record, lambda p: f"{p.created!r}/{p.ref}")
    return page.reply("plans")


def _plan_cursor(cursor: str) -> tuple[float, str]:
    created, _, ref = cursor.partition("/")
    try:
        return float(created), ref
    except ValueError:
        raise invalid_params("cursor", "not a cursor from plan.list") from None


@method("plan.apply", PLAN_APPLY, blocking=True)
def plan_apply(call: Call, params: dict) -> dict:
    opts = RunOptions.from_params(params)
    call.kernel.state_budget.check()
    return call.kernel.exec.apply(call.who, params["plan_ref"], opts, call)


@method("cap.request", CAP_REQUEST)
def cap_request(call: Call, params: dict) -> dict:
    plan = _requested(call, params)
    return {
        "plan_ref": plan.ref,
        "state": "approval_pending" if plan.state != APPROVED else APPROVED,
    }


@method("cap.ask", CAP_ASK)
def cap_ask(call: Call, params: dict) -> dict:
    """``cap.request`` plus a request state: the plan's owner (an MCP facade) shows the
    plan to the human through its client and relays the answer with ``cap.answer``."""
    plan = _requested(call, params)
    state, expires = call.kernel.plans.mint_state(plan)
    return {"plan_ref": plan.ref, "request_state": state, "expires": expires, "plan": plan.record()}


@method("cap.answer", CAP_ANSWER)
def cap_answer(call: Call, params: dict) -> dict:
    """The human's decision on a plan, relayed by the plan owner's own connection with the
    single-use state ``cap.ask`` gave it (docs/security.md, "Approvals through the MCP
    client"). Any other session or principal, a second use, or a late one: -32010."""
    kernel, who = call.kernel, call.who
    ref = kernel.plans.redeem_state(params["request_state"], who.session, who.principal)
    plan = kernel.plans.get_own(ref, who.session, who.principal)
    answer(plan, who.principal, params["decision"])
    kernel.events.publish(
        "approval",
        {
            "kind": "decided",
            "plan_ref": plan.ref,
            "state": plan.state,
            "by": who.principal,
            "via": "client",
            "decision": params["decision"],
        },
    )
    return plan.record()


def _requested(call: Call, params: dict) -> Plan:
    """The caller's own plan, marked requested (a fresh one for an applied source), with
    the ``approval requested`` event published."""
    kernel = call.kernel
    plan = kernel.plans.get_own(params["plan_ref"], call.who.session, call.who.principal)
    if plan.state == APPLIED:  # the same source again: a fresh plan, approved afresh
        plan = kernel.plans.renew(plan)
    PlanStore.request(plan)
    kernel.events.publish(
        "approval",
        {
            "kind": "requested",
            "plan_ref": plan.ref,
            "principal": plan.principal,
            "session": plan.session,
            # the whole source, controls escaped: a cut or a \r could hide a command
            "src": plan_display(plan.src),
            # what the plan really does, never what the caller claims
            "effects": sorted(plan.effect_kinds()),
            "requested_effects": params.get("effects") or sorted(plan.effect_kinds()),
        },
    )
    return plan


@method("cap.decide", CAP_DECIDE)
def cap_decide(call: Call, params: dict) -> dict:
    kernel = call.kernel
    if not kernel.guard.for_principal(call.who.principal).approver:
        raise RpcError(
            ErrorCode.DENIED,
            "only approver principals may decide plans",
            {"principal": call.who.principal},
        )
    plan = kernel.plans.find(params["plan_ref"])
    PlanStore.decide(
        plan,
        call.who.principal,
        params["approve"],
        params.get("effects"),
        targets=params.get("targets"),
        unconfined=params.get("unconfined", False),
        scope=params.get("scope", "once"),
    )
    kernel.events.publish(
        "approval",
        {"kind": "decided", "plan_ref": plan.ref, "state": plan.state, "by": call.who.principal},
    )
    return plan.record()


def _visible_plan(call: Call, ref: str):
    kernel = call.kernel
    try:
        return kernel.plans.get_own(ref, call.who.session, call.who.principal)
    except RpcError:
        if kernel.guard.for_principal(call.who.principal).approver:
            return kernel.plans.find(ref)
        raise


@method("grants.list", NONE, on_loop=True)
def grants_list(call: Call, params: dict) -> dict:
    """Targets approved for a whole session (``shoal grants``); approvers only."""
    _require_approver(call, "grants.list")
    return {"grants": call.kernel.exec.escalation.listed()}


@method("grants.revoke", GRANTS_REVOKE)
def grants_revoke(call: Call, params: dict) -> dict:
    """Take back a principal's session grants in this session (one ``target`` path, or
    all); its next exec's sandbox no longer has them.  Approvers only."""
    _require_approver(call, "grants.revoke")
    gone = call.kernel.exec.escalation.revoke(
        call.who.session, params["principal"], params.get("target")
    )
    return {"session": call.who.session, "principal": params["principal"], "revoked": gone}


def _require_approver(call: Call, what: str) -> None:
    if not call.kernel.guard.for_principal(call.who.principal).approver:
        raise RpcError(
            ErrorCode.DENIED, f"{what} is for approvers", {"principal": call.who.principal}
        )
