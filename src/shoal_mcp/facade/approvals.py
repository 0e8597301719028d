"""Approvals asked of the human through the MCP client (docs/security.md, "Approvals through
the MCP client").

A ``shoal_exec`` or ``shoal_apply`` that meets -32011 (approval required) asks the kernel
for a request state (``cap.ask``), shows the plan in a form elicitation, and hands the
human's choice back with that state (``cap.answer``); the kernel, not the facade, checks
the state (its HMAC, plan, session, principal, expiry, single use) and records the
decision. Approved, the call runs exactly that plan (``plan.apply`` of the ref the kernel
returned, never one the client names).

- 2026-07-28: the call answers ``resultType: "input_required"`` with the elicitation and
  the state as ``requestState``; the client's retry carries ``inputResponses``.
- 2025-06-18 / 2025-11-25: the facade sends ``elicitation/create`` and waits for it.
- A client that declared no (form) elicitation gets the -32011 result as before; the human
  then uses ``shoal plans`` / ``shoal approve``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..protocol.errors import ErrorCode, RpcError
from ..protocol.limits import MCP_APPROVAL_ANSWER_S
from .kernel_link import KernelLink
from .versions import Revision

APPROVAL_INPUT = "shoal_approval"
"""The ``inputRequests`` key (and form field holder) of an approval."""
DECISION_FIELD = "decision"
CHOICES = (
    ("once", "Run it once"),
    ("session", "Allow it for this session"),
    ("deny", "Deny"),
)
CANCELLED = "cancel"
"""What ``decision_of`` says when the human dismissed the form without choosing."""

Elicit = Callable[[dict, float], dict | None]
"""Sends ``elicitation/create`` with these params and waits (seconds) for the ElicitResult."""
RunPlan = Callable[[str], dict]
"""Runs the approved plan (its ref) and answers the MCP tool result."""


class ApprovalAnswerRefused(RpcError):
    """The kernel refused a request state (forged, reused, late, someone else's): -32602."""


def elicitation_params(plan: dict, rev: Revision) -> dict:
    """A form elicitation showing the whole plan: its source with every control character
    escaped (the kernel's ``src_display``), cwd, each effect and the policy's reasons."""
    lines = [
        "shoal: the agent wants to run a command that needs your approval.",
        "",
        "Command (whole; control characters shown escaped):",
        str(plan.get("src_display", "")),
        "",
        f"Working directory: {plan.get('cwd', '')}",
        "Effects:",
    ]
    effects = plan.get("effects") or []
    for effect in effects:
        if isinstance(effect, dict):
            detail = ", ".join(
                f"{k}={v}" for k, v in effect.items() if k != "kind" and isinstance(v, str | int)
            )
            lines.append(f"- {effect.get('kind', '?')}" + (f": {detail}" if detail else ""))
    if not effects:
        lines.append("- (none recognised)")
    reasons = plan.get("reasons") or []
    if reasons:
        lines.append("Why it asks: " + "; ".join(str(r) for r in reasons))
    lines.append(f"Plan: {plan.get('plan_ref', '')}")
    if rev.titled_enums:
        choice: dict[str, Any] = {
            "type": "string",
            "title": "Decision",
            "oneOf": [{"const": value, "title": title} for value, title in CHOICES],
        }
    else:
        choice = {
            "type": "string",
            "title": "Decision",
            "enum": [value for value, _ in CHOICES],
            "enumNames": [title for _, title in CHOICES],
        }
    params: dict[str, Any] = {
        "message": "\n".join(lines),
        "requestedSchema": {
            "type": "object",
            "properties": {DECISION_FIELD: choice},
            "required": [DECISION_FIELD],
        },
    }
    if rev.titled_enums:  # "mode" exists from 2025-11-25 on
        params = {"mode": "form", **params}
    return params


def decision_of(answer: object) -> str | None:
    """``once``/``session``/``deny`` from an ElicitResult; ``CANCELLED`` when the human
    dismissed it; None when it is no usable answer (then the client is asked again)."""
    if not isinstance(answer, dict):
        return None
    action = answer.get("action")
    if action == "decline":
        return "deny"
    if action == "cancel":
        return CANCELLED
    if action != "accept":
        return None
    content = answer.get("content")
    decision = content.get(DECISION_FIELD) if isinstance(content, dict) else None
    return decision if decision in {value for value, _ in CHOICES} else None


class Approvals:
    def __init__(self, link: KernelLink, elicit: Elicit) -> None:
        self.link = link
        self.elicit = elicit

    def ask(self, plan_ref: str, rev: Revision, run_plan: RunPlan) -> dict | None:
        """The answer to a call that met -32011 for ``plan_ref``: an InputRequiredResult
        (2026-07-28), or the outcome of an ``elicitation/create`` (older revisions); None
        when the human dismissed it (the caller answers the -32011 result)."""
        asked = self.link.call("cap.ask", {"plan_ref": plan_ref})
        params = elicitation_params(asked["plan"], rev)
        if rev.stateless:
            return {
                "resultType": "input_required",
                "inputRequests": {
                    APPROVAL_INPUT: {"method": "elicitation/create", "params": params}
                },
                "requestState": asked["request_state"],
            }
        decision = decision_of(self.elicit(params, MCP_APPROVAL_ANSWER_S))
        if decision is None or decision == CANCELLED:
            return None
        return self.decide(asked["request_state"], decision, run_plan)

    @staticmethod
    def decision_in(params: dict) -> str | None:
        """The human's choice in a 2026-07-28 retry carrying ``requestState``: once,
        session, deny, ``CANCELLED``, or None when it carries no usable answer (the call
        is then served afresh, which asks again)."""
        state = params.get("requestState")
        if not isinstance(state, str) or not state:
            raise ApprovalAnswerRefused(
                ErrorCode.INVALID_PARAMS,
                "invalid params: requestState: a string this server gave out",
                {"field": "requestState"},
            )
        responses = params.get("inputResponses")
        return decision_of(responses.get(APPROVAL_INPUT) if isinstance(responses, dict) else None)

    def decide(self, state: str, decision: str, run_plan: RunPlan) -> dict:
        """Relay ``decision`` with ``state`` to the kernel; approved, run the plan."""
        try:
            record = self.link.call("cap.answer", {"request_state": state, "decision": decision})
        except RpcError as exc:
            if exc.code == ErrorCode.DENIED and (exc.data or {}).get("field") == "request_state":
                raise ApprovalAnswerRefused(
                    ErrorCode.INVALID_PARAMS,
                    f"invalid params: requestState: {exc.message}",
                    {"field": "requestState", "reason": (exc.data or {}).get("reason")},
                ) from None
            raise
        if decision == "deny":
            raise RpcError(
                ErrorCode.DENIED,
                f"{record['plan_ref']} was denied by the user",
                {"plan_ref": record["plan_ref"], "uri": record.get("uri"), "state": "denied"},
            )
        return run_plan(record["plan_ref"])
