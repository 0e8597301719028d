"""The OS sandbox for a principal's processes (SPEC §4.7 rev 2): the spec and applying it.

* :class:`SandboxSpec` is plain data: canonical paths by access class, a private temp
  dir, the network mode.  The kernel builds it (``sandbox_build.build_spec``, or
  ``PrincipalPolicy.sandbox_spec``) and hands it to the exec supervisor through a pipe
  (:meth:`SandboxSpec.to_bytes`); the supervisor runs ``sandbox_run.py``.
* :func:`apply` runs in that fresh, single-threaded supervisor: no_new_privs, a private
  network namespace when no TCP is granted, no capabilities, the Landlock ruleset, the
  unix-socket seccomp filter.  Every process it starts afterwards inherits all of it.
* :func:`probe` tells what this machine enforces (``caps.enforced``), found by a child
  that confines itself; the kernel itself is never confined.

Access classes (Landlock rights per path; the mapping is recorded in docs/decisions.md):

* ``read``    execute, read files, list directories.
* ``write``   write and truncate files; create files, dirs, symlinks, fifos, sockets;
  rename within and between write trees (``refer``); unlink *files* (a write grant can
  already destroy a file's content, and rename-over, lock files and editors' atomic
  saves need it).  Not reading: that comes from ``read``.
* ``delete``  remove files and directories.
* ``devices`` read, write and ioctl on device files (ttys, ``/dev/null``...).

Standard library only, and cheap to import: the supervisor starts as ``python -I -S``.
"""

from __future__ import annotations

import ctypes
import errno
import marshal
import os

from . import landlock, namespaces, seccomp

SPEC_VERSION = 2

READ = landlock.FS_EXECUTE | landlock.FS_READ_FILE | landlock.FS_READ_DIR
WRITE = (
    landlock.FS_WRITE_FILE
    | landlock.FS_TRUNCATE
    | landlock.FS_MAKE_REG
    | landlock.FS_MAKE_DIR
    | landlock.FS_MAKE_SYM
    | landlock.FS_MAKE_FIFO
    | landlock.FS_MAKE_SOCK
    | landlock.FS_REFER
    | landlock.FS_REMOVE_FILE
)
DELETE = landlock.FS_REMOVE_FILE | landlock.FS_REMOVE_DIR
DEVICE = (
    landlock.FS_READ_FILE | landlock.FS_WRITE_FILE | landlock.FS_TRUNCATE | landlock.FS_IOCTL_DEV
)
ACCESS = {"read": READ, "write": WRITE, "delete": DELETE, "devices": DEVICE}

SECCOMP_LEVEL = "allowlist"
"""What the seccomp layer is (seccomp.py), for ``caps.enforced``."""

_MAX_SPEC_BYTES = 4 << 20
_WIRE_MAGIC = b"shoal-sandbox-spec marshal\n"
_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4


class SandboxError(OSError):
    """The sandbox could not be built or applied; the message says what and why."""


