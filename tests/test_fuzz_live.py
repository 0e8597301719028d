"""Hostile bytes at the process boundary (issue #9): every seed-corpus stream, random
garbage and a real oversize frame written to a live ``shoal-mcp``'s stdin and to a
live kernel socket. Both keep serving; every line they write back is a JSON object
with no ``"id": null`` / ``"error": null`` and no traceback text.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

import orjson
import pytest

from shoal_mcp.protocol.errors import ErrorCode
from shoal_mcp.protocol.limits import MAX_FRAME
from tests.support.facade import McpPipe, facade_env
from tests.support.kernel import running_kernel
from tests.support.results import shown
from tests.support.wire import no_traceback

CORPUS = Path(__file__).parent / "fuzz_corpus"


def _streams() -> list[bytes]:
    rng = random.Random(9)
    out = [p.read_bytes()[2:] for p in sorted(CORPUS.iterdir())]
    for _ in range(40):
        out.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))))
    return [s if s.endswith(b"\n") else s + b"\n" for s in out]


def _check_line(line: bytes) -> None:
    msg = orjson.loads(line)
    assert isinstance(msg, dict) and msg.get("jsonrpc") == "2.0", line[:200]
    assert "id" not in msg or msg["id"] is not None, line[:200]
    assert "error" not in msg or isinstance(msg["error"], dict), line[:200]


@pytest.fixture(scope="module")
def live():
    with running_kernel() as kernel:
        yield kernel


def test_facade_survives_hostile_stdin(live):
    pipe = McpPipe(facade_env(live, "fuzzlive"))
    try:
        pipe.initialize()
        for i, stream in enumerate(_streams()):
            pipe.write(stream)
            reply = pipe.request("ping", {}, timeout=60)  # in order after the stream
            assert reply.get("result") == {}, (i, reply)
        # A real oversize frame: answered -32600 to its own id, then business as usual.
        head = b'{"jsonrpc":"2.0","id":"big-1","method":"tools/call","params":{"name":"shoal_exec","arguments":{"command":"'
        pipe.write(head + b"x" * (MAX_FRAME + 10) + b'"}}}\n')
        big = pipe.read_reply("big-1", timeout=120)
        assert big["error"]["code"] == ErrorCode.INVALID_REQUEST
        assert shown(pipe.tool("shoal_exec", {"command": "echo after-fuzz"})) == "after-fuzz"
        assert pipe.alive()
    finally:
        code = pipe.close()
    assert code == 0
    assert pipe.bad_lines == []
    for line in pipe.raw_lines:
        _check_line(line)
    assert no_traceback(pipe.raw_lines) == []


def test_kernel_socket_survives_hostile_frames(live):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(live.socket))
    sock.settimeout(60)
    buf = b""
    lines: list[bytes] = []

    def until_id(msg_id: str) -> dict:
        nonlocal buf
        while True:
            while b"\n" not in buf:
                chunk = sock.recv(1 << 16)
                assert chunk, "the kernel closed the connection"
                buf += chunk
            line, buf = buf.split(b"\n", 1)
            lines.append(line)
            msg = orjson.loads(line)
            if msg.get("id") == msg_id:
                return msg

    try:
        for i, stream in enumerate(_streams()):
            sock.sendall(stream)
            marker = f"ping-{i}"
            sock.sendall(orjson.dumps({"jsonrpc": "2.0", "id": marker, "method": "ping"}) + b"\n")
            assert until_id(marker)["result"]["pong"] is True
        sock.sendall(
            orjson.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": "att",
                    "method": "session.attach",
                    "params": {"session": "fuzzlive"},
                }
            )
            + b"\n"
        )
        assert "result" in until_id("att")
        sock.sendall(
            orjson.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": "ex",
                    "method": "exec",
                    "params": {"src": "echo kernel-after-fuzz", "position": "value"},
                }
            )
            + b"\n"
        )
        assert until_id("ex")["result"]["value"]["out"]["v"] == "kernel-after-fuzz\n"
    finally:
        sock.close()
    for line in lines:
        _check_line(line)
    assert no_traceback(lines) == []
    assert live.proc.poll() is None
