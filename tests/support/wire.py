"""Raw newline-delimited JSON-RPC: building frames, a kernel connection without the
client library (``RawConn``), and checks on what a peer sent back.
"""

from __future__ import annotations

import socket
import time
from collections import deque
from pathlib import Path
from typing import Any

import orjson

CALL_TIMEOUT_S = 30.0


def jsonrpc_frame(method: str, params: Any = None, msg_id: Any = None) -> bytes:
    """One newline-terminated JSON-RPC request (or notification when ``msg_id`` is None)."""
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if msg_id is not None:
        message["id"] = msg_id
    if params is not None:
        message["params"] = params
    return orjson.dumps(message) + b"\n"


def _response_id(message: Any) -> Any:
    """The id of a response (a message with ``result`` or ``error``), else None."""
    if isinstance(message, dict) and ("result" in message or "error" in message):
        msg_id = message.get("id")
        try:
            hash(msg_id)
        except TypeError:
            return None
        return msg_id
    return None


class _Received:
    __slots__ = ("line", "message", "claimed")

    def __init__(self, line: bytes, message: Any) -> None:
        self.line = line
        self.message = message
        self.claimed = False


class RawConn:
    """Newline-delimited JSON-RPC straight to a kernel socket (no client library).

    ``send`` writes a request and returns its id; ``wait(id)`` returns that request's
    response in whatever order responses arrive; ``recv`` returns the next message no
    ``wait`` claimed (events, replies without an id, responses nobody waited for), in
    arrival order. Every frame received is kept in ``raw_frames`` (for "no traceback"
    checks) unless ``keep_frames`` is false; ``last_reply`` is the raw frame of the
    response ``wait`` returned last (its size is the reply's size on the wire).
    """

    def __init__(self, path: Path | str, keep_frames: bool = True) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(path))
        self.buf = b""
        self.keep_frames = keep_frames
        self.raw_frames: list[bytes] = []
        self.last_reply = b""
        self._inbox: deque[_Received] = deque()  # unclaimed, in arrival order
        self._responses: dict[Any, deque[_Received]] = {}  # the same responses, by id
        self._ids = 1000  # above the small literal ids tests put in hand-written frames

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> RawConn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing -----------------------------------------------------------------------

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, method: str, params: Any = None, msg_id: Any = None) -> Any:
        """Write one request (ids count up from 1001 unless given); returns its id."""
        if msg_id is None:
            self._ids += 1
            msg_id = self._ids
        self.send_raw(jsonrpc_frame(method, params, msg_id))
        return msg_id

    # -- reading -----------------------------------------------------------------------

    def _read_frame(self, timeout: float) -> _Received:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no frame from the kernel")
            self.sock.settimeout(remaining)
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("kernel closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        if self.keep_frames:
            self.raw_frames.append(line)
        return _Received(line, orjson.loads(line))

    def recv(self, timeout: float = CALL_TIMEOUT_S) -> Any:
        """The next unclaimed message, decoded."""
        while self._inbox:
            got = self._inbox.popleft()
            if not got.claimed:
                got.claimed = True
                return got.message
        got = self._read_frame(timeout)
        got.claimed = True
        return got.message

    def wait(self, msg_id: Any, timeout: float = CALL_TIMEOUT_S) -> dict:
        """The response to ``msg_id``; other messages stay unclaimed for ``recv``."""
        filed = self._responses.get(msg_id)
        while filed:
            got = filed.popleft()
            if not got.claimed:
                return self._claim(got)
        deadline = time.monotonic() + timeout
        while True:
            got = self._read_frame(max(0.01, deadline - time.monotonic()))
            rid = _response_id(got.message)
            if rid is not None and rid == msg_id:
                return self._claim(got)
            self._inbox.append(got)
            if rid is not None:
                self._responses.setdefault(rid, deque()).append(got)

    def _claim(self, got: _Received) -> dict:
        got.claimed = True
        self.last_reply = got.line
        return got.message

    def call(self, method: str, params: Any = None, timeout: float = CALL_TIMEOUT_S) -> dict:
        """``send`` then ``wait``: the whole response message (``result`` or ``error``)."""
        return self.wait(self.send(method, params), timeout)


# -- checks on what a peer sent ---------------------------------------------------------


def find_nulls(value: Any, path: str = "$") -> list[str]:
    """JSON paths holding null (the facade must omit optional fields instead)."""
    if value is None:
        return [path]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in find_nulls(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in find_nulls(v, f"{path}[{i}]")]
    return []


def jsonrpc_problems(message: Any) -> list[str]:
    """Why ``message`` is not a well-formed JSON-RPC 2.0 message from a server (empty: fine)."""
    if not isinstance(message, dict):
        return ["not an object"]
    problems = []
    if message.get("jsonrpc") != "2.0":
        problems.append("jsonrpc != 2.0")
    if "id" in message and (message["id"] is None or isinstance(message["id"], bool)):
        problems.append("id is null or bool")
    if "method" in message:
        if "result" in message or "error" in message:
            problems.append("method with result/error")
    else:
        if ("result" in message) == ("error" in message):
            problems.append("exactly one of result/error required")
        if "error" in message:
            err = message["error"]
            if (
                not isinstance(err, dict)
                or not isinstance(err.get("code"), int)
                or not isinstance(err.get("message"), str)
            ):
                problems.append("bad error object")
            elif "data" in err and err["data"] is None:
                problems.append("error.data is null")
        elif "id" not in message:
            problems.append("result without id")
    return problems


def no_traceback(lines: list[bytes]) -> list[bytes]:
    """Lines that leak Python traceback text (should be none)."""
    return [ln for ln in lines if b"Traceback (most recent call last)" in ln or b'File "/' in ln]
