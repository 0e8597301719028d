"""explain, plan.get / list / apply, cap.request, cap.decide."""

from __future__ import annotations

from ....protocol.errors import ErrorCode, RpcError
from ...access.plans import APPROVED, PlanStore
from ...exec.service import RunOptions
from ...values.elision import ELIDE_SCHEMA
from ..registry import BOOL, method, obj
from .exec import SRC

PLAN_REF = {"type": "string", "minLength": 1, "maxLength": 200}
KINDS = {"type": "array", "items": {"type": "string", "maxLength": 32}, "maxItems": 16}


@method("explain", obj({"src": SRC}, ("src",)))
def explain(call, params):
    return call.kernel.exec.explain(call.who, params["src"])


@method("plan.get", obj({"plan_ref": PLAN_REF}, ("plan_ref",)))
def plan_get(call, params):
    return _visible_plan(call, params["plan_ref"]).record()


@method(
    "plan.list",
    obj(
        {
            "state": {
                "type": "string",
                "enum": ["pending", "requested", "approved", "denied", "applied"],
            },
            "all": BOOL,
        }
    ),
)
def plan_list(call, params):
    kernel = call.kernel
    approver = kernel.guard.for_principal(call.who.principal).approver
    if params.get("all") and approver:
        plans = kernel.plans.list(None, None, params.get("state"))
    else:
        plans = kernel.plans.list(call.who.session, call.who.principal, params.get("state"))
    return {"plans": [p.record() for p in plans]}


@method(
    "plan.apply",
    obj(
        {
            "plan_ref": PLAN_REF,
            "position": {"type": "string", "enum": ["stmt", "value"]},
            "background": BOOL,
            "elide": ELIDE_SCHEMA,
        },
        ("plan_ref",),
    ),
    blocking=True,
)
def plan_apply(call, params):
    opts = RunOptions.from_params(params)
    return call.kernel.exec.apply(call.who, params["plan_ref"], opts, call)


@method("cap.request", obj({"plan_ref": PLAN_REF, "effects": KINDS}, ("plan_ref",)))
def cap_request(call, params):
    kernel = call.kernel
    plan = kernel.plans.get_own(params["plan_ref"], call.who.session, call.who.principal)
    PlanStore.request(plan)
    kernel.events.publish(
        "approval",
        {
            "kind": "requested",
            "plan_ref": plan.ref,
            "principal": plan.principal,
            "session": plan.session,
            "src": plan.src[:512],
            # what the plan really does, never what the caller claims
            "effects": sorted(plan.effect_kinds()),
            "requested_effects": params.get("effects") or sorted(plan.effect_kinds()),
        },
    )
    return {
        "plan_ref": plan.ref,
        "state": "approval_pending" if plan.state != APPROVED else APPROVED,
    }


@method(
    "cap.decide",
    obj({"plan_ref": PLAN_REF, "approve": BOOL, "effects": KINDS}, ("plan_ref", "approve")),
)
def cap_decide(call, params):
    kernel = call.kernel
    if not kernel.guard.for_principal(call.who.principal).approver:
        raise RpcError(
            ErrorCode.DENIED,
            "only approver principals may decide plans",
            {"principal": call.who.principal},
        )
    plan = kernel.plans.find(params["plan_ref"])
    PlanStore.decide(plan, call.who.principal, params["approve"], params.get("effects"))
    kernel.events.publish(
        "approval",
        {"kind": "decided", "plan_ref": plan.ref, "state": plan.state, "by": call.who.principal},
    )
    return plan.record()


def _visible_plan(call, ref: str):
    kernel = call.kernel
    try:
        return kernel.plans.get_own(ref, call.who.session, call.who.principal)
    except RpcError:
        if kernel.guard.for_principal(call.who.principal).approver:
            return kernel.plans.find(ref)
        raise
