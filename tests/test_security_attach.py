"""Security evidence (issue #6): attachment, tokens and peer credentials, live over a socket.

Each test names the historical hole it guards against. No mocks: a real kernel on a
temporary socket, raw JSON lines for the unattached calls, the real CLI for tokens.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

import shoal_mcp.kernel.rpc.methods  # noqa: F401 - registers every method
from shoal_mcp.kernel.rpc.registry import REGISTRY, UNATTACHED_METHODS
from shoal_mcp.protocol.errors import RpcError
from shoal_mcp.tokens import TokenStore
from tests.support.kernel import KernelProcess
from tests.support.other_uid import NOBODY_UID, exchange_as_uid
from tests.support.wire import RawConn

NOT_ATTACHED = -32000
AUTH_FAILED = -32030

# Plausible params per method, so the attachment check is proven with requests that
# would otherwise be valid (a handler validating params first would leak -32602).
SAMPLE_PARAMS: dict[str, dict] = {
    "exec": {"src": "echo hi"},
    "explain": {"src": "echo hi"},
    "value.get": {"ref": "out:1"},
    "blob.get": {"hash": "0" * 64},
    "task.get": {"task": "task:1"},
    "task.await": {"task": "task:1", "timeout_ms": 0},
    "task.cancel": {"task": "task:1"},
    "task.suspend": {"task": "task:1"},
    "task.resume": {"task": "task:1"},
    "plan.get": {"plan_ref": "plan:" + "0" * 32},
    "plan.apply": {"plan_ref": "plan:" + "0" * 32},
    "cap.request": {"plan_ref": "plan:" + "0" * 32},
    "cap.decide": {"plan_ref": "plan:" + "0" * 32, "approve": True},
    "journal.query": {"limit": 10},
    "pty.open": {"cmd": "true"},
    "pty.send": {"pty_id": "pty:1", "input": "x"},
    "pty.read": {"pty_id": "pty:1"},
    "pty.resize": {"pty_id": "pty:1", "cols": 80, "rows": 24},
    "pty.close": {"pty_id": "pty:1"},
    "events.read": {"channel": "user.x"},
    "events.publish": {"channel": "user.x", "payload": {}},
    "events.subscribe": {"channel": "user.x"},
    "events.unsubscribe": {"subscription": "sub:1"},
}


def shoal_cli(state: Path, *args: str) -> subprocess.CompletedProcess:
    """The real `shoal` console script in a subprocess."""
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "from shoal_mcp.cli import run; run()",
            "--state-dir",
            str(state),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            k: v
            for k, v in os.environ.items()
            if k not in ("SHOAL_TOKEN", "SHOAL_SOCKET", "SHOAL_STATE_DIR")
        },
    )


@pytest.fixture
def kernel(short_tmp_path: Path):
    k = KernelProcess(short_tmp_path).start()
    yield k
    k.stop()


@pytest.fixture
def token_kernel(short_tmp_path: Path):
    k = KernelProcess(short_tmp_path, "--require-token").start()
    yield k
    k.stop()


def test_every_method_but_three_refuses_unattached_calls(kernel: KernelProcess) -> None:
    """Hole: methods answering before attachment (cap.request, journal.query did)."""
    assert {"session.attach", "parse", "ping"} == UNATTACHED_METHODS
    assert {"cap.request", "journal.query", "cap.decide", "exec"} <= set(REGISTRY)
    conn = RawConn(kernel.socket)
    try:
        # Pipeline every request, with empty and with plausible params, then read all.
        sent: dict[int, str] = {}
        for name in sorted(REGISTRY):
            if name in UNATTACHED_METHODS:
                continue
            sent[conn.send(name, {})] = name
            sent[conn.send(name, SAMPLE_PARAMS.get(name, {}))] = name
        replies = {}
        while len(replies) < len(sent):
            msg = conn.recv()
            assert "id" in msg, msg  # no event reaches an unattached connection
            replies[msg["id"]] = msg
        for msg_id, name in sent.items():
            msg = replies[msg_id]
            assert "result" not in msg, (name, msg)
            assert msg["error"]["code"] == NOT_ATTACHED, (name, msg)
            assert msg["error"]["data"]["method"] == name
        assert {"cap.request", "journal.query"} <= set(sent.values())
        # The three exceptions answer without attachment.
        assert conn.call("ping", {})["result"]["pong"] is True
        assert "result" in conn.call("parse", {"src": "echo hi | wc -l"})
        # Nothing above left the connection attached or ran anything.
        assert conn.call("journal.query", {})["error"]["code"] == NOT_ATTACHED
    finally:
        conn.close()
    human = kernel.client("s-check")
    try:
        assert human.call("journal.query", {"limit": 1000})["rows"] == []
        assert human.call("task.list")["tasks"] == []
    finally:
        human.close()


def test_require_token_refuses_attach_without_a_valid_token(token_kernel: KernelProcess) -> None:
    """Hole: token-less or forged attachments accepted under --require-token."""
    store = TokenStore(token_kernel.state / "tokens.json")
    _, good = store.create("agent:good")
    conn = RawConn(token_kernel.socket)
    try:
        for params in (
            {},
            {"session": "s1"},
            {"token": ""},
            {"token": "not-a-token"},
            {"token": "shoal_" + "A" * 43},  # right shape, unknown
            {"token": good[:-1] + ("A" if good[-1] != "A" else "B")},  # one char off
            {"token": good + "x"},
        ):
            msg = conn.call("session.attach", params)
            assert msg.get("error", {}).get("code") == AUTH_FAILED, (params, msg)
            # A failed attach leaves the connection unattached.
            assert conn.call("journal.query", {})["error"]["code"] == NOT_ATTACHED
            assert conn.call("exec", {"src": "echo no"})["error"]["code"] == NOT_ATTACHED
        ok = conn.call("session.attach", {"token": good, "session": "s1"})
        assert ok["result"]["principal"] == "agent:good"
    finally:
        conn.close()


def test_expired_token_fails_after_expiry(token_kernel: KernelProcess) -> None:
    """Hole: expiry not checked on every attach (only at kernel start)."""
    store = TokenStore(token_kernel.state / "tokens.json")
    _, bearer = store.create("agent:short", ttl_s=1)
    created = time.time()
    c = token_kernel.client("s1", token=bearer)
    assert c.call("session.cwd")["session"] == "s1"
    c.close()
    time.sleep(max(0.0, created + 1.3 - time.time()))
    with pytest.raises(RpcError) as exc:
        token_kernel.client("s1", token=bearer)
    assert exc.value.code == AUTH_FAILED
    assert token_kernel.proc.poll() is None


def test_cli_revocation_applies_on_next_attach_without_restart(token_kernel: KernelProcess) -> None:
    """Hole: token revocation that needed a kernel restart to take effect."""
    state = token_kernel.state
    made = shoal_cli(state, "token", "create", "agent:victim", "--label", "to revoke")
    assert made.returncode == 0, made.stderr
    victim = made.stdout.strip().splitlines()[-1]
    other = shoal_cli(state, "token", "create", "agent:other").stdout.strip().splitlines()[-1]
    listed = orjson.loads(shoal_cli(state, "token", "list", "--json").stdout)
    victim_id = next(r["id"] for r in listed if r["principal"] == "agent:victim")
    assert stat.S_IMODE(os.stat(state / "tokens.json").st_mode) == 0o600
    for r in listed:
        assert "digest" not in r
    assert victim not in (state / "tokens.json").read_text()

    pid = token_kernel.pid
    live = token_kernel.client("s1", token=victim)  # proves the token worked, and loads the store
    assert live.call("session.cwd")["session"] == "s1"
    live.close()

    revoked = shoal_cli(state, "token", "revoke", victim_id)
    assert revoked.returncode == 0, revoked.stderr
    with pytest.raises(RpcError) as exc:
        token_kernel.client("s1", token=victim)
    assert exc.value.code == AUTH_FAILED
    # Same kernel process, still serving, other tokens unaffected.
    assert token_kernel.proc.poll() is None and token_kernel.pid == pid
    still = token_kernel.client("s2", token=other)
    assert (
        still.call("session.attach", {"session": "s2", "token": other})["principal"]
        == "agent:other"
    )
    still.close()
    # Revoking by principal through the CLI works the same way.
    assert shoal_cli(state, "token", "revoke", "agent:other").returncode == 0
    with pytest.raises(RpcError) as exc:
        token_kernel.client("s2", token=other)
    assert exc.value.code == AUTH_FAILED
    assert token_kernel.proc.poll() is None


@pytest.mark.skipif(not hasattr(socket, "SO_PEERCRED"), reason="SO_PEERCRED is Linux-only")
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid (setuid to nobody)")
def test_peer_credentials_refuse_another_uid_even_when_files_allow_it(
    kernel: KernelProcess,
) -> None:
    """Hole: relying on file modes alone; the kernel itself must refuse other uids."""
    nobody = NOBODY_UID
    path = kernel.socket
    dirs = [kernel.tmp, path.parent]
    saved = {p: stat.S_IMODE(os.stat(p).st_mode) for p in [*dirs, path]}
    try:
        for d in dirs:
            os.chmod(d, 0o755)
        os.chmod(path, 0o666)  # file permissions now let anyone connect
        # The OS lets it through (exchange_as_uid fails if it cannot connect)...
        data = exchange_as_uid(
            path,
            b'{"jsonrpc":"2.0","id":1,"method":"session.attach","params":{}}\n'
            b'{"jsonrpc":"2.0","id":2,"method":"ping","params":{}}\n',
            nobody,
        )
    finally:
        for p, m in saved.items():
            os.chmod(p, m)
    frames = [orjson.loads(x) for x in data.splitlines() if x.strip()]
    # ...the kernel did not: one refusal frame, no result, connection closed.
    assert all("result" not in f for f in frames), frames
    assert frames and frames[0]["error"]["code"] == AUTH_FAILED
    assert "id" not in frames[0]
    assert "different user" in frames[0]["error"]["message"]
    # The refusal is the kernel's, for that uid only: we are still served.
    c = kernel.client("s1")
    assert c.call("ping")["pong"] is True
    c.close()
    assert kernel.proc.poll() is None
