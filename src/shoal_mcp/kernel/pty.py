"""Pseudoterminals owned by the kernel (SPEC §4.9): spawn, emulate, read, send keys.

`PtyManager` knows nothing about sockets; the kernel server calls it from many threads.

Decisions (also the contract for the server/facade):

* **Spawning.** `os.openpty()` + `subprocess.Popen` with the slave as fds 0/1/2 and
  `start_new_session=True` (own session and process group; pgid == pid). The slave becomes
  the child's *controlling terminal* through a tiny trampoline (`python -I -S -c …`) that
  runs `ioctl(0, TIOCSCTTY)`, resets every signal disposition and the signal mask to the
  defaults (a kernel started with SIGINT ignored must not hand that on, or Ctrl-C would be
  dead), undoes the interpreter's C-locale coercion of `LC_CTYPE`, and `execve`s the program
  — so the multi-threaded kernel never runs Python code between fork and exec (no
  `preexec_fn`; CPython's C fork/exec path, vfork-capable, is used). Exec failures come back through a close-on-exec status pipe and
  raise `-32023`. The trampoline costs ~15 ms per `open`.
* **Environment.** The caller passes the complete environment (session env + overrides);
  `TERM=xterm-256color` is always set, because the emulator is what it is. `COLUMNS` and
  `LINES` are *removed*, not set: ncurses lets them override the window size ioctl, so a
  program would never see a resize. The size is the tty's winsize (`TIOCSWINSZ`).
  `cmd` is resolved like `execvp` against the given env's `PATH` (relative entries and
  relative paths against `cwd`); argv[0] is `cmd` as given.
* **Emulation.** A `pyte.Screen` subclass, not `pyte.HistoryScreen`: HistoryScreen wraps
  every attribute access (2.4x slower feeding) and keeps scrolled-off lines as cell objects;
  ours keeps a bounded deque (PTY_SCROLLBACK_LINES) of *rendered* lines that scrolled off a
  region whose top is row 0 (xterm's rule). It also answers device status / attribute
  queries through the master, ignores DECCOLM (the tty winsize is the only size), drops
  zero-width non-combining characters (pyte would stop drawing at them) and caps a cell at
  PTY_MAX_CELL_CHARS code points (pyte's combining path is quadratic otherwise).
* **Reading.** `screen` always has one entry per terminal row (trailing empty rows are kept,
  so `screen[i]` is row i and lines up with `cursor.row`), each right-trimmed. When the
  encoded result would exceed VALUE_HARD_CAP, `screen` is a window of rows around the
  cursor (and, only if fewer than PTY_WINDOW_MIN_ROWS rows would fit, also of columns)
  and `"window": {"top", "left", "rows", "cols"}` says which: `screen[i]` is then row
  `top + i` from column `left`. `cursor` is always in absolute screen coordinates.
  `scrollback: n` adds the newest ≤ n lines above the screen (oldest first) plus
  `scrollback_total`; when both do not fit, scrollback gets at most half the budget.
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
  group, wait up to CANCEL_GRACE_S, SIGKILL, reap, join the reader thread, close the fds.
  Signals are only sent while the child is known unreaped (no pid-reuse races). Like
  closing a terminal window, processes that left those groups (nohup, setsid) survive.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import fcntl
import logging
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
import unicodedata
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

import orjson
import pyte
from pyte.screens import Margins
from wcwidth import wcwidth

from ..constants import (
    CANCEL_GRACE_S,
    PTY_DEFAULT_COLS,
    PTY_DEFAULT_ROWS,
    PTY_EVENT_INTERVAL_S,
    PTY_MAX_DIM,
    PTY_MIN_DIM,
    PTY_SCROLLBACK_LINES,
    VALUE_HARD_CAP,
    ErrorCode,
)
from ..errors import RpcError, invalid_params
from .termfilter import OscFilter

__all__ = ["PtyManager", "encode_input", "KEY_NAMES"]

log = logging.getLogger(__name__)

# Limits local to this module (candidates for shoal_mcp.constants).
PTY_TERM = "xterm-256color"
"""TERM given to every PTY program."""
PTY_READ_CHUNK = 32 * 1024
"""Bytes read from the master per wake-up (bounds how long one feed holds the screen lock)."""
PTY_MAX_CELL_CHARS = 8
"""Code points kept per screen cell (base + combining marks)."""
PTY_MAX_READERS = 64
"""Readers remembered per PTY for `changed`."""
PTY_WINDOW_MIN_ROWS = 24
"""Fewer rows than this in a row window -> window the columns too."""
PTY_SEND_TIMEOUT_S = 5.0
"""How long `send` waits for a program that does not read its input."""
PTY_IDLE_POLL_S = 0.25
"""Reader thread wake-up period (child-exit check while the terminal is still held)."""
PTY_MAX_CMD_LEN = 4096
PTY_SPAWN_TIMEOUT_S = 10.0
"""Longest wait for the trampoline to exec the program."""
_RESULT_RESERVE = 256
"""Bytes kept free in the read budget for the window/scrollback keys."""

_DECCKM = 1 << 5  # pyte stores private modes shifted by 5
_DECCOLM_PARAM = 3

# Runs between fork and exec instead of a preexec_fn; see the module docstring.
_TRAMPOLINE = """\
import os, sys, fcntl, signal, termios
w = int(sys.argv[1])
try:
    os.set_inheritable(w, False)
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    for s in signal.valid_signals():
        if s not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(s, signal.SIG_DFL)
            except (OSError, ValueError):
                pass
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    lc = sys.argv[2]
    if lc[:1] == "=":
        os.environ["LC_CTYPE"] = lc[1:]
    else:
        os.environ.pop("LC_CTYPE", None)
    os.execve(sys.argv[3], sys.argv[4:], os.environ)
