"""Security evidence (issue #6): principals are isolated and approvals are real, live.

One kernel with a policy file and several token principals; agents attach to the same
session name and to different ones. Each test names the historical hole it guards
against. No mocks: a real kernel over its Unix socket.
"""

from __future__ import annotations

import re
import secrets
import threading
from pathlib import Path

import pytest

from shoal_mcp.client import KernelClient
from shoal_mcp.protocol.errors import RpcError
from shoal_mcp.tokens import TokenStore
from tests.support.egress import expected_enforced
from tests.support.kernel import KernelProcess
from tests.support.polling import wait_until
from tests.support.tmp import short_tmp

INVALID_PARAMS = -32602
UNKNOWN_REF = -32004
DENIED = -32010
APPROVAL_REQUIRED = -32011
UNKNOWN_PLAN = -32012
UNKNOWN_TASK = -32021
UNKNOWN_PTY = -32022
QUOTA = -32031

AGENT_GRANTS = """
proc_spawn = ["echo", "sleep", "true", "cat", "printf", "head"]
env_read = ["SHOAL_T_VISIBLE"]
ungranted = "ask"
opaque = "ask"
approver = false
journal_read = "own"
"""

POLICY = """
[principal."agent:a"]
{grants}
[principal."agent:a".fs]
read = ["{work}/**"]
write = ["{work}/**"]

[principal."agent:b"]
{grants}
[principal."agent:b".fs]
read = ["{work}/**"]
write = ["{work}/**"]

[principal."agent:c"]
proc_spawn = ["echo", "true"]
ungranted = "deny"
opaque = "deny"

[principal."agent:q"]
proc_spawn = ["sleep", "true", "cat"]
max_tasks = 2
max_ptys = 1
max_subscriptions = 2

[principal."agent:r"]
proc_spawn = ["cat"]
max_ptys = 1
max_subscriptions = 2

[principal."agent:watcher"]
proc_spawn = ["true"]
journal_read = "all"
tasks_read = "all"
"""

PRINCIPALS = (
    "agent:a",
    "agent:b",
    "agent:c",
    "agent:q",
    "agent:r",  # the quota races' own: no other test holds its PTYs or subscriptions
    "agent:watcher",
    "agent:ghost",
)


class Env:
    """The shared kernel, its tokens and a scratch dir the agents may write."""

    def __init__(self, kernel: KernelProcess, tokens: dict[str, str], work: Path) -> None:
        self.kernel = kernel
        self.tokens = tokens
        self.work = work
        self._clients: list[KernelClient] = []

    def agent(self, name: str, session: str) -> KernelClient:
        c = self.kernel.client(session, token=self.tokens[f"agent:{name}"])
        self._clients.append(c)
        return c

    def human(self, session: str, on_event=None) -> KernelClient:
        c = KernelClient(self.kernel.socket, on_event=on_event)
        c.call("session.attach", {"session": session}, timeout=30)
        self._clients.append(c)
        return c

    def close_all(self) -> None:
        for c in self._clients:
            c.close()


@pytest.fixture(scope="module")
def env():
    with short_tmp("shsp") as tmp:
        work = tmp / "work"
        work.mkdir()
        policy = tmp / "policy.toml"
        policy.write_text(POLICY.format(grants=AGENT_GRANTS, work=work))
        kernel = KernelProcess(
            tmp,
            "--policy",
            str(policy),
            env={"SHOAL_T_VISIBLE": "visible-value", "SHOAL_T_SECRET": "secret-value"},
        )
        store = TokenStore(kernel.state / "tokens.json")
        tokens = {p: store.create(p)[1] for p in PRINCIPALS}
        kernel.start()
        e = Env(kernel, tokens, work)
        try:
            yield e
        finally:
            e.close_all()
            kernel.stop()


def rpc_error(
    client: KernelClient, method: str, params: dict | None = None, timeout: float = 30
) -> RpcError:
    with pytest.raises(RpcError) as exc:
        client.call(method, params or {}, timeout=timeout)
    return exc.value


