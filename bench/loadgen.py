"""The mixed-load driver: N real ``shoal-mcp`` facades x M pipelined calls on one kernel.

Used by the load bench (``bench/test_bench_load.py``: figures, saved) and by the
reliability test (``tests/test_reliability_load.py``: correctness only, no timing).
``run_load`` returns the figures; the caller decides what to assert.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

from tests.support.facade import McpPipe, facade_env
from tests.support.kernel import KernelProcess
from tests.support.results import shown, structured, wire_text


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
            return "shoal_exec", {"command": f"echo {tok}"}, {"kind": kind, "tok": tok}
        if kind == "bg":
            return (
                "shoal_exec",
                {"command": f"sleep 0.0{i % 5}; echo {tok}", "background": True},
                {"kind": kind, "tok": tok},
            )
        if kind == "fail":
            return "shoal_exec", {"command": f"echo {tok} >&2; exit 3"}, {"kind": kind, "tok": tok}
        return "shoal_journal", {"limit": 5}, {"kind": kind}

    def _check(self, op: dict, reply: dict) -> tuple[str, dict, dict] | None:
        """Validate ``reply`` for ``op``; return a follow-up operation or None."""
        kind = op["kind"]
        sc = structured(reply)
        if kind == "fg":
            if shown(reply) != op["tok"]:
                raise LoadFailure(f"fg {op['tok']} got {shown(reply)!r}")
            return (
                "shoal_get",
                {"ref": sc["ref"], "path": ".out", "format": "json"},
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
            if shown(reply) != op["tok"]:
                raise LoadFailure(f"await {op['task']} ({op['tok']}) got {shown(reply)!r}")
            return None
        if kind == "fail":
            value = sc["value"]  # the outcome's status; its stderr tail is in the text
            if value["status"] != 3 or value["ok"] is not False or op["tok"] not in shown(reply):
                raise LoadFailure(f"fail {op['tok']} got {value!r} {shown(reply)!r}")
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
                self.pipe.send_tool(name, args, msg_id)
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
    kernel: KernelProcess,
    facades: int,
    calls: int,
    window: int = 4,
    timeout: float = 300.0,
    log_dir: Path | None = None,
) -> dict:
    """Drive ``facades`` shoal-mcp processes × ``calls`` mixed calls; return the figures."""
    pipes = [
        McpPipe(
            facade_env(kernel, f"load{i}"),
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
