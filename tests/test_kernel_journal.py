"""The journal over a live kernel (docs/protocol.md, Kernel methods): one row per exec
with the documented fields, and every filter applied in SQL before ``limit``."""

from __future__ import annotations

import sqlite3

import pytest

from shoal_mcp.kernel.config.limits import DB_WRITE_WAIT_S
from shoal_mcp.protocol.errors import ErrorCode, RpcError
from shoal_mcp.tokens import TokenStore
from tests.support.kernel import KernelProcess, close_client, running_kernel
from tests.support.polling import wait_until
from tests.support.results import call_err

AGENT = "agent:journal"
POLICY = f"""
[principal."{AGENT}"]
proc_spawn = ["seq", "true", "false"]
journal_read = "own"
"""


@pytest.fixture(scope="module")
def jk(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("journal")
    policy = tmp / "policy.toml"
    policy.write_text(POLICY)
    k = KernelProcess(tmp, "--policy", str(policy))
    k.state.mkdir(mode=0o700)
    _, bearer = TokenStore(k.state / "tokens.json").create(AGENT, label="journal tests")
    k.start()
    human = k.client("j-main")
    agent = k.client("j-agent", token=bearer)
    try:
        yield k, human, agent
    finally:
        close_client(human)
        close_client(agent)
        k.stop()


def q(c, **params) -> list[dict]:
    reply = c.call("journal.query", params, timeout=30)
    assert reply["count"] == len(reply["rows"])
    return reply["rows"]


@pytest.fixture(scope="module")
def matrix(jk):
    """30 execs in session j-main: i%3==0 → seq (ok), 1 → echo to a file, 2 → false."""
    k, human, _ = jk
    target = k.tmp / "journal-writes.txt"
    refs = []
    for i in range(1, 31):
        if i % 3 == 0:
            src = f"seq 1 {i}"
        elif i % 3 == 1:
            src = f"echo {i} > '{target}'"
        else:
            src = "false"
        refs.append(human.call("exec", {"src": src, "position": "value"}, timeout=30)["ref"])
    return refs


@pytest.fixture(scope="module")
def matrix_rows(jk, matrix):
    _, human, _ = jk
    rows = q(human, session="j-main", limit=1000)
    by_ref = {r["ref"]: r for r in rows if r.get("ref") in matrix}
    ordered = [by_ref[ref] for ref in matrix]  # oldest first
    return ordered


def test_row_fields(jk, matrix_rows):
    k, _, _ = jk
    row = matrix_rows[2]  # "seq 1 3"
    for key in (
        "id",
        "ts",
        "duration_ms",
        "session",
        "principal",
        "cwd",
        "src",
        "head",
        "kind",
        "effects",
        "status",
        "ok",
        "ref",
        "outputs",
    ):
        assert key in row, key
    assert row["src"] == "seq 1 3" and row["head"] == "seq" and row["kind"] == "exec"
    assert row["session"] == "j-main" and row["principal"].startswith("uid:")
    assert row["status"] == 0 and row["ok"] is True
    assert row["duration_ms"] >= 0
    assert {"kind": "proc_spawn", "target": "seq"} in [
        {"kind": e["kind"], "target": e.get("target")} for e in row["effects"]
    ]
    kinds = sorted(o["kind"] for o in row["outputs"])
    assert kinds == ["err", "out"]
    out = next(o for o in row["outputs"] if o["kind"] == "out")
    assert out["len"] == len("1\n2\n3\n") and len(out["hash"]) == 64
    assert (k.state / "cas" / out["hash"][:2] / out["hash"]).exists()
    failed = matrix_rows[1]
    assert failed["src"] == "false" and failed["ok"] is False and failed["status"] == 1
    ids = [r["id"] for r in matrix_rows]
    assert ids == sorted(ids) and len(set(ids)) == 30


def test_every_exec_has_a_row(matrix, matrix_rows):
    assert [r["ref"] for r in matrix_rows] == matrix


def test_until_and_limit(jk, matrix_rows):
    _, human, _ = jk
    until = matrix_rows[19]["ts"]  # the 20th
    assert matrix_rows[20]["ts"] > until
    since = matrix_rows[0]["ts"]
    rows = q(human, since=since, until=until, limit=5)
    assert len(rows) == 5
    assert all(r["ts"] <= until for r in rows)
    assert [r["id"] for r in rows] == [
        r["id"] for r in reversed(matrix_rows[15:20])
    ]  # newest first
    rows = q(human, since=since, until=until, limit=100)
    assert len(rows) == 20
    assert [r["id"] for r in rows] == [r["id"] for r in reversed(matrix_rows[:20])]


def test_since_is_inclusive_and_newest_first(jk, matrix_rows):
    _, human, _ = jk
    rows = q(human, session="j-main", since=matrix_rows[24]["ts"], until=matrix_rows[29]["ts"])
    assert [r["id"] for r in rows] == [r["id"] for r in reversed(matrix_rows[24:])]


def test_head_filter(jk, matrix_rows):
    _, human, _ = jk
    window = {"since": matrix_rows[0]["ts"], "until": matrix_rows[-1]["ts"], "limit": 100}
    seq_rows = q(human, head="seq", **window)
    assert len(seq_rows) == 10 and all(r["src"].startswith("seq ") for r in seq_rows)
    assert len(q(human, head="echo", **window)) == 10
    assert len(q(human, head="false", **window)) == 10
    assert q(human, head="nothing-like-this", **window) == []


def test_ok_filter(jk, matrix_rows):
    _, human, _ = jk
    window = {"since": matrix_rows[0]["ts"], "until": matrix_rows[-1]["ts"], "limit": 100}
    bad = q(human, ok=False, **window)
    assert len(bad) == 10 and all(r["src"] == "false" and r["ok"] is False for r in bad)
    good = q(human, ok=True, **window)
    assert len(good) == 20 and all(r["ok"] is True for r in good)
    # limit applies after the filter
    assert [
        r["id"] for r in q(human, ok=False, since=window["since"], until=window["until"], limit=3)
    ] == [r["id"] for r in reversed([m for m in matrix_rows if m["src"] == "false"][-3:])]


def test_effects_filter(jk, matrix_rows):
    _, human, _ = jk
    window = {"since": matrix_rows[0]["ts"], "until": matrix_rows[-1]["ts"], "limit": 100}
    writes = q(human, effects=["fs_write"], **window)
    assert len(writes) == 10 and all(r["head"] == "echo" for r in writes)
    both = q(
        human, effects=["proc_spawn", "fs_write"], **window
    )  # every kind listed must be present
    assert [r["id"] for r in both] == [r["id"] for r in writes]
    assert len(q(human, effects=["proc_spawn"], **window)) == 30
    assert q(human, effects=["net_connect"], **window) == []
    assert q(human, effects=["fs_write"], head="seq", **window) == []


def test_session_and_principal_filters(jk, matrix_rows):
    k, human, agent = jk
    a1 = agent.call("exec", {"src": "seq 1 2"}, timeout=30)
    agent.call("exec", {"src": "true"}, timeout=30)
    me = human.call("session.attach", {"session": "j-main"}, timeout=10)["principal"]
    agent_rows = q(human, principal=AGENT)
    assert [r["src"] for r in agent_rows] == ["true", "seq 1 2"]
    assert all(r["session"] == "j-agent" and r["principal"] == AGENT for r in agent_rows)
    assert agent_rows[1]["ref"] == a1["ref"]
    assert [r["id"] for r in q(human, session="j-agent")] == [r["id"] for r in agent_rows]
    assert all(r["principal"] == me for r in q(human, session="j-main", limit=1000))
    assert (
        len(
            q(
                human,
                principal=me,
                since=matrix_rows[0]["ts"],
                until=matrix_rows[-1]["ts"],
                limit=100,
            )
        )
        == 30
    )
    # journal_read = "own": the agent sees only its rows, whatever it asks for
    assert [r["id"] for r in q(agent)] == [r["id"] for r in agent_rows]
    assert q(agent, principal=me) == []
    assert q(agent, session="j-main") == []
    # the journal event channel is only for journal_read = all
    err = call_err(agent, "events.read", {"channel": "journal"})
    assert err.code == ErrorCode.DENIED
    # blobs of other principals' rows are not readable by the agent
    digest = next(o["hash"] for o in matrix_rows[2]["outputs"] if o["kind"] == "out")
    err = call_err(agent, "blob.get", {"hash": digest})
    assert err.code == ErrorCode.UNKNOWN_REF
    own_digest = next(o["hash"] for o in agent_rows[1]["outputs"] if o["kind"] == "out")
    assert agent.call("blob.get", {"hash": own_digest}, timeout=10)["total"] == 4


def test_denied_exec_is_refused(jk):
    _, _, agent = jk
    err = call_err(agent, "exec", {"src": "rm -rf /tmp/should-never-run"})
    assert err.code in (ErrorCode.DENIED, ErrorCode.APPROVAL_REQUIRED)


def test_plan_rows(jk):
    _, human, _ = jk
    plan = human.call("exec", {"src": "seq 1 9 > /dev/null", "mode": "plan"}, timeout=30)
    rows = q(human, session="j-main", limit=1)
    assert rows[0]["kind"] == "plan" and rows[0]["src"] == "seq 1 9 > /dev/null"
    assert rows[0]["ref"] == plan["plan_ref"]
    assert "status" not in rows[0] and rows[0]["outputs"] == []


def test_limit_defaults_and_bounds(jk, matrix_rows):
    _, human, _ = jk
    for _ in range(25):  # j-main now holds more than 50 rows
        human.call("exec", {"src": "true"}, timeout=30)
    total = len(q(human, session="j-main", limit=1000))
    assert total > 50
    assert len(q(human, session="j-main")) == 50
    err = call_err(human, "journal.query", {"limit": 1001})
    assert err.code == ErrorCode.INVALID_PARAMS and err.data["field"] == "limit"
    err = call_err(human, "journal.query", {"limit": 0})
    assert err.code == ErrorCode.INVALID_PARAMS
    err = call_err(human, "journal.query", {"ok": "yes"})
    assert err.code == ErrorCode.INVALID_PARAMS and err.data["field"] == "ok"
    assert q(human, session="j-main", limit=1)[0]["id"] == max(
        r["id"] for r in q(human, session="j-main")
    )


def test_policy_refusals_are_journaled(tmp_path):
    """An exec that policy denies or holds for approval still leaves a row (not ok)."""
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[principal."agent:j"]\nproc_spawn = ["echo"]\nungranted = "ask"\n'
        '[principal."agent:d"]\nproc_spawn = ["echo"]\n'
    )
    k = KernelProcess(tmp_path, "--policy", str(policy))
    _, ask_token = TokenStore(k.state / "tokens.json").create("agent:j")
    _, deny_token = TokenStore(k.state / "tokens.json").create("agent:d")
    k.start()
    try:
        asker, denied = k.client("j", token=ask_token), k.client("d", token=deny_token)
        for client in (asker, denied):
            try:
                client.call("exec", {"src": "rm -rf /tmp/journal-refusal-probe"}, timeout=30)
            except Exception as exc:  # noqa: BLE001 - the refusal itself is the point
                assert getattr(exc, "code", None) in (-32010, -32011)
            else:
                raise AssertionError("policy should have refused")
        held = asker.call("journal.query", {}, timeout=30)["rows"]
        refused = denied.call("journal.query", {}, timeout=30)["rows"]
        assert [(r["kind"], r["ok"]) for r in held] == [("approval_required", False)]
        assert held[0]["ref"].startswith("plan:")
        assert [(r["kind"], r["ok"]) for r in refused] == [("denied", False)]
        assert any(e["kind"] == "fs_delete" for e in refused[0]["effects"])
    finally:
        k.stop()


