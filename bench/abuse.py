"""Abusers for the soak bench (``bench/test_bench_soak.py``), one process each.

Each runs a mixed abuse loop as a token principal with no grants until its deadline:
event floods over rotating ``user.*`` channels, plans and denied execs of 1 MiB
sources, 1000-row journal queries, 16 MiB frames before attach, connection bursts. It
returns (through a queue) how many operations of each kind it did and which errors it
was answered (budget errors are expected; a lost connection or a traceback is not).
"""

from __future__ import annotations

import itertools
import socket
import time
from collections import Counter
from typing import Any

from shoal_mcp.protocol.limits import MAX_FRAME, SRC_MAX_CHARS, VALUE_HARD_CAP
from tests.support.wire import RawConn

PAYLOAD = {"d": "x" * (VALUE_HARD_CAP - 64)}
BURST = 32  # connections opened and dropped at once


def _attached(sock_path: str, token: str, session: str) -> RawConn:
    conn = RawConn(sock_path, keep_frames=False)
    reply = conn.call("session.attach", {"session": session, "token": token})
    if "result" not in reply:
        raise RuntimeError(f"attach refused: {reply}")
    return conn


def _flood_events(conn: RawConn, n: int, tally: Counter) -> None:
    for _ in range(64):
        conn.send("events.publish", {"channel": f"user.soak-{n % 12}", "payload": PAYLOAD})
    for _ in range(64):
        _note(conn.recv(60), tally, "publish")


def _big_sources(conn: RawConn, n: int, tally: Counter) -> None:
    src = f"echo {n % 7}" + "y" * (SRC_MAX_CHARS - 16)
    _note(conn.call("exec", {"src": src, "mode": "plan"}, timeout=120), tally, "plan")
    _note(conn.call("exec", {"src": src + " z"}, timeout=120), tally, "denied_exec")


def _journal(conn: RawConn, tally: Counter) -> None:
    _note(conn.call("journal.query", {"limit": 1000}, timeout=120), tally, "journal_query")
    _note(conn.call("events.read", {"channel": "user.soak-0"}, timeout=120), tally, "read")


def _before_attach(sock_path: str, tally: Counter) -> None:
    conn = RawConn(sock_path, keep_frames=False)
    try:
        pad = b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"p":"'
        conn.send_raw(pad + b"x" * (MAX_FRAME - len(pad) - 4) + b'"}}\n')
        _note(conn.recv(60), tally, "frame_before_attach")
    finally:
        conn.close()


def _burst(sock_path: str, tally: Counter) -> None:
    socks = []
    for _ in range(BURST):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(sock_path)
        except OSError:
            tally["burst_connect_failed"] += 1
            s.close()
            continue
        socks.append(s)
    for s in socks:
        s.close()
    tally["burst"] += 1


def _note(reply: dict, tally: Counter, what: str) -> None:
    if "error" in reply:
        err = reply["error"]
        quota = (err.get("data") or {}).get("quota")
        tally[f"{what}:{err['code']}{':' + quota if quota else ''}"] += 1
    else:
        tally[f"{what}:ok"] += 1


def abuse(sock_path: str, token: str, name: str, deadline: float, out: Any) -> None:
    """Run the abuse mix until ``deadline`` (time.monotonic), then put the tally on ``out``."""
    tally: Counter = Counter()
    conn = _attached(sock_path, token, f"soak-{name}")
    try:
        for n in itertools.count():
            if time.monotonic() >= deadline:
                break
            step = n % 5
            try:
                if step == 0:
                    _flood_events(conn, n, tally)
                elif step == 1:
                    _big_sources(conn, n, tally)
                elif step == 2:
                    _journal(conn, tally)
                elif step == 3:
                    _before_attach(sock_path, tally)
                else:
                    _burst(sock_path, tally)
            except (OSError, TimeoutError, ConnectionError) as exc:
                tally[f"lost:{type(exc).__name__}"] += 1
                conn.close()
                conn = _attached(sock_path, token, f"soak-{name}")
    finally:
        conn.close()
        out.put((name, dict(tally)))
