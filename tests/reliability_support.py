"""Shared helpers for the reliability tests (issue #9) and the load bench.

``McpPipe`` drives one real ``shoal-mcp`` subprocess over raw stdio pipes: requests are
written as they are asked for (several may be in flight), a reader thread decodes every
stdout line and files responses by id, so a test can pipeline calls and then prove each
id was answered exactly once. The ``proc_*`` helpers read ``/proc`` for fd, child,
zombie, thread and memory counts of the kernel.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from facade_process import FacadeProcess, jsonrpc_frame
from harness import KernelProcess

CALL_TIMEOUT = 60.0
PROTOCOL = "2025-06-18"


def short_tmp(prefix: str = "shrl-") -> Path:
    """A fresh directory under /tmp: AF_UNIX socket paths must stay under 108 bytes."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def facade_env(socket: Path, state: Path, session: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("SHOAL_TOKEN", None)
    env.update(
        SHOAL_SOCKET=str(socket),
        SHOAL_STATE_DIR=str(state),
        SHOAL_SESSION=session,
        SHOAL_NO_AUTOSTART="1",
    )
    env.update(extra)
    return env


class McpPipe(FacadeProcess):
    """One ``shoal-mcp`` child over raw pipes; responses are filed by id as they arrive."""

    def __init__(
        self, env: dict[str, str], cwd: str | None = None, stderr_path: Path | None = None
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
        super().__init__(env, cwd, stderr=self._stderr)

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

    def send(self, method: str, params: Any = None, msg_id: Any = None) -> Any:
        if msg_id is None:
            msg_id = f"p{next(self._ids)}"
        self.write(jsonrpc_frame(method, params, msg_id))
        return msg_id

    def wait(self, msg_id: Any, timeout: float = CALL_TIMEOUT) -> dict:
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

    def request(self, method: str, params: Any = None, timeout: float = CALL_TIMEOUT) -> dict:
        return self.wait(self.send(method, params), timeout)

    def tool(self, name: str, arguments: dict, msg_id: Any = None) -> Any:
        return self.send("tools/call", {"name": name, "arguments": arguments}, msg_id)

    def call_tool(self, name: str, arguments: dict, timeout: float = CALL_TIMEOUT) -> dict:
        return self.wait(self.tool(name, arguments), timeout)

    # -- lifecycle ----------------------------------------------------------------------

    def initialize(self) -> dict:
        reply = self.request(
            "initialize",
            {
                "protocolVersion": PROTOCOL,
                "capabilities": {},
                "clientInfo": {"name": "reliability", "version": "1"},
            },
        )
        assert "result" in reply, reply
        self.notify("notifications/initialized")
        self.drain()
        return reply["result"]

    def drain(self) -> None:
        """Forget replies already consumed through ``wait`` (the inbox sees them all)."""
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


def structured(reply: dict) -> dict:
    """structuredContent of a successful tools/call reply (asserting it succeeded)."""
    assert "result" in reply, reply
    result = reply["result"]
    assert result.get("isError") is False, result
    return result["structuredContent"]


def wire_text(value: dict) -> str:
    """The text of a tagged ``str`` wire value."""
    assert value.get("$") == "str", value
    return value["v"]


# -- /proc readings -------------------------------------------------------------------


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _stat_fields(pid: int | str) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text.rsplit(")", 1)[1].split()


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, state letter) of every direct child of ``pid``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(entry)
        if fields and int(fields[1]) == pid:
            out.append((int(entry), fields[0]))
    return out


def zombies(pid: int) -> list[int]:
    return [p for p, state in children(pid) if state == "Z"]


