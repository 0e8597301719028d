"""Session state and stored data integrity, live (issue 19 items 1, 2, 6, 7; issue 13
"state reports are untrusted"). See docs/decisions.md, Session state.
"""

from __future__ import annotations

import base64
import os
import sqlite3
import threading

import pytest

from shoal_mcp.protocol.errors import ErrorCode
from tests.support.kernel import close_client
from tests.support.polling import wait_until
from tests.support.results import call_err, out_text


@pytest.fixture
def session(kernel, request):
    c = kernel.client(f"state-{request.node.name}"[:120].replace("[", "-").replace("]", ""))
    yield c
    close_client(c)


def run(c, src: str, **params) -> dict:
    return c.call("exec", {"src": src, **params}, timeout=60)


def wire_bytes(node) -> bytes:
    """A wire string or bytes node as the exact bytes it stands for."""
    if isinstance(node, str):
        return node.encode()
    assert node["$"] == "bytes", node
    return base64.b64decode(node["v"])


@pytest.fixture
def odd_dir():
    path = b"/tmp/shoal-x\xff-" + str(os.getpid()).encode()
    os.mkdir(path)
    yield path
    os.rmdir(path)


# -- 19.1 bytes-clean paths and env ---------------------------------------------------------


def test_cd_into_a_non_utf8_dir_works_and_keeps_working(kernel, session, odd_dir):
    bash_path = "".join(f"\\x{b:02x}" for b in odd_dir)
    r = run(session, f"cd $'{bash_path}'")
    assert r["value"]["ok"] is True
    cwd = session.call("session.cwd", {}, timeout=10)["cwd"]
    assert wire_bytes(cwd) == odd_dir  # the documented bytes node, lossless
    # The session keeps working: the next exec runs there, a second attach works.
    run(session, "ls . ./x 2>/dev/null; cat ./nothing 2>/dev/null; true")  # path effects
    pwd = run(session, "pwd | od -An -tx1 | tr -d ' \\n'")
    assert bytes.fromhex(out_text(pwd)) == odd_dir + b"\n"
    again = kernel.client(session.call("session.cwd", {}, timeout=10)["session"])
    try:
        assert wire_bytes(again.call("session.cwd", {}, timeout=10)["cwd"]) == odd_dir
    finally:
        close_client(again)
    name = session.call("session.cwd", {}, timeout=10)["session"]
    rows = session.call("journal.query", {"session": name, "limit": 5}, timeout=10)
    mine = [r for r in rows["rows"] if r.get("src", "").startswith("pwd")]
    assert mine and wire_bytes(mine[0]["cwd"]) == odd_dir
    run(session, "cd /")


def test_export_of_a_non_utf8_value_survives_attach_and_env(kernel, session):
    run(session, "export SHOAL_T_BAD=$'a\\xffb'")
    name = session.call("session.cwd", {}, timeout=10)["session"]
    other = kernel.client(name)  # attach used to fail for every client of this session
    try:
        env = other.call("session.env", {}, timeout=10)
        assert "SHOAL_T_BAD" in env["names"]
        assert wire_bytes(env["values"]["SHOAL_T_BAD"]) == b"a\xffb"
        r = run(other, 'printf %s "$SHOAL_T_BAD" | od -An -tx1 | tr -d " \\n"')
        assert out_text(r) == "61ff62"
    finally:
        close_client(other)


def test_a_failed_finalize_changes_nothing_and_the_journal_says_so(kernel, session):
    name = session.call("session.cwd", {}, timeout=10)["session"]
    first = run(session, "true")
    n = int(first["ref"].split(":")[1])
    # Occupy the next transcript slot behind the kernel's back: the exec's one
    # finalize transaction then fails on its INSERT, after staging the session delta.
    db = sqlite3.connect(kernel.state / "journal.sqlite3", timeout=30)
    try:
        db.execute(
            "INSERT INTO transcript(session, n, principal, ts, value) VALUES (?,?,?,?,?)",
            (name, n + 1, "test", 0.0, "{}"),
        )
        db.commit()
    finally:
        db.close()
    before = session.call("session.cwd", {}, timeout=10)["cwd"]
    err = call_err(session, "exec", {"src": "cd / && export SHOAL_T_LOST=1"})
    assert err.code == ErrorCode.INTERNAL and "finalize failed" in err.message
    assert session.call("session.cwd", {}, timeout=10)["cwd"] == before
    env = session.call("session.env", {}, timeout=10)
    assert "SHOAL_T_LOST" not in env["names"]
    rows = session.call("journal.query", {"session": name, "limit": 1}, timeout=10)["rows"]
    assert rows[0]["src"].startswith("cd / &&")
    assert rows[0]["state"] == "failed" and rows[0]["ok"] is False
    assert "finalize failed" in rows[0]["error"]
    # The session goes on; the ref that failed is not handed out again.
    after = run(session, "echo fine")
    assert int(after["ref"].split(":")[1]) > n + 1


