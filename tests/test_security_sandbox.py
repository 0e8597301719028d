"""The attack corpus of issue 13, live: what the OS sandbox stops that analysis cannot.

Every case below once ran past the static analysis and wrote outside its grants.  Here
each runs through a real kernel for four principals:

* ``agent:ls``    only ``ls`` granted, ``opaque``/``ungranted`` = deny (the issue's policy);
* ``agent:allow`` the same with ``opaque = "allow"``;
* ``agent:all``   every program, ``opaque = "allow"``, ``ungranted = "ask"``: whatever the
  analysis flags is approved by the human and applied, so *every* case really runs and
  only the sandbox stands between it and the target;
* the local human, unsandboxed by default: the same corpus *does* write there, which
  shows each case is a working attack and that the sandbox is off for the human.

Checked for each: no file created outside the grants, nothing of the state dir copied
into the project, no TCP connection to a listener without a grant, no connection to
the kernel's socket.  Marked ``landlock``: fails, not skips, where Landlock exists.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from shoal_mcp.client import KernelClient
from shoal_mcp.kernel.access import sandbox
from shoal_mcp.protocol.errors import RpcError
from shoal_mcp.tokens import TokenStore
from tests.support.egress import expected_enforced
from tests.support.kernel import KernelProcess
from tests.support.landlock import landlock_evidence
from tests.support.polling import wait_until
from tests.support.tmp import short_tmp

pytestmark = pytest.mark.landlock

DENIED, APPROVAL_REQUIRED, INVALID_PARAMS = -32010, -32011, -32602
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3"

POLICY = """
[principal."agent:ls"]
proc_spawn = ["ls"]
ungranted = "deny"
opaque = "deny"
[principal."agent:ls".fs]
read = ["{proj}/**"]
write = ["{proj}/**"]

[principal."agent:allow"]
proc_spawn = ["ls"]
ungranted = "deny"
opaque = "allow"
[principal."agent:allow".fs]
read = ["{proj}/**"]
write = ["{proj}/**"]

[principal."agent:all"]
proc_spawn = ["*"]
env_write = ["*", "PATH"]  # PATH is protected: a glob does not grant it
env_read = ["*"]
ungranted = "ask"
opaque = "allow"
[principal."agent:all".fs]
read = ["{proj}/**"]
write = ["{proj}/**"]