def status_field(pid: int, name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    raise KeyError(name)


def threads(pid: int) -> int:
    return status_field(pid, "Threads")


def rss_kib(pid: int) -> int:
    return status_field(pid, "VmRSS")


def no_traceback(lines: list[bytes]) -> list[bytes]:
    """Lines that leak Python traceback text (should be none)."""
    return [ln for ln in lines if b"Traceback (most recent call last)" in ln or b'File "/' in ln]


# -- the mixed-load driver (tests/test_reliability_load.py, bench/test_bench_load.py) --


class LoadFailure(AssertionError):
    pass


class FacadeLoad:
    """M mixed calls through one facade with up to ``window`` requests in flight.

    Base operations rotate through: a foreground ``echo <token>`` (then ``shoal_get`` of
    its ``.out``), a background task (then ``shoal_get task:N`` with ``wait_ms``), a
    failing command whose stderr carries a token, and ``shoal_journal``. Follow-ups are
    sent as soon as the call they depend on has answered. Every reply is checked against
    the call it answers; anything wrong is recorded in ``errors``.
    """

    def __init__(self, pipe: McpPipe, name: str, calls: int, window: int = 4) -> None:
        self.pipe = pipe
        self.name = name
        self.calls = calls
        self.window = window
        self.latencies: list[float] = []
        self.by_kind: dict[str, list[float]] = {}
        self.errors: list[str] = []
        self.sent_ids: list[Any] = []
        self.answered = 0
        self._seq = itertools.count()
        self._bg_busy = False

    def _token(self) -> str:
        return f"{self.name}-{next(self._seq)}-{os.urandom(4).hex()}"

    def _base_op(self, i: int) -> tuple[str, dict, dict]:
        kind = ("fg", "bg", "fail", "journal")[i % 4]
        if kind == "bg" and self._bg_busy:
            # One background task per facade at a time: all facades share the local
            # principal, whose policy quota (max_tasks) must not turn load into -32031.
            kind = "fg"
        if kind == "bg":
            self._bg_busy = True
        tok = self._token()
        if kind == "fg":
            return "shoal_exec", {"src": f"echo {tok}"}, {"kind": kind, "tok": tok}
        if kind == "bg":
            return (
                "shoal_exec",
                {"src": f"sleep 0.0{i % 5}; echo {tok}", "background": True},
                {"kind": kind, "tok": tok},
            )
        if kind == "fail":
            return "shoal_exec", {"src": f"echo {tok} >&2; exit 3"}, {"kind": kind, "tok": tok}
        return "shoal_journal", {"limit": 5}, {"kind": kind}

    def _check(self, op: dict, reply: dict) -> tuple[str, dict, dict] | None:
        """Validate ``reply`` for ``op``; return a follow-up operation or None."""
        kind = op["kind"]
        sc = structured(reply)
        if kind == "fg":
            if wire_text(sc["value"]["out"]) != op["tok"] + "\n":
                raise LoadFailure(f"fg {op['tok']} got {sc['value']['out']!r}")
            return (
                "shoal_get",
                {"ref": sc["ref"], "path": ".out"},
                {"kind": "get", "tok": op["tok"]},
            )
        if kind == "get":
            if wire_text(sc["value"]) != op["tok"] + "\n":
                raise LoadFailure(f"get {op['tok']} got {sc['value']!r}")
            return None
        if kind == "bg":
            if not str(sc.get("task", "")).startswith("task:"):
                raise LoadFailure(f"bg {op['tok']} got {sc!r}")
            return (
                "shoal_get",
                {"ref": sc["task"], "wait_ms": 30000},
                {"kind": "await", "tok": op["tok"], "task": sc["task"]},
            )
        if kind == "await":
            if sc.get("task", {}).get("state") != "completed":
                raise LoadFailure(f"await {op['task']} not completed: {sc.get('task')!r}")
            if wire_text(sc["value"]["out"]) != op["tok"] + "\n":
                raise LoadFailure(f"await {op['task']} ({op['tok']}) got {sc['value']['out']!r}")
            return None
        if kind == "fail":
            value = sc["value"]
            if (
                value["status"] != 3
                or value["ok"] is not False
                or wire_text(value["err"]) != op["tok"] + "\n"
            ):
                raise LoadFailure(f"fail {op['tok']} got {value!r}")
            return None
        if kind == "journal":
            rows = sc["rows"]
            if not isinstance(rows, list) or len(rows) > 5 or sc["count"] != len(rows):
                raise LoadFailure(f"journal got {sc!r}")
            return None
        raise AssertionError(kind)

    def run(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        pending: dict[Any, tuple[dict, float]] = {}
        followups: list[tuple[str, dict, dict]] = []
        base = 0
        sent = 0
        while sent < self.calls or pending:
            while len(pending) < self.window and sent < self.calls:
                if followups:
                    name, args, op = followups.pop(0)
                else:
                    name, args, op = self._base_op(base)
                    base += 1
                msg_id = f"{self.name}:{sent}" if sent % 2 else sent  # string and int ids
                self.pipe.tool(name, args, msg_id)
                self.sent_ids.append(msg_id)
                pending[msg_id] = (op, time.perf_counter())
                sent += 1
            try:
                reply = self.pipe.inbox.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                self.errors.append(f"{self.name}: timed out with {len(pending)} calls unanswered")
                return
            entry = pending.pop(reply["id"], None)
            if entry is None:
                self.errors.append(f"{self.name}: unexpected or duplicate reply id {reply['id']!r}")
                continue
            op, t0 = entry
            self.latencies.append(time.perf_counter() - t0)
            self.by_kind.setdefault(op["kind"], []).append(self.latencies[-1])
            if op["kind"] == "await":
                self._bg_busy = False
            self.answered += 1
            try:
                follow = self._check(op, reply)
            except (AssertionError, KeyError, TypeError) as exc:
                self.errors.append(f"{self.name}: {type(exc).__name__}: {exc}"[:500])
                if op["kind"] == "bg":
                    self._bg_busy = False
                continue
            if follow is not None:
                followups.append(follow)


def run_load(
    socket: Path,
    state: Path,
    facades: int,
    calls: int,
    window: int = 4,
    timeout: float = 300.0,
    log_dir: Path | None = None,
) -> dict:
    """Drive ``facades`` shoal-mcp processes × ``calls`` mixed calls; return the figures."""
    pipes = [
        McpPipe(
            facade_env(socket, state, f"load{i}"),
            stderr_path=(log_dir / f"facade{i}.err") if log_dir else None,
        )
        for i in range(facades)
    ]
    try:
        for p in pipes:
            try:
                p.initialize()
            except (TimeoutError, ConnectionError) as exc:
                raise LoadFailure(
                    f"facade {p.pid} did not initialize: {exc}; alive={p.alive()}, "
                    f"stdout={p.raw_lines[:3]!r}, stderr={p.stderr_text()[-2000:]!r}"
                ) from exc
        loads = [FacadeLoad(p, f"f{i}", calls, window) for i, p in enumerate(pipes)]
        threads_ = [threading.Thread(target=ld.run, args=(timeout,), daemon=True) for ld in loads]
        t0 = time.perf_counter()
        for th in threads_:
            th.start()
        for th in threads_:
            th.join(timeout + 10)
        wall = time.perf_counter() - t0
        errors = [e for ld in loads for e in ld.errors]
        duplicates = {p.pid: p.duplicates() for p in pipes if p.duplicates()}
        bad_lines = [ln for p in pipes for ln in p.bad_lines]
        lat = sorted(x for ld in loads for x in ld.latencies)
        answered = sum(ld.answered for ld in loads)
        alive_before_close = all(p.alive() for p in pipes)
    finally:
        codes = [p.close() for p in pipes]

    def pct(q: float, values: list[float] | None = None) -> float:
        values = lat if values is None else values
        return (
            round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 2)
            if values
            else float("nan")
        )

    kinds: dict[str, list[float]] = {}
    for ld in loads:
        for kind, values in ld.by_kind.items():
            kinds.setdefault(kind, []).extend(values)
    per_kind = {
        k: {"n": len(v), "p50_ms": pct(0.5, sorted(v)), "p99_ms": pct(0.99, sorted(v))}
        for k, v in sorted(kinds.items())
    }

    return {
        "facades": facades,
        "calls_per_facade": calls,
        "window": window,
        "calls": facades * calls,
        "answered": answered,
        "wall_s": round(wall, 3),
        "calls_per_s": round(answered / wall, 1) if wall else 0.0,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "max_ms": round(lat[-1] * 1000, 2) if lat else None,
        "per_kind": per_kind,
        "errors": errors,
        "duplicates": duplicates,
        "bad_lines": bad_lines[:5],
        "facades_alive": alive_before_close,
        "facade_exit_codes": codes,
    }


def pgid_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid``."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(entry)
        if fields and int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return members


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, 9)
    except (ProcessLookupError, PermissionError):
        pass