# -- 19.2 deltas ---------------------------------------------------------------------------


def test_a_concurrent_exec_does_not_undo_cd_and_export(kernel, session, tmp_path):
    name = session.call("session.cwd", {}, timeout=10)["session"]
    slow_client = kernel.client(name)
    results: dict = {}

    def slow() -> None:
        results["slow"] = run(slow_client, "sleep 1.0731")

    try:
        t = threading.Thread(target=slow)
        t.start()
        wait_until(
            lambda: any(
                "sleep 1.0731" in r.get("src", "")
                for r in session.call("journal.query", {"session": name, "limit": 3}, timeout=10)[
                    "rows"
                ]
            ),
            10,
            what="the slow exec's running row",
        )
        run(session, f"cd '{tmp_path}' && export SHOAL_T_MARK=set")
        t.join(30)
    finally:
        close_client(slow_client)
    assert results["slow"]["value"]["ok"] is True
    assert session.call("session.cwd", {}, timeout=10)["cwd"] == str(tmp_path)
    env = session.call("session.env", {}, timeout=10)
    assert "SHOAL_T_MARK" in env["names"]


def test_two_execs_changing_the_same_variable_last_to_finish_wins(kernel, session):
    name = session.call("session.cwd", {}, timeout=10)["session"]
    other = kernel.client(name)
    try:
        slow = threading.Thread(target=lambda: run(other, "export SHOAL_T_SAME=slow; sleep 1.0732"))
        slow.start()
        wait_until(
            lambda: any(
                "1.0732" in r.get("src", "")
                for r in session.call("journal.query", {"session": name, "limit": 3}, timeout=10)[
                    "rows"
                ]
            ),
            10,
            what="the slow exec's running row",
        )
        run(session, "export SHOAL_T_SAME=fast SHOAL_T_ONLY_FAST=1")
        slow.join(30)
        got = run(session, 'echo "$SHOAL_T_SAME $SHOAL_T_ONLY_FAST"')
        assert out_text(got) == "slow 1\n"
    finally:
        close_client(other)


def test_unset_applies_as_a_delta(session):
    run(session, "export SHOAL_T_GONE=1")
    run(session, "unset SHOAL_T_GONE")
    assert "SHOAL_T_GONE" not in session.call("session.env", {}, timeout=10)["names"]


# -- 19.7 vanished directories ---------------------------------------------------------------


def test_deleted_spool_dir_is_recreated(kernel, session):
    import shutil

    shutil.rmtree(kernel.state / "spool")
    assert out_text(run(session, "echo back")) == "back\n"
    assert (kernel.state / "spool").is_dir()


def test_deleted_cas_dir_is_recreated(kernel, session):
    import shutil

    shutil.rmtree(kernel.state / "cas")
    assert out_text(run(session, "echo cas-back-7")) == "cas-back-7\n"


def test_a_vanished_cwd_falls_back_to_home_with_a_warning(session, tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    run(session, f"cd '{gone}'")
    gone.rmdir()
    r = run(session, "pwd")
    home = session.call("session.env", {}, timeout=10)
    assert out_text(r).strip() == session.call("session.cwd", {}, timeout=10)["cwd"]
    assert home  # attach/env still answer
    warnings = r["value"].get("warnings")
    assert warnings and "no longer exists" in str(warnings)
    assert "warnings" not in run(session, "true")["value"]  # said once
    assert out_text(run(session, "cd / && pwd")) == "/\n"


def test_parallel_execs_each_keep_their_own_export(kernel, session):
    name = session.call("session.cwd", {}, timeout=10)["session"]
    clients = [kernel.client(name) for _ in range(6)]
    try:
        threads = [
            threading.Thread(target=run, args=(c, f"export SHOAL_T_PAR_{i}={i}; sleep 0.{i}"))
            for i, c in enumerate(clients)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        for c in clients:
            close_client(c)
    env = session.call("session.env", {}, timeout=10)["names"]
    assert {f"SHOAL_T_PAR_{i}" for i in range(6)} <= set(env)


def test_env_names_bash_cannot_list_are_not_dropped_or_refused(kernel_factory):
    # A kernel whose environment holds a name that is not an identifier: bash hands it to
    # children but never reports it, which is not an unset.
    k = kernel_factory(start=False)
    k.env["SHOAL_T_ODD-NAME"] = "kept"
    k.start()
    c = k.client("odd")
    try:
        first = run(c, "true")
        assert "env_refused" not in first["value"]
        assert "SHOAL_T_ODD-NAME" in c.call("session.env", {}, timeout=10)["names"]
        got = run(c, "env | grep -c '^SHOAL_T_ODD-NAME=kept$'")
        assert out_text(got) == "1\n"
    finally:
        close_client(c)