class SandboxSpec:
    """What one sandboxed process tree may touch.  Paths are canonical (no symlinks).

    ``tcp_connect`` is ``None`` when TCP connect is not restricted (a grant with port
    ``*``), else the allowed ports; TCP bind is always denied.  ``private_net`` puts the
    tree in its own network namespace (no interfaces up: UDP and everything else cut).
    ``notes`` say which grants were narrowed or refused, for humans; :func:`apply`
    ignores them.  ``view`` (a :class:`~.namespaces.View` as a dict) puts the tree in
    namespaces of its own on a read-only view of the system (``None``: Landlock alone,
    where namespaces cannot be made); ``max_procs`` caps its processes (RLIMIT_NPROC,
    counted per user namespace: the uid's other processes do not count).
    """

    __slots__ = (
        "read",
        "write",
        "delete",
        "devices",
        "tmpdir",
        "tcp_connect",
        "private_net",
        "deny_unix_sockets",
        "view",
        "max_procs",
        "egress",
        "notes",
    )

    def __init__(
        self,
        *,
        read: tuple[str, ...] = (),
        write: tuple[str, ...] = (),
        delete: tuple[str, ...] = (),
        devices: tuple[str, ...] = (),
        tmpdir: str = "",
        tcp_connect: tuple[int, ...] | None = (),
        private_net: bool = True,
        deny_unix_sockets: bool = True,
        view: dict | None = None,
        max_procs: int = 0,
        egress: str = "",
        notes: tuple[str, ...] = (),
    ) -> None:
        self.read = tuple(read)
        self.write = tuple(write)
        self.delete = tuple(delete)
        self.devices = tuple(devices)
        self.tmpdir = tmpdir
        self.tcp_connect = None if tcp_connect is None else tuple(tcp_connect)
        self.private_net = private_net
        self.deny_unix_sockets = deny_unix_sockets
        self.view = view
        self.max_procs = max_procs
        self.egress = egress
        self.notes = tuple(notes)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SandboxSpec) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"SandboxSpec({self.to_dict()!r})"

    def to_dict(self) -> dict[str, object]:
        """The JSON-serialisable form (lists, strings, ints, bools, null)."""
        return {
            "version": SPEC_VERSION,
            "read": list(self.read),
            "write": list(self.write),
            "delete": list(self.delete),
            "devices": list(self.devices),
            "tmpdir": self.tmpdir,
            "tcp_connect": None if self.tcp_connect is None else list(self.tcp_connect),
            "private_net": self.private_net,
            "deny_unix_sockets": self.deny_unix_sockets,
            "view": self.view,
            "max_procs": self.max_procs,
            "egress": self.egress,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: object) -> SandboxSpec:
        if not isinstance(data, dict) or data.get("version") != SPEC_VERSION:
            raise SandboxError(errno.EINVAL, f"not a version-{SPEC_VERSION} sandbox spec")
        unknown = sorted(set(data) - {"version", *cls.__slots__})
        if unknown:
            raise SandboxError(errno.EINVAL, f"sandbox spec: unknown keys {unknown}")
        kw: dict[str, object] = {}
        for key in ("read", "write", "delete", "devices", "notes"):
            value = data.get(key, [])
            if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
                raise SandboxError(errno.EINVAL, f"sandbox spec: {key} must be a list of strings")
            if key != "notes" and not all(p.startswith("/") for p in value):
                raise SandboxError(errno.EINVAL, f"sandbox spec: {key} paths must be absolute")
            kw[key] = tuple(value)
        tcp = data.get("tcp_connect")
        if tcp is not None and not (
            isinstance(tcp, list) and all(type(p) is int and 0 < p < 65536 for p in tcp)  # noqa: E721 (not bool)
        ):
            raise SandboxError(errno.EINVAL, "sandbox spec: tcp_connect must be null or ports")
        tmpdir = data.get("tmpdir", "")
        if not isinstance(tmpdir, str):
            raise SandboxError(errno.EINVAL, "sandbox spec: tmpdir must be a string")
        flags = {k: data.get(k, True) for k in ("private_net", "deny_unix_sockets")}
        if not all(isinstance(v, bool) for v in flags.values()):
            raise SandboxError(errno.EINVAL, "sandbox spec: private_net/deny_unix_sockets: bool")
        view = data.get("view")
        if view is not None:
            try:
                view = namespaces.View.from_dict(view).to_dict()
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise SandboxError(errno.EINVAL, f"sandbox spec: bad view: {e}") from e
        max_procs = data.get("max_procs", 0)
        if type(max_procs) is not int or max_procs < 0:  # noqa: E721 (not bool)
            raise SandboxError(errno.EINVAL, "sandbox spec: max_procs must be an int >= 0")
        egress = data.get("egress", "")
        if not isinstance(egress, str) or (egress and not egress.startswith("/")):
            raise SandboxError(errno.EINVAL, "sandbox spec: egress must be an absolute path")
        return cls(
            tmpdir=tmpdir,
            view=view,
            max_procs=max_procs,
            egress=egress,
            tcp_connect=None if tcp is None else tuple(tcp),
            **flags,  # type: ignore[arg-type]
            **kw,  # type: ignore[arg-type]
        )

    def plus(self, *, write: tuple[str, ...] = (), devices: tuple[str, ...] = ()) -> SandboxSpec:
        """This spec with more canonical paths the kernel made for this one process: its
        spool files (``write``), its own terminal (``devices``)."""
        data = self.to_dict()
        data["write"] = [*self.write, *write]
        data["devices"] = [*self.devices, *devices]
        return SandboxSpec.from_dict(data)

    def to_bytes(self) -> bytes:
        """The supervisor's wire form: a magic line, then :mod:`marshal` of :meth:`to_dict`
        (parsing JSON would cost the supervisor ~7 ms importing json)."""
        return _WIRE_MAGIC + marshal.dumps(self.to_dict())

    @classmethod
    def from_bytes(cls, data: bytes) -> SandboxSpec:
        """Parse :meth:`to_bytes` output, or JSON text (``{...}``) for hand-written specs."""
        if len(data) > _MAX_SPEC_BYTES:
            raise SandboxError(errno.E2BIG, "sandbox spec too large")
        try:
            if data.startswith(_WIRE_MAGIC):
                obj = marshal.loads(data[len(_WIRE_MAGIC) :])
            else:
                import json  # hand-written specs only

                obj = json.loads(data)
        except (ValueError, EOFError, TypeError) as e:
            raise SandboxError(errno.EINVAL, f"unreadable sandbox spec: {e}") from e
        return cls.from_dict(obj)

    def environ(self) -> dict[str, str]:
        """Environment the sandboxed tree should get (``TMPDIR`` = the private temp dir;
        with an egress channel, the proxy variables pointing at its bridge)."""
        env = {"TMPDIR": self.tmpdir} if self.tmpdir else {}
        if self.egress:
            from ..net.bridge import proxy_environ

            env.update(proxy_environ())
        return env