def code(client: KernelClient, method: str, params: dict | None = None) -> int:
    return rpc_error(client, method, params).code


def test_another_principal_cannot_reach_anything_of_a(env: Env) -> None:
    """Hole: journal rows, out:N, plans, tasks, PTYs, blobs and task/pty channels of one
    agent readable or steerable by another, in the same session or another one."""
    a = env.agent("a", "iso-shared")
    tag = secrets.token_hex(8)
    out = a.call("exec", {"src": f"echo a-secret-{tag}", "position": "value"}, timeout=30)
    ref, n = out["ref"], int(out["ref"].split(":")[1])
    rows = a.call("journal.query", {"limit": 1000})["rows"]
    row = next(r for r in rows if r.get("ref") == ref)
    out_hash = next(o["hash"] for o in row["outputs"] if o["kind"] == "out")
    assert a.call("blob.get", {"hash": out_hash})["total"] == len(f"a-secret-{tag}\n")
    task = a.call("exec", {"src": "sleep 30", "background": True}, timeout=30)
    task_ref, task_num = task["task"], task["task"].split(":")[1]
    pty = a.call("pty.open", {"cmd": "cat"}, timeout=30)["pty_id"]
    plan = a.call("exec", {"src": "cat /etc/hostname", "mode": "plan"}, timeout=30)["plan_ref"]

    b_same = env.agent("b", "iso-shared")
    b_other = env.agent("b", "iso-other")
    b_same.call("exec", {"src": f"echo b-{tag}"}, timeout=30)
    try:
        for b in (b_same, b_other):
            rows = b.call("journal.query", {"limit": 1000})["rows"]
            assert rows and {r["principal"] for r in rows} == {"agent:b"}
            assert b.call("journal.query", {"principal": "agent:a"})["rows"] == []
            shared_rows = b.call(
                "journal.query", {"session": "iso-shared", "head": "echo", "limit": 1000}
            )["rows"]
            assert all(r["principal"] == "agent:b" for r in shared_rows)
            assert f"a-secret-{tag}" not in str(shared_rows)
            assert code(b, "value.get", {"ref": ref}) == UNKNOWN_REF
            assert code(b, "value.get", {"ref": f"shoal://out/{n}", "format": "raw"}) == UNKNOWN_REF
            assert (
                code(b, "value.get", {"ref": f"shoal://out/{n}?path=.out", "format": "render"})
                == UNKNOWN_REF
            )
            assert code(b, "value.get", {"ref": task_ref}) == UNKNOWN_TASK
            assert code(b, "value.get", {"ref": f"shoal://task/{task_num}/out"}) == UNKNOWN_TASK
            assert code(b, "blob.get", {"hash": out_hash}) == UNKNOWN_REF
            assert code(b, "plan.get", {"plan_ref": plan}) == UNKNOWN_PLAN
            assert code(b, "plan.get", {"plan_ref": f"shoal://plan/{plan}"}) == UNKNOWN_PLAN
            assert code(b, "plan.apply", {"plan_ref": plan}) == UNKNOWN_PLAN
            assert code(b, "cap.request", {"plan_ref": plan}) == UNKNOWN_PLAN
            assert code(b, "cap.decide", {"plan_ref": plan, "approve": True}) == DENIED
            assert code(b, "cap.decide", {"plan_ref": plan, "approve": False}) == DENIED
            assert plan not in {p["plan_ref"] for p in b.call("plan.list", {"all": True})["plans"]}
            for method in ("task.get", "task.cancel", "task.suspend", "task.resume", "task.await"):
                assert code(b, method, {"task": task_ref}) == UNKNOWN_TASK, method
            assert task_ref not in {t["task"] for t in b.call("task.list")["tasks"]}
            assert code(b, "pty.read", {"pty_id": pty}) == UNKNOWN_PTY
            assert code(b, "pty.send", {"pty_id": pty, "input": "x"}) == UNKNOWN_PTY
            assert code(b, "pty.resize", {"pty_id": pty, "cols": 40, "rows": 10}) == UNKNOWN_PTY
            assert code(b, "pty.close", {"pty_id": pty}) == UNKNOWN_PTY
            assert b.call("pty.list")["ptys"] == []
            for channel, want in (
                (f"task.{task_num}", UNKNOWN_TASK),
                (f"pty.{pty.split(':')[1]}", UNKNOWN_PTY),
                ("journal", DENIED),
                ("session.transcript", DENIED),
                ("approval", DENIED),
            ):
                assert code(b, "events.read", {"channel": channel}) == want, channel
                assert code(b, "events.subscribe", {"channel": channel}) == want, channel
        # Nothing B did touched A's things.
        assert a.call("task.get", {"task": task_ref})["state"] == "running"
        assert a.call("plan.get", {"plan_ref": plan})["state"] == "pending"
        assert a.call("pty.read", {"pty_id": pty})["alive"] is True
        assert (
            a.call("value.get", {"ref": ref, "path": ".out"})["value"]["v"] == f"a-secret-{tag}\n"
        )
        assert a.call("events.read", {"channel": f"task.{task_num}"})["events"]
    finally:
        a.call("task.cancel", {"task": task_ref})
        a.call("pty.close", {"pty_id": pty}, timeout=30)


