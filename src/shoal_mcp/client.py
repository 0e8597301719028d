"""A kernel client: one socket, many concurrent calls (a demux reader thread).

Used by the MCP facade and the CLI. Calls are matched to responses by id, so any
number of threads can have calls in flight on the same connection; kernel event
notifications go to ``on_event``. Losing the kernel fails every pending call with
``KernelLost`` instead of leaving it hanging.

Before a byte is sent the client checks whom it talks to: the socket's directory must be
ours and not a symlink, and the peer (``SO_PEERCRED``) our uid or root
(``KernelUntrusted`` otherwise). Every wait is bounded: connect, attach, and each call
(a per-method default or the caller's budget), and a call left unanswered makes the
client ping the kernel, so a stopped or wedged kernel becomes ``KernelStalled``
naming what stalled (docs/configuration.md, "Timeouts").

``connect`` finds the kernel (docs/configuration.md, "Discovery"): an explicit socket,
else the one ``<state>/kernel.json`` names when its kernel is the peer there, else the
default path, autostarting a kernel unless ``SHOAL_NO_AUTOSTART`` says not to.
"""

from __future__ import annotations

import itertools
import os
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

from .protocol import discovery
from .protocol.errors import ErrorCode, RpcError
from .protocol.framing import FrameReader, FrameWriter, Oversize, encode_frame
from .protocol.jsonrpc import Notification, Response, parse_message, request
from .protocol.limits import (
    ATTACH_TIMEOUT_S,
    AUTOSTART_TIMEOUT_S,
    CALL_BUDGET_GRACE_S,
    CALL_TIMEOUT_S,
    CONNECT_TIMEOUT_S,
    liveness_bounds,
)
from .protocol.paths import disk_full_reason, ensure_private_dir, socket_path, state_dir

AUTOSTART_POLL_S = 0.05
CLOSE_JOIN_S = 5.0
LOG_REASON_CHARS = 500
"""How much of the autostarted kernel's last output line an autostart failure quotes."""

# Methods whose answer legitimately waits on a command, a task or a program: no default
# ceiling (the caller's ``timeout_ms`` sets one), liveness pings only.
WAITING_METHODS = frozenset(
    {"exec", "plan.apply", "task.await", "session.reef", "pty.open", "pty.send", "value.get"}
)
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class KernelLost(ConnectionError):
    """The kernel connection closed (or never opened) while a call needed it."""


class KernelUntrusted(KernelLost):
    """The socket or its directory is not ours, or another user's process serves it."""


class KernelStalled(KernelLost, TimeoutError):
    """The kernel accepted the connection but did not answer in time."""


class KernelMisrouted(KernelUntrusted):
    """The kernel reached serves another state dir than the one this client is set up for."""


STALLED_HINT = (
    "the kernel is stopped or wedged: `shoal kernel status` names it, `shoal kernel "
    "restart` replaces it (or `kill -CONT <pid>` if it was stopped on purpose)"
)


def autostart_allowed(requested: bool | None = None) -> bool:
    """``SHOAL_NO_AUTOSTART=1`` forbids starting a kernel, whatever the caller asked;
    otherwise ``requested`` (None: yes)."""
    if os.environ.get("SHOAL_NO_AUTOSTART", "") not in ("", "0"):
        return False
    return True if requested is None else requested


def check_socket_dir(directory: Path) -> None:
    """Refuse a socket directory that is a symlink or not ours (before connecting)."""
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        raise KernelLost(f"no shoal kernel: {directory} does not exist") from None
    if stat.S_ISLNK(st.st_mode):
        raise KernelUntrusted(
            f"refusing the socket directory {directory}: it is a symlink (someone may be "
            "impersonating the kernel); remove it and let shoal recreate it"
        )
    if st.st_uid != os.geteuid():
        raise KernelUntrusted(
            f"refusing the socket directory {directory}: it belongs to uid {st.st_uid}, not "
            f"to you (uid {os.geteuid()}); another user may be impersonating the kernel"
        )


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    pid, uid, gid = _PEERCRED.unpack(raw)
    return pid, uid, gid


