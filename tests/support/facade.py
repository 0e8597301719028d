"""A real ``shoal-mcp`` child over raw pipes, and the environment that points it at a kernel.

``FacadeProcess`` spawns it, writes to stdin and hands each stdout line to ``on_line``.
``McpClient`` is the one client on it, with one set of verbs: ``send`` writes a request
and returns its id, ``read_reply(id)`` waits for its answer, ``request`` does both and
returns the reply, ``tool`` is ``request`` of a ``tools/call``; ``send_tool`` sends one
without waiting, ``send_message`` writes any message as it is. Its two kinds differ only
in how they keep what arrives:

- ``RawFacade`` keeps every message in arrival order (exact-sequence tests, stdout audits);
- ``McpPipe`` files responses by id (pipelining, "every id answered exactly once").
"""

from __future__ import annotations

import itertools
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import orjson

from .kernel import KernelProcess, child_env
from .wire import jsonrpc_frame, jsonrpc_problems

PROTOCOL_VERSION = "2025-06-18"
"""The MCP revision the tests speak (restated here, not imported: tests check the facade)."""
CALL_TIMEOUT_S = 60.0


def facade_env(
    kernel: KernelProcess, session: str | None = "default", *, agent: bool = False, **extra: str
) -> dict[str, str]:
    """Environment for a ``shoal-mcp`` that talks to ``kernel`` and never autostarts one
    (pass ``SHOAL_NO_AUTOSTART="0"`` to allow it); ``session`` sets ``SHOAL_SESSION``:
    ``default`` unless told, the session ``KernelProcess.client()`` attaches to, so a
    test can mix raw clients and facades; None leaves it unset (the facade then gets
    the session of its working directory).

    ``agent``: attach as the sandboxed default agent, as a client configured by ``shoal
    mcp-config`` does; tests of everything else opt out (``SHOAL_UNCONFINED=1``) and run
    as the local human, the unconfined principal they were written for."""
    env = child_env(
        {
            "SHOAL_SOCKET": str(kernel.socket),
            "SHOAL_STATE_DIR": str(kernel.state),
            "SHOAL_NO_AUTOSTART": "1",
        }
    )
    env.pop("SHOAL_UNCONFINED", None)
    if not agent:
        env["SHOAL_UNCONFINED"] = "1"
    env.pop("SHOAL_SESSION", None)
    if session is not None:
        env["SHOAL_SESSION"] = session
    env.update(extra)
    return env


