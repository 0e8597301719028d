"""Pseudoterminals owned by the kernel (docs/protocol.md, PTYs): spawn, read, send, resize, close.

Owns `PtyManager`: the open PTYs, their reader threads, `changed`, events, send, resize,
close/reap. Around it, one concern each (imports only go pty -> them, never back):
`ptyspawn` starts the program on a new terminal (trampoline, env, PATH lookup), `ptykeys`
is the key protocol (`encode_input`, `KEY_NAMES`), `ptyscreen` the emulator (`_Screen`) and
the fitting of `pty.read` results under VALUE_HARD_CAP. Their public names are re-exported.

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
import errno
import logging
import os
import select
import signal
import subprocess
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import pyte

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
    PTY_EVENT_INTERVAL_S,
    PTY_IDLE_POLL_S,
    PTY_MAX_CELL_CHARS,
    PTY_MAX_CMD_LEN,
    PTY_MAX_READERS,
    PTY_READ_CHUNK,
    PTY_SEND_TIMEOUT_S,
    PTY_SPAWN_TIMEOUT_S,
    PTY_TERM,
    PTY_WINDOW_MIN_ROWS,
)
from .keys import KEY_NAMES, encode_input
from .screen import _cursor, _fill, _render, _Screen
from .spawn import Spawned, _winsize, spawn
from .termfilter import OscFilter

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


# --------------------------------------------------------------------------- process helpers


def _exit_record(returncode: int) -> dict[str, int]:
    return {"signal": -returncode} if returncode < 0 else {"status": returncode}


class _Pty:
    def __init__(
        self, num: int, owner: str, started: Spawned, cmd: str, cols: int, rows: int
    ) -> None:
        self.id = uri.pty_ref(num)
        self.owner = owner
        self.proc = started.proc  # the supervisor: it ends last, with the program's status
        self.pid = started.pid  # the program: its group is what close signals
        self.master = started.master
        self.ctrl = started.ctrl  # closing it kills the program's whole tree
        self.cmd = cmd
        self.screen = _Screen(cols, rows, PTY_SCROLLBACK_LINES)
        self.stream = pyte.ByteStream(self.screen)
        self.osc_filter = OscFilter()  # pyte would buffer an unterminated OSC without bound
        self.lock = threading.Lock()  # screen, caches, version, exit, pending, closed
        self.write_lock = threading.Lock()  # whole `send`s never interleave
        self.reap_lock = threading.Lock()  # waitpid and signals to the child's group
        self.stopping = threading.Event()
        self.closed = False
        self.eof = False  # every slave fd is closed: nothing can read input any more
        self.version = 0
        self.rows_cache: list[str] = [""] * rows
        self.dirty_rows: set[int] = set(range(rows))
        self.seen: OrderedDict[Any, int] = OrderedDict()
        self.exit: dict[str, int] | None = None
        self.exit_emitted = False
        self.pending = False
        self.last_emit = time.monotonic() - PTY_EVENT_INTERVAL_S
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.thread: threading.Thread | None = None

    def wake(self) -> None:
        with contextlib.suppress(OSError):  # pipe full (already awake) or closed
            os.write(self.wake_w, b"\0")


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
        self._on_change = on_screen_change
        self._lock = threading.Lock()
        self._ptys: dict[str, _Pty] = {}
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

        with self._lock:
            num = self._next
            self._next += 1
            p = _Pty(num, owner, started, cmd, cols, rows)
            self._ptys[p.id] = p
        p.thread = threading.Thread(
            target=self._reader, args=(p,), name=f"shoal-{p.id}", daemon=True
        )
        p.thread.start()
        return {"pty_id": p.id, "pid": p.pid, "cmd": cmd, "cols": cols, "rows": rows}

    # ---------------------------------------------------------------- lookup

    def _get(self, pty_id: Any, owner: str | None) -> _Pty:
        """The PTY ``pty_id`` of ``owner`` (None: of anyone, for an approver)."""
        if not isinstance(pty_id, str):
            raise invalid_params("pty_id", "must be a string like 'pty:1'")
        with self._lock:
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
        sent = self._write(p, data, PTY_SEND_TIMEOUT_S)
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

    def _write(self, p: _Pty, data: bytes, timeout: float) -> int | None:
        """Write what the program accepts within `timeout`; None if the terminal is gone."""
        view = memoryview(data)
        sent = 0
        deadline = time.monotonic() + timeout
        with p.write_lock:
            if p.closed or p.eof:
                return None
            poller = select.poll()
            poller.register(p.master, select.POLLOUT)
            if any(ev & select.POLLHUP for _fd, ev in poller.poll(0)):
                return None  # no slave fd open (the reader may not have seen EOF yet)
            while sent < len(data):
                try:
                    sent += os.write(p.master, view[sent:])
                    continue
                except BlockingIOError:
                    pass
                except OSError as e:
                    if e.errno in (errno.EIO, errno.EBADF, errno.ENXIO):
                        return sent or None
                    raise
                left = deadline - time.monotonic()
                if left <= 0 or p.stopping.is_set():
                    break
                poller.poll(min(left, 0.05) * 1000)
        return sent

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
            self._refresh_rows(p)
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

    @staticmethod
    def _refresh_rows(p: _Pty) -> None:
        s = p.screen
        if len(p.rows_cache) != s.lines:
            p.rows_cache = [""] * s.lines
            p.dirty_rows = set(range(s.lines))
        for y in p.dirty_rows:
            if y < s.lines:
                p.rows_cache[y] = _render(s.buffer[y], s.columns)
        p.dirty_rows.clear()

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
        with self._lock:
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

    def count(self, owner: str) -> int:
        """Open PTYs of `owner` (exited but not yet closed ones included)."""
        with self._lock:
            return sum(1 for p in self._ptys.values() if p.owner == owner)

    # ---------------------------------------------------------------- close

    def close(self, pty_id: str, owner: str | None) -> dict[str, Any]:
        p = self._get(pty_id, owner)
        with self._lock:
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
        with self._lock:
            ptys = [self._ptys.pop(i) for i in pty_ids if i in self._ptys]
        if ptys:
            self._shutdown(ptys)
        return [p.id for p in ptys]

    def close_all(self) -> None:
        """Kernel shutdown: every PTY at once, one shared grace period."""
        with self._lock:
            ptys = list(self._ptys.values())
            self._ptys.clear()
        if ptys:
            self._shutdown(ptys)

    def _shutdown(self, ptys: builtins.list[_Pty]) -> None:
        for p in ptys:
            p.stopping.set()
            p.wake()
            self._signal(p, signal.SIGHUP)
            self._signal(p, signal.SIGCONT)
        deadline = time.monotonic() + CANCEL_GRACE_S
        for p in ptys:
            self._wait(p, max(0.0, deadline - time.monotonic()))
        for p in ptys:
            if p.proc.returncode is None:
                self._signal(p, signal.SIGKILL)
                self._release(p)  # the supervisor kills the rest of the tree and ends
                if not self._wait(p, CANCEL_GRACE_S):
                    log.warning("%s: pid %d survived SIGKILL", p.id, p.pid)
        for p in ptys:
            if p.thread is not None:
                p.thread.join(CANCEL_GRACE_S)
            with p.write_lock, p.lock:
                p.closed = True
                for fd in (p.master, p.wake_r, p.wake_w):
                    with contextlib.suppress(OSError):
                        os.close(fd)
            self._release(p)
            self._record_exit(p)
            self._emit_exit(p)  # once per PTY, whoever recorded the exit

    def _signal(self, p: _Pty, sig: int) -> None:
        """Signal the child's group and the terminal's foreground group, while unreaped."""
        with p.reap_lock:
            if p.proc.poll() is not None:
                return
            groups = {p.pid}
            if not p.closed:
                try:
                    fg = os.tcgetpgrp(p.master)
                    if fg > 0:
                        groups.add(fg)
                except OSError:
                    pass
            for g in groups:
                with contextlib.suppress(OSError):
                    os.killpg(g, sig)

    @staticmethod
    def _release(p: _Pty) -> None:
        """Close the supervisor's control pipe (once): it kills what is left and ends."""
        with p.reap_lock:
            fd, p.ctrl = p.ctrl, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    @staticmethod
    def _wait(p: _Pty, timeout: float) -> bool:
        with p.reap_lock:
            try:
                p.proc.wait(timeout=timeout)
                return True
            except subprocess.TimeoutExpired:
                return False

    # ---------------------------------------------------------------- reader thread

    def _reader(self, p: _Pty) -> None:
        poller = select.poll()
        poller.register(p.master, select.POLLIN)
        poller.register(p.wake_r, select.POLLIN)
        eof = False
        next_check = time.monotonic() + PTY_IDLE_POLL_S
        try:
            while not p.stopping.is_set():
                timeout = PTY_IDLE_POLL_S
                if p.pending:
                    timeout = max(0.0, p.last_emit + PTY_EVENT_INTERVAL_S - time.monotonic())
                drained = True  # nothing was waiting on the master this round
                for fd, _ev in poller.poll(timeout * 1000):
                    if fd == p.wake_r:
                        with contextlib.suppress(OSError):
                            os.read(p.wake_r, 4096)
                        continue
                    try:
                        data = os.read(p.master, PTY_READ_CHUNK)
                    except BlockingIOError:
                        continue
                    except OSError:  # EIO: every slave fd is closed
                        data = b""
                    if not data:
                        eof = p.eof = True
                        break
                    drained = False
                    self._feed(p, data)
                self._emit_screen(p)
                if eof:
                    break
                now = time.monotonic()
                # Only once the master is drained: an exit recorded while output is still
                # buffered would report a finished program with a half-drawn screen.
                if now >= next_check and drained:
                    next_check = now + PTY_IDLE_POLL_S
                    if p.exit is None and self._record_exit(p):
                        # The child is gone but someone (a background job) holds the tty.
                        self._emit_exit(p)
            if eof and not p.stopping.is_set():
                # The terminal is closed; wait (without reaping) for the child to exit.
                if hasattr(os, "waitid"):
                    with contextlib.suppress(ChildProcessError):  # already reaped by close()
                        os.waitid(os.P_PID, p.proc.pid, os.WEXITED | os.WNOWAIT)
                    self._record_exit(p)
                else:  # no waitid (macOS before 3.13): poll
                    while not self._record_exit(p) and p.exit is None:
                        if p.stopping.wait(0.02):
                            break
                self._emit_screen(p, wait=True)
                self._emit_exit(p)
        except Exception:  # never let a reader die silently
            log.exception("%s: reader thread failed", p.id)

    def _feed(self, p: _Pty, data: bytes) -> None:
        with p.lock:
            s = p.screen
            c = s.cursor
            before = (c.x, c.y, c.hidden)
            try:
                p.stream.feed(p.osc_filter.feed(data))
            except Exception as e:  # a malformed sequence must not stop the terminal
                log.debug("%s: emulator error: %r", p.id, e)
            c = s.cursor
            if s.dirty or before != (c.x, c.y, c.hidden):
                p.dirty_rows.update(s.dirty)
                s.dirty.clear()
                p.version += 1
                p.pending = True
            responses, s.responses = s.responses, []
        if responses:  # answers to device status queries, best effort
            self._write(p, "".join(responses).encode(), 0.0)

    def _record_exit(self, p: _Pty) -> bool:
        """Reap the child if it exited; True if this call recorded the exit."""
        with p.reap_lock:
            rc = p.proc.poll()
        if rc is None:
            return False
        with p.lock:
            if p.exit is not None:
                return False
            p.exit = _exit_record(rc)
            return True

    def _emit_screen(self, p: _Pty, wait: bool = False) -> None:
        if not p.pending:
            return
        due = p.last_emit + PTY_EVENT_INTERVAL_S - time.monotonic()
        if due > 0 and (not wait or p.stopping.wait(due)):
            return
        with p.lock:
            p.pending = False
            cursor = _cursor(p.screen)
        p.last_emit = time.monotonic()
        self._call(p.id, {"kind": "screen", "cursor": cursor})

    def _emit_exit(self, p: _Pty) -> None:
        with p.lock:
            if p.exit is None or p.exit_emitted:
                return
            p.exit_emitted = True
            exit_ = dict(p.exit)
        self._call(p.id, {"kind": "exit", "exit": exit_})

    def _call(self, pty_id: str, payload: dict[str, Any]) -> None:
        if self._on_change is None:
            return
        try:
            self._on_change(pty_id, payload)
        except Exception:
            log.exception("%s: on_screen_change callback failed", pty_id)
