"""``shoal-kernel``: socket discovery, single-instance lock, lifecycle, logging.

See docs/configuration.md, Paths, and docs/decisions.md, Kernel.

Start-up order matters: take the state dir's ``flock`` (``kernel.lock``, held for the
kernel's life: one kernel per state dir, whatever its socket) and then the socket's
(concurrent starts: exactly one winner, losers exit 0), then inspect the socket path
(refuse a live listener, a foreign socket or a non-socket; replace our own stale
socket), then bind ``0600`` and write ``kernel.json`` so clients can find the socket.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import json
import logging
import os
import signal
import socket
import stat
import sys
from pathlib import Path

from ... import __version__
from ...protocol import discovery
from ...protocol.paths import ensure_private_dir, socket_path, state_dir
from ..admin.config_file import ConfigError, Settings, settings_of
from ..config.limits import LISTEN_BACKLOG, SHUTDOWN_DRAIN_S

log = logging.getLogger("shoal.kernel")

EXIT_OK = 0
EXIT_REFUSED = 2


class StartRefused(Exception):
    """The socket path is unusable; the message says why."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="shoal-kernel", description="shoal kernel daemon")
    p.add_argument("--socket", help="Unix socket path (default: $SHOAL_SOCKET or XDG runtime dir)")
    p.add_argument(
        "--state-dir", help="state directory (default: $SHOAL_STATE_DIR or XDG state dir)"
    )
    p.add_argument(
        "--config",
        help="kernel config file (default: $SHOAL_KERNEL_CONFIG or "
        "$XDG_CONFIG_HOME/shoal/kernel.toml); flags win over it",
    )
    p.add_argument("--policy", help="policy TOML file (default: <state>/policy.toml if present)")
    p.add_argument(
        "--require-token",
        action="store_true",
        default=None,
        help="refuse attachments without a token",
    )
    p.add_argument(
        "--sandbox",
        choices=["auto", "required", "off"],
        default=None,
        help="confine sandboxed principals' processes with Landlock: auto (when the machine "
        "enforces it), required (refuse to start without it), off",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="check the config file and the policy this start would use, print the result "
        "as JSON and exit (0 good, 2 refused); nothing is started",
    )
    p.add_argument("--log-level", default=None, choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.add_argument("--version", action="version", version=f"shoal-kernel {__version__}")
    return p.parse_args(argv)


def probe_socket(path: Path) -> str:
    """'absent', 'live', 'stale', or raise StartRefused for foreign/non-socket paths."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "absent"
    if not stat.S_ISSOCK(st.st_mode):
        raise StartRefused(f"{path} exists and is not a socket; refusing to replace it")
    if st.st_uid != os.geteuid():
        raise StartRefused(f"{path} belongs to uid {st.st_uid}; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
        return "live"
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            return "stale"
        raise StartRefused(f"cannot probe {path}: {exc}") from exc
    finally:
        probe.close()


def check_private_dir(directory: Path, what: str) -> Path:
    """Create ``directory`` 0700, or tighten an existing one of ours.

    A symlink is refused (a squatter's link would have us chmod and bind in its target),
    and so is a foreign or shared directory (sticky or world-writable, e.g. ``--socket
    /tmp/k.sock``), before anything is changed: as root, chmod-ing /tmp to 0700 would
    break every other user of the machine.
    """
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        ensure_private_dir(directory)
        st = os.lstat(directory)  # created by us now, unless someone raced us to it
    if stat.S_ISLNK(st.st_mode):
        raise StartRefused(f"{what} {directory} is a symlink; refusing to follow it")
    if not stat.S_ISDIR(st.st_mode):
        raise StartRefused(f"{what} {directory} is not a directory")
    if st.st_uid != os.geteuid():
        raise StartRefused(f"{what} {directory} belongs to uid {st.st_uid}")
    if st.st_mode & (stat.S_ISVTX | stat.S_IWOTH):
        raise StartRefused(
            f"{what} {directory} is shared (mode {stat.S_IMODE(st.st_mode):o}); use a private subdirectory"
        )
    return ensure_private_dir(directory)


def check_socket_dir(directory: Path) -> None:
    check_private_dir(directory, "socket directory")


def bind_listener(path: Path) -> socket.socket:
    """The kernel's socket, bound ``0600`` but not listening yet: a client connecting now
    is refused (and retries) until ``kernel.json`` describes this kernel."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # the socket is born 0600; no window with wider mode
    try:
        sock.bind(str(path))
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    return sock


def setup_logging(state: Path, level: str) -> None:
    log_path = state / "kernel.log"
    os.close(os.open(log_path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600))  # private from birth
    handler = logging.FileHandler(log_path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def take_lock(path: Path) -> int | None:
    """An fd holding an exclusive ``flock`` on ``path``, or None when another holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def held_elsewhere(state: Path, sock_path: Path) -> int:
    """Another kernel holds the state dir's lock: name it (status 2), or, when it is still
    starting (no record yet), we merely lost the start race (status 0).

    docs/decisions.md, "One kernel per state dir".
    """
    record = discovery.live_record(state)
    if record is not None and record.get("pid") != os.getpid():
        print(
            f"shoal-kernel: a kernel already serves state dir {state}: pid {record['pid']}, "
            f"socket {record['socket']} (version {record.get('version', '?')}); refusing. "
            "Stop it with `shoal kernel stop` or use it.",
            file=sys.stderr,
        )
        return EXIT_REFUSED
    print(
        f"shoal-kernel: another kernel holds the lock of state dir {state} (starting); exiting",
        file=sys.stderr,
    )
    return EXIT_OK


def check(args: argparse.Namespace) -> int:
    """``--check``: would a start with these flags accept its kernel.toml and policy?
    One JSON object on stdout (``shoal policy check`` and ``shoal kernel restart`` read it)."""
    from ..access.policy import Policy, PolicyError

    result: dict = {"ok": True}
    try:
        settings = settings_of(args)
        result["config"] = str(settings.config_path) if settings.config_path else None
        policy = settings.policy_path(state_dir(args.state_dir))
        result["policy"] = str(policy) if policy else None
        result["principals"] = Policy.load(str(policy) if policy else None).principals
        result["settings"] = {
            "require_token": settings.require_token,
            "sandbox": settings.sandbox,
            "limits": settings.limits,
        }
    except ConfigError as exc:
        result = {**result, "ok": False, "file": str(exc.path), "key": exc.key, "error": str(exc)}
    except PolicyError as exc:
        result = {**result, "ok": False, "file": result.get("policy"), "key": exc.key}
        result["error"] = str(exc)
    print(json.dumps(result))
    return EXIT_OK if result["ok"] else EXIT_REFUSED


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.check:
        return check(args)
    try:
        args.settings = settings_of(args)
    except ConfigError as exc:
        print(f"shoal-kernel: cannot start: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    sock_path = socket_path(args.socket)
    try:
        state = check_private_dir(state_dir(args.state_dir), "state directory")
        check_socket_dir(sock_path.parent)
    except (StartRefused, OSError) as exc:
        print(f"shoal-kernel: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    # One kernel per state dir (whatever socket it was given), then one per socket.
    state_fd = take_lock(discovery.lock_path(state))
    if state_fd is None:
        return held_elsewhere(state, sock_path)
    lock_fd = take_lock(Path(str(sock_path) + ".lock"))
    if lock_fd is None:
        # Another kernel (of another state dir) holds this socket's lock. If it already
        # serves the socket this is a start over a live listener (refused, status 2); if
        # it is still starting we merely lost the start-up race (status 0).
        os.close(state_fd)
        try:
            live = probe_socket(sock_path) == "live"
        except StartRefused:
            live = False
        if live:
            print(
                f"shoal-kernel: a kernel is already listening on {sock_path}; refusing",
                file=sys.stderr,
            )
            return EXIT_REFUSED
        print("shoal-kernel: another kernel holds the lock; exiting", file=sys.stderr)
        return EXIT_OK
    try:
        state_of_socket = probe_socket(sock_path)
    except StartRefused as exc:
        print(f"shoal-kernel: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    if state_of_socket == "live":
        print(
            f"shoal-kernel: a kernel is already listening on {sock_path}; refusing", file=sys.stderr
        )
        return EXIT_REFUSED
    if state_of_socket == "stale":
        os.unlink(sock_path)
    setup_logging(state, args.settings.log_level)
    try:
        return run(args, sock_path, state, lock_fd)
    finally:
        discovery.remove_record(state, os.getpid())
        os.close(state_fd)  # last: the lock is held until the record is gone


def run(args: argparse.Namespace, sock_path: Path, state: Path, lock_fd: int) -> int:
    from ..app import Kernel, KernelConfig
    from . import methods  # noqa: F401 - registers every handler
    from .server import KernelServer

    settings: Settings = args.settings
    config = KernelConfig(
        socket=sock_path,
        state_dir=state,
        policy_path=settings.policy_path(state),
        require_token=settings.require_token,
        sandbox=settings.sandbox,
        limits=settings.limits,
        config_path=settings.config_path,
        flags=settings.flags,
    )
    try:
        kernel = Kernel(config)
    except Exception as exc:  # noqa: BLE001 - a bad policy file etc.: say why and stop
        log.exception("kernel start failed")
        print(f"shoal-kernel: cannot start: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    listener = bind_listener(sock_path)
    inode = os.stat(sock_path).st_ino
    server = KernelServer(kernel, listener)
    discovery.write_record(
        state,
        {
            "pid": os.getpid(),
            "socket": str(sock_path.absolute()),
            "version": __version__,
            "started": kernel.started,
            "state_dir": str(state.absolute()),
        },
    )
    listener.listen(LISTEN_BACKLOG)  # ready: the record above already names this kernel

    def stop(signum, _frame):
        log.info("signal %s: shutting down", signum)
        server.request_stop()  # serve_forever returns; the finally below stops the rest

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    log.info("shoal-kernel %s listening on %s (pid %s)", __version__, sock_path, os.getpid())
    try:
        server.serve_forever()
    finally:
        server.stop()
        try:
            if os.stat(sock_path).st_ino == inode:
                os.unlink(sock_path)
        except FileNotFoundError:
            pass
        # Order matters: the stores close only after killed tasks and the calls still
        # running have written their results (docs/decisions.md, "Kernel exit").
        if not kernel.stop_work(SHUTDOWN_DRAIN_S):
            log.warning("tasks still finalizing after %ss; closing anyway", SHUTDOWN_DRAIN_S)
        if not server.drain(SHUTDOWN_DRAIN_S):
            log.warning("calls still running after %ss; closing anyway", SHUTDOWN_DRAIN_S)
        kernel.close()
        log.info("shoal-kernel stopped")
        os.close(lock_fd)
    return EXIT_OK