def test_reading_all_tasks_does_not_allow_steering_them(env: Env) -> None:
    """Hole: tasks_read = "all" (a read grant) letting one agent cancel or stop another's."""
    a = env.agent("a", "watch")
    w = env.agent("watcher", "watch")
    task = a.call("exec", {"src": "sleep 30", "background": True}, timeout=30)["task"]
    try:
        assert w.call("task.get", {"task": task})["principal"] == "agent:a"
        assert task in {t["task"] for t in w.call("task.list")["tasks"]}
        for method in ("task.cancel", "task.suspend", "task.resume"):
            assert code(w, method, {"task": task}) == DENIED, method
        assert a.call("task.get", {"task": task})["state"] == "running"
    finally:
        a.call("task.cancel", {"task": task})
    wait_until(lambda: a.call("task.get", {"task": task})["state"] == "cancelled")


def test_approval_flow_needs_a_real_approver(env: Env) -> None:
    """Holes: unchecked approver (any caller could cap.decide) and self-approval."""
    events: list[dict] = []
    human = env.human("appr-human", on_event=events.append)
    human.call("events.subscribe", {"channel": "approval"})
    a = env.agent("a", "appr")
    b = env.agent("b", "appr")
    planned = a.call("exec", {"src": "cat /etc/hostname", "mode": "plan"}, timeout=30)
    ref = planned["plan_ref"]
    assert planned["verdict"] == "ask" and planned["state"] == "pending"
    assert {e["kind"] for e in planned["effects"]} == {"proc_spawn", "fs_read"}

    assert code(a, "cap.decide", {"plan_ref": ref, "approve": True}) == DENIED  # not itself
    assert code(b, "cap.decide", {"plan_ref": ref, "approve": True}) == DENIED  # not a peer
    filed = a.call("cap.request", {"plan_ref": ref, "effects": ["proc_spawn"]})
    assert filed == {"plan_ref": ref, "state": "approval_pending"}
    requested = wait_until(lambda: [e for e in events if e["payload"].get("plan_ref") == ref])
    assert requested[0]["channel"] == "approval" and requested[0]["payload"]["kind"] == "requested"
    assert requested[0]["payload"]["principal"] == "agent:a"
    # The approver sees the plan's real effect kinds, not what the agent claimed.
    assert set(requested[0]["payload"]["effects"]) == {"proc_spawn", "fs_read"}
    assert a.call("plan.get", {"plan_ref": ref})["state"] == "requested"  # never approved by asking
    assert code(a, "plan.apply", {"plan_ref": ref}) == APPROVAL_REQUIRED
    assert code(a, "cap.decide", {"plan_ref": ref, "approve": True}) == DENIED
    assert (
        code(
            b,
            "cap.decide",
            {"plan_ref": ref, "approve": True, "effects": ["proc_spawn", "fs_read"]},
        )
        == DENIED
    )
    assert (
        a.call("cap.request", {"plan_ref": ref})["state"] == "approval_pending"
    )  # asking again: still asking

    # The local human approves; an approval must cover every effect kind.
    partial = rpc_error(
        human, "cap.decide", {"plan_ref": ref, "approve": True, "effects": ["proc_spawn"]}
    )
    assert partial.code == INVALID_PARAMS and partial.data["field"] == "effects"
    assert human.call("plan.get", {"plan_ref": ref})["state"] == "requested"
    decided = human.call(
        "cap.decide", {"plan_ref": ref, "approve": True, "effects": ["fs_read", "proc_spawn"]}
    )
    assert decided["state"] == "approved" and decided["decided_by"].startswith("uid:")
    wait_until(
        lambda: any(
            e["payload"].get("kind") == "decided" and e["payload"].get("plan_ref") == ref
            for e in events
        )
    )

    assert code(b, "plan.apply", {"plan_ref": ref}) == UNKNOWN_PLAN  # not B's to run
    ran = a.call("plan.apply", {"plan_ref": ref, "position": "value"}, timeout=30)
    assert ran["value"]["ok"] is True
    assert ran["value"]["out"]["v"] == Path("/etc/hostname").read_text()
    assert code(a, "plan.apply", {"plan_ref": ref}) == DENIED  # once
    assert a.call("plan.get", {"plan_ref": ref})["state"] == "applied"