class FacadeProcess:
    """``python -m shoal_mcp.facade``; a reader thread hands each stdout line to ``on_line``.

    Subclasses set up their own state before calling ``__init__``: the reader starts here.
    """

    def __init__(
        self,
        env: dict[str, str],
        cwd: str | Path | None = None,
        stderr: int | IO[bytes] = subprocess.PIPE,
        command: list[str] | None = None,
    ) -> None:
        self.proc = subprocess.Popen(
            command or [sys.executable, "-m", "shoal_mcp.facade"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
            cwd=cwd,
        )
        self._write_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read_stdout, name="facade-stdout", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def on_line(self, line: bytes) -> None:
        """One stdout line, newline included (absent only on a last, unterminated line)."""
        raise NotImplementedError

    def on_eof(self) -> None:
        """stdout closed."""

    def _read_stdout(self) -> None:
        out = self.proc.stdout
        assert out is not None
        for line in iter(out.readline, b""):
            self.on_line(line)
        self.on_eof()

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        with self._write_lock:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()

    def notify(self, method: str, params: Any = None) -> None:
        self.write(jsonrpc_frame(method, params))

    def close(self, timeout: float = 15.0) -> int:
        """Close stdin (the facade's cue to exit), wait for it, kill it if it lingers."""
        try:
            if self.proc.stdin is not None and not self.proc.stdin.closed:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._reader.join(5)
        return code


class McpClient(FacadeProcess):
    """The verbs every facade client has; a kind keeps what arrives (``on_line``), assigns
    ids (``next_id``) and finds an answer among it (``read_reply``)."""

    def next_id(self) -> Any:
        raise NotImplementedError

    def read_reply(self, msg_id: Any, timeout: float = CALL_TIMEOUT_S) -> dict:
        """The response to ``msg_id``, waiting up to ``timeout``."""
        raise NotImplementedError

    def send_message(self, message: dict | list, eol: bytes = b"\n") -> None:
        """Write ``message`` as it is (a batch, a response to the facade, an odd frame...)."""
        self.write(orjson.dumps(message) + eol)

    def send(self, method: str, params: Any = None, msg_id: Any = None) -> Any:
        """Send a request without waiting; returns its id."""
        msg_id = self.next_id() if msg_id is None else msg_id
        self.write(jsonrpc_frame(method, params, msg_id))
        return msg_id

    def request(self, method: str, params: Any = None, timeout: float = CALL_TIMEOUT_S) -> dict:
        """Send a request and return its reply."""
        return self.read_reply(self.send(method, params), timeout)

    def send_tool(self, name: str, arguments: dict, msg_id: Any = None, **extra: Any) -> Any:
        """Send a ``tools/call`` without waiting; returns its id."""
        return self.send("tools/call", {"name": name, "arguments": arguments, **extra}, msg_id)

    def tool(
        self, name: str, arguments: dict, timeout: float = CALL_TIMEOUT_S, **extra: Any
    ) -> dict:
        """Call a tool and return the reply."""
        return self.read_reply(self.send_tool(name, arguments, **extra), timeout)


class RawFacade(McpClient):
    """``shoal-mcp`` over raw pipes: write bytes, read parsed frames, keep every line."""

    def __init__(
        self,
        env: dict[str, str],
        cwd: str | Path | None = None,
        command: list[str] | None = None,
    ) -> None:
        self.lines: list[bytes] = []
        self.messages: queue.Queue[dict] = queue.Queue()
        self.stderr = bytearray()
        self._ids = iter(range(1000, 10**9))
        super().__init__(env, cwd, command=command)
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def on_line(self, line: bytes) -> None:
        self.lines.append(line)
        try:
            self.messages.put(orjson.loads(line))
        except orjson.JSONDecodeError:
            self.messages.put({"__unparseable__": line[:200].decode("utf-8", "replace")})

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for chunk in iter(lambda: self.proc.stderr.read1(65536), b""):  # type: ignore[union-attr]
            self.stderr += chunk

    def next_id(self) -> Any:
        return next(self._ids)

    # -- reading -----------------------------------------------------------------------

    def next_message(self, timeout: float = 10.0) -> dict:
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(
                f"no message from shoal-mcp within {timeout} s; stderr: {self.stderr[-2000:]!r}"
            ) from None

    def expect_silence(self, seconds: float) -> None:
        try:
            message = self.messages.get(timeout=seconds)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected message: {message}")

    def read_reply(self, msg_id: Any, timeout: float = CALL_TIMEOUT_S) -> dict:
        """The response to ``msg_id``; the messages before it (notifications, other
        replies) are consumed and dropped."""
        deadline = time.monotonic() + timeout
        while True:
            message = self.next_message(max(0.01, deadline - time.monotonic()))
            if (
                "method" not in message
                and message.get("id", object()) == msg_id
                and type(message.get("id")) is type(msg_id)
            ):
                return message
            if time.monotonic() > deadline:
                raise AssertionError(f"no reply to {msg_id!r} within {timeout} s")

    def initialize(self, version: str = PROTOCOL_VERSION) -> dict:
        reply = self.request(
            "initialize",
            {
                "protocolVersion": version,
                "capabilities": {},
                "clientInfo": {"name": "shoal-tests", "version": "0"},
            },
        )
        self.notify("notifications/initialized")
        return reply

    def invalid_lines(self) -> list[tuple[bytes, list[str]]]:
        """Every stdout line that is not exactly one valid JSON-RPC frame."""
        bad = []
        for line in list(self.lines):
            if not line.endswith(b"\n"):
                bad.append((line[:200], ["not newline-terminated"]))
                continue
            try:
                message = orjson.loads(line)
            except orjson.JSONDecodeError:
                bad.append((line[:200], ["not JSON"]))
                continue
            problems = jsonrpc_problems(message)
            if problems:
                bad.append((line[:200], problems))
        return bad


class McpPipe(McpClient):
    """One ``shoal-mcp`` child over raw pipes; responses are filed by id as they arrive."""

    def __init__(
        self,
        env: dict[str, str],
        cwd: str | None = None,
        stderr_path: Path | None = None,
        command: list[str] | None = None,
    ) -> None:
        self._stderr = open(stderr_path, "wb") if stderr_path else subprocess.DEVNULL  # noqa: SIM115
        self._ids = itertools.count(1)
        self._cond = threading.Condition()
        self.responses: dict[Any, dict] = {}
        self.answer_counts: dict[tuple[str, Any], int] = {}
        self.notifications: list[dict] = []
        self.raw_lines: list[bytes] = []
        self.bad_lines: list[bytes] = []  # stdout lines that were not JSON objects
        self.inbox: queue.Queue[dict] = queue.Queue()  # every response, in arrival order
        self.eof = False
        super().__init__(env, cwd, stderr=self._stderr, command=command)

    # -- wire ---------------------------------------------------------------------------

    def on_line(self, line: bytes) -> None:
        line = line.rstrip(b"\n")
        self.raw_lines.append(line)
        try:
            msg = orjson.loads(line)
        except orjson.JSONDecodeError:
            self.bad_lines.append(line)
            return
        if not isinstance(msg, dict):
            self.bad_lines.append(line)
            return
        if "id" in msg and ("result" in msg or "error" in msg):
            key = (type(msg["id"]).__name__, msg["id"])
            with self._cond:
                self.answer_counts[key] = self.answer_counts.get(key, 0) + 1
                self.responses[msg["id"]] = msg
                self._cond.notify_all()
            self.inbox.put(msg)
        elif "id" not in msg:
            # Notifications, and error replies that carry no id (unattributable).
            self.notifications.append(msg)
        else:
            self.bad_lines.append(line)

    def on_eof(self) -> None:
        with self._cond:
            self.eof = True
            self._cond.notify_all()

    def next_id(self) -> Any:
        return f"p{next(self._ids)}"

    def read_reply(self, msg_id: Any, timeout: float = CALL_TIMEOUT_S) -> dict:
        """The response to ``msg_id``, whenever it arrived (responses are filed by id)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while msg_id not in self.responses:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no response to id {msg_id!r} within {timeout} s")
                if self.eof:
                    raise ConnectionError(f"shoal-mcp closed stdout before answering id {msg_id!r}")
                self._cond.wait(remaining)
            return self.responses.pop(msg_id)

    # -- lifecycle ----------------------------------------------------------------------

    def initialize(self) -> dict:
        reply = self.request(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "reliability", "version": "1"},
            },
        )
        assert "result" in reply, reply
        self.notify("notifications/initialized")
        self.drain()
        return reply["result"]

    def drain(self) -> None:
        """Forget replies already consumed through ``read_reply`` (the inbox sees them all)."""
        while True:
            try:
                self.inbox.get_nowait()
            except queue.Empty:
                return

    def stderr_text(self) -> str:
        path = getattr(self._stderr, "name", None)
        if not isinstance(path, str):
            return ""
        self._stderr.flush()
        return Path(path).read_text(errors="replace")

    def close(self, timeout: float = 15.0) -> int:
        code = super().close(timeout)
        if self._stderr is not subprocess.DEVNULL:
            self._stderr.close()
        return code

    def duplicates(self) -> dict:
        return {k: n for k, n in self.answer_counts.items() if n != 1}
