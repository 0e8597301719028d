"""``exec`` against a live kernel: persistence, isolation, outcomes, errors.

See docs/protocol.md, Kernel methods, and docs/decisions.md, Exec.
"""

from __future__ import annotations

import base64
import os
import signal
import time

import pytest

from shoal_mcp.protocol.errors import ErrorCode
from tests.support.kernel import close_client
from tests.support.polling import wait_until
from tests.support.results import call_err, out_text


@pytest.fixture
def session(kernel, request):
    c = kernel.client(f"exec-{request.node.name}"[:120].replace("[", "-").replace("]", ""))
    yield c
    close_client(c)


def run(c, src: str, **params) -> dict:
    return c.call("exec", {"src": src, **params}, timeout=60)


def test_result_shape_and_outcome_fields(session, kernel):
    r = run(session, "echo hello; echo warn >&2")
    assert set(r) >= {"ref", "uri", "value", "render", "elapsed_ms"}
    assert r["ref"].startswith("out:")
    assert r["uri"] == "shoal://out/" + r["ref"].split(":")[1]
    v = r["value"]
    assert v["$"] == "outcome"
    assert v["status"] == 0 and v["ok"] is True
    assert "signal" not in v
    assert v["out"] == {"$": "str", "v": "hello\n"}
    assert v["err"] == {"$": "str", "v": "warn\n"}
    assert isinstance(v["dur_ns"], int) and v["dur_ns"] > 0
    assert isinstance(v["pid"], int) and v["pid"] > 0 and v["pid"] != kernel.pid
    assert v["cmd"] == {"$": "str", "v": "echo hello; echo warn >&2"}
    assert os.path.isabs(v["cwd"])
    assert r["render"] == "hello\n"
    assert r["elapsed_ms"] >= 0


def test_cd_and_export_persist_shell_variables_do_not(session, tmp_path):
    target = tmp_path / "dir with space"
    target.mkdir()
    run(
        session,
        f"cd '{target}' && export SHOAL_T_EXPORTED=yes; SHOAL_T_SHELLVAR=no; f() {{ echo fn; }}",
    )
    assert session.call("session.cwd", {}, timeout=10)["cwd"] == str(target)
    r = run(
        session,
        'pwd; echo "e=$SHOAL_T_EXPORTED s=${SHOAL_T_SHELLVAR-unset}"; type f >/dev/null 2>&1 || echo nofunc',
    )
    assert out_text(r) == f"{target}\ne=yes s=unset\nnofunc\n"
    assert r["value"]["cwd"] == str(target)
    env = session.call("session.env", {}, timeout=10)
    assert "SHOAL_T_EXPORTED" in env["names"]
    assert "SHOAL_T_SHELLVAR" not in env["names"]
    # unset of an exported variable persists too
    run(session, "unset SHOAL_T_EXPORTED")
    assert out_text(run(session, 'echo "${SHOAL_T_EXPORTED-gone}"')) == "gone\n"


def test_failed_command_still_applies_cd(session, tmp_path):
    run(session, f"cd '{tmp_path}'; false", position="value")
    assert session.call("session.cwd", {}, timeout=10)["cwd"] == str(tmp_path)


def test_sessions_are_independent(kernel, tmp_path):
    a, b = kernel.client("exec-indep-a"), kernel.client("exec-indep-b")
    try:
        run(a, f"cd '{tmp_path}'; export SHOAL_T_ONLY_A=1")
        assert out_text(run(b, 'echo "${SHOAL_T_ONLY_A-no}"')) == "no\n"
        assert b.call("session.cwd", {}, timeout=10)["cwd"] != str(tmp_path)
    finally:
        close_client(a)
        close_client(b)


def test_stdin_is_dev_null(session):
    r = run(session, "cat; echo rc=$?; readlink /proc/self/fd/0", timeout_ms=20_000)
    assert out_text(r) == "rc=0\n/dev/null\n"


def test_own_process_group(session, kernel):
    r = run(session, "ps -o pgid= $$; echo $$")
    pgid, bash_pid = (int(x) for x in out_text(r).split())
    assert pgid == bash_pid == r["value"]["pid"]  # bash leads its own group
    assert pgid != os.getpgid(kernel.pid)
    sid = int(out_text(run(session, "ps -o sid= $$")).strip())
    assert sid != os.getsid(kernel.pid)


def test_stmt_failure_raises_with_data(session):
    err = call_err(session, "exec", {"src": "echo out; echo boom-1 >&2; echo boom-2 >&2; exit 3"})
    assert err.code == ErrorCode.RAISED
    data = err.data
    assert data["status"] == 3
    assert data["ref"].startswith("out:")
    assert data["uri"] == "shoal://out/" + data["ref"].split(":")[1]
    assert data["stderr_tail"].endswith("boom-1\nboom-2\n")
    # the failed outcome was stored and is addressable
    got = session.call("value.get", {"ref": data["ref"], "path": ".status"}, timeout=10)
    assert got["value"] == {"$": "int", "v": 3}