[principal."agent:net"]
proc_spawn = ["*"]
opaque = "allow"
net_connect = ["127.0.0.1:{port}"]
[principal."agent:net".fs]
read = ["{proj}/**"]
write = ["{proj}/**"]
"""

AGENTS = ("agent:ls", "agent:allow", "agent:all")

# name -> the exec sources, run in order in one fresh session.  {out}/NAME is the file a
# writer case tries to create; {proj} is granted; {state} is the kernel's state dir.
WRITERS: dict[str, list[str]] = {
    "array-subscript": ["a[$(touch {out}/array-subscript)]=1"],
    "arith-indirect": ["x='a[$(touch {out}/arith-indirect)]'; (( x ))"],
    "printf-v": ["printf -v 'a[$(touch {out}/printf-v)]' x"],
    "prompt-expand": ["x='$(touch {out}/prompt-expand)'; echo \"${{x@P}}\""],
    "alias": ["shopt -s expand_aliases\nalias ls='touch {out}/alias; :'\nls"],
    "crlf-backslash": ["echo hi \\\r\ntouch {out}/crlf-backslash"],
    "heredoc-backticks": ["ls >/dev/null <<EOF\n`touch {out}/heredoc-backticks`\nEOF"],
    "proc-fd-path": ["echo p > /proc/self/fd/../../..{out}/proc-fd-path"],
    "sed-e": ["sed -n '1e touch {out}/sed-e' {proj}/f.txt"],
    "sed-w": ["sed -n 'w {out}/sed-w' {proj}/f.txt"],
    "tar-checkpoint": [
        "tar -cf /dev/null --checkpoint=1 --checkpoint-action=exec='touch {out}/tar-checkpoint'"
        " -C {proj} f.txt"
    ],
    "tar-to-command": ["tar -xf {proj}/a.tar --to-command='touch {out}/tar-to-command'"],
    "git-diff-output": [
        "git diff --no-index --output={out}/git-diff-output {proj}/f.txt {proj}/g.txt"
    ],
    "git-grep-O": ["cd {proj}/repo && git grep -O'touch {out}/git-grep-O; true' hello"],
    "git-init": ["git init -q {out}/git-init"],
    "core-fsmonitor": [
        "git -C {proj}/repo config core.fsmonitor 'touch {out}/core-fsmonitor; false'",
        "git -C {proj}/repo status --short",
    ],
    "symlink-out": ["ln -sfn {out} {proj}/link", "echo x > {proj}/link/symlink-out"],
    "bash-env": [
        "printf 'touch {out}/bash-env\\n' > {proj}/env.sh; \\export BASH_ENV={proj}/env.sh",
        "true",
    ],
    "bash-env-expansion": ["\\export BASH_ENV='$(touch {out}/bash-env-expansion)'", "true"],
    "set-a-read": [
        "set -a; read -r BASH_ENV <<< '$(touch {out}/set-a-read)'",
        "true",
    ],
    "python-c": [PYTHON + " -c \"open('{out}/python-c', 'w')\""],
    "ld-preload": ["LD_PRELOAD={proj}/evil.so ls >/dev/null"],
    "function": ["f() {{ touch {out}/function; }}; f"],
    "trap": ["trap 'touch {out}/trap' EXIT; ls >/dev/null"],
    "exec-fd": ["exec {{fd}}>{out}/exec-fd; echo x >&$fd"],
    "eval": ["eval 'touch {out}/eval'"],
    "bash-c": ["bash -c 'touch {out}/bash-c'"],
    "xargs": ["echo {out}/xargs | xargs touch"],
}
# Copy the kernel's secrets into the (writable) project: reading the state dir.
READERS: dict[str, list[str]] = {
    "read-key": ["cat {state}/tokens.key > {proj}/leak-read-key"],
    "read-listing": ["ls -a {state} > {proj}/leak-read-listing"],
    "read-python": [
        PYTHON
        + " -c \"import shutil; shutil.copy('{state}/tokens.key', '{proj}/leak-read-python')\""
    ],
    "read-journal": ["cp {state}/journal.sqlite3 {proj}/leak-read-journal"],
}
SOCKET_CASE = (
    PYTHON + ' -c "import socket; s = socket.socket(socket.AF_UNIX); '
    "s.connect('{sock}'); open('{proj}/kernel-socket', 'w')\""
)
TCP_CASE = "echo hi > /dev/tcp/127.0.0.1/{port}"
CONNECT = PYTHON + " -c \"import socket; socket.create_connection(('127.0.0.1', {port})).close()\""
CONNECT_VIA_PROXY = (
    PYTHON + " -c \"import socket; s = socket.create_connection(('127.0.0.1', 3128)); "
    "s.sendall(b'CONNECT 127.0.0.1:{port} HTTP/1.1\\r\\n\\r\\n'); r = s.recv(200); "
    "assert r.startswith(b'HTTP/1.1 200'), r; s.close()\""
)
PTY_CASE = "!touch {out}/pty-less; touch {proj}/pty-ran-{tag}\r"

EVIL_SO = r"""
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void evil(void) { close(creat("%s/ld-preload", 0644)); }
"""


class Listener:
    """A TCP listener on 127.0.0.1 that counts the connections made to it.

    No accept thread: ``settled_count`` accepts in the caller's thread until it meets a
    probe of its own, so every connection made before the call is counted (accept order
    is arrival order) and nothing depends on a thread keeping up (one that fell behind,
    or died on an aborted connection, made this test flaky)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.sock.settimeout(30)
        self.port = self.sock.getsockname()[1]
        self.peers: list[int] = []

    def settled_count(self) -> int:
        """Connections so far, our own probes not counted."""
        with socket.create_connection(("127.0.0.1", self.port)) as probe:
            mine = probe.getsockname()[1]
        while True:
            try:
                conn, peer = self.sock.accept()  # TimeoutError after 30 s: a clear failure
            except ConnectionAbortedError:
                continue  # gone before its accept: it never reached the listener
            conn.close()
            if peer[1] == mine:
                return len(self.peers)
            self.peers.append(peer[1])

    def close(self) -> None:
        self.sock.close()


