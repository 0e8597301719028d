"""The human CLI against a real kernel (autostarted by the CLI itself)."""

from __future__ import annotations

import errno
import json
import os
import pty
import random
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from shoal_mcp.kernel.access import sandbox_probe
from tests.support.facade import RawFacade
from tests.support.kernel import child_env
from tests.support.polling import wait_until
from tests.support.procfs import kill_pids, pids_with_arg
from tests.support.tmp import short_tmp

# The CLI as an interactive shell starts it: SIGINT at its default (KeyboardInterrupt).
# Ctrl-C is part of what is tested, and a test run started with SIGINT ignored (nohup,
# `cmd &` in a script) would otherwise hand SIG_IGN down to the CLI.
CLI = [
    sys.executable,
    "-c",
    "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from shoal_mcp.cli import run; run()",
]


@pytest.fixture()
def env():
    with short_tmp("shoal-cli-") as root:
        sock = root / "run" / "k.sock"
        e = child_env({"SHOAL_SOCKET": str(sock), "SHOAL_STATE_DIR": str(root / "state")})
        try:
            yield e
        finally:
            subprocess.run([*CLI, "kernel", "stop"], env=e, capture_output=True, timeout=30)
            kill_pids(pids_with_arg(str(sock)))  # a kernel that did not stop (never expected)


def _stdout_lines(proc: subprocess.Popen) -> list[str]:
    """The lines ``proc`` prints, collected by a thread as they arrive."""
    lines: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


def _json_objects(text: str) -> list[dict]:
    """The complete pretty-printed JSON objects in ``text`` (a partial last one is left)."""
    decoder = json.JSONDecoder()
    objects, pos = [], 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return objects
        objects.append(obj)


def shoal(env, *args, check=True, timeout=60):
    proc = subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"shoal {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def test_exec_autostarts_the_kernel_and_prints_render_and_ref(env):
    proc = shoal(env, "exec", "seq 1 100000")
    lines = proc.stdout.splitlines()
    assert lines[0] == "1" and lines[-1] == "100000"
    # The elision hint is the command a person types, not an MCP call.
    # Lines count from 1 in the hint as in the preview ("lines 11-99990").
    assert "lines elided" in proc.stdout and "see: shoal get out:1 --lines 11..99990" in proc.stdout
    assert "shoal get out:1 --match REGEX" in proc.stdout
    assert "shoal_get" not in proc.stdout and "{" not in proc.stdout
    assert proc.stderr == ""  # the command wrote nothing there; no footer off a terminal
    assert len(proc.stdout) < 8192
    page = shoal(env, "get", "out:1", "--lines", "11..-11").stdout.splitlines()
    assert page[0] == "11" and page[-1] == "99990" and len(page) == 99980  # every page
    # The hint's search, as a person types it: numbered matching lines and an exact total.
    found = shoal(env, "get", "out:1", "--match", "^9999[0-3]$").stdout
    assert "4 lines match" in found
    assert "99990:99990" in found.replace(" ", "") and "99993:99993" in found.replace(" ", "")
    # the socket and state dir were created privately
    assert oct(os.stat(env["SHOAL_SOCKET"]).st_mode & 0o777) == "0o600"
    assert oct(os.stat(env["SHOAL_STATE_DIR"]).st_mode & 0o777) == "0o700"


def test_get_with_path_and_formats(env):
    shoal(env, "exec", "seq 1 1000")
    assert shoal(env, "get", "out:1", "--path", ".out.lines[-3..]").stdout.split() == [
        "998",
        "999",
        "1000",
    ]
    assert shoal(env, "get", "out:1", "--lines", "-3..").stdout.split() == ["998", "999", "1000"]
    # Plain JSON for people; the tagged wire form only when asked for.
    plain = shoal(env, "get", "out:1", "--path", ".out.lines[0..2]", "--format", "json")
    assert json.loads(plain.stdout) == ["1", "2"]
    wire = shoal(env, "get", "out:1", "--path", ".out.lines[0]", "--format", "json", "--wire")
    assert json.loads(wire.stdout) == {"$": "str", "v": "1"}
    one_page = shoal(env, "get", "out:1", "--path", ".out", "--format", "raw")
    assert one_page.stdout == "".join(f"{i}\n" for i in range(1, 1001))  # 3893 bytes: one page
    raw = shoal(
        env, "get", "out:1", "--path", ".out", "--format", "raw", "--offset", "0", "--length", "4"
    )
    assert raw.stdout == "1\n2\n"
    bad = shoal(env, "get", "out:99", check=False)
    assert bad.returncode == 2 and "-32004" in bad.stderr


