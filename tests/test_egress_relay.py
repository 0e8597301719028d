"""The egress relay on an event loop (kernel/net/relay.py): bytes both ways through
``splice``, backpressure, half-close, a reset, a cancel; no thread per direction.

The relay runs on a real asyncio loop over real sockets (a Unix pair on the client's
side, TCP on the upstream side, as in the proxy); the peers are plain blocking sockets
driven from threads of the test.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import threading
from collections.abc import Callable

import pytest

from shoal_mcp.kernel.net.relay import relay


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        a = socket.create_connection(server.getsockname())
        b, _ = server.accept()
    return a, b


def _recv_all(s: socket.socket) -> bytes:
    chunks = []
    while chunk := s.recv(1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def _in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    return t, out


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def ends() -> tuple[socket.socket, socket.socket, socket.socket, socket.socket]:
    """(client peer, client end for the relay, upstream end for the relay, upstream peer)."""
    agent, client = socket.socketpair()
    upstream, server = _tcp_pair()
    for s in (agent, server):
        s.settimeout(20)
    yield agent, client, upstream, server
    for s in (agent, client, upstream, server):
        s.close()


def test_bytes_go_both_ways_and_the_first_bytes_are_not_counted(ends) -> None:
    agent, client, upstream, server = ends

    def serve() -> bytes:
        got = _recv_all(server)  # until the agent's half-close arrives
        server.sendall(b"reply:" + hashlib.sha256(got).hexdigest().encode())
        server.shutdown(socket.SHUT_WR)
        return got

    def agent_side() -> bytes:
        agent.sendall(b"body")
        agent.shutdown(socket.SHUT_WR)  # a half-close: the answer still comes back
        return _recv_all(agent)

    server_t, served = _in_thread(serve)
    agent_t, answered = _in_thread(agent_side)
    up, down = asyncio.run(relay(client, upstream, b"HEAD ", b"200 "))
    server_t.join(20)
    agent_t.join(20)
    assert served == [b"HEAD body"]
    reply = b"reply:" + hashlib.sha256(b"HEAD body").hexdigest().encode()
    assert answered == [b"200 " + reply]
    assert (up, down) == (len(b"body"), len(reply))
    assert client.fileno() == -1 and upstream.fileno() == -1  # both closed on return


def test_a_slow_reader_holds_the_source_back_and_nothing_is_lost(ends) -> None:
    """8 MiB upstream → agent while the agent reads slowly: the destination fills, the
    relay waits as a writer, and every byte arrives in order."""
    agent, client, upstream, server = ends
    data = os.urandom(8 << 20)

    def serve() -> None:
        server.sendall(data)
        server.close()

    def slow_agent() -> bytes:
        chunks = []
        while chunk := agent.recv(4096):
            chunks.append(chunk)
            if len(chunks) % 64 == 0:
                threading.Event().wait(0.001)
        return b"".join(chunks)

    server_t, _ = _in_thread(serve)
    agent_t, got = _in_thread(slow_agent)

    async def run() -> tuple[int, int]:
        task = asyncio.ensure_future(relay(client, upstream))
        await asyncio.sleep(0.2)
        agent.shutdown(socket.SHUT_WR)  # the agent sends nothing
        return await task

    up, down = asyncio.run(run())
    server_t.join(20)
    agent_t.join(20)
    assert (up, down) == (0, len(data))
    assert hashlib.sha256(got[0]).digest() == hashlib.sha256(data).digest()


def test_a_reset_on_one_side_ends_both_directions(ends) -> None:
    agent, client, upstream, server = ends
    server.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")

    async def run() -> tuple[int, int]:
        task = asyncio.ensure_future(relay(client, upstream))
        await asyncio.sleep(0.05)
        server.close()  # linger 0: a reset, not a FIN
        return await asyncio.wait_for(task, 10)

    up, down = asyncio.run(run())
    assert (up, down) == (0, 0)
    assert agent.recv(10) == b""  # the agent's side ended too (not left hanging)


def test_a_cancelled_relay_closes_its_sockets_and_pipes(ends) -> None:
    agent, client, upstream, server = ends
    before = _open_fds()

    async def run() -> None:
        on_the_loop = _open_fds()  # the loop's own descriptors counted
        task = asyncio.ensure_future(relay(client, upstream))
        await asyncio.sleep(0.05)
        assert _open_fds() == on_the_loop + 4  # a pipe per direction
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert client.fileno() == -1 and upstream.fileno() == -1
    assert _open_fds() == before - 2  # the two sockets closed, the pipes too
    assert agent.recv(10) == b""