def test_an_approval_is_bound_to_the_cwd_it_was_given_for(env: Env) -> None:
    """Hole: an approved plan applied after `cd`, running the same source somewhere else."""
    human = env.human("cwd-human")
    a = env.agent("a", "cwd")
    victim = env.work / "cwd-victim"
    victim.mkdir()
    (victim / "notes.txt").write_text("keep")
    (env.work / "notes.txt").write_text("disposable")
    a.call("exec", {"src": f"cd {env.work}"}, timeout=30)
    ref = a.call("exec", {"src": "rm notes.txt", "mode": "plan"}, timeout=30)["plan_ref"]
    human.call("cap.decide", {"plan_ref": ref, "approve": True})
    a.call("exec", {"src": f"cd {victim}"}, timeout=30)
    moved = rpc_error(a, "plan.apply", {"plan_ref": ref})
    assert moved.code == APPROVAL_REQUIRED and moved.data["plan_cwd"] == str(env.work)
    assert (victim / "notes.txt").read_text() == "keep"
    a.call("exec", {"src": f"cd {env.work}"}, timeout=30)
    a.call("plan.apply", {"plan_ref": ref}, timeout=30)
    assert not (env.work / "notes.txt").exists() and (victim / "notes.txt").exists()


def test_an_approved_plan_runs_once_under_concurrent_applies(env: Env) -> None:
    """Hole: plan.apply checked the state and marked it applied non-atomically."""
    a = env.agent("a", "once")
    target = env.work / f"once-{secrets.token_hex(4)}"
    ref = a.call("exec", {"src": f"echo x >> {target}", "mode": "plan"}, timeout=30)["plan_ref"]
    calls = [a.start_call("plan.apply", {"plan_ref": ref}) for _ in range(8)]
    ok = 0
    for _, fut in calls:
        try:
            fut.result(30)
            ok += 1
        except RpcError as exc:
            assert exc.code == DENIED
    assert ok == 1
    assert target.read_text() == "x\n"