class RawKernel:
    """Newline-JSON straight to the kernel socket; replies filed by id (any order)."""

    def __init__(self, path: Path) -> None:
        import socket as _socket

        self.sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        self.sock.connect(str(path))
        self.buf = b""
        self.replies: dict[Any, dict] = {}
        self.frames: list[bytes] = []
        self._ids = itertools.count(1)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawKernel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send(self, method: str, params: Any = None) -> int:
        msg_id = next(self._ids)
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None:
            msg["params"] = params
        self.sock.sendall(orjson.dumps(msg) + b"\n")
        return msg_id

    def wait(self, msg_id: Any, timeout: float = CALL_TIMEOUT) -> dict:
        deadline = time.monotonic() + timeout
        while msg_id not in self.replies:
            while b"\n" not in self.buf:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no reply to {msg_id!r} from the kernel")
                self.sock.settimeout(remaining)
                chunk = self.sock.recv(1 << 16)
                if not chunk:
                    raise ConnectionError("the kernel closed the connection")
                self.buf += chunk
            line, self.buf = self.buf.split(b"\n", 1)
            self.frames.append(line)
            msg = orjson.loads(line)
            if "id" in msg and ("result" in msg or "error" in msg):
                self.replies[msg["id"]] = msg
        return self.replies.pop(msg_id)

    def call(self, method: str, params: Any = None, timeout: float = CALL_TIMEOUT) -> dict:
        return self.wait(self.send(method, params), timeout)


@contextlib.contextmanager
def fresh_kernel():
    """A kernel on a short temporary socket path, stopped and removed afterwards."""
    tmp = short_tmp()
    k = KernelProcess(tmp).start()
    try:
        yield k
    finally:
        k.stop()
        shutil.rmtree(tmp, ignore_errors=True)