def open_trusted_socket(
    path: Path, timeout: float = CONNECT_TIMEOUT_S
) -> tuple[socket.socket, int]:
    """(socket, peer pid) connected to ``path`` after the trust checks (dir and peer ours)."""
    check_socket_dir(path.parent)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(str(path))
        sock.settimeout(None)
        peer_pid, peer_uid, _ = peer_credentials(sock)
    except TimeoutError:
        sock.close()
        raise KernelStalled(
            f"the shoal kernel at {path} did not accept a connection within "
            f"{timeout:g} s (stalled? see `shoal kernel status`)"
        ) from None
    except OSError as exc:
        sock.close()
        raise KernelLost(f"cannot connect to the shoal kernel at {path}: {exc}") from exc
    if peer_uid not in (os.geteuid(), 0):
        sock.close()
        raise KernelUntrusted(
            f"refusing {path}: it is served by uid {peer_uid} (pid {peer_pid}), "
            f"not by you (uid {os.geteuid()}); nothing was sent"
        )
    return sock, peer_pid


class KernelClient:
    def __init__(
        self,
        path: Path,
        on_event: Callable[[dict], None] | None = None,
        *,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        liveness_interval: float | None = None,
        liveness_timeout: float | None = None,
        connected: tuple[socket.socket, int] | None = None,
    ) -> None:
        # connected: (socket, peer pid) of a link made elsewhere (client_transport's ssh)
        self.path = Path(path)
        self.on_event = on_event
        default_interval, default_timeout = liveness_bounds()
        self.liveness_interval = liveness_interval or default_interval
        self.liveness_timeout = liveness_timeout or default_timeout
        self.throttled_at: float | None = None  # last "throttled" notice (monotonic)
        self.throttled_for_s = 0.0  # the debt that notice named
        self._heartbeat: threading.Thread | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, Future] = {}
        self._lock = threading.Lock()
        self._io_lock = threading.Lock()
        self.closed = threading.Event()
        if connected is None:
            connected = open_trusted_socket(self.path, connect_timeout)
        self.sock, self.peer_pid = connected
        self.writer = FrameWriter(self.sock.fileno())
        self._reader = threading.Thread(target=self._read_loop, name="kernel-demux", daemon=True)
        self._reader.start()

    # -- calls ------------------------------------------------------------------------

    def start_call(self, method: str, params: dict | None = None) -> tuple[int, Future]:
        """Send a request now; the Future resolves to the result or raises RpcError."""
        msg_id = next(self._ids)
        fut: Future = Future()
        frame = encode_frame(request(msg_id, method, params or {}))
        with self._lock:
            self._pending[msg_id] = fut
        try:
            with self._io_lock:
                if self.closed.is_set():
                    raise OSError("the shoal kernel connection is closed")
                self.writer.write_frame(frame)
        except OSError as exc:
            with self._lock:
                self._pending.pop(msg_id, None)
            self._lost(f"write failed: {exc}")
            raise KernelLost(f"lost the shoal kernel: {exc}") from exc
        return msg_id, fut

    def call(self, method: str, params: dict | None = None, timeout: float | None = None) -> Any:
        """Call and wait: ``timeout`` if given, else the method's default (see ``budget``);
        ``KernelStalled`` when it runs out or the kernel stops answering pings."""
        params = params or {}
        msg_id, fut = self.start_call(method, params)
        return self.wait(msg_id, fut, method, budget(method, params, timeout))

    def wait(self, msg_id: int, fut: Future, method: str, limit: float | None) -> Any:
        """Wait for a started call up to ``limit`` seconds (None: as long as the kernel
        answers pings). The call is forgotten when the wait gives up."""
        deadline = None if limit is None else time.monotonic() + limit
        try:
            while True:
                step = self.liveness_interval
                if deadline is not None:
                    step = min(step, max(0.0, deadline - time.monotonic()))
                try:
                    return fut.result(step)
                except FutureTimeout:
                    if fut.done():  # failed with KernelStalled (a TimeoutError) by the heartbeat
                        return fut.result()
                if deadline is not None and time.monotonic() >= deadline:
                    raise KernelStalled(
                        f"the shoal kernel at {self.path} did not answer {method} within "
                        f"{limit:g} s"
                    )
                if method != "ping" and not self.heartbeat_running:
                    self.check_alive(f"while {method} was waiting")
        except BaseException:
            with self._lock:
                self._pending.pop(msg_id, None)
            raise

    def check_alive(self, doing: str = "") -> None:
        """Ping on this connection; ``KernelStalled`` if no answer within the liveness
        timeout (a SIGSTOPped kernel, or a listener that accepts and never answers).

        A kernel holding this connection back for its CPU budget says so ("throttled"
        notices): the ping then waits as long as those keep coming, and is not a stall.
        """
        msg_id, fut = self.start_call("ping", {})
        try:
            self._await_ping(fut)
        except FutureTimeout:
            raise KernelStalled(self.stalled_message(doing)) from None
        finally:
            with self._lock:
                self._pending.pop(msg_id, None)

    def _await_ping(self, fut: Future) -> None:
        """Wait for a ping's answer while the kernel answers or reports throttling;
        ``FutureTimeout`` after a full liveness timeout of neither."""
        waited_since = time.monotonic()
        while True:
            try:
                fut.result(self.liveness_timeout)
                return
            except FutureTimeout:
                if self.closed.is_set():
                    raise KernelLost("the shoal kernel connection closed") from None
                if not self.throttled_since(waited_since):
                    raise
                waited_since = time.monotonic()

    def throttled_since(self, moment: float) -> bool:
        """True when the kernel said after ``moment`` that it holds this connection back
        for its principal's CPU budget (``max_cpu_ms_per_s``)."""
        at = self.throttled_at
        return at is not None and at >= moment

    def stalled_message(self, doing: str = "") -> str:
        return (
            f"the shoal kernel at {self.path} (pid {self.peer_pid}) is stalled: no answer "
            f"to ping within {self.liveness_timeout:g} s {doing}".rstrip()
            + " (stopped? `shoal kernel status`, `shoal kernel restart`)"
        )

    # -- heartbeat ----------------------------------------------------------------------

    @property
    def heartbeat_running(self) -> bool:
        return self._heartbeat is not None and self._heartbeat.is_alive()

    def start_heartbeat(self) -> None:
        """Ping this connection every liveness interval while a call is in flight, and
        fail every pending call with ``KernelStalled`` (closing the link) when a ping goes
        unanswered for the liveness timeout: callers that do not wait on a thread of
        their own (the facade's) learn of a stopped kernel too."""
        if self._heartbeat is None:
            self._heartbeat = threading.Thread(
                target=self._heartbeat_loop, name="kernel-heartbeat", daemon=True
            )
            self._heartbeat.start()

    def _heartbeat_loop(self) -> None:
        while not self.closed.wait(self.liveness_interval):
            with self._lock:
                busy = bool(self._pending)
            if not busy:
                continue
            try:
                self.check_alive("while calls were in flight")
            except KernelStalled as exc:
                self._fail_pending(KernelStalled(str(exc)))
                self.close()
                return
            except (KernelLost, OSError):
                return  # the reader thread has failed the calls already

    def close(self) -> None:
        """Shut down, let the reader thread finish, then release the fd.

        Closing the fd while the reader may still be about to read it would let that
        thread read from whatever socket reuses the fd number next and eat its replies.
        """
        self.closed.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if self._reader is not threading.current_thread():
            self._reader.join(CLOSE_JOIN_S)
        self._release_fd()

    def _release_fd(self) -> None:
        # Under the I/O lock: no writer is between its closed-check and its write.
        with self._io_lock:
            self.closed.set()
            self.sock.close()

    # -- demux ------------------------------------------------------------------------

    def _read_loop(self) -> None:
        reader = FrameReader(self.sock.fileno())
        reason = "the shoal kernel closed the connection"
        try:
            while True:
                events = reader.read_frames()
                if not events:
                    break
                for frame in events:
                    if not isinstance(frame, Oversize):
                        self._dispatch(frame)
        except OSError as exc:
            reason = f"lost the shoal kernel: {exc}"
        self._lost(reason)
        self._release_fd()  # nothing reads this fd any more

    def _dispatch(self, frame: bytes) -> None:
        msg = parse_message(frame)
        if isinstance(msg, Response):
            with self._lock:
                fut = self._pending.pop(msg.id, None)
            if fut is None or fut.done():
                return
            if msg.error is not None:
                err = msg.error
                fut.set_exception(
                    RpcError(
                        err.get("code", ErrorCode.INTERNAL), err.get("message", ""), err.get("data")
                    )
                )
            else:
                fut.set_result(msg.result)
        elif isinstance(msg, Notification) and msg.method == "throttled":
            wait_s = msg.params.get("wait_s") if isinstance(msg.params, dict) else None
            self.throttled_for_s = float(wait_s) if isinstance(wait_s, int | float) else 0.0
            self.throttled_at = time.monotonic()
        elif isinstance(msg, Notification) and msg.method == "event" and self.on_event:
            try:
                self.on_event(msg.params)
            except Exception:  # noqa: BLE001 - a bad callback must not kill the demux
                pass

    def _lost(self, reason: str) -> None:
        self._fail_pending(KernelLost(reason))

    def _fail_pending(self, exc: KernelLost) -> None:
        self.closed.set()
        with self._lock:
            pending = list(self._pending.values())
            self._pending.clear()
        for fut in pending:
            if not fut.done():
                fut.set_exception(type(exc)(str(exc)))  # one instance per waiting thread