def test_a_denied_plan_stays_denied(env: Env) -> None:
    """Hole: cap.* calls reviving a plan that an approver (or the policy) denied."""
    human = env.human("deny-human")
    a = env.agent("a", "deny")
    ref = a.call("exec", {"src": "cat /etc/passwd", "mode": "plan"}, timeout=30)["plan_ref"]
    a.call("cap.request", {"plan_ref": ref})
    assert human.call("cap.decide", {"plan_ref": ref, "approve": False})["state"] == "denied"
    for _ in range(2):
        assert code(a, "cap.request", {"plan_ref": ref}) == DENIED
        assert code(human, "cap.decide", {"plan_ref": ref, "approve": True}) == DENIED
        assert (
            code(
                human,
                "cap.decide",
                {"plan_ref": ref, "approve": True, "effects": ["proc_spawn", "fs_read"]},
            )
            == DENIED
        )
        assert code(a, "plan.apply", {"plan_ref": ref}) == DENIED
    # Planning or running the same source again does not reset it.
    assert (
        a.call("exec", {"src": "cat /etc/passwd", "mode": "plan"}, timeout=30)["state"] == "denied"
    )
    again = rpc_error(a, "exec", {"src": "cat /etc/passwd"})
    assert again.code == APPROVAL_REQUIRED and again.data["plan_ref"] == ref
    assert code(a, "plan.apply", {"plan_ref": ref}) == DENIED
    assert a.call("plan.get", {"plan_ref": ref})["state"] == "denied"

    # A plan the policy denies cannot be approved into running either.
    c = env.agent("c", "deny")
    target = env.work / "must-not-exist"
    planned = c.call("exec", {"src": f"echo x > {target}", "mode": "plan"}, timeout=30)
    assert planned["verdict"] == "deny"
    pref = planned["plan_ref"]
    assert code(c, "cap.request", {"plan_ref": pref}) == DENIED
    assert code(human, "cap.decide", {"plan_ref": pref, "approve": True}) == DENIED
    assert code(c, "plan.apply", {"plan_ref": pref}) == DENIED
    assert not target.exists()


def test_plan_refs_never_collide_between_callers(env: Env) -> None:
    """Hole: colliding plan handles (one caller's plan overwriting or exposing another's)."""
    human = env.human("coll-human")
    a = env.agent("a", "coll")
    b = env.agent("b", "coll")
    a_elsewhere = env.agent("a", "coll-2")
    src = "cat /etc/hostname"
    pa = a.call("exec", {"src": src, "mode": "plan"}, timeout=30)
    pb = b.call("exec", {"src": src, "mode": "plan"}, timeout=30)
    pa2 = a_elsewhere.call("exec", {"src": src, "mode": "plan"}, timeout=30)
    refs = {pa["plan_ref"], pb["plan_ref"], pa2["plan_ref"]}
    assert len(refs) == 3
    assert all(re.fullmatch(r"plan:[0-9a-f]{32}", r) for r in refs)
    assert a.call("plan.get", {"plan_ref": pa["plan_ref"]})["principal"] == "agent:a"
    assert b.call("plan.get", {"plan_ref": pb["plan_ref"]})["principal"] == "agent:b"
    assert code(b, "plan.get", {"plan_ref": pa["plan_ref"]}) == UNKNOWN_PLAN
    assert code(a, "plan.get", {"plan_ref": pb["plan_ref"]}) == UNKNOWN_PLAN
    assert code(a, "plan.get", {"plan_ref": pa2["plan_ref"]}) == UNKNOWN_PLAN  # other session
    # Re-planning returns the same ref and keeps its state; approving one leaves the others.
    assert a.call("exec", {"src": src, "mode": "plan"}, timeout=30)["plan_ref"] == pa["plan_ref"]
    human.call("cap.decide", {"plan_ref": pa["plan_ref"], "approve": True})
    assert b.call("plan.get", {"plan_ref": pb["plan_ref"]})["state"] == "pending"
    assert a_elsewhere.call("plan.get", {"plan_ref": pa2["plan_ref"]})["state"] == "pending"
    assert code(b, "plan.apply", {"plan_ref": pb["plan_ref"]}) == APPROVAL_REQUIRED
    assert code(b, "plan.apply", {"plan_ref": pa["plan_ref"]}) == UNKNOWN_PLAN
    assert a.call("plan.get", {"plan_ref": pa["plan_ref"]})["state"] == "approved"
    mine = a.call("plan.list")["plans"]
    assert {p["plan_ref"] for p in mine} == {pa["plan_ref"]}
    everyone = {p["plan_ref"] for p in human.call("plan.list", {"all": True})["plans"]}
    assert refs <= everyone


