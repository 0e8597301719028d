"""What this machine's sandbox enforces (``caps.enforced``), found by trying it.

:func:`probe` runs ``sandbox_run.py --probe`` once per process: a throwaway child enters
the namespaces and the view (:func:`probe_namespaces`), then confines itself with an
empty Landlock ruleset and the seccomp filter and tries what should fail
(:func:`probe_self`).  The caller, the kernel, is never confined.

Standard library only (the probe child runs ``python -I -S``).
"""

from __future__ import annotations

import ctypes
import errno
import os

from . import landlock, namespaces, seccomp
from .sandbox import RUNNER, SECCOMP_LEVEL, _drop_capabilities, _private_network


class SandboxSupport:
    """What :func:`probe` found: Landlock ABI, and which parts were seen to enforce.

    ``ns``: the namespaces a sandboxed tree was seen to get with its read-only view
    (empty where they cannot be made: Landlock alone then)."""

    __slots__ = ("abi", "fs", "tcp", "netns", "unix", "ns", "reason")

    def __init__(
        self,
        abi: int = 0,
        fs: bool = False,
        tcp: bool = False,
        netns: str | None = None,
        unix: bool = False,
        ns: list[str] | tuple[str, ...] = (),
        reason: str = "",
    ) -> None:
        self.abi, self.fs, self.tcp, self.netns, self.unix = abi, fs, tcp, netns, unix
        self.ns = list(ns)
        self.reason = reason

    def to_dict(self) -> dict[str, object]:
        return {s: getattr(self, s) for s in self.__slots__}

    @property
    def view(self) -> bool:
        """Sandboxed trees get namespaces and the read-only view."""
        return "mnt" in self.ns and "user" in self.ns and "pid" in self.ns

    def enforced(self, *, private_net: bool = True) -> dict[str, object] | bool:
        """``caps.enforced`` for a tree with (``private_net``) or without a network of its
        own: per layer, what holds, or ``False`` when processes cannot be confined (no
        Landlock, or no unix-socket filter: the kernel socket would be open)::

            {"fs": "ro-root+landlock-v7", "ns": ["user", "mnt", "pid", "ipc", "uts", "net"],
             "net": "none", "seccomp": "allowlist"}

        ``net``: ``"none"`` (a network namespace with only loopback), ``"landlock-tcp"``
        (the host's network, TCP by granted port), or ``False`` (not confined).
        Without namespaces ``fs`` is ``"landlock-vN"`` and ``ns`` is absent."""
        if not (self.fs and self.unix):
            return False
        own_net = private_net and (self.view and "net" in self.ns or bool(self.netns))
        net: str | bool = "none" if own_net else ("landlock-tcp" if self.tcp else False)
        out: dict[str, object] = {"fs": f"landlock-v{self.abi}", "net": net}
        if self.view:
            out["fs"] = f"ro-root+landlock-v{self.abi}"
            out["ns"] = [n for n in self.ns if n != "net" or private_net]
        out["seccomp"] = SECCOMP_LEVEL
        return out


def probe_namespaces() -> tuple[list[str], str]:
    """Whether a tree can get its namespaces and read-only view here: tried in a child
    (which enters them and checks it is pid 1 on a read-only root).  Returns (the
    namespaces made, or [], and why not)."""
    import json
    import tempfile

    flags = namespaces.supported_flags(True)
    scratch = tempfile.mkdtemp(prefix="shoal-probe-")
    r, w = os.pipe()
    try:
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                namespaces.enter(flags, namespaces.View(scratch), init=False)
                pid1 = os.getpid() == 1 and os.readlink("/proc/self") == "1"
                try:
                    os.close(os.open("/.shoal-probe", os.O_CREAT | os.O_WRONLY, 0o600))
                    ro = False
                except OSError as e:
                    ro = e.errno == errno.EROFS
                result = {"ok": pid1 and ro, "why": "" if pid1 and ro else f"pid1={pid1} ro={ro}"}
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                result = {"ok": False, "why": str(e)}
            os.write(w, json.dumps(result).encode())
            os._exit(0)
        os.close(w)
        w = -1
        data = b""
        while chunk := os.read(r, 4096):
            data += chunk
        os.waitpid(pid, 0)
        try:
            result = json.loads(data)
        except ValueError:
            result = {"ok": False, "why": data.decode(errors="replace") or "no answer"}
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
        os.rmdir(scratch)
    if result.get("ok"):
        return namespaces.names(flags), ""
    return [], f"no namespaces for the sandbox: {result.get('why')}"


def probe_self() -> dict[str, object]:
    """Apply an empty sandbox to *this* process and test each part by trying it.

    Only for a throwaway child (``sandbox_run.py --probe``): afterwards this process
    can open no file at all.  The namespaces are tried first, in a child of their own.
    """
    import socket

    out = SandboxSupport()
    try:
        out.abi = landlock.abi_version()
    except landlock.LandlockError as e:
        out.reason = str(e)
        return out.to_dict()
    problems: list[str] = []
    try:
        out.ns, why = probe_namespaces()
    except OSError as e:
        why = f"no namespaces for the sandbox: {e}"
    if why:
        problems.append(why)
    libc = ctypes.CDLL(None, use_errno=True)
    before = os.readlink("/proc/self/ns/net")
    try:
        landlock.set_no_new_privs()
        try:
            mode = _private_network(libc)
            if os.readlink("/proc/self/ns/net") != before:
                out.netns = mode
        except OSError as e:
            problems.append(str(e))
        _drop_capabilities(libc)
        handled_net = landlock.net_rights(out.abi)
        with landlock.Ruleset(
            landlock.fs_rights(out.abi), handled_net, landlock.scopes(out.abi)
        ) as rs:
            rs.restrict_self()
        try:
            seccomp.deny_unix_sockets()
        except OSError as e:
            problems.append(str(e))
    except OSError as e:
        out.reason = str(e)
        return out.to_dict()
    out.fs = _denied(lambda: os.listdir("/"))
    if handled_net:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            out.tcp = _denied(lambda: s.connect(("127.0.0.1", 9)))
    out.unix = _denied(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close())
    if not out.fs:
        problems.append("Landlock did not deny a directory listing")
    if not out.unix:
        problems.append("unix sockets stayed open")
    out.reason = "; ".join(problems)
    return out.to_dict()


def _denied(attempt: object) -> bool:
    try:
        attempt()  # type: ignore[operator]
    except PermissionError:
        return True
    except OSError:
        return False
    return False


_probed: SandboxSupport | None = None


def probe(
    *, python: str | None = None, timeout: float = 10.0, refresh: bool = False
) -> SandboxSupport:
    """What this machine enforces, found once per process by a child running
    ``sandbox_run.py --probe`` (the caller is never confined)."""
    global _probed
    if _probed is not None and not refresh:
        return _probed
    import json
    import subprocess
    import sys

    try:
        done = subprocess.run(
            [python or sys.executable, "-I", "-S", RUNNER, "--probe"],
            capture_output=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        data = json.loads(done.stdout)
        support = SandboxSupport(**{k: data[k] for k in SandboxSupport.__slots__})
    except (OSError, ValueError, KeyError, TypeError, subprocess.SubprocessError) as e:
        support = SandboxSupport(reason=f"sandbox probe failed: {e}")
    _probed = support
    return support
