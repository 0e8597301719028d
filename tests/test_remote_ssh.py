"""Remote hosts over OpenSSH (issue 29), live: a real sshd on a loopback port
(tests/support/sshd.py), the real ``shoal-mcp --host`` / ``shoal --host`` over pipes, and
the "remote" kernel autostarted by ``shoal kernel bridge`` in its own state dir. The
local side has no kernel and never starts one: everything it sees came over ssh."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from shoal_mcp import __version__
from shoal_mcp.client_transport import BadHost, parse_host
from tests.support.facade import McpPipe
from tests.support.kernel import child_env, running_kernel
from tests.support.polling import wait_until
from tests.support.procfs import argv_of, children, proc_state
from tests.support.results import shown, structured
from tests.support.sshd import SSHD, SSHD_MISSING, remote_side, running_sshd, shoal_script

LINK_CUT = re.compile(r"ssh link to \S+ was cut")


@pytest.fixture(scope="module")
def sshd():
    if not SSHD.exists():  # the only reason to skip: CI installs it (.ci/run)
        pytest.skip(SSHD_MISSING)
    with running_sshd() as server:
        yield server


@pytest.fixture
def remote(sshd):
    with remote_side(sshd) as side:
        yield side


def facade(remote, tmp: Path, **env: str) -> McpPipe:
    """``shoal-mcp`` for the remote side (``SHOAL_HOST``, the env form of ``--host``)."""
    return McpPipe(remote.client_env(**env), cwd=str(tmp), stderr_path=tmp / "facade.err")


def ssh_children(pid: int) -> list[int]:
    """The ssh processes ``pid`` started (its kernel links), zombies excluded."""
    return [
        child
        for child in children(pid)
        if proc_state(child) not in (None, "Z") and argv_of(child)[:1] == [b"ssh"]
    ]


def shoal(remote, *args: str, env: dict[str, str] | None = None, timeout: float = 60):
    return subprocess.run(
        [str(shoal_script()), *args],
        env=env or remote.client_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# -- the MCP workflow ----------------------------------------------------------------


def test_mcp_workflow_runs_on_the_remote_kernel(remote, tmp_path):
    go = remote.dir / "go"
    env = remote.client_env()
    host = env.pop("SHOAL_HOST")
    shoal_mcp = [str(shoal_script().with_name("shoal-mcp")), "--host", host]
    pipe = McpPipe(env, cwd=str(tmp_path), stderr_path=tmp_path / "facade.err", command=shoal_mcp)
    try:
        init = pipe.initialize()
        assert init["serverInfo"]["host"] == remote.server.host_spec
        assert remote.server.host_spec in init["instructions"]

        hi = pipe.tool("shoal_exec", {"command": "echo hi; echo $SHOAL_STATE_DIR >&2"})
        assert shown(hi) == "hi"

        big = pipe.tool("shoal_exec", {"command": "seq 1 2000000"})
        ref = structured(big)["ref"]
        text = big["result"]["content"][0]["text"]
        assert len(text.encode()) < 16 * 1024, len(text)  # a bounded preview, not 14 MB
        got = pipe.tool("shoal_get", {"ref": ref, "match": "^1999999$"})["result"]
        assert "1999999" in got["content"][0]["text"]
        assert got["structuredContent"]["total"] == 1

        started = structured(
            pipe.tool(
                "shoal_exec",
                {
                    "command": f"until [ -e {go} ]; do sleep 0.05; done; echo bg-done",
                    "background": True,
                },
            )
        )
        task = started["task"]
        # Kernel events come over a second ssh link: the task's end is notified.
        task_uri = f"shoal://task/{task.split(':')[1]}"
        assert pipe.request("resources/subscribe", {"uri": task_uri})["result"] == {}

        def updated() -> bool:
            return any(
                n.get("method") == "notifications/resources/updated"
                and n["params"]["uri"] == task_uri
                for n in list(pipe.notifications)
            )

        go.touch()  # the task ends only now, after the subscription
        wait_until(updated, timeout=30, what="the remote task's update notification")
        waited = pipe.tool("shoal_get", {"ref": task, "wait_ms": 30000})
        assert "bg-done" in waited["result"]["content"][0]["text"]

        doomed = structured(pipe.tool("shoal_exec", {"command": "sleep 60", "background": True}))[
            "task"
        ]
        assert "result" in pipe.tool("shoal_cancel", {"task": doomed})
        ended = structured(pipe.tool("shoal_get", {"ref": doomed, "wait_ms": 30000}))
        # Cancelled, not finished. A SIGTERM that lands while bash forks is held until the
        # SIGKILL after the grace (docs/decisions.md), so either signal ends it.
        assert ended["value"]["ok"] is False, ended
        assert ended["value"]["signal"] in ("SIGTERM", "SIGKILL"), ended

        pty = structured(pipe.tool("shoal_pty_open", {"cmd": "bash", "args": ["--norc"]}))
        pty_id = pty["pty_id"]
        pipe.tool(
            "shoal_pty_send", {"pty_id": pty_id, "input": ["echo $((6*7))", {"key": "Enter"}]}
        )

        def screen_has_42() -> bool:
            screen = pipe.tool("shoal_pty_read", {"pty_id": pty_id})["result"]
            return "42" in orjson.dumps(screen).decode()

        wait_until(screen_has_42, timeout=30, what="42 on the remote PTY's screen")
        pipe.tool("shoal_pty_close", {"pty_id": pty_id})
    finally:
        assert pipe.close() == 0
    # The outputs were stored where they were made: the remote state dir, never here.
    assert (remote.state / "kernel.json").exists()
    assert any((remote.state / "cas").rglob("*")), "no stored output on the remote side"
    assert not (remote.dir / "local-state").exists()


def test_cutting_the_ssh_link_mid_call_fails_clearly_and_the_task_survives(remote, tmp_path):
    marker = remote.dir / "ran"
    pipe = facade(remote, tmp_path, SHOAL_LIVENESS_S="1,3")
    try:
        pipe.initialize()
        task = structured(
            pipe.tool(
                "shoal_exec", {"command": "sleep 3; echo survived-the-cut", "background": True}
            )
        )["task"]
        slow = pipe.send_tool("shoal_exec", {"command": f"echo once >> {marker}; sleep 60"})
        wait_until(lambda: marker.exists() and marker.read_text(), timeout=30, what="the call ran")
        links = ssh_children(pipe.pid)
        assert links, "the facade has no ssh link"
        for pid in links:
            os.kill(pid, signal.SIGKILL)
        reply = pipe.read_reply(slow, timeout=30)
        assert "error" in reply, reply
        message = reply["error"]["message"]
        assert LINK_CUT.search(message), message
        assert "Traceback" not in message
        # The next call reconnects (a new ssh) and the remote task's result is there.
        done = pipe.tool("shoal_get", {"ref": task, "wait_ms": 30000}, timeout=60)
        assert "survived-the-cut" in done["result"]["content"][0]["text"]
        assert set(ssh_children(pipe.pid)).isdisjoint(links)
        # Nothing was run twice: the interrupted call is not retried.
        assert marker.read_text() == "once\n"
    finally:
        assert pipe.close() == 0
    assert "Traceback" not in (tmp_path / "facade.err").read_text()


def test_a_silent_link_fails_in_flight_calls_within_the_liveness_bound(remote, tmp_path):
    """ssh alive but nothing coming back (a dead network): the heartbeat names it."""
    pipe = facade(remote, tmp_path, SHOAL_LIVENESS_S="1,3")
    links: list[int] = []
    try:
        pipe.initialize()
        assert shown(pipe.tool("shoal_exec", {"command": "echo up"})) == "up"
        slow = pipe.send_tool("shoal_exec", {"command": "sleep 60"})
        links = ssh_children(pipe.pid)
        for pid in links:
            os.kill(pid, signal.SIGSTOP)
        reply = pipe.read_reply(slow, timeout=30)
        assert "error" in reply, reply
        assert "no answer from the shoal kernel on" in reply["error"]["message"], reply
        assert reply["error"]["data"]["stalled"] is True
        for pid in links:
            os.kill(pid, signal.SIGCONT)
        again = pipe.tool("shoal_exec", {"command": "echo back"}, timeout=60)
        assert shown(again) == "back"
    finally:
        for pid in links:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        assert pipe.close() == 0


def test_the_sandboxed_agent_works_in_the_remote_dir(remote, tmp_path):
    """The default agent (no token, not --unconfined) on a host: ``--remote-dir`` is its
    working directory and project there, as the local cwd is for a local facade; without
    it the agent has no project on that host and writes nowhere in it."""
    project = remote.dir / "project"
    project.mkdir()
    beside = remote.dir / "beside"
    beside.mkdir()
    env = remote.client_env(SHOAL_UNCONFINED="", SHOAL_SESSION="")
    host = env.pop("SHOAL_HOST")
    command = [str(shoal_script().with_name("shoal-mcp")), "--host", host]
    agent = McpPipe(
        env,
        cwd=str(tmp_path),
        stderr_path=tmp_path / "agent.err",
        command=[*command, "--remote-dir", str(project)],
    )
    try:
        init = agent.initialize()
        assert f"({project} on that host" in init["instructions"], init["instructions"]
        here = agent.tool("shoal_exec", {"command": "pwd; echo made > made.txt"})
        assert shown(here) == str(project), here
        assert (project / "made.txt").read_text() == "made\n"
        outside = structured(agent.tool("shoal_exec", {"command": f"touch {beside}/x"}))
        assert outside["value"]["ok"] is False and not (beside / "x").exists(), outside
        assert f"{beside}/x" in {d["path"] for d in outside["sandbox_denied"]}, outside
    finally:
        assert agent.close() == 0
    homeless = McpPipe(
        env, cwd=str(tmp_path), stderr_path=tmp_path / "homeless.err", command=command
    )
    try:
        init = homeless.initialize()
        assert "(none on that host)" in init["instructions"]
        refused = structured(homeless.tool("shoal_exec", {"command": f"touch {project}/y"}))
        assert refused["value"]["ok"] is False and not (project / "y").exists(), refused
    finally:
        assert homeless.close() == 0
    assert "Traceback" not in (tmp_path / "agent.err").read_text()


def test_remote_dir_options_are_checked(remote, tmp_path):
    env = remote.client_env()
    host = env.pop("SHOAL_HOST")
    relative = shoal(remote, "--host", host, "--remote-dir", "src/app", "exec", "true", env=env)
    assert relative.returncode == 2 and "expected an absolute path on the host" in relative.stderr
    alone = shoal(remote, "--remote-dir", "/srv/app", "exec", "true", env=env)
    assert alone.returncode == 2 and "--remote-dir needs --host" in alone.stderr
    facade_alone = subprocess.run(
        [str(shoal_script().with_name("shoal-mcp")), "--remote-dir", "/srv/app"],
        env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert facade_alone.returncode == 2 and "--remote-dir needs --host" in facade_alone.stderr
    missing = shoal(remote, "--host", host, "--remote-dir", "/no/such/dir", "exec", "pwd", env=env)
    assert missing.returncode != 0 and "'/no/such/dir' is not a directory on this host" in (
        missing.stderr
    ), missing
    typo = McpPipe(
        env,
        cwd=str(tmp_path),
        stderr_path=tmp_path / "typo.err",
        command=[str(shoal_script().with_name("shoal-mcp")), "--host", host,
                 "--remote-dir", "/no/such/dir"],
    )  # fmt: skip
    try:
        typo.initialize()
        failed = typo.tool("shoal_exec", {"command": "pwd"})["result"]
        assert failed["isError"] is True, failed
        assert "is not a directory on this host" in failed["content"][0]["text"]
    finally:
        assert typo.close() == 0
    # The CLI works there too, and mcp-config writes the flag into the entry.
    there = shoal(remote, "--host", host, "--remote-dir", str(remote.dir), "exec", "pwd", env=env)
    assert there.stdout == f"{remote.dir}\n", there.stderr
    config = shoal(remote, "mcp-config", "--host", host, "--remote-dir", "/srv/app", env=env)
    entry = orjson.loads(config.stdout[config.stdout.index("{") :])["mcpServers"]["shoal"]
    assert entry["args"][-4:] == ["--host", host, "--remote-dir", "/srv/app"]


# -- the CLI ------------------------------------------------------------------------------


def test_cli_exec_over_ssh(remote):
    env = remote.client_env()
    host = env.pop("SHOAL_HOST")
    done = shoal(remote, "--host", host, "exec", "echo hi", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hi\n"
    again = shoal(remote, "exec", "echo $((2+3))")  # SHOAL_HOST
    assert again.stdout == "5\n", again.stderr
    # A hint the CLI prints works when pasted: it names the host given by --host.
    preview = shoal(remote, "--host", host, "exec", "--preview", "seq 1 100000", env=env)
    hint = re.search(r"shoal --host (\S+) get (out:\d+) --lines (\S+)", preview.stdout)
    assert hint and hint[1] == host, preview.stdout
    pasted = shoal(remote, "--host", host, "get", hint[2], "--lines", hint[3], env=env)
    assert pasted.stdout.splitlines()[0] == "11" and pasted.stdout.endswith("99990\n")
    assert not (remote.dir / "local-state").exists()


def test_cli_refuses_host_for_local_only_commands(remote):
    done = shoal(remote, "kernel", "status")
    assert done.returncode == 2
    assert "does not take --host" in done.stderr and "Traceback" not in done.stderr


def test_doctor_and_mcp_config_for_a_host(remote):
    env = remote.client_env()
    host = env.pop("SHOAL_HOST")
    doctor = shoal(remote, "doctor", "--host", host, "--json", env=env)
    checks = {c["check"]: c for c in orjson.loads(doctor.stdout)}
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert checks["ssh"]["status"] == "ok"
    assert checks[f"shoal on {host}"]["detail"] == f"shoal {__version__} (same as here)"
    kernel = checks[f"kernel on {host}"]
    assert kernel["status"] == "ok" and str(remote.state) in kernel["detail"]
    assert not any(" on " in name and name.startswith("/") for name in checks)  # no dir given

    # With a remote dir: a fourth check, the attach there (a typo fails it, named).
    there = shoal(
        remote, "doctor", "--host", host, "--json", env={**env, "SHOAL_REMOTE_DIR": str(remote.dir)}
    )
    found = {c["check"]: c for c in orjson.loads(there.stdout)}[f"{remote.dir} on {host}"]
    assert there.returncode == 0 and found["status"] == "ok", there.stdout
    assert f"cwd {remote.dir}" in found["detail"]
    typo = shoal(
        remote, "--host", host, "--remote-dir", "/no/such/dir", "doctor", "--json", env=env
    )
    failed = {c["check"]: c for c in orjson.loads(typo.stdout)}[f"/no/such/dir on {host}"]
    assert typo.returncode != 0 and failed["status"] != "ok", typo.stdout
    assert "is not a directory on this host" in failed["detail"], failed

    config = shoal(remote, "mcp-config", "--host", host, env=env)
    assert config.returncode == 0, config.stderr
    entry = orjson.loads(config.stdout[config.stdout.index("{") :])["mcpServers"]["shoal"]
    assert entry["args"][-2:] == ["--host", host]
    assert entry["env"]["SHOAL_SSH"] == remote.server.ssh_command
    assert "SHOAL_STATE_DIR" not in entry["env"]


def test_doctor_reports_a_version_skew(remote, tmp_path):
    fake = tmp_path / "old-shoal"
    fake.write_text(
        f'#!/bin/sh\n[ "$1" = --version ] && echo "shoal 0.0.1" && exit 0\nexec {shoal_script()} "$@"\n'
    )
    fake.chmod(0o755)
    env = remote.client_env(
        SHOAL_REMOTE_COMMAND=remote.remote_command().replace(str(shoal_script()), str(fake))
    )
    doctor = shoal(remote, "doctor", "--json", env=env)
    checks = {c["check"]: c for c in orjson.loads(doctor.stdout)}
    version = checks[f"shoal on {remote.server.host_spec}"]
    assert version["status"] == "warn", version
    assert "version skew" in version["detail"] and "0.0.1" in version["detail"]


# -- bad input -------------------------------------------------------------------------


def _clear_failure(done: subprocess.CompletedProcess, *needles: str) -> None:
    assert done.returncode == 125, (done.returncode, done.stderr)  # exec: shoal failed
    assert "Traceback" not in done.stderr, done.stderr
    for needle in needles:
        assert needle in done.stderr, done.stderr


def test_unknown_host_fails_clearly(remote):
    done = shoal(remote, "--host", "no-such-host.invalid", "exec", "true")
    _clear_failure(done, "ssh to no-such-host.invalid failed", "unknown host")


def test_refused_key_fails_clearly_without_prompting(remote, tmp_path):
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "stranger")],
        check=True,
    )
    config = tmp_path / "ssh_config"
    config.write_text(
        remote.server.client_config.read_text().replace(
            str(remote.server.dir / "client_key"), str(tmp_path / "stranger")
        )
    )
    env = remote.client_env(SHOAL_SSH=f"ssh -F {config}")
    done = shoal(remote, "exec", "true", env=env)
    _clear_failure(done, "Permission denied", "BatchMode")


def test_remote_without_shoal_fails_clearly(remote):
    env = remote.client_env(SHOAL_REMOTE_COMMAND="/opt/nowhere/bin/shoal")
    done = shoal(remote, "exec", "true", env=env)
    _clear_failure(done, "shoal is not installed on", "SHOAL_REMOTE_COMMAND")


def test_facade_reports_a_failing_host_on_the_call(remote, tmp_path):
    pipe = facade(remote, tmp_path, SHOAL_HOST="no-such-host.invalid")
    try:
        pipe.initialize()
        reply = pipe.tool("shoal_exec", {"command": "true"})
        assert "error" in reply, reply
        assert "ssh to no-such-host.invalid failed" in reply["error"]["message"]
        # Backoff: the next call fails at once with the same error, no new ssh.
        again = pipe.tool("shoal_exec", {"command": "true"})
        assert "next reconnect try in" in again["error"]["message"], again
    finally:
        assert pipe.close() == 0


def test_bad_host_spec_stops_the_facade_with_a_message(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "shoal_mcp.facade", "--host", "a b:99999"],
        env=child_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "bad host 'a b:99999'" in done.stderr and "Traceback" not in done.stderr


# -- the bridge alone -------------------------------------------------------------------


def test_bridge_relays_frames_and_answers_an_oversize_one():
    with running_kernel() as kernel:
        env = child_env({"SHOAL_SOCKET": str(kernel.socket), "SHOAL_STATE_DIR": str(kernel.state)})
        bridge = subprocess.Popen(
            [str(shoal_script()), "kernel", "bridge"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            assert bridge.stdin is not None and bridge.stdout is not None
            huge = b'{"jsonrpc":"2.0","id":7,"method":"ping","params":{"x":"' + b"a" * (17 << 20)
            bridge.stdin.write(huge + b'"}}\n')
            bridge.stdin.write(b'{"jsonrpc":"2.0","id":8,"method":"ping","params":{}}\n')
            bridge.stdin.flush()
            first = orjson.loads(bridge.stdout.readline())
            second = orjson.loads(bridge.stdout.readline())
            assert first["id"] == 7 and first["error"]["code"] == -32600, first
            assert second["id"] == 8 and second["result"]["kernel"]["pid"] == kernel.pid
            bridge.stdin.close()
            assert bridge.wait(30) == 0
        finally:
            if bridge.poll() is None:
                bridge.kill()
                bridge.wait()
        # The client ending the bridge left the kernel running.
        assert kernel.proc.poll() is None


# -- host specs and the ssh command line (no sshd needed) ---------------------------------


@pytest.mark.parametrize(
    ("spec", "user", "host", "port"),
    [
        ("build", None, "build", None),
        ("alice@build.example", "alice", "build.example", None),
        ("alice@build.example:2222", "alice", "build.example", 2222),
        ("[::1]:22", None, "[::1]", 22),
    ],
)
def test_host_specs_parse(spec, user, host, port):
    parsed = parse_host(spec)
    assert (parsed.user, parsed.host, parsed.port) == (user, host, port)
    assert parsed.label == spec


@pytest.mark.parametrize("spec", ["", "a b", "host:0", "host:99999", "@host", "-oProxyCommand=x"])
def test_bad_host_specs_are_refused(spec):
    with pytest.raises(BadHost, match="expected \\[user@\\]host\\[:port\\]"):
        parse_host(spec)


def test_the_ssh_command_line(monkeypatch):
    monkeypatch.setenv("SHOAL_SSH", "ssh -F /etc/shoal-ssh")
    monkeypatch.setenv("SHOAL_REMOTE_COMMAND", "~/venv/bin/shoal")
    argv = parse_host("alice@[::1]:2222").ssh_argv(("kernel", "bridge"))
    assert argv[:3] == ["ssh", "-F", "/etc/shoal-ssh"]
    assert "BatchMode=yes" in argv and argv[argv.index("-p") + 1] == "2222"
    # The host comes after "--" (never read as an option); the remote command is shell
    # text for the remote side, so ~ expands there.
    assert argv[-3:] == ["--", "alice@::1", "~/venv/bin/shoal kernel bridge"]
