"""Request states for approvals through the MCP client (``cap.ask`` / ``cap.answer``): only
the plan owner's own session and principal may present one, once, before it expires, and
only a state the kernel minted; it records the human's decision, never more.

A real kernel with a token agent (tests/support/approving) and raw kernel clients.
"""

from __future__ import annotations

import base64
import time

import pytest

from shoal_mcp.kernel.access.plans import REQUEST_STATE_TTL_S, Plan, PlanStore
from shoal_mcp.protocol.errors import RpcError
from tests.support.approving import approving_kernel

DENIED, APPROVAL_REQUIRED = -32010, -32011


@pytest.fixture(scope="module")
def env():
    with approving_kernel("shrs") as found:
        yield found


def _ask(client, src: str) -> dict:
    with pytest.raises(RpcError) as exc:
        client.call("exec", {"src": src}, timeout=60)
    assert exc.value.code == APPROVAL_REQUIRED
    return client.call("cap.ask", {"plan_ref": exc.value.data["plan_ref"]})


def _refused(client, state: str, why: str, decision: str = "once") -> None:
    with pytest.raises(RpcError) as exc:
        client.call("cap.answer", {"request_state": state, "decision": decision})
    assert exc.value.code == DENIED and why in exc.value.message, exc.value


def test_only_the_owner_session_may_answer_and_only_once(env):
    kernel, token, _tmp = env
    agent = kernel.client("states", token=token)
    same_principal_other_session = kernel.client("elsewhere", token=token)
    human = kernel.client("states")  # the local principal, an approver, same session name
    try:
        asked = _ask(agent, "basename /x/owner-only")
        assert asked["plan"]["src_display"] == "basename /x/owner-only"
        assert asked["plan"]["state"] == "requested"
        state = asked["request_state"]
        _refused(same_principal_other_session, state, "another session or principal")
        _refused(human, state, "another session or principal")
        answered = agent.call("cap.answer", {"request_state": state, "decision": "once"})
        assert answered["state"] == "approved" and answered["decided_via"] == "client"
        assert "scope" not in answered
        _refused(agent, state, "single-use")
        ran = agent.call("plan.apply", {"plan_ref": answered["plan_ref"]}, timeout=60)
        assert ran["value"]["ok"] is True
    finally:
        for c in (agent, same_principal_other_session, human):
            c.close()


def test_forged_or_edited_states_are_refused_and_deny_stays_denied(env):
    kernel, token, _tmp = env
    agent = kernel.client("forged", token=token)
    try:
        asked = _ask(agent, "basename /x/forged")
        state = asked["request_state"]
        raw = bytearray(base64.urlsafe_b64decode(state + "=" * (-len(state) % 4)))
        raw[-3] ^= 1  # one bit of the payload
        edited = base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")
        _refused(agent, edited, "not a request state")
        _refused(agent, "bm90IG91cnM", "not a request state")
        denied = agent.call("cap.answer", {"request_state": state, "decision": "deny"})
        assert denied["state"] == "denied"
        with pytest.raises(RpcError) as exc:
            agent.call("plan.apply", {"plan_ref": denied["plan_ref"]}, timeout=60)
        assert exc.value.code == DENIED
        with pytest.raises(RpcError) as exc:
            agent.call("cap.ask", {"plan_ref": denied["plan_ref"]})
        assert exc.value.code == DENIED  # a denied plan is not asked about again
    finally:
        agent.close()


def test_session_decisions_are_recorded_with_their_scope(env):
    kernel, token, _tmp = env
    agent = kernel.client("scoped", token=token)
    try:
        asked = _ask(agent, "basename /x/scoped")
        answered = agent.call(
            "cap.answer", {"request_state": asked["request_state"], "decision": "session"}
        )
        assert answered["scope"] == "session" and answered["state"] == "approved"
        assert agent.call("plan.get", {"plan_ref": answered["plan_ref"]})["scope"] == "session"
    finally:
        agent.close()


def test_a_state_expires():
    store = PlanStore()
    plan = Plan("plan:" + "0" * 32, "s", "p", "true", "/", [], "reversible", "ask", [])
    store.put(plan)
    late, _ = store.mint_state(plan, now=time.time() - REQUEST_STATE_TTL_S - 1)
    with pytest.raises(RpcError) as exc:
        store.redeem_state(late, "s", "p")
    assert "expired" in exc.value.message
    fresh, _ = store.mint_state(plan)
    assert store.redeem_state(fresh, "s", "p") == plan.ref
