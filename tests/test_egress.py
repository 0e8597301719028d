"""The egress proxy, live (issue 27): a real kernel (``--sandbox required``) and the
default agent through a real ``shoal-mcp``; stand-in hosts are local HTTP servers the
proxy resolves test names to (``SHOAL_NET_RESOLVE``), the policy allows some of them.

Every connection a sandboxed command makes goes through the proxy: an allowed host works
over plain HTTP, CONNECT and SOCKS5; a refused one gets a clear error and a
``sandbox_denied`` entry; a program ignoring the proxy variables has no route at all;
each attempt is journaled (``egress.query``); an approval lets a host through once, or
for the session until revoked.  Then ``pip download`` and ``git clone`` through it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal_mcp.protocol.limits import AGENT_PRINCIPAL
from tests.support.egress import EgressWorld, egress_world
from tests.support.polling import wait_until

pytestmark = pytest.mark.landlock

PROXY = "http://127.0.0.1:3128"


@pytest.fixture(scope="module")
def world() -> Iterator[EgressWorld]:
    with egress_world("shnet") as w:
        yield w


def _text(result: dict) -> str:
    return str(result.get("_text", ""))


def _rows(world: EgressWorld, **params: object) -> list[dict]:
    human = world.human()
    try:
        reply = human.call("egress.query", {"principal": AGENT_PRINCIPAL, **params})
    finally:
        human.close()
    assert reply["proxy"] is True
    return reply["rows"]


def _denied_hosts(result: dict) -> dict[str, dict]:
    return {d["host"]: d for d in result.get("sandbox_denied", []) if d["access"] == "connect"}


def test_caps_say_the_network_is_the_proxy(world: EgressWorld) -> None:
    human = world.human()
    try:
        agent = human.call("ping")["kernel"]["agent"]
    finally:
        human.close()
    assert agent["enforced"]["net"] == "proxy+netns", agent
    assert "net" in agent["enforced"]["ns"]


def test_an_allowed_host_over_http_connect_and_socks(world: EgressWorld) -> None:
    url = f"http://allowed.test:{world.port}/hello.txt"
    result = world.exec(
        f"curl -fsS {url} && curl -fsS -p {url} && curl -fsS -x socks5h://127.0.0.1:3128 {url}"
    )
    assert result["value"]["ok"] is True, result
    assert _text(result).count("hello through the proxy") == 3, result
    rows = [r for r in _rows(world, limit=20) if r["host"] == "allowed.test"]
    kinds = {r["protocol"] for r in rows if r["allowed"]}
    assert kinds >= {"forward", "connect", "socks"}, rows
    for row in rows[:3]:
        assert row["port"] == world.port and row["address"] == "127.0.0.1"
        assert row["bytes_down"] > len("hello through the proxy") and row["bytes_up"] > 0
        assert row["exec_id"] is not None and row["why"].startswith("net.allow")


def test_a_refused_host_says_why_and_is_in_sandbox_denied(world: EgressWorld) -> None:
    body = world.exec(f"curl -sS http://denied.test:{world.port}/hello.txt")
    assert "shoal egress proxy: denied.test:" in _text(body) and "net.deny" in _text(body)
    failed = world.exec("curl -fsS https://denied.test/ ; curl -fsS http://nothere.test:8/")
    assert failed["value"]["ok"] is False
    hosts = _denied_hosts(failed)
    assert hosts["denied.test"]["port"] == 443 and hosts["denied.test"]["source"] == "proxy"
    assert "net.deny" in hosts["denied.test"]["why"]
    assert hosts["nothere.test"]["why"] == "nothere.test:8 is not in net.allow"
    assert failed["ask"]["plan_ref"].startswith("plan:")
    refused = [r for r in _rows(world, limit=20) if r["host"] in ("denied.test", "nothere.test")]
    assert refused and not any(r["allowed"] for r in refused)
    assert all(r["bytes_up"] == r["bytes_down"] == 0 for r in refused)


def test_socks_refusal_is_a_socks_reply_not_a_hang(world: EgressWorld) -> None:
    result = world.exec(f"curl -sS -x socks5h://127.0.0.1:3128 http://denied.test:{world.port}/")
    assert result["value"]["ok"] is False
    # curl prints the SOCKS5 reply code: 2, "connection not allowed by ruleset".
    assert "socks5 connection to denied.test. (2)" in _text(result).lower(), result


def test_a_host_allowed_on_443_only_is_not_reached_on_another_port(world: EgressWorld) -> None:
    for port in (22, world.port):
        result = world.exec(f"curl -sS http://only443.test:{port}/hello.txt")
        assert "hello through the proxy" not in _text(result)
        assert f"only443.test is allowed on other ports, not {port}" in _text(result), result


def test_a_loopback_address_needs_the_policy_to_name_it(world: EgressWorld) -> None:
    result = world.exec(f"curl -sS http://127.0.0.1:{world.port}/hello.txt")
    assert "hello through the proxy" not in _text(result)
    assert "127.0.0.1" in _text(result) and "not in net.allow" in _text(result)


@pytest.fixture
def host_listeners() -> Iterator[tuple[int, int, list, list]]:
    """A TCP and a UDP listener on the host's 127.0.0.1, recording what reaches them."""
    tcp, udp = socket.socket(), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(8)
    udp.bind(("127.0.0.1", 0))
    tcp.settimeout(0.2)
    udp.settimeout(0.2)
    accepted: list = []
    grams: list = []
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            for sock, into in ((tcp, accepted), (udp, grams)):
                try:
                    into.append(sock.accept() if sock is tcp else sock.recvfrom(100))
                except OSError:
                    continue

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield tcp.getsockname()[1], udp.getsockname()[1], accepted, grams
    finally:
        stop.set()
        thread.join(5)
        tcp.close()
        udp.close()