# --- applying a spec (runs in the fresh supervisor process) --------------------------


def apply(spec: SandboxSpec) -> dict[str, object]:
    """Confine this process (and everything it starts) to ``spec``.  Call it once, from
    a single-threaded process, before starting the sandboxed program.

    With a ``view`` the process first moves into namespaces of its own
    (:func:`namespaces.enter`): it returns in a new process there (pid 2, below the
    namespace's init), the calling process staying behind as a relay that ends like it.

    Order: no_new_privs; the private network namespace (needs its privileges first);
    drop capabilities; the Landlock ruleset (rule paths are opened with the powers the
    sandbox keeps); the seccomp filter.  Fails closed: whatever the spec asks for that
    cannot be enforced raises :class:`SandboxError` (or ``landlock.LandlockUnavailable``).
    Rule paths that vanished, cannot be opened or now resolve elsewhere are left out,
    never widened.  Returns ``{"abi": N, "netns": mode or None, "skipped": [paths]}``.
    """
    if spec.view is not None:
        enter_namespaces(spec, init=True)
        return confine_tree(spec)
    abi, netns = confine_process(spec, seccomp_filter=False)
    skipped = restrict_files(spec, abi)
    if spec.deny_unix_sockets:
        seccomp.deny_unix_sockets()
    return {"abi": abi, "netns": netns, "skipped": skipped}


def enter_namespaces(spec: SandboxSpec, *, init: bool) -> None:
    """Into the namespaces and the view of ``spec`` (see :func:`apply`; ``init`` False:
    the exec zygote, which becomes the pid namespace's init itself).  Fails closed."""
    assert spec.view is not None
    _check_enforceable(spec)
    landlock.set_no_new_privs()  # first, so the relay left behind has it too
    namespaces.enter(
        namespaces.supported_flags(spec.private_net),
        namespaces.View.from_dict(spec.view),
        init=init,
        max_procs=spec.max_procs,
        egress=spec.egress,
        raise_view_error=True,  # the zygote (init False) reports it on each job's stderr
    )