@dataclass
class World:
    kernel: KernelProcess
    tokens: dict[str, str]
    proj: Path
    outs: dict[str, Path]  # principal -> its own "outside" dir
    listener: Listener
    other: Listener
    approved: set[str] = field(default_factory=set)  # fs targets of approved plans

    def fmt(self, src: str, who: str) -> str:
        return src.format(
            out=self.outs[who],
            proj=self.proj,
            state=self.kernel.state,
            sock=self.kernel.socket,
            port=self.listener.port,
            tag=who.replace(":", "-"),
        )

    def client(self, who: str, session: str) -> KernelClient:
        return self.kernel.client(session, token=self.tokens.get(who))


def _abi_or_skip() -> None:
    try:
        sandbox.landlock.abi_version()
    except sandbox.landlock.LandlockUnavailable as e:
        pytest.skip(f"{e} (evidence of Landlock: {landlock_evidence()})")


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    _abi_or_skip()
    with short_tmp("shsb") as tmp:
        proj = tmp / "proj"
        proj.mkdir()
        (proj / "f.txt").write_text("hello\n")
        (proj / "g.txt").write_text("world\n")
        subprocess.run(["tar", "-cf", str(proj / "a.tar"), "-C", str(proj), "f.txt"], check=True)
        repo = proj / "repo"
        repo.mkdir()
        git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run([*git, "init", "-q"], check=True)
        (repo / "h.txt").write_text("hello\n")
        subprocess.run([*git, "add", "h.txt"], check=True)
        subprocess.run([*git, "commit", "-qm", "x"], check=True)
        outs = {}
        for who in (*AGENTS, "human", "agent:net"):
            outs[who] = tmp / ("out-" + who.replace(":", "-"))
            outs[who].mkdir()
        listener, other = Listener(), Listener()
        policy = tmp / "policy.toml"
        policy.write_text(POLICY.format(proj=proj, port=listener.port))
        kernel = KernelProcess(tmp, "--policy", str(policy), "--sandbox", "required")
        store = TokenStore(kernel.state / "tokens.json")
        tokens = {p: store.create(p)[1] for p in (*AGENTS, "agent:net")}
        kernel.start()
        if shutil.which("gcc"):  # the LD_PRELOAD library; without a compiler that case is moot
            for who in (*AGENTS, "human"):
                so = tmp / f"evil-{who.replace(':', '-')}.c"
                so.write_text(EVIL_SO % outs[who])
        try:
            yield World(kernel, tokens, proj, outs, listener, other)
        finally:
            kernel.stop()
            listener.close()
            other.close()


def _build_so(w: World, who: str) -> None:
    src = w.kernel.tmp / f"evil-{who.replace(':', '-')}.c"
    if src.exists():
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-o", str(w.proj / "evil.so"), str(src)], check=True
        )


def _run(w: World, who: str, session: str, src: str) -> str:
    """Run ``src`` as ``who``; agent:all's flagged plans are approved by the human and
    applied.  Returns how it went: ran | denied | approval."""
    c = w.client(who, session)
    try:
        try:
            c.call("exec", {"src": src, "position": "value"}, timeout=60)
            return "ran"
        except RpcError as e:
            if e.code == DENIED:
                return "denied"
            if e.code != APPROVAL_REQUIRED or who != "agent:all":
                return f"error {e.code}" if e.code != APPROVAL_REQUIRED else "approval"
            ref = e.data["plan_ref"]
        c.call("cap.request", {"plan_ref": ref})
        human = w.client("human", "approver")
        try:
            decided = human.call("cap.decide", {"plan_ref": ref, "approve": True})
            # An approval grants the targets the plan names (issue 26), nothing hidden.
            w.approved.update(
                e["target"] for e in decided["effects"] if e["kind"] in ("fs_write", "fs_delete")
            )
        except RpcError as e:
            # A plan the analysis cannot name (opaque) is approvable only as an unconfined
            # run (issue 26), which this human does not give: nothing runs.
            if e.code != INVALID_PARAMS or "unconfined" not in str(e):
                raise
            return "opaque: approvable only unconfined"
        finally:
            human.close()
        c.call("plan.apply", {"plan_ref": ref, "position": "value"}, timeout=60)
        return "ran"
    finally:
        c.close()


