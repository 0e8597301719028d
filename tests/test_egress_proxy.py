"""The egress proxy in-process (issue 27), over real sockets: its per-principal
connection budget, a refused attempt journaled, a relay's byte counts, and a client that
never finishes its request.  The proxy, its database and the stand-in server are real;
only the kernel around them is absent (tests/test_egress.py drives the whole path)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal_mcp.kernel.net import proxy as proxy_mod
from shoal_mcp.kernel.net.log import EgressLog
from shoal_mcp.kernel.net.proxy import EgressProxy
from shoal_mcp.kernel.net.resolve import Resolver
from shoal_mcp.kernel.store.db import Database
from tests.support.polling import wait_until

LIMIT = 3


class Holder:
    """A TCP server that greets each connection and holds it until the client's EOF."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.sendall(b"welcome\n")
            self.conns.append(conn)
            threading.Thread(target=self._drain, args=(conn,), daemon=True).start()

    def _drain(self, conn: socket.socket) -> None:
        """Read until the client's EOF, then close, as a server does."""
        try:
            while conn.recv(65536):
                pass
            conn.close()
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple]:
    monkeypatch.setattr(proxy_mod, "MAX_CONNECTIONS_PER_PRINCIPAL", LIMIT)
    monkeypatch.setattr(proxy_mod, "HEAD_TIMEOUT_S", 0.5)
    db = Database(tmp_path / "db.sqlite3")
    log = EgressLog(db)
    server = Holder()
    proxy = EgressProxy(
        str(tmp_path / "egress"), log, lambda p, s: (7, False), Resolver({"held.test": "127.0.0.1"})
    )
    path = proxy.channel("agent:t", "s", (f"held.test:{server.port}",), ())
    try:
        yield proxy, log, server, path
    finally:
        proxy.close()
        server.close()
        db.close()


def _connect(path: str, host: str, port: int) -> tuple[socket.socket, bytes]:
    """A CONNECT through the channel: the socket and the proxy's reply head.  The head
    is read a byte at a time: on a busy machine the relayed server's first bytes can
    follow it in the same segment, and they belong to the caller's next ``recv``."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(path)
    s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\n\r\n".encode())
    reply = b""
    while not reply.endswith(b"\r\n\r\n"):
        chunk = s.recv(1)
        if not chunk:
            break
        reply += chunk
    return s, reply


def test_connections_per_principal_are_bounded(setup: tuple) -> None:
    proxy, log, server, path = setup
    held = []
    for _ in range(LIMIT):
        s, reply = _connect(path, "held.test", server.port)
        assert reply.startswith(b"HTTP/1.1 200"), reply
        held.append(s)
    extra, reply = _connect(path, "held.test", server.port)
    assert reply.startswith(b"HTTP/1.1 429"), reply
    assert f"{LIMIT} connections already open for agent:t".encode() in reply + extra.recv(4096)
    extra.close()
    held.pop().close()  # one slot back: the next connection goes through
    wait_until(lambda: _connect(path, "held.test", server.port)[1].startswith(b"HTTP/1.1 200"),
               timeout=10, what="a slot freed")  # fmt: skip
    for s in held:
        s.close()


def test_a_relay_counts_its_bytes_and_a_refusal_is_journaled(setup: tuple) -> None:
    proxy, log, server, path = setup
    s, reply = _connect(path, "held.test", server.port)
    assert reply.startswith(b"HTTP/1.1 200")
    assert s.recv(100) == b"welcome\n"
    s.sendall(b"x" * 1000)
    s.close()
    t, refused = _connect(path, "other.test", 443)
    assert refused.startswith(b"HTTP/1.1 403"), refused
    assert b"other.test:443 is not in net.allow" in refused + t.recv(4096)
    t.close()
    assert log.refused(7)[-1].host == "other.test"

    def rows() -> list[dict]:
        return log.query(principal="agent:t")

    # Rows are written on the housekeeping thread in the order the proxy gives them, and
    # the relay's row may be given before the refusal's: wait for each row on its own.
    wait_until(lambda: any(r["allowed"] and r["bytes_up"] >= 1000 for r in rows()),
               timeout=10, what="the relay's row")  # fmt: skip
    wait_until(lambda: any(not r["allowed"] and r["host"] == "other.test" for r in rows()),
               timeout=10, what="the refusal's row")  # fmt: skip
    allowed = next(r for r in rows() if r["allowed"])
    assert allowed["bytes_down"] == len(b"welcome\n") and allowed["exec_id"] == 7
    assert allowed["protocol"] == "connect" and allowed["address"] == "127.0.0.1"


def test_a_client_that_never_finishes_its_request_gets_408(setup: tuple) -> None:
    proxy, log, server, path = setup
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(b"CONNECT held.test:1 HTTP/1.1\r\n")  # and never the blank line
        reply = s.recv(4096)
    assert reply.startswith(b"HTTP/1.1 408"), reply