def test_exec_verdicts_ask_and_deny(env: Env) -> None:
    """Hole: exec in run mode bypassing the policy that plans are held to."""
    a = env.agent("a", "verdict")
    asked = rpc_error(a, "exec", {"src": "cat /etc/hostname"})
    assert asked.code == APPROVAL_REQUIRED
    assert re.fullmatch(r"plan:[0-9a-f]{32}", asked.data["plan_ref"])
    assert asked.data["uri"] == f"shoal://plan/{asked.data['plan_ref']}"
    assert {"kind": "fs_read", "target": "/etc/hostname"} in asked.data["effects"]
    stored = a.call("plan.get", {"plan_ref": asked.data["plan_ref"]})
    assert stored["state"] == "pending" and stored["src"] == "cat /etc/hostname"
    # In-grant commands simply run.
    assert (
        a.call("exec", {"src": f"echo ok > {env.work}/v.txt && cat {env.work}/v.txt"}, timeout=30)[
            "render"
        ].strip()
        == "ok"
    )

    c = env.agent("c", "verdict")
    denied = rpc_error(c, "exec", {"src": f"cat {env.work}/v.txt"})
    assert denied.code == DENIED and denied.data["effects"]
    assert "plan_ref" not in denied.data
    assert code(c, "exec", {"src": "echo $(true)"}) == DENIED  # opaque = deny
    assert c.call("exec", {"src": "echo fine"}, timeout=30)["render"].strip() == "fine"

    ghost = env.agent("ghost", "verdict")  # a principal with no policy table
    for src in ("echo hi", "true", ""):
        assert code(ghost, "exec", {"src": src}) == DENIED, src
    assert ghost.call("exec", {"src": "true", "mode": "plan"}, timeout=30)["verdict"] == "deny"
    assert code(ghost, "pty.open", {"cmd": "true"}) == DENIED
    assert ghost.call("journal.query")["rows"] == [
        r for r in ghost.call("journal.query")["rows"] if r["principal"] == "agent:ghost"
    ]


def test_pty_env_is_gated_like_exec_env(env: Env) -> None:
    """Hole: pty.open's env param setting LD_PRELOAD/PATH etc. outside the env_write grants."""
    a = env.agent("a", "ptyenv")
    for variables in (
        {"LD_PRELOAD": "/nonexistent/evil.so"},
        {"PATH": str(env.work)},
        {"BASH_ENV": "/x"},
    ):
        err = rpc_error(a, "pty.open", {"cmd": "cat", "env": variables})
        assert err.code == APPROVAL_REQUIRED, variables
        assert {"kind": "env_write", "target": next(iter(variables))} in err.data["effects"]
    bad = rpc_error(a, "pty.open", {"cmd": "cat", "env": {"X;rm -rf /": "1"}})
    assert bad.code == INVALID_PARAMS
    assert a.call("pty.list")["ptys"] == []