def _run_corpus(w: World, who: str) -> dict[str, list[str]]:
    outcomes: dict[str, list[str]] = {}
    for name, steps in {**WRITERS, **READERS}.items():
        if name == "ld-preload":
            _build_so(w, who)
        session = f"{who.replace(':', '-')}-{name}"
        outcomes[name] = [_run(w, who, session, w.fmt(s, who)) for s in steps]
    return outcomes


def _leaks(w: World) -> list[str]:
    found = sorted(p.name for p in w.proj.glob("leak-*") if p.stat().st_size > 0)
    for p in w.proj.glob("leak-*"):
        p.unlink()
    return found


def _reset_repo(w: World) -> None:
    subprocess.run(
        ["git", "-C", str(w.proj / "repo"), "config", "--unset", "core.fsmonitor"], check=False
    )
    (w.proj / "link").unlink(missing_ok=True)


@pytest.mark.parametrize("who", AGENTS)
def test_corpus_cannot_leave_the_grants(world: World, who: str) -> None:
    _reset_repo(world)
    outcomes = _run_corpus(world, who)
    # Written outside the grants: only what an approved plan named as its target (the
    # human approved exactly that write); nothing the analysis could not see.
    written = sorted(p.name for p in world.outs[who].iterdir() if str(p) not in world.approved)
    assert written == [], f"{who} wrote outside its grants: {written}; outcomes {outcomes}"
    assert _leaks(world) == [], f"{who} read the state dir; outcomes {outcomes}"
    if who == "agent:all":  # nothing was refused: the sandbox alone stopped every case
        ran = ("ran", "opaque: approvable only unconfined")  # opaque: not run at all
        refused = {n: o for n, o in outcomes.items() if any(x not in ran for x in o)}
        assert refused == {}, refused


def test_same_corpus_writes_as_the_local_human(world: World) -> None:
    """The sandbox is off for the local human: every case reaches its target."""
    _reset_repo(world)
    outcomes = _run_corpus(world, "human")
    written = {p.name for p in world.outs["human"].iterdir()}
    missing = sorted(
        set(WRITERS) - written - ({"ld-preload"} if not shutil.which("gcc") else set())
    )
    assert missing == [], f"cases that did not work unsandboxed: {missing}; {outcomes}"
    assert _leaks(world) == sorted(f"leak-{n}" for n in READERS)
    _reset_repo(world)


@pytest.mark.parametrize("who", [*AGENTS, "human"])
def test_kernel_socket_and_tcp(world: World, who: str) -> None:
    marker = world.proj / "kernel-socket"
    marker.unlink(missing_ok=True)
    before = world.listener.settled_count()
    session = f"net-{who.replace(':', '-')}"
    _run(world, who, session, world.fmt(SOCKET_CASE, who))
    _run(world, who, session, world.fmt(TCP_CASE, who))
    if who == "human":
        assert marker.exists() and world.listener.settled_count() > before
    else:
        assert not marker.exists()
        assert world.listener.settled_count() == before


