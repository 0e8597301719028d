"""A synchronous MCP client over a server's raw stdio pipes, shared by the benches.

One request line out, the matching reply line back: the numbers measure the servers,
not a client library. Used for shoal's ``shoal-mcp`` and the FastMCP baseline alike.
"""

from __future__ import annotations

import itertools
import subprocess

import orjson

PROTOCOL_VERSION = "2025-06-18"


class PipeClient:
    """An initialized MCP session with a server child; ``call_tool`` is one round trip."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
        )
        self._ids = itertools.count(1)
        reply = self.request(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "shoal-bench", "version": "0"},
            },
        )
        assert "result" in reply, reply
        self.send_message({"jsonrpc": "2.0", "method": "notifications/initialized"})

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send_message(self, message: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(orjson.dumps(message) + b"\n")
        self.proc.stdin.flush()

    def request(self, method: str, params: dict) -> dict:
        msg_id = next(self._ids)
        self.send_message({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("server closed stdout")
            message = orjson.loads(line)
            if message.get("id") == msg_id and "method" not in message:
                return message

    def call_tool(self, name: str, arguments: dict) -> dict:
        reply = self.request("tools/call", {"name": name, "arguments": arguments})
        result = reply["result"]
        assert result.get("isError") is False, result
        return result

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
