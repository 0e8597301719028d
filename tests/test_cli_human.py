"""The human's side as good as a shell (issue 32), through a real terminal.

Each CLI here runs on a pseudoterminal of its own (``pty.openpty``) against a real
kernel: live interleaved streams, ``-it``, ``shoal pty attach`` to a PTY an agent opened
through the real MCP facade, every hint pasted back, kernel.toml across restart and
autostart, a bad policy refused by ``policy check`` and ``kernel reload``.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import shlex
import signal
import struct
import subprocess
import termios
import threading
from pathlib import Path

import pytest

from tests.support.facade import RawFacade
from tests.support.kernel import child_env
from tests.support.landlock import landlock_evidence
from tests.support.polling import wait_until
from tests.support.procfs import kill_pids, pids_with_arg
from tests.support.tmp import short_tmp
from tests.test_cli import CLI, shoal

WAIT_S = 60.0


@pytest.fixture()
def env():
    """A kernel of its own (socket, state) and an XDG_CONFIG_HOME with no kernel.toml yet."""
    with short_tmp("shoal-human-") as root:
        sock = root / "run" / "k.sock"
        config = root / "config"
        (config / "shoal").mkdir(parents=True)
        e = child_env(
            {
                "SHOAL_SOCKET": str(sock),
                "SHOAL_STATE_DIR": str(root / "state"),
                "XDG_CONFIG_HOME": str(config),
            }
        )
        e.pop("SHOAL_KERNEL_CONFIG", None)  # found through XDG_CONFIG_HOME, as a user's
        try:
            yield e
        finally:
            subprocess.run([*CLI, "kernel", "stop"], env=e, capture_output=True, timeout=30)
            kill_pids(pids_with_arg(str(sock)))


class OnTerminal:
    """The CLI with stdin, stdout and stderr on one pseudoterminal, as typed in a shell;
    everything it writes is collected as it comes."""

    def __init__(self, env: dict, *args: str, cols: int = 100, rows: int = 30) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.proc = subprocess.Popen(
            [*CLI, *args], env=env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True
        )
        os.close(slave)
        self.master = master
        self.seen = bytearray()
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            with self.lock:
                self.seen.extend(data)

    def text(self) -> str:
        with self.lock:
            return self.seen.decode("utf-8", "replace")

    def wait_for(self, marker: str, timeout: float = WAIT_S) -> None:
        wait_until(
            lambda: marker in self.text() or self.proc.poll() is not None and marker in self.text(),
            timeout,
            what=f"{marker!r} on the terminal (got {self.text()[-600:]!r})",
        )

    def type(self, data: bytes) -> None:
        os.write(self.master, data)

    def resize(self, cols: int, rows: int) -> None:
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def wait(self, timeout: float = WAIT_S) -> int:
        """The exit status (what it wrote last may still be on its way: ``wait_for``)."""
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        os.close(self.master)


def test_stdout_and_stderr_interleave_as_produced_on_a_terminal(env, short_tmp_path):
    """Each line waits for a flag the test creates only once it saw the line before on
    the terminal: the order seen is the order produced, whatever the stream."""
    shoal(env, "kernel", "start")
    flags = [short_tmp_path / f"go{i}" for i in range(3)]
    wait = "while [ ! -e {} ]; do sleep 0.02; done"
    src = "; ".join(
        [
            "echo out-1",
            wait.format(flags[0]),
            "echo err-1 >&2",
            wait.format(flags[1]),
            "echo out-2",
            wait.format(flags[2]),
            "echo err-2 >&2",
        ]
    )
    term = OnTerminal(env, "exec", src)
    try:
        for marker, flag in zip(["out-1", "err-1", "out-2"], flags, strict=True):
            term.wait_for(marker)
            assert term.proc.poll() is None  # streamed while the command still runs
            flag.touch()
        term.wait_for("err-2")
        assert term.wait() == 0
        text = term.text()
        positions = [text.index(m) for m in ("out-1", "err-1", "out-2", "err-2")]
        assert positions == sorted(positions), text
    finally:
        term.close()


def test_a_300000_line_command_shows_its_last_line_and_both_stderr_lines(env):
    term = OnTerminal(env, "exec", "echo early-err >&2; seq 1 300000; echo late-err >&2")
    try:
        assert term.wait(120) == 0
        term.wait_for("── out:")  # the footer, last
        lines = term.text().replace("\r\n", "\n").split("\n")
        assert "300000" in lines and "early-err" in lines and "late-err" in lines
        assert "150000" in lines  # the middle too: nothing stopped the live view
        assert "stopped" not in term.text()
    finally:
        term.close()


def test_exec_it_python_evaluates_six_times_seven(env):
    term = OnTerminal(env, "exec", "-it", "python3 -q")
    try:
        term.wait_for(">>>")
        term.type(b"6*7\r")
        term.wait_for("42")
        term.type(b"\x03")  # Ctrl-C reaches python through its terminal
        term.wait_for("KeyboardInterrupt")
        term.type(b"exit(7)\r")
        assert term.wait() == 7
    finally:
        term.close()


def test_exec_it_follows_the_terminal_size(env):
    """The PTY starts at the terminal's size and follows a resize (SIGWINCH)."""
    term = OnTerminal(
        env, "exec", "-it", "PS1='ready$ ' bash --norc --noprofile", cols=100, rows=30
    )
    try:
        term.wait_for("ready$")
        term.type(b"stty size\r")
        term.wait_for("30 100")
        term.resize(120, 40)
        term.proc.send_signal(signal.SIGWINCH)  # what the terminal sends its foreground job
        term.type(b"stty size\r")
        term.wait_for("40 120")
        term.type(b"exit 3\r")
        assert term.wait() == 3
    finally:
        term.close()