def test_a_database_locked_by_another_process_fails_the_exec_clearly_with_a_row():
    """Issue 31: SQLite locked by another process past the write wait gave "internal
    error … database is locked" and no journal row."""
    with running_kernel(prefix="shjl-") as k:
        c = k.client("locked")
        try:
            c.call("exec", {"src": "echo warm"}, timeout=60)
            other = sqlite3.connect(k.state / "journal.sqlite3", isolation_level=None)
            other.execute("BEGIN EXCLUSIVE")  # another process's write lock, held
            try:
                with pytest.raises(RpcError) as err:
                    c.call("exec", {"src": "echo while-locked"}, timeout=DB_WRITE_WAIT_S + 60)
            finally:
                other.execute("ROLLBACK")
                other.close()
            assert err.value.code == ErrorCode.INTERNAL
            assert "state database locked" in err.value.message
            assert "internal error" not in err.value.message
            assert err.value.data["reason"] == "locked" and "hint" in err.value.data

            def row() -> dict | None:
                rows = c.call("journal.query", {"limit": 5}, timeout=60)["rows"]
                return next((r for r in rows if r["src"] == "echo while-locked"), None)

            found = wait_until(row, 60, what="the refused exec's journal row")
            assert found["state"] == "failed" and found["ok"] is False
            assert "state database locked" in found["error"]
        finally:
            close_client(c)