def test_raw_length_pages_through_the_kernel(env):
    shoal(env, "exec", "seq 1 100000")  # 588,895 bytes, a dozen kernel pages
    expected = "".join(f"{i}\n" for i in range(1, 100001))
    whole = shoal(env, "get", "out:1", "--path", ".out", "--format", "raw", "--length", "100000000")
    assert whole.stdout == expected
    part = shoal(env, "get", "out:1", "--path", ".out", "--format", "raw", "--offset", "10")
    assert part.stdout == expected[10:]  # raw writes to the end unless --length bounds it
    bounded = shoal(env, "get", "out:1", "--format", "raw", "--offset", "10", "--length", "5")
    assert bounded.stdout == expected[10:15]


def test_plain_json_of_parsed_output(env):
    shoal(env, "exec", """echo '{"a": {"b": [1, 2, {"c": null}], "s": "x"}}'""")
    got = shoal(env, "get", "out:1", "--path", ".out.json.a.b", "--format", "json").stdout
    assert json.loads(got) == [1, 2, {"c": None}]
    whole = json.loads(shoal(env, "get", "out:1", "--format", "json").stdout)
    assert whole["out"] == '{"a": {"b": [1, 2, {"c": null}], "s": "x"}}\n' and whole["ok"] is True
    assert "$" not in json.dumps(whole)
    # The default render of a record is plain JSON too, not the tagged wire form (#31).
    rendered = shoal(env, "get", "out:1", "--path", ".out.json.a").stdout
    assert json.loads(rendered) == {"b": [1, 2, {"c": None}], "s": "x"}


def test_exec_streams_and_status_like_the_command(env):
    proc = shoal(env, "exec", "echo to-out; echo to-err >&2; exit 3", check=False)
    assert proc.returncode == 3
    assert proc.stdout == "to-out\n" and proc.stderr == "to-err\n"
    assert "[exit" not in proc.stdout
    assert shoal(env, "exec", "kill -TERM $$", check=False).returncode == 128 + signal.SIGTERM
    assert shoal(env, "exec", "kill -KILL $$", check=False).returncode == 128 + signal.SIGKILL
    result = json.loads(shoal(env, "exec", "--json", "echo hi").stdout)
    assert result["value"]["out"] == "hi\n" and result["value"]["ok"] is True
    assert result["ref"].startswith("out:")
    wire = json.loads(shoal(env, "exec", "--json", "--wire", "echo hi").stdout)
    assert wire["value"]["$"] == "outcome"


def test_exec_full_writes_every_byte(env):
    proc = shoal(env, "exec", "--full", "seq 1 50000; seq 1 3 >&2")
    assert proc.stdout == "".join(f"{i}\n" for i in range(1, 50001))
    assert proc.stderr == "1\n2\n3\n"


def test_exec_kernel_error_is_125(env):
    proc = shoal(env, "--session", "not a valid name", "exec", "true", check=False)
    assert proc.returncode == 125 and "-32602" in proc.stderr
    for args in (["get", "out:1"], ["journal"]):  # other commands: 2 for a kernel error
        assert shoal(env, "--session", "not a valid name", *args, check=False).returncode == 2


def test_autostart_failure_names_the_log_and_the_reason(env):
    state = Path(env["SHOAL_STATE_DIR"])
    state.mkdir(mode=0o700)
    (state / "policy.toml").write_text('[principal."agent:x"]\nno_such_key = 1\n')
    proc = shoal(env, "exec", "true", check=False)
    assert proc.returncode == 125
    assert str(state / "kernel.out") in proc.stderr and "no_such_key" in proc.stderr, proc.stderr