except BaseException as e:
    os.write(w, f"{type(e).__name__}: {e}".encode("utf-8", "replace")[:2000])
    os._exit(127)
"""


# --------------------------------------------------------------------------- key protocol

_PLAIN_KEYS: dict[str, bytes] = {
    "enter": b"\r",
    "return": b"\r",
    "tab": b"\t",
    "backtab": b"\x1b[Z",
    "escape": b"\x1b",
    "esc": b"\x1b",
    "backspace": b"\x7f",
    "delete": b"\x1b[3~",
    "insert": b"\x1b[2~",
    "space": b" ",
    "pageup": b"\x1b[5~",
    "pagedown": b"\x1b[6~",
    "f1": b"\x1bOP",
    "f2": b"\x1bOQ",
    "f3": b"\x1bOR",
    "f4": b"\x1bOS",
    "f5": b"\x1b[15~",
    "f6": b"\x1b[17~",
    "f7": b"\x1b[18~",
    "f8": b"\x1b[19~",
    "f9": b"\x1b[20~",
    "f10": b"\x1b[21~",
    "f11": b"\x1b[23~",
    "f12": b"\x1b[24~",
}
# Cursor keys: CSI <final> normally, SS3 <final> in application cursor mode (DECCKM).
_CURSOR_KEYS: dict[str, bytes] = {
    "up": b"A",
    "down": b"B",
    "right": b"C",
    "left": b"D",
    "home": b"H",
    "end": b"F",
}
_CTRL_RE = re.compile(r"^(?:ctrl|control|c)[-+]([a-z])$")

KEY_NAMES: tuple[str, ...] = (
    "Enter", "Tab", "Escape", "Backspace", "Delete", "Space", "Up", "Down", "Left", "Right",
    "Home", "End", "PageUp", "PageDown", *(f"F{i}" for i in range(1, 13)),
    "Ctrl-A..Ctrl-Z", "Insert", "BackTab",
)  # fmt: skip


def _key_bytes(name: Any, field: str, app_cursor: bool) -> bytes:
    if not isinstance(name, str):
        raise invalid_params(field, "must be a key name (string)")
    norm = name.strip().lower().replace("_", "").replace(" ", "")
    if norm in _PLAIN_KEYS:
        return _PLAIN_KEYS[norm]
    if norm in _CURSOR_KEYS:
        return (b"\x1bO" if app_cursor else b"\x1b[") + _CURSOR_KEYS[norm]
    m = _CTRL_RE.match(name.strip().lower())
    if m:
        return bytes([ord(m.group(1)) - ord("a") + 1])
    raise invalid_params(
        field, f"unknown key {name[:40]!r}; expected one of {', '.join(KEY_NAMES)}"
    )


def _item_bytes(item: Any, field: str, app_cursor: bool) -> bytes:
    if isinstance(item, str):
        return item.encode("utf-8", "surrogatepass")
    if not isinstance(item, dict):
        raise invalid_params(field, "must be a string, {text}, {key}, {bytes} or an array of them")
    if len(item) != 1 or next(iter(item)) not in ("text", "key", "bytes"):
        raise invalid_params(field, "must have exactly one of 'text', 'key', 'bytes'")
    kind, value = next(iter(item.items()))
    if kind == "key":
        return _key_bytes(value, f"{field}.key", app_cursor)
    if not isinstance(value, str):
        raise invalid_params(f"{field}.{kind}", "must be a string")
    if kind == "text":
        return value.encode("utf-8", "surrogatepass")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise invalid_params(f"{field}.bytes", "not valid base64") from None


def encode_input(input: Any, *, app_cursor: bool = False, field: str = "input") -> bytes:
    """Turn a `pty.send` input (string, {text}, {key}, {bytes} or an array) into bytes.

    Raises `invalid_params` naming the bad element, e.g. ``input[2].key``.
    """
    if not isinstance(input, list):
        return _item_bytes(input, field, app_cursor)
    parts = []
    for i, item in enumerate(input):
        if isinstance(item, list):
            raise invalid_params(f"{field}[{i}]", "nested arrays are not allowed")
        parts.append(_item_bytes(item, f"{field}[{i}]", app_cursor))
    return b"".join(parts)


# --------------------------------------------------------------------------- emulation


def _line_cells(line: Any, columns: int) -> list[str]:
    cells = [" "] * columns
    for x, ch in line.items():
        if x < columns:
            cells[x] = ch.data
    return cells


def _render(line: Any, columns: int) -> str:
    return "".join(_line_cells(line, columns)).rstrip()


class _Screen(pyte.Screen):
    """pyte.Screen + bounded rendered scrollback + the fixes listed in the module docstring."""

    def __init__(self, columns: int, lines: int, history: int) -> None:
        self.history: deque[str] = deque(maxlen=history)
        self.responses: list[str] = []
        super().__init__(columns, lines)

    @property
    def app_cursor(self) -> bool:
        return _DECCKM in self.mode

    def index(self) -> None:
        top, bottom = self.margins or Margins(0, self.lines - 1)
        if self.cursor.y == bottom and top == 0:
            self.history.append(_render(self.buffer[0], self.columns))
        super().index()

    def erase_in_display(self, how: int = 0, *args: Any, **kwargs: Any) -> None:
        super().erase_in_display(how, *args, **kwargs)
        if how == 3:  # "clear scrollback" (xterm)
            self.history.clear()

    def set_mode(self, *modes: int, **kwargs: Any) -> None:
        if kwargs.get("private"):
            modes = tuple(m for m in modes if m != _DECCOLM_PARAM)
        super().set_mode(*modes, **kwargs)

    def reset_mode(self, *modes: int, **kwargs: Any) -> None:
        if kwargs.get("private"):
            modes = tuple(m for m in modes if m != _DECCOLM_PARAM)
        super().reset_mode(*modes, **kwargs)

    def write_process_input(self, data: str) -> None:
        if len(self.responses) < 64:
            self.responses.append(data)

    def draw(self, data: str) -> None:
        if not data.isascii():
            data = self._sanitize(data)
        if data:
            super().draw(data)

    def _sanitize(self, data: str) -> str:
        # Room for combining marks on the cell pyte would combine into (see pyte's draw).
        x, y = self.cursor.x, self.cursor.y
        if x:
            room = PTY_MAX_CELL_CHARS - len(self.buffer[y][x - 1].data)
        elif y:
            room = PTY_MAX_CELL_CHARS - len(self.buffer[y - 1][self.columns - 1].data)
        else:
            room = 0
        out = []
        for ch in data:
            w = wcwidth(ch)
            if w > 0:
                out.append(ch)
                room = PTY_MAX_CELL_CHARS - 1
            elif w == 0 and unicodedata.combining(ch) and room > 0:
                out.append(ch)
                room -= 1
            # else: zero-width non-combining / unprintable: dropped
        return "".join(out)


def _cursor(screen: _Screen) -> dict[str, Any]:
    return {
        "row": min(screen.cursor.y, screen.lines - 1),
        "col": min(screen.cursor.x, screen.columns - 1),
        "hidden": bool(screen.cursor.hidden),
    }


def _exit_record(returncode: int) -> dict[str, int]:
    return {"signal": -returncode} if returncode < 0 else {"status": returncode}


def _winsize(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _fit_rows(costs: list[int], center: int, budget: int) -> tuple[int, int, int]:
    """Largest contiguous run of rows around `center` whose costs fit `budget`."""
    n = len(costs)
    if not n or costs[center] > budget:
        return center, center, 0
    lo, hi, used = center, center + 1, costs[center]
    down = up = True
    while down or up:
        if down:
            if hi < n and used + costs[hi] <= budget:
                used += costs[hi]
                hi += 1
            else:
                down = False
        if up:
            if lo > 0 and used + costs[lo - 1] <= budget:
                used += costs[lo - 1]
                lo -= 1
            else:
                up = False
    return lo, hi, used


def _cost(s: str) -> int:
    return len(orjson.dumps(s)) + 1


class _Pty:
    def __init__(
        self, num: int, owner: str, proc: subprocess.Popen, master: int, cmd: str,
        cols: int, rows: int,
    ) -> None:  # fmt: skip
        self.id = f"pty:{num}"
        self.owner = owner
        self.proc = proc
        self.pid = proc.pid
        self.master = master
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


def _spawn_error(cmd: str, reason: str) -> RpcError:
    return RpcError(
        ErrorCode.PTY_SPAWN,
        f"pty spawn failed: {cmd[:200]}: {reason}",
        {"cmd": cmd[:200], "reason": reason},
    )


def _resolve(cmd: str, env: dict[str, str], cwd: str) -> str:
    """execvp's lookup, against the given env's PATH and relative to `cwd`."""
    if "/" in cmd:
        candidates = [os.path.join(cwd, cmd)]
    else:
        path = env.get("PATH", os.defpath)
        candidates = [os.path.join(cwd, d or ".", cmd) for d in path.split(os.pathsep)]
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.normpath(c)
    raise _spawn_error(cmd, "command not found or not executable")


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
        if not os.path.isdir(cwd):
            raise _spawn_error(cmd, f"cwd {cwd!r} is not a directory")
        path = _resolve(cmd, env, cwd)

        child_env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}
        child_env["TERM"] = PTY_TERM
        lc_ctype = "=" + child_env["LC_CTYPE"] if "LC_CTYPE" in child_env else "-"

        master, slave = os.openpty()
        status_r, status_w = os.pipe()
        try:
            _winsize(master, cols, rows)
            attrs = termios.tcgetattr(slave)
            attrs[0] |= getattr(termios, "IUTF8", 0)
            termios.tcsetattr(slave, termios.TCSANOW, attrs)
            os.set_blocking(master, False)
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    "-S",
                    "-c",
                    _TRAMPOLINE,
                    str(status_w),
                    lc_ctype,
                    path,
                    cmd,
                    *args,
                ],
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=cwd,
                env=child_env,
                start_new_session=True,
                pass_fds=(status_w,),
            )
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            os.close(master)
            os.close(status_r)
            raise _spawn_error(cmd, str(e)) from None
        finally:
            os.close(slave)
            os.close(status_w)
        try:
            failure = self._read_status(status_r)
        finally:
            os.close(status_r)
        if failure is not None:
            try:
                proc.wait(timeout=CANCEL_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            os.close(master)
            raise _spawn_error(cmd, failure)

        with self._lock:
            num = self._next
            self._next += 1
            p = _Pty(num, owner, proc, master, cmd, cols, rows)
            self._ptys[p.id] = p
        p.thread = threading.Thread(
            target=self._reader, args=(p,), name=f"shoal-{p.id}", daemon=True
        )
        p.thread.start()
        return {"pty_id": p.id, "pid": p.pid, "cmd": cmd, "cols": cols, "rows": rows}

    @staticmethod
    def _read_status(fd: int) -> str | None:
        """None once the trampoline exec'd (EOF, nothing written), else its error text."""
        chunks: list[bytes] = []
        deadline = time.monotonic() + PTY_SPAWN_TIMEOUT_S
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timed out waiting for the program to start"
            if not poller.poll(left * 1000):
                continue
            data = os.read(fd, 4096)
            if not data:
                break
            chunks.append(data)
        text = b"".join(chunks).decode("utf-8", "replace")
        return text or None

    # ---------------------------------------------------------------- lookup

    def _get(self, pty_id: Any, owner: str) -> _Pty:
        if not isinstance(pty_id, str):
            raise invalid_params("pty_id", "must be a string like 'pty:1'")
        with self._lock:
            p = self._ptys.get(pty_id)
        if p is None or p.owner != owner:
            raise RpcError(
                ErrorCode.UNKNOWN_PTY, f"unknown pty: {pty_id[:100]}", {"pty_id": pty_id[:100]}
            )
        return p

    # ---------------------------------------------------------------- send

    def send(self, pty_id: str, input: Any, owner: str) -> dict[str, Any]:
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

    def read(self, pty_id: str, reader: object, owner: str, scrollback: int = 0) -> dict[str, Any]:
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
            self._fill(p, result, history)
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

    @staticmethod
    def _fill(p: _Pty, result: dict[str, Any], history: list[str] | None) -> None:
        """Add `screen` (+`window`) and scrollback within VALUE_HARD_CAP."""
        s = p.screen
        rows = p.rows_cache
        cur = result["cursor"]
        budget = VALUE_HARD_CAP - len(orjson.dumps(result)) - _RESULT_RESERVE
        costs = [_cost(r) for r in rows]
        sb_costs = [_cost(r) for r in history] if history else []
        screen_need, sb_need = sum(costs), sum(sb_costs)
        window = None
        if screen_need + sb_need <= budget:
            screen, used = list(rows), screen_need
        else:
            screen_budget = budget - min(sb_need, budget // 2)
            if screen_need <= screen_budget:
                screen, used = list(rows), screen_need
            else:
                lo, hi, used = _fit_rows(costs, cur["row"], screen_budget)
                left, width = 0, s.columns
                if hi - lo < min(s.lines, PTY_WINDOW_MIN_ROWS):
                    cells = [_line_cells(s.buffer[y], s.columns) for y in range(s.lines)]
                    while hi - lo < min(s.lines, PTY_WINDOW_MIN_ROWS) and width > 1:
                        width = max(1, width // 2)
                        left = max(0, min(cur["col"] - width // 2, s.columns - width))
                        rows = ["".join(c[left : left + width]).rstrip() for c in cells]
                        lo, hi, used = _fit_rows(
                            [_cost(r) for r in rows], cur["row"], screen_budget
                        )
                screen = rows[lo:hi]
                window = {"top": lo, "left": left, "rows": hi - lo, "cols": width}
        result["screen"] = screen
        if window is not None:
            result["window"] = window
        if history is not None:
            left_budget = budget - used
            n = 0
            for c in reversed(sb_costs):
                if c > left_budget:
                    break
                left_budget -= c
                n += 1
            result["scrollback"] = history[len(history) - n :] if n else []
            result["scrollback_total"] = len(s.history)
        PtyManager._enforce_cap(result)

    @staticmethod
    def _enforce_cap(result: dict[str, Any]) -> None:
        """Last line of defence: the accounting above should make this a no-op."""
        while len(orjson.dumps(result)) > VALUE_HARD_CAP:
            if result.get("scrollback"):
                result["scrollback"].pop(0)
                continue
            screen = result["screen"]
            win = result.setdefault(
                "window", {"top": 0, "left": 0, "rows": len(screen), "cols": result["cols"]}
            )
            if not screen:
                break
            if win["top"] + len(screen) - 1 > result["cursor"]["row"]:
                screen.pop()
            else:
                screen.pop(0)
                win["top"] += 1
            win["rows"] = len(screen)

    # ---------------------------------------------------------------- resize

    def resize(self, pty_id: str, cols: int, rows: int, owner: str) -> dict[str, Any]:
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
        out.sort(key=lambda i: int(i["pty_id"].split(":")[1]))
        return out

    def count(self, owner: str) -> int:
        """Open PTYs of `owner` (exited but not yet closed ones included)."""
        with self._lock:
            return sum(1 for p in self._ptys.values() if p.owner == owner)

    # ---------------------------------------------------------------- close

    def close(self, pty_id: str, owner: str) -> dict[str, Any]:
        p = self._get(pty_id, owner)
        with self._lock:
            if self._ptys.get(p.id) is not p:  # a concurrent close won
                raise RpcError(ErrorCode.UNKNOWN_PTY, f"unknown pty: {p.id}", {"pty_id": p.id})
            del self._ptys[p.id]
        self._shutdown([p])
        with p.lock:
            exit_ = dict(p.exit) if p.exit else {}
        return {"pty_id": p.id, "closed": True, "exit": exit_}

    def close_all(self) -> None:
        """Kernel shutdown: every PTY at once, one shared grace period."""
        with self._lock:
            ptys = list(self._ptys.values())
            self._ptys.clear()
        if ptys:
            self._shutdown(ptys)

    def _shutdown(self, ptys: list[_Pty]) -> None:
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
                    self._feed(p, data)
                self._emit_screen(p)
                if eof:
                    break
                now = time.monotonic()
                if now >= next_check:
                    next_check = now + PTY_IDLE_POLL_S
                    if p.exit is None and self._record_exit(p):
                        # The child is gone but someone (a background job) holds the tty.
                        self._emit_exit(p)
            if eof and not p.stopping.is_set():
                # The terminal is closed; wait (without reaping) for the child to exit.
                if hasattr(os, "waitid"):
                    with contextlib.suppress(ChildProcessError):  # already reaped by close()
                        os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)
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