BYPASSES = {
    "curl --noproxy": "curl -sS --max-time 5 --noproxy '*' http://127.0.0.1:{tcp}/ && echo GOT-THROUGH",
    "python raw socket": "python3 -c \"import socket; socket.create_connection(('127.0.0.1', {tcp}), 3); print('GOT-THROUGH')\"",
    "bash /dev/tcp": "exec 3<>/dev/tcp/127.0.0.1/{tcp} && echo GOT-THROUGH",
    "udp to loopback": "python3 -c \"import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b'x', ('127.0.0.1', {udp}))\"",
    "udp to the world": "python3 -c \"import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b'x', ('8.8.8.8', 53)); print('GOT-THROUGH')\"",
    "dns query": "python3 -c \"import socket; print(socket.getaddrinfo('example.com', 443)); print('GOT-THROUGH')\"",
    "dns over tcp": "exec 3<>/dev/tcp/8.8.8.8/53 && echo GOT-THROUGH",
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BYPASSES))
def test_a_program_ignoring_the_proxy_has_no_route(
    world: EgressWorld, host_listeners: tuple[int, int, list, list], case: str
) -> None:
    tcp, udp, accepted, grams = host_listeners
    result = world.exec(BYPASSES[case].format(tcp=tcp, udp=udp), timeout=60)
    assert "GOT-THROUGH" not in _text(result), result
    # The UDP send on loopback "succeeds" inside the namespace, but nothing arrives.
    marker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    marker.sendto(b"marker", ("127.0.0.1", udp))
    marker.close()
    wait_until(lambda: grams, timeout=5, what="the test's own datagram")
    assert [g[0] for g in grams] == [b"marker"] and accepted == []


def _approve(world: EgressWorld, ref: str, scope: str | None = None) -> None:
    asked = world.facade.tool("shoal_cap_request", {"plan_ref": ref})
    assert "result" in asked, asked
    human = world.human()
    try:
        decision = {"plan_ref": ref, "approve": True, **({"scope": scope} if scope else {})}
        human.call("cap.decide", decision)
    finally:
        human.close()