def test_tasks_list_show_wait_cancel(env):
    started = shoal(env, "exec", "--background", "sleep 0.3; echo bg").stdout.split()[0]
    assert started.startswith("task:")
    listed = json.loads(shoal(env, "tasks", "--json").stdout)
    assert [t["task"] for t in listed] == [started]
    waited = shoal(env, "tasks", "wait", started, "--timeout", "20")
    assert waited.stdout == "bg\n" and "result out:" in waited.stderr
    assert json.loads(shoal(env, "tasks", "show", started).stdout)["state"] == "completed"
    long = shoal(env, "exec", "--background", "sleep 100").stdout.split()[0]
    assert "cancelled" in shoal(env, "tasks", "cancel", long).stdout
    again = shoal(env, "tasks", "cancel", long, check=False)
    assert again.returncode == 2 and "-32020" in again.stderr


def test_tasks_wait_mirrors_the_status_and_get_says_where_the_result_is(env):
    failing = shoal(env, "exec", "--background", "echo bad >&2; exit 4").stdout.split()[0]
    waited = shoal(env, "tasks", "wait", failing, "--timeout", "20", check=False)
    assert waited.returncode == 4 and "bad" in waited.stderr
    running = shoal(env, "exec", "--background", "echo partial; sleep 100").stdout.split()[0]
    still = shoal(env, "tasks", "wait", running, "--timeout", "0.2", check=False)
    assert still.returncode == 124 and "still running" in still.stderr
    wait_until(
        lambda: "partial" in shoal(env, "get", running).stdout, timeout=20, what="partial output"
    )
    shown = shoal(env, "get", running).stdout
    assert "[running]" in shown and "None" not in shown
    shoal(env, "tasks", "cancel", running)
    done = shoal(env, "get", failing, check=False)
    result_ref = json.loads(shoal(env, "tasks", "show", failing).stdout)["result_ref"]
    assert f"{failing}'s result is {result_ref}" in done.stderr
    err = shoal(env, "get", result_ref, "--path", ".err").stdout
    assert err == "bad\n"  # no extra blank line


def test_journal_filters_and_json(env):
    shoal(env, "exec", "true")
    shoal(env, "exec", "false", check=False)
    rows = json.loads(shoal(env, "journal", "--json").stdout)  # an array, as tasks/plans
    assert [r["src"] for r in rows] == ["true", "false"]  # oldest first, newest last
    shoal(env, "exec", "echo third")
    last_two = json.loads(shoal(env, "journal", "-n", "2", "--json").stdout)
    assert [r["src"] for r in last_two] == ["false", "echo third"]
    failed = json.loads(shoal(env, "journal", "--failed", "--json").stdout)
    assert len(failed) == 1 and failed[0]["status"] == 1
    table = shoal(env, "journal").stdout
    assert "SRC" not in table or "false" in table