def budget(method: str, params: dict, timeout: float | None = None) -> float | None:
    """How long to wait for ``method``: the caller's ``timeout``; else its ``timeout_ms``
    budget plus a grace; else no ceiling for waiting methods, ``CALL_TIMEOUT_S`` for
    the rest (liveness pings apply either way)."""
    if timeout is not None:
        return timeout
    wait_ms = params.get("timeout_ms")
    if isinstance(wait_ms, int | float) and not isinstance(wait_ms, bool):
        return wait_ms / 1000 + CALL_BUDGET_GRACE_S
    if method == "session.attach":
        return ATTACH_TIMEOUT_S
    return None if method in WAITING_METHODS else CALL_TIMEOUT_S


def spawn_kernel(sock: Path, state: Path, flags: list[str] | None = None) -> subprocess.Popen:
    """Start ``shoal-kernel`` detached (own session), its stdio going to the state dir;
    ``flags``: more arguments (a restart passes on the flags the old kernel had). The
    kernel reads kernel.toml itself (docs/configuration.md, "Kernel config file")."""
    ensure_private_dir(state)
    log = os.fdopen(
        os.open(state / "kernel.out", os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600), "ab"
    )
    try:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "shoal_mcp.kernel",
                "--socket",
                str(sock),
                "--state-dir",
                str(state),
                *(flags or []),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        log.close()