def test_quotas_are_per_principal(env: Env) -> None:
    """Hole: resource quotas bypassed through timed-out foreground execs, extra sessions
    or extra connections."""
    q = env.agent("q", "quota-1")
    q_other = env.agent("q", "quota-2")
    tasks = [
        q.call("exec", {"src": "sleep 30", "background": True}, timeout=30)["task"]
        for _ in range(2)
    ]
    try:
        assert code(q, "exec", {"src": "sleep 30", "background": True}) == QUOTA
        assert code(q_other, "exec", {"src": "sleep 30", "background": True}) == QUOTA
        assert (
            code(q, "exec", {"src": "sleep 30", "timeout_ms": 0}) == QUOTA
        )  # would detach and keep running
        planned = q.call("exec", {"src": "sleep 31", "mode": "plan"}, timeout=30)["plan_ref"]
        assert code(q, "plan.apply", {"plan_ref": planned, "background": True}) == QUOTA
        assert (
            q.call("plan.get", {"plan_ref": planned})["state"] == "pending"
        )  # refused, not used up
        assert len([t for t in q.call("task.list")["tasks"] if t["state"] == "running"]) == 2
    finally:
        for t in tasks:
            q.call("task.cancel", {"task": t})
    for t in tasks:
        assert q.call("task.await", {"task": t, "timeout_ms": 20000}, timeout=30)["done"] is True
    # Under the quota a timed-out foreground exec becomes a listed task, and counts.
    again = q.call("exec", {"src": "sleep 30", "background": True}, timeout=30)["task"]
    detached = q.call("exec", {"src": "sleep 30", "timeout_ms": 0}, timeout=30)
    assert detached["timed_out"] is True
    assert code(q, "exec", {"src": "sleep 30", "background": True}) == QUOTA
    for t in (again, detached["task"]):
        q.call("task.cancel", {"task": t})
        assert q.call("task.await", {"task": t, "timeout_ms": 20000}, timeout=30)["done"] is True

    pty = q.call("pty.open", {"cmd": "cat"}, timeout=30)["pty_id"]
    try:
        assert code(q, "pty.open", {"cmd": "cat"}) == QUOTA
        assert code(q_other, "pty.open", {"cmd": "cat"}) == QUOTA
    finally:
        q.call("pty.close", {"pty_id": pty}, timeout=30)
    pty = q_other.call("pty.open", {"cmd": "cat"}, timeout=30)["pty_id"]
    q_other.call("pty.close", {"pty_id": pty}, timeout=30)

    subs = [q.call("events.subscribe", {"channel": f"user.q{i}"})["subscription"] for i in range(2)]
    assert code(q, "events.subscribe", {"channel": "user.q2"}) == QUOTA
    assert code(q_other, "events.subscribe", {"channel": "user.q2"}) == QUOTA
    q.call("events.unsubscribe", {"subscription": subs[0]})
    q_other.call("events.subscribe", {"channel": "user.q2"})
    assert code(q, "events.subscribe", {"channel": "user.q3"}) == QUOTA
    q.close()  # a closed connection gives its subscriptions back
    q3 = env.agent("q", "quota-3")
    wait_until(lambda: _subscribes(q3, "user.q4"))


def _subscribes(client: KernelClient, channel: str) -> bool:
    try:
        client.call("events.subscribe", {"channel": channel})
        return True
    except RpcError as exc:
        assert exc.code == QUOTA
        return False


def test_concurrent_background_execs_respect_the_task_quota(env: Env) -> None:
    """Hole: the quota check and the spawn racing, so parallel calls overshoot max_tasks."""
    q = env.agent("q", "quota-race")
    calls = [q.start_call("exec", {"src": "sleep 30", "background": True}) for _ in range(8)]
    started, refused = [], 0
    for _, fut in calls:
        try:
            started.append(fut.result(30)["task"])
        except RpcError as exc:
            assert exc.code == QUOTA
            refused += 1
    try:
        assert len(started) <= 2 and refused >= 6
    finally:
        for t in started:
            q.call("task.cancel", {"task": t})
        for t in started:
            assert (
                q.call("task.await", {"task": t, "timeout_ms": 20000}, timeout=30)["done"] is True
            )