def test_stmt_is_the_default_position(session):
    err = call_err(session, "exec", {"src": "false"})
    assert err.code == ErrorCode.RAISED and err.data["status"] == 1


def test_stderr_tail_is_bounded(session):
    err = call_err(session, "exec", {"src": "seq 1 100000 >&2; exit 1"})
    tail = err.data["stderr_tail"]
    assert tail.endswith("100000\n")
    assert len(tail.encode()) <= 4096


def test_value_position_returns_failed_outcome(session):
    r = run(session, "echo partial; exit 7", position="value")
    v = r["value"]
    assert v["status"] == 7 and v["ok"] is False
    assert v["out"]["v"] == "partial\n"
    assert "[exit 7]" in r["render"]


def test_non_utf8_output_is_bytes(session):
    r = run(session, r"printf '\xff\xfeab\x80'")
    out = r["value"]["out"]
    assert out["$"] == "bytes"
    assert base64.b64decode(out["v"]) == b"\xff\xfeab\x80"
    # valid UTF-8 (non-ASCII) stays a string
    assert out_text(run(session, "printf 'h\u00e9llo \u2603\\n'")) == "h\u00e9llo \u2603\n"


def test_signal_killed_command_reports_signal(session):
    r = run(session, "kill -TERM $$", position="value")
    v = r["value"]
    assert v["signal"] == "SIGTERM"
    assert v["status"] == 128 + signal.SIGTERM
    assert v["ok"] is False
    assert "SIGTERM" in r["render"]
    err = call_err(session, "exec", {"src": "kill -KILL $$"})
    assert err.code == ErrorCode.RAISED and err.data["status"] == 137


def test_forked_daemon_does_not_hold_exec(session):
    t0 = time.monotonic()
    r = run(session, "(sleep 30 &) ; echo started")
    assert out_text(r) == "started\n"
    assert time.monotonic() - t0 < 20  # generous: the point is "not 30 s"
    pgid = r["value"]["pid"]
    # the orphaned sleep is still in the exec's process group; tidy it up
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_command_closing_stdout_early(session):
    r = run(session, "exec 1>&-; echo x >&2")
    v = r["value"]
    assert v["ok"] is True
    assert v["out"] == {"$": "str", "v": ""}
    assert v["err"] == {"$": "str", "v": "x\n"}


def test_exit_status_and_empty_output(session):
    r = run(session, "true")
    assert r["value"]["out"] == {"$": "str", "v": ""} and r["render"] == ""


def test_transcript_numbers_rise_per_session(session):
    a = int(run(session, "echo 1")["ref"].split(":")[1])
    b = int(run(session, "echo 2")["ref"].split(":")[1])
    assert b == a + 1


def test_background_returns_handle_at_once(session):
    h = run(session, "sleep 0.5; echo bg", background=True)
    assert set(h) == {"task", "uri", "events"}
    n = h["task"].split(":")[1]
    assert h["uri"] == f"shoal://task/{n}" and h["events"] == f"task.{n}"
    rec = session.call("task.await", {"task": h["task"], "timeout_ms": 20_000}, timeout=30)
    assert rec["state"] == "completed"
    got = session.call("value.get", {"ref": rec["result_ref"], "path": ".out"}, timeout=10)
    assert got["value"] == {"$": "str", "v": "bg\n"}


def test_background_does_not_change_session_cwd(session, tmp_path):
    before = session.call("session.cwd", {}, timeout=10)["cwd"]
    h = run(session, f"cd '{tmp_path}'", background=True)
    session.call("task.await", {"task": h["task"], "timeout_ms": 20_000}, timeout=30)
    wait_until(
        lambda: session.call("task.get", {"task": h["task"]}, timeout=10)["state"] == "completed"
    )
    assert session.call("session.cwd", {}, timeout=10)["cwd"] == before


def test_plan_mode_spawns_nothing(session, tmp_path):
    marker = tmp_path / "should-not-exist"
    r = run(session, f"touch '{marker}'", mode="plan")
    assert r["plan_ref"].startswith("plan:")
    assert not marker.exists()


@pytest.mark.parametrize("mode", ["run", "plan"])
def test_nul_in_src_is_invalid_params(session, mode):
    err = call_err(session, "exec", {"src": "echo a\u0000b", "mode": mode})
    assert err.code == ErrorCode.INVALID_PARAMS and err.data["field"] == "src"