class JobConfinement:
    """A zygote's confinement of its jobs, prepared once inside its namespaces so that
    each job's own part is a few system calls (``supervise.py``):

    built here: the Landlock ruleset (its rule paths opened and resolved in the view),
    the seccomp program, the capability bounding set emptied (the zygote keeps its
    effective capabilities, for each job's IPC namespace).  :meth:`apply` in a job: a
    SysV IPC namespace of its own (its objects die with the job), no_new_privs, the
    process cap, no capabilities, the ruleset, the filter.  Nothing can undo it."""

    def __init__(self, spec: SandboxSpec) -> None:
        self.spec = spec
        self.abi = landlock.abi_version()
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.ruleset, self.skipped = build_ruleset(spec, self.abi)
        if spec.deny_unix_sockets:
            seccomp.prepare_filter(allow_listen=spec.private_net)
        _drop_bounding_set(self._libc)

    def apply(self) -> None:
        namespaces.unshare(namespaces.CLONE_NEWIPC)
        _confine_now(self.spec, self._libc, self.ruleset)


def confine_tree(spec: SandboxSpec) -> dict[str, object]:
    """Inside the namespaces, for one program (``apply``): no_new_privs, the process cap,
    no capabilities, the Landlock rules (the second layer), the seccomp filter."""
    abi = landlock.abi_version()
    libc = ctypes.CDLL(None, use_errno=True)
    _drop_bounding_set(libc)
    ruleset, skipped = build_ruleset(spec, abi)
    _confine_now(spec, libc, ruleset)
    return {"abi": abi, "netns": "netns" if spec.private_net else None, "skipped": skipped}


def _confine_now(spec: SandboxSpec, libc: object, ruleset: landlock.Ruleset) -> None:
    landlock.set_no_new_privs()
    if spec.max_procs:
        import resource

        resource.setrlimit(resource.RLIMIT_NPROC, (spec.max_procs, spec.max_procs))
    _clear_capabilities(libc)
    ruleset.restrict_self()
    if spec.deny_unix_sockets:
        # Listening is harmless in a network namespace of the tree's own (only its own
        # processes can connect: a test server on loopback works); on the host's, never.
        seccomp.install_filter(allow_listen=spec.private_net)


def _check_enforceable(spec: SandboxSpec) -> None:
    if spec.deny_unix_sockets and not seccomp.supported():
        raise SandboxError(errno.EOPNOTSUPP, "no seccomp filter for this architecture")


def confine_process(spec: SandboxSpec, *, seccomp_filter: bool = True) -> tuple[int, str | None]:
    """Everything of ``spec`` but the file rules: no_new_privs, the private network,
    no capabilities, and (``seccomp_filter``) the unix-socket filter.  The exec
    supervisor's zygote applies this once; each job's supervisor then adds
    :func:`restrict_files` with its own spool paths.  Returns (Landlock ABI, netns)."""
    abi = landlock.abi_version()
    handled_net = landlock.net_rights(abi)
    if spec.tcp_connect is not None and not handled_net and not spec.private_net:
        raise SandboxError(
            errno.EOPNOTSUPP, f"TCP port rules need Landlock ABI 4; this kernel has {abi}"
        )
    if spec.deny_unix_sockets and not seccomp.supported():
        raise SandboxError(errno.EOPNOTSUPP, "no seccomp filter for this architecture")
    libc = ctypes.CDLL(None, use_errno=True)
    landlock.set_no_new_privs()
    netns = _private_network(libc) if spec.private_net else None
    _drop_capabilities(libc)
    if seccomp_filter and spec.deny_unix_sockets:
        seccomp.deny_unix_sockets()
    return abi, netns


def restrict_files(spec: SandboxSpec, abi: int) -> list[str]:
    """The Landlock ruleset of ``spec`` (files, TCP ports, scopes), on this process;
    the rule paths left out (gone, or resolving elsewhere now)."""
    ruleset, skipped = build_ruleset(spec, abi)
    ruleset.restrict_self()
    return skipped


