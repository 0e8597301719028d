"""Safe by default (issue 26): the agent a newcomer connects is sandboxed.

``shoal-mcp`` is started exactly as ``shoal mcp-config`` prints it, with the MCP SDK's
default environment (HOME, LOGNAME, PATH, SHELL, TERM, USER) and no token, in a git
project.  It attaches as ``agent:mcp``: writes only in its project, ``$TMPDIR`` and
``~/.cache``; reads everything but the secrets; no network; a refusal says what to ask
for; an approval grants exactly the targets approved, once or for the session.  Live,
through a real kernel; the human side (approvals, grants) through the kernel socket as
the local human, who is the approver.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from shoal_mcp.kernel.access.sandbox_build import HOME_SECRETS
from shoal_mcp.protocol.limits import AGENT_PRINCIPAL
from tests.support.facade import RawFacade
from tests.support.kernel import KernelProcess
from tests.support.tmp import short_tmp

pytestmark = pytest.mark.landlock

SECRET = "TOPSECRET-7c1d"
SDK_DEFAULT_ENV = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER")
PYPROJECT = """[build-system]
requires = []
build-backend = "editable_backend"
backend-path = ["_build"]
"""
BACKEND = '''"""A PEP 517 backend for this test's project: editable installs with nothing to
download (a sandboxed agent has no network, and the venv has no wheel package)."""
import base64, hashlib, os, zipfile

NAME, VERSION = "agentpkg", "0.1"
DIST = f"{NAME}-{VERSION}.dist-info"


def get_requires_for_build_editable(config_settings=None):
    return []


def _metadata(directory):
    os.makedirs(os.path.join(directory, DIST), exist_ok=True)
    with open(os.path.join(directory, DIST, "METADATA"), "w") as fh:
        fh.write(f"Metadata-Version: 2.1\\nName: {NAME}\\nVersion: {VERSION}\\n")
    return DIST


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    return _metadata(metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    name = f"{NAME}-{VERSION}-py3-none-any.whl"
    files = {
        f"{NAME}.pth": os.getcwd() + "\\n",
        f"{DIST}/METADATA": f"Metadata-Version: 2.1\\nName: {NAME}\\nVersion: {VERSION}\\n",
        f"{DIST}/WHEEL": "Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
    }
    record = []
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as zf:
        for path, text in files.items():
            data = text.encode()
            zf.writestr(path, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{path},sha256={digest},{len(data)}")
        record.append(f"{DIST}/RECORD,,")
        zf.writestr(f"{DIST}/RECORD", "\\n".join(record) + "\\n")
    return name
'''
OFFLINE_EDITABLE = "--no-build-isolation --no-deps --no-index -e ."
"""An editable install with no network: the project's own in-tree build backend."""


@dataclass
class World:
    kernel: KernelProcess
    facade: RawFacade
    home: Path
    proj: Path
    outside: Path
    init: dict

    def exec(self, command: str, timeout: float = 120.0) -> dict:
        """``shoal_exec`` through the facade; its structured result (the kernel's reply,
        or the error for a kernel error)."""
        reply = self.facade.tool("shoal_exec", {"command": command}, timeout)
        assert "result" in reply, reply
        text = "".join(c.get("text", "") for c in reply["result"]["content"])
        return {**reply["result"]["structuredContent"], "_text": text}

    def human(self):
        return self.kernel.client(f"human-{os.getpid()}")


def _out(result: dict) -> str:
    """What the agent was shown of a result: its text (the render: stdout, stderr tail)."""
    return str(result.get("_text", ""))


SECRET_DIRS = {
    ".ssh", ".gnupg", ".aws", ".azure", ".config/gcloud", ".kube", ".config/gh",
    ".config/hub", ".password-store", ".local/share/keyrings", ".config/op", ".mozilla",
    ".config/google-chrome", ".config/chromium", ".config/BraveSoftware",
}  # fmt: skip


def _plant_secrets(home: Path) -> None:
    """Every listed secret, as a file (or a directory holding one) with a marker."""
    for rel in HOME_SECRETS:
        path = home / rel
        if rel in SECRET_DIRS:
            path.mkdir(parents=True, exist_ok=True)
            (path / "secret").write_text(f"{SECRET} {rel}\n")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{SECRET} {rel}\n")