def discovered(state: Path, on_event: Callable[[dict], None] | None = None) -> KernelClient | None:
    """A client on the kernel ``<state>/kernel.json`` names, if that kernel is the peer
    at its socket; None when no live kernel serves the state dir."""
    record = discovery.live_record(state)
    if record is None:
        return None
    try:
        client = KernelClient(Path(record["socket"]), on_event)
    except KernelUntrusted:
        raise
    except KernelLost:
        return None
    if client.peer_pid != record.get("pid"):
        client.close()  # a stale record whose socket now has another server
        return None
    return client


def check_serves(client: KernelClient, state: Path) -> None:
    """Refuse (``KernelMisrouted``, the connection closed) a kernel whose ``ping`` names
    another state dir than ``state``: its journal, sessions and outputs are not ours.
    A kernel too old to say which state dir it serves is believed."""
    try:
        info = client.call("ping", {}, client.liveness_timeout).get("kernel") or {}
    except KernelStalled:
        client.close()
        raise KernelStalled(
            client.stalled_message("when asked which state dir it serves")
        ) from None
    except BaseException:
        client.close()
        raise
    served = info.get("state_dir")
    if not isinstance(served, str) or os.path.realpath(served) == os.path.realpath(state):
        return
    client.close()
    raise KernelMisrouted(
        f"refusing the shoal kernel at {client.path} (pid {client.peer_pid}): it serves the "
        f"state dir {served}, not this client's {state}; no command was sent. Give each "
        "state dir its own socket (SHOAL_SOCKET) or use the same SHOAL_STATE_DIR"
    )