def test_net_grant_opens_exactly_its_port(world: World) -> None:
    """A grant goes through the egress proxy (issue 27): the granted address and port
    (named by the policy, so loopback is allowed) through a CONNECT; another port is
    refused by the proxy (403); a direct connect has no route at all."""
    before, other_before = world.listener.settled_count(), world.other.settled_count()
    c = world.client("agent:net", "net-grant")
    try:
        c.call("exec", {"src": CONNECT_VIA_PROXY.format(port=world.listener.port)}, timeout=60)
        with pytest.raises(RpcError) as exc:  # another port: the proxy refuses it
            c.call("exec", {"src": CONNECT_VIA_PROXY.format(port=world.other.port)}, timeout=60)
        assert "403" in exc.value.data["stderr_tail"]
        with pytest.raises(RpcError) as exc:  # around the proxy: no route (and Landlock)
            c.call("exec", {"src": CONNECT.format(port=world.listener.port)}, timeout=60)
        assert "Error" in exc.value.data["stderr_tail"]
    finally:
        c.close()
    wait_until(lambda: world.listener.settled_count() == before + 1, what="the granted one")
    assert world.other.settled_count() == other_before


@pytest.mark.parametrize("who", ["agent:all", "human"])
def test_pty_less_shell_escape_is_confined(world: World, who: str) -> None:
    tag = who.replace(":", "-")
    ran = world.proj / f"pty-ran-{tag}"
    c = world.client(who, f"pty-{tag}")
    # less's `!cmd` where less exists; otherwise an interactive sh on the terminal (the
    # point is the same: what a PTY program starts is confined with it).
    pager = shutil.which("less") is not None
    cmd = ["less", str(world.proj / "f.txt")] if pager else ["sh", "-i"]
    try:
        pty = c.call("pty.open", {"cmd": cmd[0], "args": cmd[1:]}, timeout=30)["pty_id"]
        if pager:
            wait_until(lambda: "hello" in "\n".join(c.call("pty.read", {"pty_id": pty})["screen"]))
        case = world.fmt(PTY_CASE, who)
        c.call("pty.send", {"pty_id": pty, "input": case if pager else case[1:]})
        wait_until(ran.exists, timeout=30, what="the PTY program to run the command")
        c.call("pty.close", {"pty_id": pty})
    finally:
        c.close()
    assert (world.outs[who] / "pty-less").exists() == (who == "human")
    (world.outs[who] / "pty-less").unlink(missing_ok=True)


def test_caps_tell_the_truth(world: World) -> None:
    enforced = expected_enforced()
    assert isinstance(enforced, dict)
    for who in AGENTS:
        c = KernelClient(world.kernel.socket)
        try:
            got = c.call("session.attach", {"session": "caps", "token": world.tokens[who]})
            assert got["caps"]["enforced"] == enforced and got["caps"]["sandbox"] == "required"
        finally:
            c.close()
    human = world.client("human", "caps")
    try:
        assert human.call("session.attach", {"session": "caps"})["caps"]["enforced"] is False
        assert human.call("ping")["kernel"]["sandbox"]["enforced"] == enforced
    finally:
        human.close()


def test_reef_probes_run_confined(world: World) -> None:
    """A planted ``bash`` on the session PATH runs inside the sandbox, not in the kernel."""
    fake = world.proj / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "bash").write_text(f"#!/bin/sh\ntouch {world.outs['agent:all']}/reef\necho fake 1\n")
    (fake / "bash").chmod(0o755)
    c = world.client("agent:all", "reef")
    try:
        c.call("exec", {"src": f"export PATH={fake}:$PATH"}, timeout=60)
        got = c.call("session.reef", timeout=60)
    finally:
        c.close()
    bash = next(t for t in got["tools"] if t["name"] == "bash")
    assert bash["path"] == str(fake / "bash") and bash["version"] == "fake 1"  # it did run
    assert not (world.outs["agent:all"] / "reef").exists()  # but confined


