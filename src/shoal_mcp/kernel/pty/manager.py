"""Pseudoterminals owned by the kernel (docs/protocol.md, PTYs): spawn, read, send, resize, close.

Owns `PtyManager`: the table of open PTYs and the calls on it (open, send, read, resize,
list, close/reap, `changed`). Around it, one concern each (imports only go pty -> them,
never back): `terminal` is one open PTY and its process (signals, reaping, exit),
`screen_io` its reader thread, input writes and events, `spawn` starts the program on a
new terminal (trampoline, env, PATH lookup), `keys` is the key protocol (`encode_input`,
`KEY_NAMES`), `screen` the emulator (`_Screen`) and the fitting of `pty.read` results
under VALUE_HARD_CAP. Their public names are re-exported.

`PtyManager` knows nothing about sockets; the kernel server calls it from many threads.

Decisions (also the contract for the server/facade):

* **Spawning / environment.** See `ptyspawn`.
* **Emulation / reading.** See `ptyscreen`.
* **changed** is per `reader` (any hashable, e.g. a connection id): True on a reader's first
  read and whenever the screen (content, cursor, size) changed since its last read. The
  last PTY_MAX_READERS readers per PTY are remembered.
* **alive / exit.** `alive` is False once the child (the session leader) has exited and been
  reaped; `exit` is `{"status": n}` or `{"signal": n}` and absent while alive. An exited PTY
  stays open (its last screen readable) until `close`.
* **Events.** `on_screen_change(pty_id, payload)` is called from the PTY's reader thread
  (or from `close`), never under a lock: `{"kind": "screen", "cursor": {...}}` at most once
  per PTY_EVENT_INTERVAL_S (leading + trailing edge: the last change is always reported),
  then once `{"kind": "exit", "exit": {...}}`.
* **send.** Writes are non-blocking with a PTY_SEND_TIMEOUT_S budget; if the program does not
  drain its input the result says `"dropped": n`. Sending to a PTY whose terminal is gone
  (program exited) is `-32602` on `pty_id`. Cursor keys follow the application-cursor
  mode (DECCKM) the program selected, like a real terminal.
* **close.** SIGHUP (+SIGCONT) to the child's process group and the terminal's foreground
  group, wait up to CANCEL_GRACE_S, then SIGKILL and close the supervisor's control pipe,
  reap, join the reader thread, close the fds. Signals are only sent while the supervisor
  is known unreaped (no pid-reuse races).
* **Containment.** Each program runs below its own supervisor (`ptyspawn`, a child
  subreaper): when the program exits, on `close`, on kernel exit and after a kernel
  SIGKILL, its whole tree is killed, including what left its groups (`&`, `nohup`,
  `setsid`). A background job cannot outlive the program that started it.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from ...protocol import uri
from ...protocol.errors import ErrorCode, RpcError, invalid_params

# The manager reads these limits as globals of *this* module at call time, so a test can
# monkeypatch them here (e.g. PTY_SEND_TIMEOUT_S). The PTY limits used only by ptyscreen /
# ptyspawn are re-exported (see __all__); patch those in the module that reads them.
from ...protocol.limits import (
    PTY_DEFAULT_COLS,
    PTY_DEFAULT_ROWS,
    PTY_MAX_DIM,
    PTY_MIN_DIM,
    PTY_SCROLLBACK_LINES,
)
from ..access.sandbox import SandboxSpec
from ..config.limits import (
    CANCEL_GRACE_S,
    PTY_MAX_CELL_CHARS,
    PTY_MAX_CMD_LEN,
    PTY_MAX_READERS,
    PTY_SEND_TIMEOUT_S,
    PTY_SPAWN_TIMEOUT_S,
    PTY_TERM,
    PTY_WINDOW_MIN_ROWS,
)
from ..owner.tables import TABLES
from .keys import KEY_NAMES, encode_input
from .screen import _cursor, _fill, _Screen
from .screen_io import ScreenPump
from .spawn import _winsize, spawn
from .terminal import OpenPty

__all__ = [
    "PtyManager",
    "encode_input",
    "KEY_NAMES",
    # re-exported for callers and tests that import them from here
    "PTY_MAX_CELL_CHARS",
    "PTY_SPAWN_TIMEOUT_S",
    "PTY_TERM",
    "PTY_WINDOW_MIN_ROWS",
    "_Screen",
    "spawn",
]

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- validation


def _dim(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid_params(field, "must be an integer")
    if not PTY_MIN_DIM <= value <= PTY_MAX_DIM:
        raise invalid_params(field, f"must be between {PTY_MIN_DIM} and {PTY_MAX_DIM}")
    return value


# --------------------------------------------------------------------------- manager


class PtyManager:
    """All PTYs of one kernel. Thread-safe; see the module docstring for the contract."""

    def __init__(self, on_screen_change: Callable[[str, dict], None] | None = None) -> None:
        self._io = ScreenPump(on_screen_change)  # reader threads, input, events
        self._ptys: dict[str, OpenPty] = {}
        self._next = 1

    # ---------------------------------------------------------------- open

    def open(
        self,
        *,
        cmd: str,
        args: list[str] | None = None,
        cols: int = PTY_DEFAULT_COLS,
        rows: int = PTY_DEFAULT_ROWS,
        env: dict[str, str],
        cwd: str,
        owner: str,
        sandbox: SandboxSpec | None = None,
    ) -> dict[str, Any]:
        if not isinstance(cmd, str) or not cmd or "\0" in cmd:
            raise invalid_params("cmd", "must be a non-empty string")
        if len(cmd) > PTY_MAX_CMD_LEN:
            raise invalid_params("cmd", f"longer than {PTY_MAX_CMD_LEN} characters")
        args = [] if args is None else args
        if not isinstance(args, list):
            raise invalid_params("args", "must be an array of strings")
        for i, a in enumerate(args):
            if not isinstance(a, str) or "\0" in a:
                raise invalid_params(f"args[{i}]", "must be a string without NUL")
        cols, rows = _dim(cols, "cols"), _dim(rows, "rows")
        if not isinstance(env, dict):
            raise invalid_params("env", "must be an object of strings")
        for k, v in env.items():
            if not isinstance(k, str) or not k or "=" in k or "\0" in k:
                raise invalid_params(f"env.{k}", "bad variable name")
            if not isinstance(v, str) or "\0" in v:
                raise invalid_params(f"env.{k}", "must be a string without NUL")
        if not isinstance(cwd, str) or not cwd:
            raise invalid_params("cwd", "must be a directory path")
        started = spawn(cmd, args, cols, rows, env, cwd, sandbox=sandbox)

        with TABLES:
            num = self._next
            self._next += 1
            p = OpenPty(num, owner, started, cmd, cols, rows)
            self._ptys[p.id] = p
        p.thread = threading.Thread(
            target=self._io.run, args=(p,), name=f"shoal-{p.id}", daemon=True
        )
        p.thread.start()
        return {"pty_id": p.id, "pid": p.pid, "cmd": cmd, "cols": cols, "rows": rows}

    # ---------------------------------------------------------------- lookup

    def _get(self, pty_id: Any, owner: str | None) -> OpenPty:
        """The PTY ``pty_id`` of ``owner`` (None: of anyone, for an approver)."""
        if not isinstance(pty_id, str):
            raise invalid_params("pty_id", "must be a string like 'pty:1'")
        with TABLES:
            p = self._ptys.get(pty_id)
        if p is None or (owner is not None and p.owner != owner):
            raise RpcError(
                ErrorCode.UNKNOWN_PTY, f"unknown pty: {pty_id[:100]}", {"pty_id": pty_id[:100]}
            )
        return p

    # ---------------------------------------------------------------- send

    def send(self, pty_id: str, input: Any, owner: str | None) -> dict[str, Any]:
        p = self._get(pty_id, owner)
        with p.lock:
            app_cursor = p.screen.app_cursor
        data = encode_input(input, app_cursor=app_cursor)
        sent = self._io.write(p, data, PTY_SEND_TIMEOUT_S)
        if sent is None:
            with p.lock:
                exit_ = p.exit
            why = "the program has exited" if exit_ else "the terminal is closed"
            err = invalid_params("pty_id", f"{p.id}: {why}; read or close it")
            err.data = {**(err.data or {}), "pty_id": p.id, **({"exit": exit_} if exit_ else {})}
            raise err
        result: dict[str, Any] = {"pty_id": p.id, "bytes": sent}
        if sent < len(data):
            result["dropped"] = len(data) - sent
        return result

    # ---------------------------------------------------------------- read

    def read(
        self, pty_id: str, reader: object, owner: str | None, scrollback: int = 0
    ) -> dict[str, Any]:
        if isinstance(scrollback, bool) or not isinstance(scrollback, int) or scrollback < 0:
            raise invalid_params("scrollback", "must be a non-negative integer")
        scrollback = min(scrollback, PTY_SCROLLBACK_LINES)
        p = self._get(pty_id, owner)
        try:
            key: Any = reader
            hash(key)
        except TypeError:
            key = id(reader)
        with p.lock:
            s = p.screen
            p.refresh_rows()
            last = p.seen.pop(key, None)
            p.seen[key] = p.version
            while len(p.seen) > PTY_MAX_READERS:
                p.seen.popitem(last=False)
            result: dict[str, Any] = {
                "pty_id": p.id,
                "pid": p.pid,
                "cmd": p.cmd,
                "cols": s.columns,
                "rows": s.lines,
                "alive": p.exit is None,
            }
            if p.exit is not None:
                result["exit"] = dict(p.exit)
            result["changed"] = last != p.version
            result["cursor"] = _cursor(s)
            history = list(s.history)[-scrollback:] if scrollback else None
            _fill(s, p.rows_cache, result, history)
        return result

    # ---------------------------------------------------------------- resize

    def resize(self, pty_id: str, cols: int, rows: int, owner: str | None) -> dict[str, Any]:
        cols, rows = _dim(cols, "cols"), _dim(rows, "rows")
        p = self._get(pty_id, owner)
        with p.lock:
            if p.closed:
                raise RpcError(ErrorCode.UNKNOWN_PTY, f"unknown pty: {p.id}", {"pty_id": p.id})
            if (cols, rows) != (p.screen.columns, p.screen.lines):
                # Emulator first, so the program's redraw (after SIGWINCH) lands on the new size.
                p.screen.resize(lines=rows, columns=cols)
                p.screen.ensure_hbounds()  # pyte leaves the cursor outside a shrunk screen
                p.screen.ensure_vbounds()
                p.screen.dirty.clear()
                p.rows_cache = [""] * rows
                p.dirty_rows = set(range(rows))
                p.version += 1
                p.pending = True
                try:
                    _winsize(p.master, cols, rows)  # the tty driver sends SIGWINCH
                except OSError as e:
                    log.debug("%s: TIOCSWINSZ failed: %s", p.id, e)
        p.wake()
        return {"pty_id": p.id, "cols": cols, "rows": rows}

    # ---------------------------------------------------------------- list / count

    def list(self, owner: str | None) -> list[dict[str, Any]]:
        with TABLES:
            ptys = [p for p in self._ptys.values() if owner is None or p.owner == owner]
        out = []
        for p in ptys:
            with p.lock:
                item: dict[str, Any] = {
                    "pty_id": p.id,
                    "pid": p.pid,
                    "cmd": p.cmd,
                    "cols": p.screen.columns,
                    "rows": p.screen.lines,
                    "alive": p.exit is None,
                }
                if p.exit is not None:
                    item["exit"] = dict(p.exit)
            if owner is None:
                item["owner"] = p.owner
            out.append(item)
        out.sort(key=lambda i: uri.ref_number(i["pty_id"], uri.PTY))
        return out

    def count_of(self, principal: str) -> int:
        """Open PTYs of ``principal`` in all its sessions, exited but not yet closed ones
        included (``max_ptys``); a leaf, for ``Guard.reserved``."""
        with TABLES:
            return sum(1 for p in self._ptys.values() if p.owner.split("\x00", 1)[-1] == principal)

    # ---------------------------------------------------------------- close

    def close(self, pty_id: str, owner: str | None) -> dict[str, Any]:
        p = self._get(pty_id, owner)
        with TABLES:
            if self._ptys.get(p.id) is not p:  # a concurrent close won
                raise RpcError(ErrorCode.UNKNOWN_PTY, f"unknown pty: {p.id}", {"pty_id": p.id})
            del self._ptys[p.id]
        self._shutdown([p])
        with p.lock:
            exit_ = dict(p.exit) if p.exit else {}
        return {"pty_id": p.id, "closed": True, "exit": exit_}

    def reap(self, pty_ids: builtins.list[str]) -> builtins.list[str]:
        """Close these PTYs whoever owns them (the orphan reaper, ``orphans.py``); the ids
        that were still open."""
        with TABLES:
            ptys = [self._ptys.pop(i) for i in pty_ids if i in self._ptys]
        if ptys:
            self._shutdown(ptys)
        return [p.id for p in ptys]

    def close_all(self) -> None:
        """Kernel shutdown: every PTY at once, one shared grace period."""
        with TABLES:
            ptys = list(self._ptys.values())
            self._ptys.clear()
        if ptys:
            self._shutdown(ptys)

    def _shutdown(self, ptys: builtins.list[OpenPty]) -> None:
        for p in ptys:
            p.stopping.set()
            p.wake()
            p.signal(signal.SIGHUP)
            p.signal(signal.SIGCONT)
        deadline = time.monotonic() + CANCEL_GRACE_S
        for p in ptys:
            p.wait(max(0.0, deadline - time.monotonic()))
        for p in ptys:
            if p.proc.returncode is None:
                p.signal(signal.SIGKILL)
                p.release()  # the supervisor kills the rest of the tree and ends
                if not p.wait(CANCEL_GRACE_S):
                    log.warning("%s: pid %d survived SIGKILL", p.id, p.pid)
        for p in ptys:
            if p.thread is not None:
                p.thread.join(CANCEL_GRACE_S)
            with p.write_lock, p.lock:
                p.closed = True
                for fd in (p.master, p.wake_r, p.wake_w):
                    with contextlib.suppress(OSError):
                        os.close(fd)
            p.release()
            p.record_exit()
            self._io.emit_exit(p)  # once per PTY, whoever recorded the exit