def _mcp_config(kernel: KernelProcess, env: dict[str, str]) -> dict:
    """The ``mcpServers`` entry ``shoal mcp-config`` prints for this kernel."""
    out = subprocess.run(
        [sys.executable, "-c", "from shoal_mcp.cli import run; run()", "--socket",
         str(kernel.socket), "--state-dir", str(kernel.state), "mcp-config"],
        capture_output=True, text=True, env=env, check=True,
    ).stdout  # fmt: skip
    block = out[out.index("{") :]
    return json.loads(block)["mcpServers"]["shoal"]


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with short_tmp("shda") as tmp:
        home = tmp / "home"
        home.mkdir()
        _plant_secrets(home)
        (home / ".bashrc").write_text("# the human's\n")
        (home / ".cache").mkdir(exist_ok=True)
        proj = tmp / "proj"
        proj.mkdir()
        git = ["git", "-C", str(proj), "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run([*git, "init", "-q"], check=True)
        (proj / "pyproject.toml").write_text(PYPROJECT)
        (proj / "_build").mkdir()
        (proj / "_build" / "editable_backend.py").write_text(BACKEND)
        (proj / "agentpkg").mkdir()
        (proj / "agentpkg" / "__init__.py").write_text("VALUE = 42\n")
        outside = tmp / "outside"
        outside.mkdir()
        kernel = KernelProcess(tmp, "--sandbox", "required", env={"HOME": str(home)})
        kernel.start()
        sdk_env = {k: os.environ[k] for k in SDK_DEFAULT_ENV if k in os.environ}
        sdk_env["HOME"] = str(home)
        server = _mcp_config(kernel, {**os.environ, "HOME": str(home)})
        env = {**sdk_env, **server.get("env", {})}
        assert "SHOAL_UNCONFINED" not in env and "SHOAL_TOKEN" not in env
        facade = RawFacade(env, cwd=proj, command=[server["command"], *server.get("args", [])])
        try:
            init = facade.initialize()
            yield World(kernel, facade, home, proj, outside, init)
        finally:
            facade.close()
            kernel.stop()


def test_the_agent_is_sandboxed_and_every_view_says_so(world: World) -> None:
    instructions = world.init["result"]["instructions"]
    assert AGENT_PRINCIPAL in instructions and str(world.proj) in instructions
    result = world.exec("pwd")
    assert _out(result).startswith(str(world.proj))
    human = world.human()
    try:
        agent = human.call("ping")["kernel"]["agent"]
        assert agent["principal"] == AGENT_PRINCIPAL and agent["confined"] is True
        assert agent["enforced"]["fs"].startswith("ro-root+landlock")
        assert "opt_out" not in agent
        rows = human.call("journal.query", {"limit": 5})["rows"]
        assert any(r["principal"] == AGENT_PRINCIPAL for r in rows), rows
    finally:
        human.close()


def test_writes_only_in_its_project_tmp_and_cache(world: World) -> None:
    ok = world.exec('touch inside.txt "$TMPDIR/t" ~/.cache/c && echo wrote')
    assert "wrote" in _out(ok), ok
    assert (world.proj / "inside.txt").exists() and (world.home / ".cache" / "c").exists()
    for target in (world.outside / "x", world.home / "planted", world.home / ".bashrc"):
        refused = world.exec(f"echo pwned >> {target}")
        assert refused["value"]["ok"] is False
        assert {"access": "write", "path": str(target), "source": "os"} in refused[
            "sandbox_denied"
        ], refused
        assert refused["ask"]["plan_ref"].startswith("plan:")
    assert not (world.outside / "x").exists() and not (world.home / "planted").exists()
    assert (world.home / ".bashrc").read_text() == "# the human's\n"


@pytest.mark.parametrize("rel", HOME_SECRETS)
def test_no_listed_secret_is_readable(world: World, rel: str) -> None:
    result = world.exec(f"cat ~/{rel} ~/{rel}/* 2>&1; ls -la ~/{rel} 2>&1; true")
    assert SECRET not in _out(result), result


def test_the_state_dir_is_out_of_reach(world: World) -> None:
    state = world.kernel.state
    result = world.exec(
        f"ls -la {state}; cat {state}/tokens.key {state}/journal.sqlite3 2>&1 | head -c 200; "
        f"ls {state}/cas | head; touch {state}/x; true"
    )
    text = _out(result)
    assert "journal.sqlite3" not in text.split("cat")[0] and "SQLite format" not in text
    assert not (state / "x").exists()


def test_no_tcp_connection_leaves(world: World) -> None:
    accepted: list[object] = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        result = world.exec(
            f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo CONNECTED; "
            f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2); print('CONNECTED')\"; "
            f"curl -fsS --max-time 3 http://127.0.0.1:{port}/ && echo CONNECTED; true"
        )
        assert "CONNECTED" not in _out(result)
    finally:
        stop.set()
        thread.join(5)
        listener.close()
    assert accepted == []