def test_journal_follow_prints_new_rows(env):
    shoal(env, "exec", "true")
    follower = subprocess.Popen(
        [*CLI, "journal", "--follow", "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = _stdout_lines(follower)

    def srcs() -> list[str]:
        return [row["src"] for row in _json_objects("".join(lines))]

    try:
        # It prints the rows there are, then follows: once the `true` row is out, a row
        # for a command run from now on can only reach it by following.
        wait_until(lambda: srcs() == ["true"], timeout=20, what="the existing row")
        shoal(env, "exec", "echo followed")
        wait_until(lambda: srcs() == ["true", "echo followed"], 20, what="the new row")
    finally:
        follower.send_signal(signal.SIGINT)
        follower.wait(10)
    assert follower.returncode == 0, follower.stderr.read()


def test_token_create_list_revoke(env):
    created = shoal(env, "token", "create", "agent:x", "--ttl", "60", "--label", "ci")
    bearer = created.stdout.strip().splitlines()[-1]
    assert bearer.startswith("shoal_")
    listed = json.loads(shoal(env, "token", "list", "--json").stdout)
    assert (
        listed[0]["principal"] == "agent:x"
        and "digest" not in listed[0]
        and bearer not in json.dumps(listed)
    )
    assert "revoked 1" in shoal(env, "token", "revoke", "agent:x").stdout
    assert shoal(env, "token", "revoke", "agent:x", check=False).returncode != 0


def test_kernel_status_stop_and_doctor(env):
    assert shoal(env, "kernel", "status", check=False).returncode == 1
    shoal(env, "kernel", "start")
    status = json.loads(shoal(env, "kernel", "status", "--json").stdout)
    assert status["running"] and status["framing_backend"] in ("cython", "python")
    assert status["socket"] == env["SHOAL_SOCKET"] and status["pid"] > 0
    doctor = json.loads(shoal(env, "doctor", "--json").stdout)
    assert {c["check"] for c in doctor} >= {"bash", "tree-sitter-bash", "pyte", "socket"}
    assert all(c["status"] != "fail" for c in doctor), doctor
    box = next(c for c in doctor if c["check"] == "sandbox")  # the kernel's level, or why off
    assert box["status"] == ("ok" if sandbox_probe.probe().enforced() else "warn"), box
    assert box["detail"].startswith("auto"), box
    grammar = next(c for c in doctor if c["check"] == "tree-sitter-bash")
    assert grammar == {
        "check": "tree-sitter-bash",
        "status": "ok",
        "detail": "the kernel parses bash",
    }
    shoal(env, "kernel", "stop")
    assert not os.path.exists(env["SHOAL_SOCKET"])


def test_doctor_checks_the_grammar_through_the_kernel(env):
    # No kernel and autostart off: the grammar check cannot run and says why (a warning,
    # not a failure); nothing is started.
    quiet = {**env, "SHOAL_NO_AUTOSTART": "1"}
    proc = shoal(quiet, "doctor", "--json")
    grammar = next(c for c in json.loads(proc.stdout) if c["check"] == "tree-sitter-bash")
    assert grammar["status"] == "warn" and "SHOAL_NO_AUTOSTART" in grammar["detail"], grammar
    kernel = next(c for c in json.loads(proc.stdout) if c["check"] == "kernel")
    assert kernel["status"] == "warn" and "not running" in kernel["detail"], kernel
    assert not os.path.exists(env["SHOAL_SOCKET"])
    # With autostart (the default) the doctor starts the kernel and asks it to parse.
    doctor = json.loads(shoal(env, "doctor", "--json").stdout)
    grammar = next(c for c in doctor if c["check"] == "tree-sitter-bash")
    assert grammar["status"] == "ok", doctor
    kernel = next(c for c in doctor if c["check"] == "kernel")
    assert kernel["status"] == "ok" and "pid" in kernel["detail"], doctor  # the one it started
    assert json.loads(shoal(env, "kernel", "status", "--json").stdout)["running"]


def test_plans_approve_deny_flow_as_local_human(env):
    shoal(env, "kernel", "start")
    from shoal_mcp.client import KernelClient

    client = KernelClient(env["SHOAL_SOCKET"])
    client.call("session.attach", {"session": "agent"})
    plan = client.call("exec", {"src": "rm -rf /tmp/nothing-here", "mode": "plan"})
    client.call("cap.request", {"plan_ref": plan["plan_ref"]})
    listed = json.loads(shoal(env, "plans", "--json").stdout)
    assert [p["plan_ref"] for p in listed] == [plan["plan_ref"]] and listed[0][
        "state"
    ] == "requested"
    assert "approved" in shoal(env, "approve", plan["plan_ref"]).stdout
    other = client.call("exec", {"src": "rm -rf /tmp/other-thing", "mode": "plan"})
    assert "denied" in shoal(env, "deny", other["plan_ref"]).stdout
    assert shoal(env, "approve", other["plan_ref"], check=False).returncode == 2
    client.close()


def test_mcp_config_prints_three_forms(env):
    out = shoal(env, "mcp-config").stdout
    assert "claude mcp add shoal" in out
    config = json.loads(out[out.index("{") :])
    server = config["mcpServers"]["shoal"]
    assert server["env"]["SHOAL_SOCKET"] == env["SHOAL_SOCKET"]


def test_version_names_the_backend(env):
    out = shoal(env, "--version").stdout
    assert "framing:" in out


def test_state_files_are_private(env):
    shoal(env, "exec", "echo private")
    state = Path(env["SHOAL_STATE_DIR"])
    files = [state / "journal.sqlite3", state / "kernel.log", state / "kernel.out"]
    files += [p for p in (state / "cas").rglob("*") if p.is_file()]
    assert len(files) > 3
    for path in files:
        assert os.stat(path).st_mode & 0o077 == 0, f"{path} is {oct(os.stat(path).st_mode & 0o777)}"


def test_events_tail_prints_published_events(env):
    shoal(env, "kernel", "start")
    from shoal_mcp.client import KernelClient

    client = KernelClient(env["SHOAL_SOCKET"])
    tail = None
    try:
        client.call("session.attach", {})
        first = client.call("events.publish", {"channel": "user.cli", "payload": {"n": 1}})
        # Replay from just before the first event: the kernel replays and registers the
        # live subscription in one step, so once the tail prints n=1 it is subscribed.
        tail = subprocess.Popen(
            [*CLI, "events", "tail", "user.cli", "--since", str(first["seq"] - 1), "--json"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        lines = _stdout_lines(tail)

        def payloads() -> list[dict]:
            events = _json_objects("".join(lines))
            return [e["payload"] for e in events if e.get("channel") == "user.cli"]

        wait_until(lambda: payloads() == [{"n": 1}], timeout=20, what="the replayed event")
        client.call("events.publish", {"channel": "user.cli", "payload": {"n": 2}})
        wait_until(lambda: payloads() == [{"n": 1}, {"n": 2}], 20, what="the live event")
    finally:
        client.close()
        if tail is not None:
            tail.send_signal(signal.SIGINT)
            tail.wait(10)
    assert tail.returncode == 0, tail.stderr.read()


def test_ctrl_c_cancels_the_running_command(env):
    shoal(env, "kernel", "start")
    marker = f"37.{random.randrange(10**6):06d}"  # names this test's sleep among all processes
    proc = subprocess.Popen(
        [*CLI, "exec", f"sleep {marker}"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    from shoal_mcp.client import KernelClient

    client = KernelClient(env["SHOAL_SOCKET"])
    client.call("session.attach", {})
    try:
        # the sleep is running under the kernel before we interrupt the CLI
        wait_until(lambda: pids_with_arg(marker), timeout=20, what="the sleep to start")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert "cancelled" in err
        rows = client.call("journal.query", {"head": "sleep"})["rows"]
        assert rows and rows[0]["ok"] is False
        wait_until(lambda: not pids_with_arg(marker), timeout=10, what="the sleep to end")
    finally:
        if proc.poll() is None:
            proc.kill()
        client.close()
        kill_pids(pids_with_arg(marker))


# -- one kernel per state dir, a session per project (SPEC §4.1, §4.2) -----------------------

SDK_ENV = ("LOGNAME", "PATH", "SHELL", "TERM", "USER")
"""What the MCP SDKs pass a server by default, HOME aside."""


@pytest.fixture()
def user_home():
    """A fresh $HOME (state in its ~/.local/state/shoal) and a private XDG_RUNTIME_DIR:
    the minimal-env facade and the full-env terminal of one user."""
    with short_tmp("shoal-home-") as root:
        home, runtime = root / "home", root / "xdg"
        home.mkdir()
        runtime.mkdir(mode=0o700)
        terminal = child_env({"HOME": str(home), "XDG_RUNTIME_DIR": str(runtime)})
        for name in ("SHOAL_SOCKET", "SHOAL_STATE_DIR", "SHOAL_SESSION", "XDG_STATE_HOME"):
            terminal.pop(name, None)
        mcp = {k: os.environ[k] for k in SDK_ENV if k in os.environ}
        mcp["HOME"] = str(home)
        if "SHOAL_PURE_PYTHON" in os.environ:  # the backend under test, not discovery
            mcp["SHOAL_PURE_PYTHON"] = os.environ["SHOAL_PURE_PYTHON"]
        state = home / ".local" / "state" / "shoal"
        try:
            yield root, terminal, mcp, state
        finally:
            subprocess.run([*CLI, "kernel", "stop"], env=terminal, capture_output=True, timeout=60)
            kill_pids(pids_with_arg(str(state)))


def _facade_text(reply: dict) -> str:
    assert "result" in reply, reply
    return "".join(c.get("text", "") for c in reply["result"]["content"] if c["type"] == "text")


def _agent_exec(facade: RawFacade, command: str) -> str:
    """``shoal_exec`` through a real facade; the source argument is named as its schema
    names it (``command`` since SPEC rev 2, ``src`` before)."""
    tools = facade.request("tools/list")["result"]["tools"]
    props = next(t for t in tools if t["name"] == "shoal_exec")["inputSchema"]["properties"]
    key = "command" if "command" in props else "src"
    return _facade_text(facade.tool("shoal_exec", {key: command}))


def test_minimal_env_facade_and_full_env_cli_reach_one_kernel(user_home):
    root, terminal, mcp, state = user_home
    project = root / "projA"
    project.mkdir()
    started = shoal(terminal, "kernel", "start").stdout
    assert str(root / "xdg" / "shoal" / "kernel.sock") in started
    facade = RawFacade(mcp, cwd=project)
    try:
        facade.initialize()
        text = _agent_exec(facade, "echo agent-was-here; pwd")
        assert "agent-was-here" in text and str(project) in text
    finally:
        facade.close()
    # The human's journal (full environment, another cwd) shows what the agent ran.
    rows = json.loads(shoal(terminal, "journal", "--json").stdout)
    assert "echo agent-was-here; pwd" in [r["src"] for r in rows]
    record = json.loads((state / "kernel.json").read_text())
    assert pids_with_arg(str(state)) == [record["pid"]]  # one kernel serves this user


def test_two_projects_get_their_own_sessions_and_the_human_joins_one(user_home):
    root, terminal, mcp, _ = user_home
    proj_a, proj_b = root / "projA", root / "projB"
    proj_a.mkdir()
    proj_b.mkdir()
    shoal(terminal, "kernel", "start")
    facades = {p: RawFacade(mcp, cwd=p) for p in (proj_a, proj_b)}
    try:
        for project, facade in facades.items():
            facade.initialize()
            assert _agent_exec(facade, "pwd").startswith(str(project))
        # The human's shoal in projB lands in projB's session: its export is the agent's.
        subprocess.run(
            [*CLI, "exec", "export MARK=from-the-human"], env=terminal, cwd=proj_b, check=True
        )
        shown = {p: _agent_exec(f, 'echo "mark=$MARK"') for p, f in facades.items()}
        assert "mark=from-the-human" in shown[proj_b]
        assert "mark=from-the-human" not in shown[proj_a]
    finally:
        for facade in facades.values():
            facade.close()
    named = shoal(terminal, "--session", "elsewhere", "exec", "pwd").stdout
    assert str(proj_a) not in named and str(proj_b) not in named  # a named session is its own


def test_no_autostart_starts_nothing(env):
    quiet = {**env, "SHOAL_NO_AUTOSTART": "1"}
    for args in (["exec", "true"], ["journal"], ["get", "out:1"], ["tasks"]):
        proc = shoal(quiet, *args, check=False)
        assert proc.returncode != 0 and "SHOAL_NO_AUTOSTART" in proc.stderr, (args, proc.stderr)
    assert shoal(quiet, "exec", "true", check=False).returncode == 125
    assert shoal(quiet, "kernel", "status", check=False).returncode == 1
    assert not os.path.lexists(env["SHOAL_SOCKET"])
    assert not pids_with_arg(env["SHOAL_SOCKET"])
    assert not (Path(env["SHOAL_STATE_DIR"]) / "kernel.json").exists()
    # An explicit start is not an autostart.
    assert "kernel running" in shoal(quiet, "kernel", "start").stdout


def test_exec_on_a_terminal_streams_output_while_the_command_runs(env, short_tmp_path):
    """stdout on a pty: the first line shows while the command still waits for a flag
    file that only this test creates after seeing it; stderr stays a separate stream."""
    shoal(env, "kernel", "start")
    flag = short_tmp_path / "go"
    src = f"echo first; echo warn >&2; while [ ! -e {flag} ]; do sleep 0.05; done; echo second"
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [*CLI, "exec", src], env=env, stdout=slave, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    os.close(slave)
    seen = bytearray()

    def read_until(marker: bytes) -> None:
        while marker not in seen:
            ready, _, _ = select.select([master], [], [], 30)
            assert ready, f"no {marker!r} on the terminal; got {bytes(seen)!r}"
            try:
                seen.extend(os.read(master, 4096))
            except OSError:  # EIO: the CLI closed the terminal
                code = proc.wait(30)
                raise AssertionError(
                    f"terminal closed before {marker!r}: {bytes(seen)!r}; exit {code}, "
                    f"stderr {proc.stderr.read()!r}"
                ) from None

    try:
        read_until(b"first")
        assert proc.poll() is None and not flag.exists()  # streamed before the command ended
        flag.touch()
        read_until(b"second")
        assert proc.wait(30) == 0
        assert proc.stderr.read().decode().startswith("warn\n")
        assert b"warn" not in seen
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)


def test_every_cli_command_and_flag_is_documented():
    """docs/*.md and README.md name every `shoal` command and every long option."""
    import click

    from shoal_mcp.cli import main

    root = Path(__file__).resolve().parent.parent
    docs = "\n".join(p.read_text() for p in (root / "docs").glob("*.md"))
    docs += (root / "README.md").read_text()
    missing = []

    def walk(group: click.Command, words: list[str]) -> None:
        for param in group.params:
            for opt in getattr(param, "opts", []) + getattr(param, "secondary_opts", []):
                if opt.startswith("--") and opt not in docs:
                    missing.append(f"{' '.join(words)} {opt}")
        for name, sub in getattr(group, "commands", {}).items():
            if f"shoal {' '.join([*words[1:], name])}" not in docs:
                missing.append(" ".join([*words, name]))
            walk(sub, [*words, name])

    walk(main, ["shoal"])
    assert not missing, f"undocumented: {missing}"


def test_a_state_dir_that_is_a_file_is_named_not_a_traceback(env):
    """Issue 31: autostart raised a bare FileExistsError traceback."""
    state = Path(env["SHOAL_STATE_DIR"])
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text("not a directory")
    got = shoal(env, "exec", "echo hi", check=False)
    assert got.returncode != 0
    assert f"{state} cannot be a directory" in got.stderr and "SHOAL_STATE_DIR" in got.stderr
    assert "Traceback" not in got.stderr and "FileExistsError" not in got.stderr
    assert state.read_text() == "not a directory"  # nothing lost


@pytest.fixture()
def full_disk():
    """A full 256 KiB tmpfs (root only: skipped where mounting is not allowed)."""
    with short_tmp("shoal-full-") as root:
        mnt = root / "mnt"
        mnt.mkdir()
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True
        )
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
        try:
            fd = os.open(mnt / "fill", os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                with pytest.raises(OSError) as full:
                    while True:
                        os.write(fd, b"\0" * 4096)
                assert full.value.errno == errno.ENOSPC
            finally:
                os.close(fd)
            yield mnt
        finally:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_autostart_on_a_full_disk_says_the_disk_is_full(env, full_disk):
    """Issue 31: "exited with status 120: no output" (the kernel could not even log)."""
    state = full_disk / "state"
    got = shoal({**env, "SHOAL_STATE_DIR": str(state)}, "exec", "echo hi", check=False)
    assert got.returncode != 0
    assert f"the disk holding {state} is full" in got.stderr, got.stderr
    assert "Traceback" not in got.stderr