DEFAULT_POLICY = """
[principal."agent:d"]
proc_spawn = ["touch", "eval"]
[principal."agent:d".fs]
read = ["{proj}/**"]
write = ["{proj}/**"]
"""


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_opaque_defaults_to_sandbox_only_where_it_enforces(mode: str) -> None:
    """Unset ``opaque``: confined opaque work runs without approval (and stays inside the
    grants) under an enforcing sandbox; with ``--sandbox off`` it is denied, and caps say
    nothing is enforced.  Plans keep showing the predicted (opaque) effect either way."""
    _abi_or_skip()
    with short_tmp("shsd") as tmp:
        proj, out = tmp / "proj", tmp / "out"
        proj.mkdir()
        out.mkdir()
        policy = tmp / "policy.toml"
        policy.write_text(DEFAULT_POLICY.format(proj=proj))
        kernel = KernelProcess(tmp, "--policy", str(policy), "--sandbox", mode)
        token = TokenStore(kernel.state / "tokens.json").create("agent:d")[1]
        kernel.start()
        try:
            c = KernelClient(kernel.socket)
            attached = c.call("session.attach", {"session": "d", "token": token})
            src = f"eval 'touch {proj}/inside'; eval 'touch {out}/outside'"
            planned = c.call("exec", {"src": src, "mode": "plan"})
            assert "opaque" in {e["kind"] for e in planned["effects"]}
            if mode == "auto":
                assert attached["caps"]["enforced"] == expected_enforced()
                assert planned["verdict"] == "allow"
                c.call("exec", {"src": src, "position": "value"}, timeout=60)
                assert (proj / "inside").exists() and not (out / "outside").exists()
            else:
                assert attached["caps"]["enforced"] is False
                assert c.call("ping")["kernel"]["sandbox"]["reason"] == "--sandbox off"
                with pytest.raises(RpcError) as exc:
                    c.call("exec", {"src": src}, timeout=60)
                assert exc.value.code == DENIED
                assert not (proj / "inside").exists()
            c.close()
        finally:
            kernel.stop()


def test_local_human_is_confined_when_its_policy_says_so() -> None:
    _abi_or_skip()
    with short_tmp("shsh") as tmp:
        proj, out = tmp / "proj", tmp / "out"
        proj.mkdir()
        out.mkdir()
        policy = tmp / "policy.toml"
        policy.write_text(
            f'[principal."uid:{os.geteuid()}"]\nproc_spawn = ["*"]\nopaque = "allow"\n'
            f"sandbox = true\n"
            f'[principal."uid:{os.geteuid()}".fs]\nread = ["{proj}/**"]\nwrite = ["{proj}/**"]\n'
        )
        kernel = KernelProcess(tmp, "--policy", str(policy)).start()
        try:
            c = kernel.client("me")
            caps = c.call("session.attach", {"session": "me"})["caps"]
            assert caps["enforced"] == expected_enforced() and caps["approver"] is True
            c.call("exec", {"src": f"eval 'touch {proj}/in {out}/x'", "position": "value"})
            assert (proj / "in").exists() and not (out / "x").exists()
            c.close()
        finally:
            kernel.stop()


def test_reef_does_not_probe_when_the_sandbox_cannot_hold() -> None:
    """A token principal on a ``--sandbox off`` kernel: reef names the planted ``bash``
    but never runs it (no version), since nothing would confine it."""
    with short_tmp("shsr") as tmp:
        fake = tmp / "proj" / "bin"
        fake.mkdir(parents=True)
        (fake / "bash").write_text(f"#!/bin/sh\ntouch {tmp}/planted-ran\necho fake 1\n")
        (fake / "bash").chmod(0o755)
        policy = tmp / "policy.toml"
        policy.write_text(
            '[principal."agent:r"]\nproc_spawn = ["true"]\nenv_write = ["PATH"]\n'
            'env_read = ["PATH"]\n'
        )
        kernel = KernelProcess(tmp, "--policy", str(policy), "--sandbox", "off")
        token = TokenStore(kernel.state / "tokens.json").create("agent:r")[1]
        kernel.start()
        try:
            c = kernel.client("r", token=token)
            c.call("exec", {"src": f"export PATH={fake}:$PATH"}, timeout=60)
            got = c.call("session.reef", timeout=60)
            c.close()
        finally:
            kernel.stop()
        bash = next(t for t in got["tools"] if t["name"] == "bash")
        assert bash["path"] == str(fake / "bash") and "version" not in bash
        assert "not probed" in got["versions"]
        assert not (tmp / "planted-ran").exists()
