"""Shared helpers for the shoal-mcp end-to-end tests (no tests in this module).

Real processes only: a kernel on a short temporary socket (``start_kernel``) and a
``shoal-mcp`` subprocess spoken to over raw pipes (``RawFacade``); the SDK tests build
on the same kernel helpers.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from facade_process import FacadeProcess, jsonrpc_frame
from harness import KernelProcess, child_env

READY_TIMEOUT_S = 15.0


def short_tmp(prefix: str = "shoal-mcpt-") -> Path:
    """A temp dir directly under /tmp: AF_UNIX socket paths are limited to 108 bytes."""
    return Path(tempfile.mkdtemp(dir="/tmp", prefix=prefix))


def start_kernel(tmp: Path | None = None, *args: str) -> KernelProcess:
    """A real kernel, ready when its socket accepts a connection.

    Readiness is probed with a bare socket rather than ``KernelProcess.wait_ready``:
    that one opens and immediately closes a ``KernelClient``, whose demux thread can
    outlive ``close()`` and then read from the next socket that reuses its fd number,
    stealing replies from the test's own client (reported to the lead).
    """
    k = KernelProcess(tmp or short_tmp(), *args).start(wait=False)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        assert k.proc is not None
        if k.proc.poll() is not None:
            _, err = k.proc.communicate()
            raise RuntimeError(f"kernel exited {k.proc.returncode}: {err.decode()[-2000:]}")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(k.socket))
            return k
        except OSError:
            if time.monotonic() > deadline:
                k.stop(signal.SIGKILL)
                raise TimeoutError("kernel did not become ready") from None
            time.sleep(0.02)
        finally:
            probe.close()


def stop_kernel(k: KernelProcess) -> None:
    k.stop()
    shutil.rmtree(k.tmp, ignore_errors=True)


def facade_env(k: KernelProcess, **extra: str) -> dict[str, str]:
    env = child_env(
        {
            "SHOAL_SOCKET": str(k.socket),
            "SHOAL_STATE_DIR": str(k.state),
            "SHOAL_NO_AUTOSTART": "1",
        }
    )
    env.pop("SHOAL_SESSION", None)
    env.update(extra)
    return env


def pids_with_arg(arg: str) -> list[int]:
    """Pids whose argv contains ``arg`` as one exact argument (a per-test marker)."""
    needle = arg.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in argv:
            found.append(int(entry))
    return found


def kill_pids(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def vm_hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM")


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


class RawFacade(FacadeProcess):
    """``shoal-mcp`` over raw pipes: write bytes, read parsed frames, keep every line."""

    def __init__(self, env: dict[str, str], cwd: str | Path | None = None) -> None:
        self.lines: list[bytes] = []
        self.messages: queue.Queue[dict] = queue.Queue()
        self.stderr = bytearray()
        self._ids = iter(range(1000, 10**9))
        super().__init__(env, cwd)
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

    # -- writing -----------------------------------------------------------------------

    def send(self, message: dict, eol: bytes = b"\n") -> None:
        self.write(orjson.dumps(message) + eol)

    def request(self, method: str, params: dict | None = None, msg_id: Any = None) -> Any:
        """Send a request; returns its id."""
        msg_id = next(self._ids) if msg_id is None else msg_id
        self.write(jsonrpc_frame(method, params, msg_id))
        return msg_id

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

    def wait_reply(self, msg_id: Any, timeout: float = 15.0) -> dict:
        """The response to ``msg_id`` (notifications and other replies are skipped)."""
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

    def call(self, method: str, params: dict | None = None, timeout: float = 15.0) -> dict:
        return self.wait_reply(self.request(method, params), timeout)

    def initialize(self, version: str = "2025-06-18") -> dict:
        reply = self.call(
            "initialize",
            {
                "protocolVersion": version,
                "capabilities": {},
                "clientInfo": {"name": "shoal-tests", "version": "0"},
            },
        )
        self.notify("notifications/initialized")
        return reply

    def tool(self, name: str, arguments: dict, timeout: float = 30.0) -> dict:
        return self.call("tools/call", {"name": name, "arguments": arguments}, timeout)

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