def test_concurrent_pty_opens_respect_the_pty_quota(env: Env) -> None:
    """Hole: parallel pty.open calls racing past max_ptys (1), now that no lock is held
    across the spawn (access/guard.py ``reserved``)."""
    q = env.agent("r", "pty-race")
    calls = [q.start_call("pty.open", {"cmd": "cat"}) for _ in range(6)]
    opened, refused = [], 0
    for _, fut in calls:
        try:
            opened.append(fut.result(30)["pty_id"])
        except RpcError as exc:
            assert exc.code == QUOTA and exc.data["quota"] == "max_ptys", exc
            refused += 1
    try:
        assert len(opened) == 1 and refused == 5
    finally:
        for pty_id in opened:
            q.call("pty.close", {"pty_id": pty_id}, timeout=30)
    # The slots were all given back: one more opens.
    again = q.call("pty.open", {"cmd": "cat"}, timeout=30)["pty_id"]
    q.call("pty.close", {"pty_id": again}, timeout=30)


def test_concurrent_subscribes_respect_the_subscription_quota(env: Env) -> None:
    """Hole: parallel events.subscribe calls on several connections racing past
    max_subscriptions (2 per principal, all connections together)."""
    clients = [env.agent("r", f"sub-race-{i}") for i in range(3)]
    calls = [
        c.start_call("events.subscribe", {"channel": f"user.race{i}.{j}"})
        for i, c in enumerate(clients)
        for j in range(2)
    ]
    made, refused = 0, 0
    for _, fut in calls:
        try:
            fut.result(30)
            made += 1
        except RpcError as exc:
            assert exc.code == QUOTA, exc
            refused += 1
    assert (made, refused) == (2, 4)


def test_env_values_only_per_env_read(env: Env) -> None:
    """Hole: session.env disclosing every value to every principal."""
    a = env.agent("a", "envs")
    seen = a.call("session.env")
    assert {"SHOAL_T_VISIBLE", "SHOAL_T_SECRET"} <= set(seen["names"])
    assert seen["values"] == {"SHOAL_T_VISIBLE": "visible-value"}
    assert "secret-value" not in str(seen)
    ghost = env.agent("ghost", "envs")
    assert ghost.call("session.env")["values"] == {}
    human = env.human("envs")
    values = human.call("session.env")["values"]
    assert (
        values["SHOAL_T_SECRET"] == "secret-value" and values["SHOAL_T_VISIBLE"] == "visible-value"
    )
    # Reading it through exec is gated by the same grant.
    assert code(a, "exec", {"src": "echo $SHOAL_T_SECRET"}) == APPROVAL_REQUIRED
    assert (
        a.call("exec", {"src": "echo $SHOAL_T_VISIBLE"}, timeout=30)["render"].strip()
        == "visible-value"
    )


def test_attach_reports_the_principals_caps(env: Env) -> None:
    """Hole: agents told they were approvers, or a sandbox claimed that is not there."""
    c = KernelClient(env.kernel.socket)
    try:
        got = c.call("session.attach", {"session": "caps", "token": env.tokens["agent:a"]})
        assert got["principal"] == "agent:a"
        # The agent's processes are confined exactly when this machine enforces the sandbox.
        assert got["caps"]["enforced"] == expected_enforced()  # the network: the proxy's
        assert got["caps"]["approver"] is False
        assert got["caps"]["journal_read"] == "own"
        human = c.call("session.attach", {"session": "caps"})
        assert human["principal"].startswith("uid:") and human["caps"]["approver"] is True
        assert human["caps"]["enforced"] is False  # the local human is not sandboxed by default
    finally:
        c.close()


def test_many_agents_hammering_do_not_cross_wires(env: Env) -> None:
    """Hole: shared-state races letting one principal's value land in another's view."""
    errors: list[BaseException] = []

    def run(name: str) -> None:
        try:
            c = env.agent(name, "hammer")
            for i in range(5):
                got = c.call("exec", {"src": f"echo {name}-{i}", "position": "value"}, timeout=30)
                assert got["value"]["out"]["v"] == f"{name}-{i}\n"
                assert (
                    c.call("value.get", {"ref": got["ref"], "path": ".out"})["value"]["v"]
                    == f"{name}-{i}\n"
                )
            rows = c.call("journal.query", {"session": "hammer", "limit": 1000})["rows"]
            assert {r["principal"] for r in rows} == {f"agent:{name}"}
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