def test_git_a_venv_and_an_editable_install_work_in_the_project(world: World) -> None:
    git = "git -c user.name=agent -c user.email=agent@example.com"
    result = world.exec(
        f"{git} add -A && {git} commit -qm 'by the agent' && echo COMMITTED && "
        f"python3 -m venv .venv && .venv/bin/pip install -q {OFFLINE_EDITABLE} && "
        ".venv/bin/python -c 'import agentpkg; print(agentpkg.VALUE * 2)'",
        timeout=300,
    )
    text = _out(result)
    assert "COMMITTED" in text and "84" in text, result
    log = subprocess.run(
        ["git", "-C", str(world.proj), "log", "--format=%s"], capture_output=True, text=True
    ).stdout
    assert "by the agent" in log


def test_git_hooks_and_config_are_refused(world: World) -> None:
    hook = world.proj / ".git" / "hooks" / "pre-commit"
    config = world.proj / ".git" / "config"
    before = config.read_text()
    result = world.exec(f"printf 'touch {world.outside}/hooked' > .git/hooks/pre-commit")
    config_try = world.exec("git config core.fsmonitor 'touch /tmp/fsmon'")
    assert not hook.exists() and config.read_text() == before, (result, config_try)
    assert config_try["value"]["ok"] is False
    assert str(hook) in {d["path"] for d in result.get("sandbox_denied", [])}, result


def test_an_approval_grants_exactly_the_approved_target(world: World) -> None:
    a, b = world.outside / "approved.txt", world.outside / "not-approved.txt"
    first = world.exec(f"echo one > {a}; echo two > {b}")
    assert {d["path"] for d in first["sandbox_denied"]} >= {str(a), str(b)}
    ref = first["ask"]["plan_ref"]
    asked = world.facade.tool("shoal_cap_request", {"plan_ref": ref})
    assert "result" in asked, asked
    human = world.human()
    try:
        decided = human.call(
            "cap.decide", {"plan_ref": ref, "approve": True, "targets": [f"fs_write:{a}"]}
        )
        assert decided["approved_targets"] == [f"fs_write:{a}"]
    finally:
        human.close()
    applied = world.facade.tool("shoal_apply", {"plan_ref": ref})["result"]
    applied = {**applied["structuredContent"], "_text": applied["content"][0]["text"]}
    assert a.read_text() == "one\n" and not b.exists(), applied
    assert {d["path"] for d in applied["sandbox_denied"]} == {str(b)}, (
        applied["sandbox_denied"],
        applied["_text"],
    )
    # Once: the same target is refused again afterwards.
    again = world.exec(f"echo three > {a}")
    assert a.read_text() == "one\n" and again["sandbox_denied"][0]["path"] == str(a)


def test_a_session_grant_lasts_until_revoked(world: World) -> None:
    target = world.outside / "session-grant.txt"
    target.write_text("")
    first = world.exec(f"echo 1 >> {target}")
    ref = first["ask"]["plan_ref"]
    world.facade.tool("shoal_cap_request", {"plan_ref": ref})
    human = world.human()
    try:
        human.call("cap.decide", {"plan_ref": ref, "approve": True, "scope": "session"})
        world.facade.tool("shoal_apply", {"plan_ref": ref})
        later = world.exec(f"echo 2 >> {target}")  # a later exec, no approval of its own
        assert later["value"]["ok"] is True and target.read_text() == "1\n2\n", later
        grants = human.call("grants.list")["grants"]
        assert any(str(target) in g["write"] and g["principal"] == AGENT_PRINCIPAL for g in grants)
        session = next(g["session"] for g in grants if str(target) in g["write"])
        revoker = world.kernel.client(session)
        try:
            assert revoker.call("grants.revoke", {"principal": AGENT_PRINCIPAL})["revoked"] >= 1
        finally:
            revoker.close()
    finally:
        human.close()
    after = world.exec(f"echo 3 >> {target}")
    assert after["value"]["ok"] is False and target.read_text() == "1\n2\n"