def _apply(world: EgressWorld, ref: str) -> dict:
    applied = world.facade.tool("shoal_apply", {"plan_ref": ref}, 120)["result"]
    return {**applied["structuredContent"], "_text": applied["content"][0]["text"]}


def test_an_approved_host_works_once(world: EgressWorld) -> None:
    fetch = f"curl -fsS http://asked.test:{world.port}/hello.txt"
    first = world.exec(fetch)
    assert _denied_hosts(first)["asked.test"]["port"] == world.port, first
    _approve(world, first["ask"]["plan_ref"])
    applied = _apply(world, first["ask"]["plan_ref"])
    assert "hello through the proxy" in applied["_text"], applied
    again = world.exec(fetch)
    assert again["value"]["ok"] is False and "asked.test" in _denied_hosts(again)


def test_a_session_grant_lets_a_host_through_until_revoked(world: EgressWorld) -> None:
    fetch = f"curl -fsS -p http://asked.test:{world.port}/hello.txt"
    first = world.exec(fetch)
    _approve(world, first["ask"]["plan_ref"], scope="session")
    _apply(world, first["ask"]["plan_ref"])
    later = world.exec(fetch)
    assert "hello through the proxy" in _text(later), later
    human = world.human()
    try:
        grants = human.call("grants.list")["grants"]
        mine = [g for g in grants if f"asked.test:{world.port}" in g.get("net", [])]
        assert mine, grants
        revoker = world.kernel.client(mine[0]["session"])
        try:
            assert revoker.call("grants.revoke", {"principal": AGENT_PRINCIPAL})["revoked"] >= 1
        finally:
            revoker.close()
    finally:
        human.close()
    after = world.exec(fetch)
    assert after["value"]["ok"] is False and "asked.test" in _denied_hosts(after)


