"""PtyManager (docs/protocol.md, PTYs) against real pseudoterminals and real processes: no mocks."""

from __future__ import annotations

import base64
import gc
import os
import signal
import sys
import threading
import time
from pathlib import Path

import orjson
import pyte
import pytest

from shoal_mcp.kernel.config.limits import PTY_EVENT_INTERVAL_S
from shoal_mcp.kernel.pty.manager import PTY_MAX_CELL_CHARS, PtyManager, _Screen, encode_input
from shoal_mcp.protocol.errors import ErrorCode, RpcError
from shoal_mcp.protocol.limits import PTY_SCROLLBACK_LINES, VALUE_HARD_CAP
from tests.support.polling import wait_until
from tests.support.procfs import children, proc_comm, proc_gone, proc_ids, proc_state

CURSES_BOX = Path(__file__).resolve().parent / "support" / "curses_box.py"
PY = sys.executable
OWNER = "default\x00uid:1000"
OTHER = "default\x00agent:other"
OWNER_PRINCIPAL, OTHER_PRINCIPAL = "uid:1000", "agent:other"
DEADLINE_S = 60.0  # a waiting budget, not a speed check: 1000x1000 screens on a loaded machine


def wait_for(predicate, timeout: float = DEADLINE_S, what: str = "condition"):
    return wait_until(predicate, timeout, what=what)