def test_exec_preview_on_a_terminal_is_the_bounded_preview(env):
    term = OnTerminal(env, "exec", "--preview", "seq 1 300000")
    try:
        assert term.wait() == 0
        term.wait_for("── out:")
        assert "lines elided" in term.text() and "\n150000\r" not in term.text()
    finally:
        term.close()


def test_exec_i_passes_stdin_and_ends_it(env):
    proc = subprocess.run(
        [*CLI, "exec", "-i", "wc -l; cat"],
        env=env,
        input="a\nb\nc\n",
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["3"]
    proc = subprocess.run(
        [*CLI, "exec", "-i", "tr a-z A-Z"],
        env=env,
        input="shoal\n",
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert proc.stdout == "SHOAL\n"
    # Without -i the command's stdin stays empty (like docker exec without -i).
    assert shoal(env, "exec", "cat").stdout == ""


def _facade_result(reply: dict) -> dict:
    assert "result" in reply, reply
    result = reply["result"]
    assert not result.get("isError"), result
    return result.get("structuredContent") or json.loads(result["content"][0]["text"])


def test_pty_attach_to_an_agents_pty_sees_its_screen_types_and_detaches(env, short_tmp_path):
    """An agent (the real MCP facade, in another project: another session) opens a
    shell on a PTY; the human lists it, attaches, sees what the agent typed, types
    too (the agent sees it), detaches with Ctrl-], and the shell keeps running."""
    shoal(env, "kernel", "start")
    project = short_tmp_path / "agent-project"
    project.mkdir()
    facade = RawFacade(env, cwd=project)
    term = None
    try:
        facade.initialize()
        opened = _facade_result(
            facade.tool("shoal_pty_open", {"cmd": "bash", "args": ["--norc", "-i"]})
        )
        pty_id = opened["pty_id"]
        facade.tool(
            "shoal_pty_send", {"pty_id": pty_id, "input": ["echo agent-typed", {"key": "Enter"}]}
        )
        listed = json.loads(shoal(env, "pty", "list", "--json").stdout)
        assert pty_id in [p["pty_id"] for p in listed]
        assert next(p for p in listed if p["pty_id"] == pty_id)["session"] != ""
        term = OnTerminal(env, "pty", "attach", pty_id)
        term.wait_for("agent-typed")
        term.type(b"echo human-$((6*7))\r")
        term.wait_for("human-42")

        def agent_sees() -> bool:
            screen = _facade_result(facade.tool("shoal_pty_read", {"pty_id": pty_id}))
            return any("human-42" in row for row in screen["screen"])

        wait_until(agent_sees, WAIT_S, what="the agent to see the human's typing")
        term.type(b"\x1d")  # Ctrl-]
        assert term.wait() == 0
        assert "detached" in term.text()
        screen = _facade_result(facade.tool("shoal_pty_read", {"pty_id": pty_id}))
        assert screen["alive"] is True  # detaching leaves the program running
        # The human's one-shot commands work on it too.
        shoal(env, "pty", "send", pty_id, "echo sent-by-cli", "--key", "Enter")
        wait_until(
            lambda: "sent-by-cli" in shoal(env, "pty", "read", pty_id).stdout.splitlines(),
            WAIT_S,
            what="the output of the line sent with `shoal pty send`",
        )
        assert "closed" in shoal(env, "pty", "close", pty_id).stdout
    finally:
        if term is not None:
            term.close()
        facade.close()


HINT = re.compile(r"shoal get [^\n;()]*?(?=\s*(?:[;()]|$))", re.M)


def _hints(text: str) -> list[str]:
    return [h.strip() for h in HINT.findall(text)]


def _run_hint(env: dict, hint: str) -> subprocess.CompletedProcess:
    words = shlex.split(hint)
    assert words[:2] == ["shoal", "get"], hint
    proc = subprocess.run([*CLI, *words[1:]], env=env, capture_output=True, timeout=WAIT_S)
    assert proc.returncode == 0, f"{hint} -> {proc.returncode}: {proc.stderr!r}"
    assert proc.stdout, f"{hint} wrote nothing"
    return proc


def test_every_hint_the_cli_prints_works_when_pasted(env):
    """Previews, match results and pages name `shoal get` commands: each one is run as
    printed, and it writes all it promises (lines counted from 1, inclusive)."""
    src = "seq 1 300000; seq 1 5000 | sed s/^/e/ >&2"
    ran = shoal(env, "exec", src)  # not a terminal: the bounded preview with its hints
    hints = _hints(ran.stdout + ran.stderr)
    assert hints, ran.stdout[-2000:]
    ref = re.search(r"out:\d+", hints[0]).group(0)
    match = shoal(env, "get", ref, "--match", "^12", "--max", "3")
    hints += _hints(match.stdout)
    raw = shoal(env, "get", ref, "--path", ".out")
    hints += _hints(raw.stdout + raw.stderr)
    assert any("--from-line" in h for h in hints), hints
    assert any("--path .err" in h for h in hints), hints
    for hint in hints:
        assert "shoal_get" not in hint and "{" not in hint, hint
        out = _run_hint(env, hint).stdout.decode()
        lines = re.search(r"--lines (-?\d*)\.\.(-?\d*)", hint)
        if lines and "--path .err" not in hint:
            first, last = int(lines.group(1)), int(lines.group(2))
            got = out.split("\n")
            assert got[0] == str(first) and got[last - first] == str(last), hint
            assert len([g for g in got if g]) == last - first + 1, hint
        if "--from-line" in hint:
            start = int(re.search(r"--from-line (\d+)", hint).group(1))
            numbers = [int(m) for m in re.findall(r"^(\d+):", out, re.M)]
            assert numbers and min(numbers) >= start, (hint, out[:300])
    # --format raw writes every byte, paging through the kernel.
    full = subprocess.run(
        [*CLI, "get", ref, "--format", "raw"], env=env, capture_output=True, timeout=WAIT_S
    )
    expected = "".join(f"{i}\n" for i in range(1, 300001)).encode()
    assert full.stdout == expected


def test_a_pruned_output_is_an_error_on_stderr(env):
    shoal(env, "exec", "echo soon-pruned")
    shoal(env, "gc", "--older-than", "0s", "--delete")
    for args in (
        ["get", "out:1"],
        ["get", "out:1", "--lines", "1..2"],
        ["get", "out:1", "--format", "raw"],
    ):
        proc = shoal(env, *args, check=False)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert "removed by shoal gc" in proc.stderr and proc.stdout == ""


def _ping(env: dict) -> dict:
    from shoal_mcp.client import KernelClient

    client = KernelClient(Path(env["SHOAL_SOCKET"]))
    try:
        return client.call("ping", {})["kernel"]
    finally:
        client.close()


@pytest.mark.landlock
def test_kernel_toml_require_token_and_sandbox_survive_autostart_and_restart(env):
    if landlock_evidence() is None:
        pytest.skip("sandbox = required needs Landlock")
    config = Path(env["XDG_CONFIG_HOME"]) / "shoal" / "kernel.toml"
    config.write_text('require_token = true\nsandbox = "required"\n')
    refused = shoal(env, "exec", "echo hi", check=False)  # autostarts from kernel.toml
    assert refused.returncode == 125 and "requires a token" in refused.stderr
    first = _ping(env)
    assert first["sandbox"]["mode"] == "required"
    restarted = shoal(env, "kernel", "restart")
    assert f"was pid {first['pid']}" in restarted.stdout
    second = _ping(env)
    assert second["pid"] != first["pid"] and second["sandbox"]["mode"] == "required"
    again = shoal(env, "exec", "echo hi", check=False)
    assert again.returncode == 125 and "requires a token" in again.stderr
    bearer = shoal(env, "token", "create", "agent")
    assert bearer.stdout.count("\n") == 1  # only the bearer on stdout: $(...) captures it
    with_token = {**env, "SHOAL_TOKEN": bearer.stdout.strip()}
    assert shoal(with_token, "kernel", "status", "--json").returncode == 0


def test_a_bad_policy_is_refused_by_check_and_reload_and_the_kernel_keeps_its_own(
    env, short_tmp_path
):
    config = Path(env["XDG_CONFIG_HOME"]) / "shoal" / "kernel.toml"
    good = short_tmp_path / "good.toml"
    good.write_text('[principal."agent"]\nproc_spawn = ["git"]\n')
    bad = short_tmp_path / "bad.toml"
    bad.write_text('[principal."agent"]\nproc_spwan = ["git"]\n')
    config.write_text(f'policy = "{good}"\n')
    shoal(env, "kernel", "start")
    before = json.loads(shoal(env, "kernel", "status", "--json").stdout)
    assert before["policy"] == str(good)

    checked = shoal(env, "policy", "check", str(bad), check=False)
    assert checked.returncode == 1
    assert "proc_spwan" in checked.stderr and "did you mean proc_spawn" in checked.stderr
    assert shoal(env, "policy", "check", str(good)).stdout.startswith("ok:")

    config.write_text(f'policy = "{bad}"\n')
    reloaded = shoal(env, "kernel", "reload", check=False)
    assert reloaded.returncode == 2 and "did you mean proc_spawn" in reloaded.stderr
    restart = shoal(env, "kernel", "restart", check=False)
    assert restart.returncode == 1 and "left as it is" in restart.stderr
    after = json.loads(shoal(env, "kernel", "status", "--json").stdout)
    assert (after["pid"], after["policy"]) == (before["pid"], str(good))
    assert shoal(env, "exec", "echo still-serving").stdout == "still-serving\n"

    other = short_tmp_path / "other.toml"
    other.write_text('[principal."other"]\nproc_spawn = ["ls"]\n')
    config.write_text(f'policy = "{other}"\nrequire_token = false\n')
    assert "reloaded" in shoal(env, "kernel", "reload").stdout
    now = json.loads(shoal(env, "kernel", "status", "--json").stdout)
    assert (now["pid"], now["policy"]) == (before["pid"], str(other))

    config.write_text("require_tokn = true\n")
    typo = shoal(env, "kernel", "reload", check=False)
    assert typo.returncode == 2 and "did you mean require_token" in typo.stderr


def test_journal_since_a_duration_with_session_and_cwd_as_a_json_array(env):
    shoal(env, "exec", "echo journaled")
    rows = json.loads(shoal(env, "journal", "--since", "5m", "--json").stdout)
    assert isinstance(rows, list) and rows[-1]["src"] == "echo journaled"
    session = rows[-1]["session"]
    table = shoal(env, "journal", "--since", "1h").stdout
    assert "SESSION" in table and "CWD" in table and session in table
    assert json.loads(shoal(env, "journal", "--session", "no-such", "--json").stdout) == []
    assert shoal(env, "journal", "--since", "soon", check=False).returncode == 2


def test_the_cli_env_is_not_the_sessions_and_it_says_so(env):
    shoal(env, "kernel", "start")  # sessions start from the kernel's env, not this one
    with_var = {**env, "SHOAL_TEST_ONLY_HERE": "x"}
    ran = shoal(with_var, "exec", "echo [$SHOAL_TEST_ONLY_HERE]")
    assert ran.stdout == "[]\n"
    assert "$SHOAL_TEST_ONLY_HERE is set in this shell but not in the shoal session" in ran.stderr
    assert "shoal exec 'export SHOAL_TEST_ONLY_HERE=VALUE'" in ran.stderr


def test_doctor_reports_a_kernel_whose_package_changed_on_disk(env):
    shoal(env, "kernel", "start")
    checks = json.loads(shoal(env, "doctor", "--json", check=False).stdout)
    package = next(c for c in checks if c["check"] == "kernel package")
    assert package["status"] == "ok", package
    import shoal_mcp

    module = Path(shoal_mcp.__file__).parent / "tokens.py"
    stat = module.stat()
    os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    try:
        checks = json.loads(shoal(env, "doctor", "--json", check=False).stdout)
        ran = shoal(env, "exec", "echo still-runs")
    finally:
        os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    package = next(c for c in checks if c["check"] == "kernel package")
    assert package["status"] == "fail" and "shoal kernel restart" in package["detail"]
    # Every client says so too, once, at attach.
    assert ran.stdout == "still-runs\n"
    assert "package changed on disk" in ran.stderr and "shoal kernel restart" in ran.stderr