def _wheel(directory: Path, name: str = "tinypkg", version: str = "0.1") -> Path:
    """A minimal pure-Python wheel."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": "VALUE = 7\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    path = directory / f"{name}-{version}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(path, "w") as zf:
        for rel, text in files.items():
            zf.writestr(rel, text)
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest())
            record.append(f"{rel},sha256={digest.rstrip(b'=').decode()},{len(text)}")
        zf.writestr(f"{dist}/RECORD", "\n".join([*record, f"{dist}/RECORD,,"]) + "\n")
    return path


def test_pip_download_from_an_allowed_index(world: EgressWorld) -> None:
    files = world.www / "files"
    files.mkdir(exist_ok=True)
    wheel = _wheel(files)
    index = world.www / "simple" / "tinypkg"
    index.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    link = f'<a href="/files/{wheel.name}#sha256={digest}">{wheel.name}</a>'
    (index / "index.html").write_text(f"<!DOCTYPE html><html><body>{link}</body></html>\n")
    result = world.exec(
        "python3 -m pip download --no-cache-dir --disable-pip-version-check --no-deps "
        f"--index-url http://pkg.test:{world.port}/simple/ --trusted-host pkg.test "
        '-d "$TMPDIR/dl" tinypkg && ls "$TMPDIR/dl"',
        timeout=180,
    )
    assert result["value"]["ok"] is True, result
    assert wheel.name in _text(result)
    hosts = {(r["host"], r["allowed"]) for r in _rows(world, limit=20)}
    assert ("pkg.test", True) in hosts


def test_git_clone_over_http_from_an_allowed_host(world: EgressWorld) -> None:
    src = world.tmp / "src"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", str(src)], check=True)
    (src / "README").write_text("cloned through the proxy\n")
    subprocess.run([*git, "-C", str(src), "add", "README"], check=True)
    subprocess.run([*git, "-C", str(src), "commit", "-qm", "one"], check=True)
    bare = world.www / "repo.git"
    subprocess.run([*git, "clone", "-q", "--bare", str(src), str(bare)], check=True)
    subprocess.run(["git", "-C", str(bare), "update-server-info"], check=True)
    result = world.exec(
        f'git clone -q http://git.test:{world.port}/repo.git "$TMPDIR/clone" && '
        'cat "$TMPDIR/clone/README"',
        timeout=180,
    )
    assert "cloned through the proxy" in _text(result), result
    rows = [r for r in _rows(world, limit=50) if r["host"] == "git.test"]
    assert rows and all(r["allowed"] for r in rows)


def test_doctor_checks_the_egress_path_end_to_end(world: EgressWorld) -> None:
    cli = [sys.executable, "-c", "from shoal_mcp.cli import run; run()"]
    where = ["--socket", str(world.kernel.socket), "--state-dir", str(world.kernel.state)]
    done = subprocess.run(
        [*cli, *where, "doctor", "--json"], capture_output=True, text=True, timeout=120
    )
    checks = {c["check"]: c for c in json.loads(done.stdout)}
    assert checks["egress proxy"]["status"] == "ok", checks["egress proxy"]
    channels = world.kernel.state / "egress"
    before = sorted(p.name for p in channels.iterdir())
    human = world.human()
    try:
        got = human.call("egress.check", None, timeout=60)
    finally:
        human.close()
    assert got["ok"] is True and got["steps"]["refused"] == "403", got
    assert got["steps"]["direct"].startswith("no route"), got
    assert sorted(p.name for p in channels.iterdir()) == before  # its channel is gone


def test_the_local_human_is_not_proxied(world: EgressWorld) -> None:
    human = world.human()
    try:
        got = human.call(
            "exec",
            {
                "src": f"env | grep -iE '^(https?|all|no)_proxy='; echo PROXYVARS-END; curl -sS http://127.0.0.1:{world.port}/hello.txt"
            },
            timeout=60,
        )
    finally:
        human.close()
    assert got["render"].startswith("PROXYVARS-END"), got["render"]  # no proxy variables
    assert "hello through the proxy" in got["render"]  # straight to the server


def _channel(world: EgressWorld) -> str:
    """A channel socket of the default agent (an exec makes it)."""
    world.exec("true")
    socks = sorted((world.kernel.state / "egress").glob("c*.sock"))
    assert socks
    return str(socks[0])


def _talk(path: str, data: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(path)
        s.sendall(data)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
        return reply


BAD_INPUT = {
    "malformed CONNECT": (b"CONNECT nothing HTTP/1.1\r\n\r\n", b"HTTP/1.1 400 "),
    "garbage line": (b"\x16\x03\x01 hello\r\n\r\n", b"HTTP/1.1 400 "),
    "oversize head": (b"CONNECT a.test:443 HTTP/1.1\r\nX: " + b"a" * 20000, b"HTTP/1.1 431 "),
    "origin-form request": (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 405 "),
    "SOCKS4": (b"\x04\x01\x00\x50\x7f\x00\x00\x01\x00", b"HTTP/1.1 400 "),
    "SOCKS5 no method": (b"\x05\x01\x02", b"\x05\xff"),
    "SOCKS5 BIND": (b"\x05\x01\x00\x05\x02\x00\x01\x7f\x00\x00\x01\x00\x50", b"\x05\x00\x05\x07"),
    "SOCKS5 bad address": (b"\x05\x01\x00\x05\x01\x00\x09\x00", b"\x05\x00\x05\x08"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_gets_a_clear_answer_and_the_proxy_lives_on(
    world: EgressWorld, case: str
) -> None:
    data, expected = BAD_INPUT[case]
    reply = _talk(_channel(world), data)
    assert reply.startswith(expected), reply[:200]
    if reply.startswith(b"HTTP/1.1 4"):
        assert b"shoal egress proxy: " in reply
    # The proxy still serves: an allowed fetch through the same channel works.
    ok = _talk(
        _channel(world),
        f"GET http://allowed.test:{world.port}/hello.txt HTTP/1.1\r\n\r\n".encode(),
    )
    assert ok.startswith(b"HTTP/1.") and b"hello through the proxy" in ok