def pty_env(**extra: str) -> dict[str, str]:
    """This run's environment without what would change a shell's prompt or startup."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PS1", "BASH"))}
    env.update(extra)
    return env


class Events:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[tuple[float, str, dict]] = []

    def __call__(self, pty_id: str, payload: dict) -> None:
        with self.lock:
            self.items.append((time.monotonic(), pty_id, payload))

    def of(self, pty_id: str, kind: str) -> list[tuple[float, dict]]:
        with self.lock:
            return [(t, p) for t, i, p in self.items if i == pty_id and p["kind"] == kind]


@pytest.fixture
def events() -> Events:
    return Events()


@pytest.fixture
def mgr(events: Events):
    m = PtyManager(on_screen_change=events)
    yield m
    m.close_all()


def open_pty(m: PtyManager, cmd: str, *args: str, cols: int = 80, rows: int = 24, **kw) -> dict:
    return m.open(
        cmd=cmd,
        args=list(args),
        cols=cols,
        rows=rows,
        env=kw.pop("env", None) or pty_env(),
        cwd=kw.pop("cwd", "/tmp"),
        owner=kw.pop("owner", OWNER),
    )


def screen_text(m: PtyManager, pty_id: str, owner: str = OWNER) -> str:
    return "\n".join(m.read(pty_id, "probe", owner)["screen"])


def wait_screen(m: PtyManager, pty_id: str, needle: str, what: str | None = None) -> str:
    def check() -> str | None:
        text = screen_text(m, pty_id)
        return text if needle in text else None

    return wait_for(check, what=what or repr(needle))


def wait_exit(m: PtyManager, pty_id: str) -> dict:
    def check() -> dict | None:
        out = m.read(pty_id, "probe", OWNER)
        return None if out["alive"] else out

    return wait_for(check, what=f"{pty_id} to exit")


def rpc_code(exc_info) -> int:
    return exc_info.value.code


def settled_fd_count() -> int:
    """This process's open fds once the collector ran: fds an earlier test left to it
    would otherwise close in the middle of a count."""
    gc.collect()
    return len(os.listdir("/proc/self/fd"))


# ------------------------------------------------------------------ real programs


def test_python_repl_computes(mgr: PtyManager) -> None:
    r = open_pty(mgr, PY, "-q")
    assert r["pty_id"].startswith("pty:") and r["cmd"] == PY
    assert (r["cols"], r["rows"]) == (80, 24) and r["pid"] > 0
    wait_screen(mgr, r["pty_id"], ">>>")
    assert mgr.send(r["pty_id"], ["6*7", {"key": "Enter"}], OWNER) == {
        "pty_id": r["pty_id"],
        "bytes": 4,
    }
    text = wait_screen(mgr, r["pty_id"], "42")
    assert ">>> 6*7" in text
    out = mgr.read(r["pty_id"], "probe", OWNER)
    assert out["alive"] and "exit" not in out and out["pid"] == r["pid"]
    assert len(out["screen"]) == 24 and all(row == row.rstrip() for row in out["screen"])
    assert out["screen"][out["cursor"]["row"]].startswith(">>>")


def test_curses_box_follows_resize(mgr: PtyManager) -> None:
    # LINES/COLUMNS in the given env would make ncurses ignore the winsize: they are dropped.
    env = pty_env(LINES="12", COLUMNS="40")
    r = open_pty(mgr, PY, str(CURSES_BOX), cols=40, rows=12, env=env)
    pid = r["pty_id"]

    def box(w: int, h: int):
        def check():
            s = mgr.read(pid, "probe", OWNER)["screen"]
            edge = "+" + "-" * (w - 2) + "+"
            return len(s) == h and s[0] == edge and s[h - 1] == edge and f"size {w}x{h}" in s[1]

        return check

    wait_for(box(40, 12), what="40x12 box")
    assert mgr.resize(pid, 60, 20, OWNER) == {"pty_id": pid, "cols": 60, "rows": 20}
    wait_for(box(60, 20), what="60x20 box")
    out = mgr.read(pid, "probe", OWNER)
    assert (out["cols"], out["rows"]) == (60, 20)
    assert out["screen"][19][59] == "+" and out["screen"][10][59] == "|"
    mgr.resize(pid, 30, 8, OWNER)
    wait_for(box(30, 8), what="30x8 box")
    mgr.send(pid, "q", OWNER)
    assert wait_exit(mgr, pid)["exit"] == {"status": 0}


def test_bash_ctrl_c_interrupts_foreground_job(mgr: PtyManager) -> None:
    r = open_pty(mgr, "bash", "--noprofile", "--norc", env=pty_env(PS1="READY$ "))
    pid = r["pty_id"]
    wait_screen(mgr, pid, "READY$")
    mgr.send(pid, ["sleep 100", {"key": "Enter"}], OWNER)
    (sleeper,) = wait_for(lambda: children(r["pid"]), what="sleep child")
    # ^C before the forked child has exec'd sleep would only hit bash's own handler
    wait_for(lambda: proc_comm(sleeper) == "sleep", what="sleep exec'd")
    # the PTY is bash's controlling terminal and sleep is its foreground job
    bash_stat, sleep_stat = proc_ids(r["pid"]), proc_ids(sleeper)
    assert bash_stat["tty_nr"] != 0 and sleep_stat["tty_nr"] == bash_stat["tty_nr"]
    assert bash_stat["session"] == r["pid"] and sleep_stat["tpgid"] == sleep_stat["pgrp"]
    mgr.send(pid, {"key": "Ctrl-C"}, OWNER)
    wait_for(lambda: screen_text(mgr, pid).count("READY$") >= 2, what="prompt after ^C")
    wait_for(lambda: proc_gone(sleeper), what="sleep gone")
    out = mgr.read(pid, "probe", OWNER)
    assert out["alive"] and out["screen"][out["cursor"]["row"]] == "READY$"


def test_exit_status_and_signal(mgr: PtyManager, events: Events) -> None:
    a = open_pty(mgr, "sh", "-c", "exit 3")
    b = open_pty(mgr, "sh", "-c", "kill -TERM $$")
    ra = wait_exit(mgr, a["pty_id"])
    assert ra["alive"] is False and ra["exit"] == {"status": 3}
    assert wait_exit(mgr, b["pty_id"])["exit"] == {"signal": signal.SIGTERM}
    wait_for(lambda: events.of(a["pty_id"], "exit"), what="exit event")
    assert [p for _, p in events.of(a["pty_id"], "exit")] == [
        {"kind": "exit", "exit": {"status": 3}}
    ]
    # an exited PTY stays listed (and counted) until closed; input is refused
    assert {i["pty_id"]: i["alive"] for i in mgr.list(OWNER)} == {
        a["pty_id"]: False,
        b["pty_id"]: False,
    }
    with pytest.raises(RpcError) as ei:
        mgr.send(a["pty_id"], "x", OWNER)
    assert rpc_code(ei) == ErrorCode.INVALID_PARAMS and ei.value.data["field"] == "pty_id"
    assert mgr.close(a["pty_id"], OWNER) == {
        "pty_id": a["pty_id"],
        "closed": True,
        "exit": {"status": 3},
    }
    assert len(events.of(a["pty_id"], "exit")) == 1


def test_close_live_pty_leaves_no_process_or_fd(mgr: PtyManager, events: Events) -> None:
    fds_before = settled_fd_count()
    threads_before = threading.active_count()
    r = open_pty(mgr, "sleep", "1000")
    assert proc_state(r["pid"]) in ("S", "R")
    out = mgr.close(r["pty_id"], OWNER)
    assert out == {"pty_id": r["pty_id"], "closed": True, "exit": {"signal": signal.SIGHUP}}
    assert proc_gone(r["pid"])  # reaped: not even a zombie
    assert len(os.listdir("/proc/self/fd")) == fds_before
    assert threading.active_count() == threads_before
    assert events.of(r["pty_id"], "exit")[-1][1]["exit"] == {"signal": signal.SIGHUP}
    for call in (
        lambda: mgr.read(r["pty_id"], "c", OWNER),
        lambda: mgr.close(r["pty_id"], OWNER),
        lambda: mgr.send(r["pty_id"], "x", OWNER),
    ):
        with pytest.raises(RpcError) as ei:
            call()
        assert rpc_code(ei) == ErrorCode.UNKNOWN_PTY


def test_close_escalates_to_sigkill(mgr: PtyManager) -> None:
    r = open_pty(mgr, "sh", "-c", "trap '' HUP; echo ready; exec sleep 1000")
    wait_screen(mgr, r["pty_id"], "ready")
    t0 = time.monotonic()
    assert mgr.close(r["pty_id"], OWNER)["exit"] == {"signal": signal.SIGKILL}
    assert time.monotonic() - t0 < 5
    assert proc_gone(r["pid"])


def test_close_all(mgr: PtyManager) -> None:
    pids = [open_pty(mgr, "sleep", "1000")["pid"] for _ in range(3)]
    t0 = time.monotonic()
    mgr.close_all()
    assert time.monotonic() - t0 < 2 and all(proc_gone(p) for p in pids)
    assert mgr.list(None) == [] and mgr.count_of(OWNER_PRINCIPAL) == 0


@pytest.mark.parametrize("pidfds", [True, False], ids=["pidfd", "looking"])
def test_waiting_for_the_program_holds_no_lock(mgr: PtyManager, monkeypatch, pidfds: bool) -> None:
    """``OpenPty.wait`` holds no lock while it waits (``TABLES`` only for each look): a
    signal sent meanwhile goes at once, and the waiter sees the exit on the supervisor's
    pidfd or, without pidfds (not Linux), by looking."""
    import shoal_mcp.kernel.pty.terminal as terminal

    if not pidfds:
        monkeypatch.setattr(terminal, "_open_pidfd", lambda pid: None)
    r = open_pty(mgr, "sleep", "1000")
    p = mgr._get(r["pty_id"], OWNER)
    assert p.wait(0.2) is False  # still running
    outcome: list[bool] = []
    waiter = threading.Thread(target=lambda: outcome.append(p.wait(DEADLINE_S)))
    waiter.start()
    time.sleep(0.2)  # let it wait
    t0 = time.monotonic()
    p.signal(signal.SIGKILL)
    assert time.monotonic() - t0 < 1  # not held back by the waiter
    waiter.join(DEADLINE_S)
    assert outcome == [True] and time.monotonic() - t0 < 5
    assert p.proc.returncode is not None
    assert wait_exit(mgr, r["pty_id"])["exit"] == {"signal": signal.SIGKILL}


@pytest.mark.parametrize("pidfds", [True, False], ids=["pidfd", "looking"])
def test_exit_after_the_terminal_closed(mgr: PtyManager, monkeypatch, pidfds: bool) -> None:
    """A program that closes the terminal and ends later: the reader sees the terminal
    close first, then waits for the exit on the supervisor's pidfd (never on its pid,
    which ``close()`` may reap and the system reuse) or, without one, by looking."""
    import shoal_mcp.kernel.pty.terminal as terminal

    if not pidfds:
        monkeypatch.setattr(terminal, "_open_pidfd", lambda pid: None)
    r = open_pty(mgr, "sh", "-c", "exec </dev/null >/dev/null 2>&1; sleep 1.5; exit 7")
    p = mgr._get(r["pty_id"], OWNER)
    wait_for(lambda: p.eof, what="the terminal to close")
    assert p.exit is None  # closed before the program ended
    assert wait_exit(mgr, r["pty_id"])["exit"] == {"status": 7}


def test_huge_screen_read_stays_under_cap(mgr: PtyManager) -> None:
    r = open_pty(mgr, PY, "-c", "print(('x'*999+'\\n')*1000, end='')", cols=1000, rows=1000)
    out = wait_exit(mgr, r["pty_id"])
    assert len(orjson.dumps(out)) <= VALUE_HARD_CAP
    win = out["window"]
    assert (out["cols"], out["rows"]) == (1000, 1000)
    assert win["left"] == 0 and win["cols"] == 1000 and win["rows"] == len(out["screen"])
    assert 30 < win["rows"] < 1000
    assert win["top"] <= out["cursor"]["row"] < win["top"] + win["rows"]
    assert out["cursor"] == {"row": 999, "col": 0, "hidden": False}
    assert out["screen"][-1] == "" and out["screen"][-2] == "x" * 999
    # scrollback requested: still bounded, shares the budget
    sb = mgr.read(r["pty_id"], "probe", OWNER, scrollback=PTY_SCROLLBACK_LINES)
    assert len(orjson.dumps(sb)) <= VALUE_HARD_CAP
    assert sb["scrollback_total"] == 1 and sb["scrollback"] == ["x" * 999]
    with pytest.raises(RpcError) as ei:
        mgr.read(r["pty_id"], "probe", OWNER, scrollback=-1)
    assert ei.value.data["field"] == "scrollback"


def test_pathological_cells_window_columns(mgr: PtyManager) -> None:
    # 1000 columns of a base letter carrying many combining marks: ~22 KB per row.
    script = "import sys; sys.stdout.write(('a' + '\\u20d0'*20)*1000 * 40)"
    r = open_pty(mgr, PY, "-c", script, cols=1000, rows=50)
    out = wait_exit(mgr, r["pty_id"])
    assert len(orjson.dumps(out)) <= VALUE_HARD_CAP
    win = out["window"]
    assert win["cols"] < 1000 and win["rows"] >= 24
    row = out["screen"][0]
    assert len(row) == win["cols"] * PTY_MAX_CELL_CHARS


def test_scrollback_continues_the_screen(mgr: PtyManager) -> None:
    r = open_pty(mgr, "seq", "1", "100", cols=20, rows=10)
    out = wait_exit(mgr, r["pty_id"])
    assert "scrollback" not in out
    sb = mgr.read(r["pty_id"], "probe", OWNER, scrollback=30)
    assert sb["scrollback_total"] == 91
    lines = sb["scrollback"] + sb["screen"]
    assert lines[:31] == [str(i) for i in range(62, 93)]
    assert lines[-10:-1] == [str(i) for i in range(92, 101)] and lines[-1] == ""


# ------------------------------------------------------------------ terminal behaviour

RAW_ECHO = (
    "import os, sys, tty; tty.setraw(0); os.write(1, b'\\x1b[?1hREADY\\r\\n');"
    "print(os.read(0, 64).hex(), end='\\r\\n', flush=True);"
    "os.write(1, b'\\x1b[?1lNORMAL\\r\\n');"
    "print(os.read(0, 64).hex(), end='\\r\\n', flush=True);"
    "os.write(1, b'\\x1b[6n'); print('DSR', os.read(0, 64).hex(), end='\\r\\n', flush=True)"
)


def test_keys_reach_the_program_as_bytes(mgr: PtyManager) -> None:
    r = open_pty(mgr, PY, "-c", RAW_ECHO)
    pid = r["pty_id"]
    wait_screen(mgr, pid, "READY")
    mgr.send(pid, {"key": "Up"}, OWNER)  # application cursor mode (DECCKM) is on
    wait_screen(mgr, pid, b"\x1bOA".hex())
    wait_screen(mgr, pid, "NORMAL")  # the program switched DECCKM off again
    mgr.send(pid, [{"key": "Left"}, {"bytes": base64.b64encode(b"\x00\xff").decode()}], OWNER)
    wait_screen(mgr, pid, (b"\x1b[D" + b"\x00\xff").hex())
    # the emulator answered the cursor position report itself (cursor on row 5)
    text = wait_screen(mgr, pid, "DSR ")
    dsr = next(ln for ln in text.splitlines() if ln.startswith("DSR "))
    assert bytes.fromhex(dsr[4:]) == b"\x1b[5;1R"


def test_child_gets_default_signals_and_untouched_locale(mgr: PtyManager) -> None:
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        r = open_pty(
            mgr,
            "sh",
            "-c",
            'echo "[${LC_CTYPE-unset}] [$TERM] [${LINES-nolines}]"; exec sleep 1000',
            env=pty_env(LANG="C", LINES="5") | {"LC_CTYPE": ""},
        )
    finally:
        signal.signal(signal.SIGINT, old)
    assert "[] [xterm-256color] [nolines]" in wait_screen(mgr, r["pty_id"], "[xterm")
    status = Path(f"/proc/{r['pid']}/status").read_text()
    sigign = int(next(ln for ln in status.splitlines() if ln.startswith("SigIgn:")).split()[1], 16)
    assert not sigign & (1 << (signal.SIGINT - 1))
    env = pty_env(LANG="C")
    env.pop("LC_CTYPE", None)
    r2 = open_pty(mgr, "sh", "-c", 'echo "<${LC_CTYPE-unset}>"', env=env)
    assert "<unset>" in wait_screen(mgr, r2["pty_id"], "<")


def test_changed_is_per_reader(mgr: PtyManager) -> None:
    r = open_pty(mgr, "sh", "-c", "echo hello; exec sleep 1000")
    pid = r["pty_id"]
    wait_screen(mgr, pid, "hello")
    assert mgr.read(pid, "conn-a", OWNER)["changed"] is True
    assert mgr.read(pid, "conn-a", OWNER)["changed"] is False
    assert mgr.read(pid, "conn-b", OWNER)["changed"] is True
    mgr.resize(pid, 100, 30, OWNER)
    assert mgr.read(pid, "conn-a", OWNER)["changed"] is True
    assert mgr.read(pid, "conn-a", OWNER)["changed"] is False


def test_screen_events_are_throttled(mgr: PtyManager, events: Events) -> None:
    r = open_pty(mgr, "cat")
    pid = r["pty_id"]
    t0 = time.monotonic()
    for ch in "abcdefghijklmnopqrstuvwxyz0123456789":
        mgr.send(pid, ch, OWNER)
        time.sleep(0.01)
    burst = time.monotonic() - t0
    wait_screen(mgr, pid, "xyz0123456789")
    final = mgr.read(pid, "probe", OWNER)["cursor"]
    wait_for(
        lambda: (e := events.of(pid, "screen")) and e[-1][1]["cursor"] == final, what="trailing"
    )
    time.sleep(2 * PTY_EVENT_INTERVAL_S)
    got = events.of(pid, "screen")
    assert 1 <= len(got) <= burst / PTY_EVENT_INTERVAL_S + 3
    gaps = [b[0] - a[0] for a, b in zip(got, got[1:], strict=False)]
    assert all(g >= PTY_EVENT_INTERVAL_S * 0.9 for g in gaps), gaps
    assert got[-1][1] == {"kind": "screen", "cursor": final}


# ------------------------------------------------------------------ validation / ownership


@pytest.mark.parametrize("bad", [0, 1001, -5, "80", 80.0, True, None])
def test_dimension_validation(mgr: PtyManager, bad) -> None:
    with pytest.raises(RpcError) as ei:
        open_pty(mgr, "true", cols=bad)
    assert rpc_code(ei) == ErrorCode.INVALID_PARAMS and ei.value.data["field"] == "cols"
    with pytest.raises(RpcError) as ei:
        open_pty(mgr, "true", rows=bad)
    assert ei.value.data["field"] == "rows"


def test_resize_validation_and_limits(mgr: PtyManager) -> None:
    r = open_pty(mgr, "sleep", "1000", cols=1, rows=1)
    for cols, rows, field in ((0, 10, "cols"), (10, 1001, "rows"), ("a", 10, "cols")):
        with pytest.raises(RpcError) as ei:
            mgr.resize(r["pty_id"], cols, rows, OWNER)
        assert rpc_code(ei) == ErrorCode.INVALID_PARAMS and ei.value.data["field"] == field
    assert mgr.resize(r["pty_id"], 1000, 1000, OWNER)["cols"] == 1000
    out = mgr.read(r["pty_id"], "c", OWNER)
    assert len(out["screen"]) == 1000 and len(orjson.dumps(out)) <= VALUE_HARD_CAP


def test_spawn_failures(mgr: PtyManager, tmp_path: Path) -> None:
    noexec = tmp_path / "script"
    noexec.write_text("#!/bin/sh\n")
    garbage = tmp_path / "garbage"  # executable, but execve() says ENOEXEC (in the trampoline)
    garbage.write_bytes(b"\x7fELF not really")
    garbage.chmod(0o755)
    fds_before = settled_fd_count()
    for kw in (
        {"cmd": "definitely-not-a-command-4711"},
        {"cmd": str(noexec)},
        {"cmd": "true", "cwd": str(tmp_path / "missing")},
        {"cmd": "true", "env": {"PATH": str(tmp_path)}},
        {"cmd": str(garbage)},
    ):
        with pytest.raises(RpcError) as ei:
            mgr.open(
                cmd=kw["cmd"],
                args=[],
                cols=80,
                rows=24,
                env=kw.get("env", pty_env()),
                cwd=kw.get("cwd", "/tmp"),
                owner=OWNER,
            )
        assert rpc_code(ei) == ErrorCode.PTY_SPAWN and "reason" in ei.value.data
    assert len(os.listdir("/proc/self/fd")) == fds_before and mgr.count_of(OWNER_PRINCIPAL) == 0
    # relative commands resolve against cwd and the given PATH
    noexec.chmod(0o755)
    r = mgr.open(
        cmd="./script", args=None, cols=80, rows=24, env={}, cwd=str(tmp_path), owner=OWNER
    )
    assert wait_exit(mgr, r["pty_id"])["exit"] == {"status": 0}
    for field, kw in (
        ("cmd", {"cmd": ""}),
        ("args[1]", {"cmd": "true", "args": ["a", 3]}),
        ("env.X", {"cmd": "true", "env": {"X": 1}}),
    ):
        with pytest.raises(RpcError) as ei:
            mgr.open(
                cmd=kw["cmd"],
                args=kw.get("args"),
                cols=80,
                rows=24,
                env=kw.get("env", {}),
                cwd="/tmp",
                owner=OWNER,
            )
        assert ei.value.data["field"] == field
    assert mgr.count_of(OWNER_PRINCIPAL) == 1


def test_other_owner_sees_nothing(mgr: PtyManager) -> None:
    r = open_pty(mgr, "sleep", "1000")
    pid = r["pty_id"]
    calls = (
        lambda i, o: mgr.read(i, "c", o),
        lambda i, o: mgr.send(i, "x", o),
        lambda i, o: mgr.resize(i, 10, 10, o),
        lambda i, o: mgr.close(i, o),
    )
    for call in calls:
        with pytest.raises(RpcError) as other:
            call(pid, OTHER)
        with pytest.raises(RpcError) as unknown:
            call("pty:987654", OWNER)
        assert other.value.code == unknown.value.code == ErrorCode.UNKNOWN_PTY
        assert other.value.message == f"unknown pty: {pid}"
        assert other.value.data == {"pty_id": pid}
    assert mgr.list(OTHER) == [] and mgr.count_of(OTHER_PRINCIPAL) == 0
    assert mgr.count_of(OWNER_PRINCIPAL) == 1
    assert [i["pty_id"] for i in mgr.list(OWNER)] == [pid]
    assert set(mgr.list(OWNER)[0]) == {"pty_id", "pid", "cmd", "cols", "rows", "alive"}
    (everything,) = mgr.list(None)
    assert everything["owner"] == OWNER and everything["alive"] is True
    with pytest.raises(RpcError) as ei:
        mgr.read(7, "c", OWNER)
    assert ei.value.data["field"] == "pty_id"
    out = mgr.read(pid, "c", OWNER)  # untouched for its owner
    assert out["alive"] and (out["cols"], out["rows"]) == (80, 24)


# ------------------------------------------------------------------ key protocol


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Enter", b"\r"),
        ("Tab", b"\t"),
        ("Escape", b"\x1b"),
        ("Backspace", b"\x7f"),
        ("Delete", b"\x1b[3~"),
        ("Space", b" "),
        ("Up", b"\x1b[A"),
        ("Down", b"\x1b[B"),
        ("Right", b"\x1b[C"),
        ("Left", b"\x1b[D"),
        ("Home", b"\x1b[H"),
        ("End", b"\x1b[F"),
        ("PageUp", b"\x1b[5~"),
        ("page_down", b"\x1b[6~"),
        ("F1", b"\x1bOP"),
        ("F4", b"\x1bOS"),
        ("F5", b"\x1b[15~"),
        ("f10", b"\x1b[21~"),
        ("F12", b"\x1b[24~"),
        ("Ctrl-A", b"\x01"),
        ("ctrl-c", b"\x03"),
        ("CTRL+Z", b"\x1a"),
        ("enter", b"\r"),
    ],
)
def test_key_names(name: str, expected: bytes) -> None:
    assert encode_input({"key": name}) == expected


def test_every_function_and_ctrl_key_is_distinct() -> None:
    fkeys = {encode_input({"key": f"F{i}"}) for i in range(1, 13)}
    ctrl = {encode_input({"key": f"Ctrl-{chr(c)}"}) for c in range(ord("A"), ord("Z") + 1)}
    assert len(fkeys) == 12 and ctrl == {bytes([i]) for i in range(1, 27)}


def test_application_cursor_keys() -> None:
    assert encode_input({"key": "Up"}, app_cursor=True) == b"\x1bOA"
    assert encode_input({"key": "Home"}, app_cursor=True) == b"\x1bOH"
    assert encode_input({"key": "PageUp"}, app_cursor=True) == b"\x1b[5~"


def test_input_shapes() -> None:
    assert encode_input("héllo\n") == "héllo\n".encode()
    assert encode_input({"text": "ls"}) == b"ls"
    assert encode_input({"bytes": base64.b64encode(b"\x00\x1b").decode()}) == b"\x00\x1b"
    assert encode_input(["ls", {"key": "Enter"}, {"text": "x"}, {"bytes": "AA=="}]) == b"ls\rx\x00"
    assert encode_input([]) == b"" and encode_input("") == b""


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"key": "Hyper"}, "input.key"),
        (["a", "b", {"key": "Ctrl-1"}], "input[2].key"),
        ([{"key": 3}], "input[0].key"),
        ({"bytes": "not base64!"}, "input.bytes"),
        ([{"bytes": 5}], "input[0].bytes"),
        ({"text": 5}, "input.text"),
        ({"text": "a", "key": "Enter"}, "input"),
        ({"colour": "red"}, "input"),
        ({}, "input"),
        (5, "input"),
        (None, "input"),
        (["a", ["b"]], "input[1]"),
        (["a", 7], "input[1]"),
    ],
)
def test_bad_input_names_the_field(value, field: str) -> None:
    with pytest.raises(RpcError) as ei:
        encode_input(value)
    assert ei.value.code == ErrorCode.INVALID_PARAMS and ei.value.data["field"] == field


def test_send_validates_before_writing(mgr: PtyManager) -> None:
    r = open_pty(mgr, "cat")
    with pytest.raises(RpcError) as ei:
        mgr.send(r["pty_id"], ["ok", {"key": "Nope"}], OWNER)
    assert ei.value.data["field"] == "input[1].key"
    mgr.send(r["pty_id"], "zz", OWNER)
    assert "okzz" not in wait_screen(mgr, r["pty_id"], "zz")


# ------------------------------------------------------------------ emulator hardening


def feed(screen: _Screen, data: str) -> None:
    pyte.ByteStream(screen).feed(data.encode())


def test_cells_are_capped_and_zero_width_chars_do_not_stop_drawing() -> None:
    s = _Screen(20, 3, 10)
    feed(s, "a" + "\u0301\u0302" * 500 + "b\u200dc\ufe0fd")
    cells = [s.buffer[0][x].data for x in range(4)]
    assert 1 < len(cells[0]) <= PTY_MAX_CELL_CHARS and cells[1:] == ["b", "c", "d"]


def test_deccolm_is_ignored_and_scrollback_is_bounded() -> None:
    s = _Screen(20, 3, 5)
    feed(s, "\x1b[?3h")
    assert s.columns == 20
    feed(s, "\r\n".join(str(i) for i in range(12)))
    assert list(s.history) == ["4", "5", "6", "7", "8"]
    feed(s, "\x1b[3J")
    assert not s.history


# ------------------------------------------------------------------ backpressure / threads


def test_send_to_a_program_that_does_not_read(mgr: PtyManager, monkeypatch) -> None:
    import shoal_mcp.kernel.pty.manager as pty_mod

    monkeypatch.setattr(pty_mod, "PTY_SEND_TIMEOUT_S", 0.3)
    r = open_pty(mgr, "sh", "-c", "stty raw -echo; echo raw; exec sleep 1000")
    wait_screen(mgr, r["pty_id"], "raw")
    t0 = time.monotonic()
    out = mgr.send(r["pty_id"], "y" * 1_000_000, OWNER)
    assert time.monotonic() - t0 < 3
    assert 0 < out["bytes"] < 1_000_000 and out["bytes"] + out["dropped"] == 1_000_000


def test_concurrent_calls_and_close(mgr: PtyManager) -> None:
    r = open_pty(mgr, "cat")
    pid = r["pty_id"]
    errors: list[BaseException] = []
    stop = threading.Event()
    rounds = [0] * 8  # calls completed per thread (answered or refused)

    def hammer(n: int) -> None:
        try:
            while not stop.is_set():
                try:
                    mgr.send(pid, f"t{n} ", OWNER)
                    out = mgr.read(pid, f"reader-{n}", OWNER)
                    assert len(out["screen"]) == out["rows"]
                    if n == 0:
                        mgr.resize(pid, 70 + len(out["screen"][0]) % 20, 20, OWNER)
                except RpcError as e:
                    assert e.code in (ErrorCode.UNKNOWN_PTY, ErrorCode.INVALID_PARAMS), e
                rounds[n] += 1
        except BaseException as e:  # reported below
            errors.append(e)

    def every_thread_ran(more_than: list[int]) -> bool:
        return all(now >= before + 3 for now, before in zip(rounds, more_than, strict=True))

    threads = [threading.Thread(target=hammer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    # Close while all eight are mid-stream, and let each go on a few calls after it.
    wait_for(lambda: errors or every_thread_ran([0] * 8), what="every thread calling")
    assert mgr.close(pid, OWNER)["closed"] is True
    at_close = list(rounds)
    wait_for(lambda: errors or every_thread_ran(at_close), what="calls after the close")
    stop.set()
    for t in threads:
        t.join(10)
    assert not errors, errors
    assert proc_gone(r["pid"]) and mgr.list(None) == []
