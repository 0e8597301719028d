"""One real ``shoal-mcp`` child over raw pipes: spawn, write, read lines, close.

The base of the two raw-pipe test clients: ``mcp_support.RawFacade`` (every message in
arrival order, for exact-sequence tests) and ``reliability_support.McpPipe`` (responses
filed by id, for pipelining and exactly-once checks). They differ only in what they do
with each stdout line, which a subclass says in ``on_line``.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

import orjson


def jsonrpc_frame(method: str, params: Any = None, msg_id: Any = None) -> bytes:
    """One newline-terminated JSON-RPC request (or notification when ``msg_id`` is None)."""
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if msg_id is not None:
        message["id"] = msg_id
    if params is not None:
        message["params"] = params
    return orjson.dumps(message) + b"\n"


class FacadeProcess:
    """``python -m shoal_mcp.facade``; a reader thread hands each stdout line to ``on_line``.

    Subclasses set up their own state before calling ``__init__``: the reader starts here.
    """

    def __init__(
        self,
        env: dict[str, str],
        cwd: str | Path | None = None,
        stderr: int | IO[bytes] = subprocess.PIPE,
    ) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "shoal_mcp.facade"],
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