DENIAL_CASES = [
    ("write ~/.bashrc", "echo alias ls=rm >> ~/.bashrc", "write", "{home}/.bashrc"),
    ("write ~/.profile", "echo x >> ~/.profile", "write", "{home}/.profile"),
    ("read ~/.ssh key", "cat ~/.ssh/id_ed25519", "read", "{home}/.ssh/id_ed25519"),
    ("read ~/.netrc", "cat ~/.netrc", "read", "{home}/.netrc"),
    ("read aws creds", "cat ~/.aws/secret", "read", "{home}/.aws/secret"),
    ("mkdir in /opt", "mkdir /opt/agent-tool", "write", "/opt/agent-tool"),
    ("copy into /etc", "cp pyproject.toml /etc/agent.toml", "write", "/etc/agent.toml"),
    (
        "python open /usr",
        "python3 -c \"open('/usr/local/agent.txt','w')\"",
        "write",
        "/usr/local/agent.txt",
    ),
    ("write outside", "date > {outside}/date.txt", "write", "{outside}/date.txt"),
    (
        "pip --user",
        f"pip install -q --prefix ~/.local {OFFLINE_EDITABLE}",
        "write",
        "{home}/.local",
    ),
    ("curl", "curl -sS --max-time 5 https://pypi.org/simple/", "connect", "pypi.org"),
    ("git push", "git push https://github.com/example/repo.git HEAD", "connect", "github.com"),
]


@pytest.mark.parametrize(
    ("what", "command", "access", "target"), DENIAL_CASES, ids=[c[0] for c in DENIAL_CASES]
)
def test_a_denial_names_its_target(
    world: World, what: str, command: str, access: str, target: str
) -> None:
    fmt = {"home": world.home, "outside": world.outside}
    (world.home / ".ssh" / "id_ed25519").write_text(f"{SECRET}\n")
    result = world.exec(command.format(**fmt), timeout=180)
    expected = target.format(**fmt)
    named = [
        d for d in result.get("sandbox_denied", [])
        if d["access"] == access and (d.get("path", "").startswith(expected) or d.get("host") == expected)
    ]  # fmt: skip
    assert named, f"{what}: {result.get('sandbox_denied')} / {_out(result)[-600:]}"
    assert result["ask"]["plan_ref"].startswith("plan:")


@pytest.mark.parametrize(
    "command",
    [
        "cat /nonexistent/file",
        "false",
        "ls no-such-dir-here",
        "python3 -c 'raise SystemExit(3)'",
        "touch locked/f",  # a directory of the project the user made read-only
        "grep -q needle pyproject.toml",
    ],
)
def test_no_denial_is_claimed_for_other_failures(world: World, command: str) -> None:
    locked = world.proj / "locked"
    locked.mkdir(exist_ok=True)
    locked.chmod(0o555)
    try:
        result = world.exec(command)
    finally:
        locked.chmod(0o755)
    assert result["value"]["ok"] is False
    assert "sandbox_denied" not in result, result


def test_an_unconfined_opt_out_is_explicit_and_reported(world: World, tmp_path: Path) -> None:
    env = {k: os.environ[k] for k in SDK_DEFAULT_ENV if k in os.environ}
    env.update(HOME=str(world.home), SHOAL_SOCKET=str(world.kernel.socket),
               SHOAL_STATE_DIR=str(world.kernel.state))  # fmt: skip
    shoal_mcp = shutil.which("shoal-mcp", path=str(Path(sys.executable).parent)) or "shoal-mcp"
    facade = RawFacade(env, cwd=world.proj, command=[shoal_mcp, "--unconfined"])
    try:
        init = facade.initialize()
        assert "unconfined" in init["result"]["instructions"]
        reply = facade.tool("shoal_exec", {"command": f"touch {world.outside}/by-the-human"})
        assert reply["result"]["isError"] is False
        assert (world.outside / "by-the-human").exists()
    finally:
        facade.close()
    assert re.search("unconfined", init["result"]["instructions"], re.I)