def connect(
    sock: str | Path | None = None,
    state: str | Path | None = None,
    *,
    autostart: bool | None = None,
    on_event: Callable[[dict], None] | None = None,
    timeout: float = AUTOSTART_TIMEOUT_S,
) -> KernelClient:
    """Connect to the kernel (docs/configuration.md, "Discovery"), starting it first when
    allowed: ``autostart`` None follows ``SHOAL_NO_AUTOSTART``, False never starts one,
    True starts one unless ``SHOAL_NO_AUTOSTART`` is set."""
    explicit = sock or os.environ.get("SHOAL_SOCKET") or None
    state_path = state_dir(str(state) if state else None)
    target = socket_path(str(explicit) if explicit else None)
    # The kernel at the default socket must serve our state dir; one named by socket,
    # only when a state dir was named too (else any state dir is the one meant).
    verify = not explicit or bool(state or os.environ.get("SHOAL_STATE_DIR"))

    def attempt() -> KernelClient | None:
        if not explicit:
            found = discovered(state_path, on_event)
            if found is not None:
                return found
        try:
            client = KernelClient(target, on_event)
        except KernelUntrusted:
            raise
        except KernelLost:
            return None
        if verify:
            check_serves(client, state_path)
        return client

    client = attempt()
    if client is not None:
        return client
    if not autostart_allowed(autostart):
        why = "SHOAL_NO_AUTOSTART is set" if autostart is not False else "not started"
        raise KernelLost(
            f"no shoal kernel is running for state dir {state_path} (socket {target}); {why}: "
            "start one with `shoal kernel start`"
        )
    return start_and_wait(target, state_path, attempt, timeout)


def start_and_wait(
    target: Path,
    state: Path,
    attempt: Callable[[], KernelClient | None],
    timeout: float = AUTOSTART_TIMEOUT_S,
    flags: list[str] | None = None,
) -> KernelClient:
    """Spawn a kernel on ``target`` for ``state`` and return the first client ``attempt``
    makes; a kernel that exits first is reported with its reason and log file."""
    proc = spawn_kernel(target, state, flags)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        client = attempt()
        if client is not None:
            return client
        code = proc.poll()
        if code not in (None, 0):
            raise KernelLost(autostart_failure(state, code))
        time.sleep(AUTOSTART_POLL_S)
    raise KernelLost(
        f"shoal-kernel did not become ready on {target} within {timeout:g} s; "
        f"see {state / 'kernel.out'} and {state / 'kernel.log'}"
    )


def start_kernel(
    sock: str | Path | None = None,
    state: str | Path | None = None,
    flags: list[str] | None = None,
) -> KernelClient:
    """``shoal kernel start``: connect to the running kernel or start one, whatever
    ``SHOAL_NO_AUTOSTART`` says (starting is what was asked for)."""
    try:
        return connect(sock, state, autostart=False)
    except KernelUntrusted:
        raise
    except KernelLost:
        pass
    explicit = sock or os.environ.get("SHOAL_SOCKET") or None
    state_path = state_dir(str(state) if state else None)
    target = socket_path(str(explicit) if explicit else None)

    def attempt() -> KernelClient | None:
        try:
            return connect(sock, state, autostart=False)
        except KernelUntrusted:
            raise
        except KernelLost:
            return None

    return start_and_wait(target, state_path, attempt, flags=flags)


def autostart_failure(state: Path, code: int) -> str:
    """Why an autostarted kernel exited: its last output line and where its log is."""
    log_path = state / "kernel.out"
    try:
        lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        lines = []
    reason = lines[-1][:LOG_REASON_CHARS] if lines else disk_full_reason(state) or "no output"
    return f"shoal-kernel exited with status {code}: {reason} (log: {log_path})"