def build_ruleset(spec: SandboxSpec, abi: int) -> tuple[landlock.Ruleset, list[str]]:
    """The Landlock ruleset of ``spec`` (files, TCP ports, scopes), not yet enforced;
    and the rule paths left out (gone, or resolving elsewhere now)."""
    handled_net = landlock.net_rights(abi)
    if spec.tcp_connect is None:
        handled_net &= ~landlock.NET_CONNECT_TCP
    rights: dict[str, int] = {}
    for cls, access in ACCESS.items():
        for path in getattr(spec, cls):
            rights[path] = rights.get(path, 0) | access
    skipped: list[str] = []
    rs = landlock.Ruleset(landlock.fs_rights(abi), handled_net, landlock.scopes(abi))
    try:
        for path, access in rights.items():
            try:
                rs.add_path(path, access, expect=path)
            except landlock.LandlockError as e:
                if e.errno != errno.ELOOP:
                    raise
                skipped.append(path)
            except OSError:  # gone, or not reachable without the dropped capabilities
                skipped.append(path)
        for port in spec.tcp_connect or ():
            rs.add_port(port, landlock.NET_CONNECT_TCP)
    except BaseException:
        rs.close()
        raise
    return rs, skipped


def _private_network(libc: object) -> str:
    """Move into a new network namespace (only a loopback, down).  As root directly;
    otherwise inside a new user namespace mapping our own uid/gid (setgroups denied)."""
    uid, gid = os.geteuid(), os.getegid()
    if uid == 0 and libc.unshare(_CLONE_NEWNET) == 0:  # type: ignore[attr-defined]
        return "netns"
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:  # type: ignore[attr-defined]
        err = _errno()
        raise SandboxError(err, f"cannot create a private network namespace: {os.strerror(err)}")
    for name, text in (
        ("setgroups", "deny"),
        ("uid_map", f"{uid} {uid} 1"),
        ("gid_map", f"{gid} {gid} 1"),
    ):
        fd = os.open(f"/proc/self/{name}", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    return "userns+netns"


def _errno() -> int:
    return ctypes.get_errno()


def _drop_capabilities(libc: object) -> None:
    """No capabilities after exec, even as root: empty bounding and ambient sets and
    cleared inheritable ones (root keeps uid 0, not its powers: no module loading, raw
    I/O, reboot, raw sockets, or DAC override past Landlock's own checks)."""
    status = _read_text("/proc/self/status")
    eff = next((ln.split()[1] for ln in status.splitlines() if ln.startswith("CapEff:")), "0")
    if int(eff, 16) == 0:
        return  # nothing to drop; exec cannot gain any (no_new_privs blocks file caps)
    _drop_bounding_set(libc)
    _clear_capabilities(libc)


def _drop_bounding_set(libc: object) -> None:
    """Empty the bounding and ambient sets: nothing can be gained at an exec any more
    (the effective set is untouched: :func:`_clear_capabilities`)."""
    status = _read_text("/proc/self/status")
    bnd = next((ln.split()[1] for ln in status.splitlines() if ln.startswith("CapBnd:")), "0")
    if int(bnd, 16) == 0:
        return
    last = int(_read_text("/proc/sys/kernel/cap_last_cap") or "40")
    for cap in range(last + 1):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:  # type: ignore[attr-defined]
            err = _errno()
            if err != errno.EINVAL:  # EINVAL: a cap this kernel does not know
                raise SandboxError(err, f"cannot drop capability {cap}: {os.strerror(err)}")
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)  # type: ignore[attr-defined]


def _clear_capabilities(libc: object) -> None:
    """Effective, permitted and inheritable sets all empty."""
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this pid
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2 words: all zero
    if libc.capset(header, data) != 0:  # type: ignore[attr-defined]
        err = _errno()
        raise SandboxError(err, f"cannot clear capabilities: {os.strerror(err)}")


def _read_text(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


# --- what this machine can enforce ---------------------------------------------------

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_run.py")


def runner_argv(
    spec_fd: int,
    argv: list[str],
    python: str | None = None,
    env: dict[str, str] | None = None,
) -> list[str]:
    """The command line that applies the spec read from ``spec_fd`` and execs ``argv``.

    With ``env`` (the environment the child gets), the runner restores ``LC_CTYPE`` as
    it is there: the interpreter coerces a C locale to ``LC_CTYPE=C.UTF-8`` in its own
    environment, which the program would otherwise inherit."""
    import sys

    flags: list[str] = []
    if env is not None:
        flags.append("--lc-ctype=" + ("=" + env["LC_CTYPE"] if "LC_CTYPE" in env else "-"))
    return [python or sys.executable, "-I", "-S", RUNNER, str(spec_fd), *flags, "--", *argv]
