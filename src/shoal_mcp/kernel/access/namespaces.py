"""Namespaces and the read-only view of the system for one sandboxed process tree.

Landlock filters paths; it does not stop what is checked by uid rather than by path
(chmod, utime, xattrs, signals, ``prlimit``, ``/proc/PID``, SysV IPC, inotify).  So a
sandboxed tree also gets namespaces of its own (docs/security.md, "Isolation"):

* **user**: our own uid and gid mapped to themselves (one id each, setgroups denied).
  The capabilities a new user namespace gives are used only to build the view below
  and are dropped before any caller code runs.
* **mount**: a recursive copy of ``/`` made read-only, nosuid and nodev in one
  ``mount_setattr``; the write grants bound back read-write on top; the kernel's own
  directories and the secrets replaced by empty read-only tmpfs (directories) or an
  empty read-only file (files); the trusted base (the package, the kernel's Python, the
  policy) bound read-only again over any grant; paths the kernel lets the tree read
  inside a hidden directory (``$SHOAL_OUT``, the private temp dir) bound back; a fresh
  ``/dev`` with a few device nodes and a private ``/dev/shm``; a ``/proc`` of the new
  pid namespace.  Then ``pivot_root`` into it and the old root detached.
* **pid**: the tree sees only its own processes; nothing outside can be signalled,
  ``prlimit``-ed or read in ``/proc``.  The first process in it is an init that reaps.
* **ipc**, **uts**, and **net** when the spec asks for a private network (loopback up,
  nothing else).

:func:`enter` does all of it from a single-threaded process: it forks, and the parent
stays behind as a *relay* that waits for the namespace's init and exits like it, so the
caller's parent (the kernel, a PTY supervisor) still has one child to wait for and kill.

Standard library and ctypes only: imported by ``python -I -S`` supervisors.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import socket
import struct

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

NAMES = {
    CLONE_NEWUSER: "user",
    CLONE_NEWNS: "mnt",
    CLONE_NEWPID: "pid",
    CLONE_NEWIPC: "ipc",
    CLONE_NEWUTS: "uts",
    CLONE_NEWCGROUP: "cgroup",
    CLONE_NEWNET: "net",
}

_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_MNT_DETACH = 2

_AT_FDCWD = -100
_AT_RECURSIVE = 0x8000
_MOUNT_ATTR_RDONLY = 0x1
_MOUNT_ATTR_NOSUID = 0x2
_MOUNT_ATTR_NODEV = 0x4
_SYS_MOUNT_SETATTR = 442  # generic number: the same on x86_64 and aarch64
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_SIGKILL = 9

_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1

USER_NS_LIMITS = {
    "max_inotify_instances": 16,
    "max_inotify_watches": 65536,
    "max_user_namespaces": 0,
    "max_mnt_namespaces": 0,
    "max_net_namespaces": 0,
}
"""Per-user-namespace limits set in a sandbox's own user namespace (``/proc/sys/user``).
Those counts are charged to the uid's in the namespaces above too, so without them one
agent could hold the uid's 128 inotify instances and break the human's editor; and no
tree needs namespaces of its own (seccomp refuses them as well)."""

CGROUP_REMOVE_TRIES = 100
"""How many times (10 ms apart) a relay tries to remove its tree's emptied cgroup."""

DEVICES = ("null", "zero", "full", "random", "urandom", "tty", "ptmx")
"""Device nodes the view's ``/dev`` has (bound from the host's); plus ``pts``, ``shm``."""
DEV_LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
             "stderr": "/proc/self/fd/2"}  # fmt: skip

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.syscall.restype = ctypes.c_long


class NamespaceError(OSError):
    """A namespace or a mount of the view could not be made; the message says which."""


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _fail(what: str) -> NamespaceError:
    err = ctypes.get_errno()
    return NamespaceError(err, f"{what}: {os.strerror(err)}")


def _b(path: str) -> bytes:
    return path.encode("utf-8", "surrogateescape")


def _mount(src: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    if (
        _libc.mount(
            None if src is None else _b(src),
            _b(target),
            None if fstype is None else fstype.encode(),
            flags,
            data.encode() if data else None,
        )
        != 0
    ):
        raise _fail(f"mount {src or fstype} on {target}")


def bind_read_only(src: str, target: str) -> None:
    """Mount ``src`` at ``target`` read-only in this (the caller's) mount namespace: a
    write through ``target`` fails with EROFS, root's included. OSError where mounting
    is not allowed (no CAP_SYS_ADMIN, a container)."""
    _mount(src, target, None, _MS_BIND)
    try:
        _mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY)
    except OSError:
        unmount(target)
        raise


def mounted_at(path: str) -> bool:
    """Something is mounted at ``path`` in this mount namespace (``/proc/self/mountinfo``:
    a bind mount within one file system has the same device, so ``os.path.ismount``
    cannot tell)."""
    escaped = path.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011")
    escaped = escaped.replace("\n", "\\012")
    with open("/proc/self/mountinfo", "rb") as fh:
        return any(line.split(b" ")[4] == _b(escaped) for line in fh)


def unmount(target: str) -> None:
    """Detach the mount at ``target`` (lazily: open files keep it until closed)."""
    if _libc.umount2(_b(target), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"umount {target}: {os.strerror(err)}")


def _setattr(path: str, attr_set: int, attr_clr: int = 0, *, recursive: bool) -> None:
    attr = _MountAttr(attr_set, attr_clr, 0, 0)
    flags = _AT_RECURSIVE if recursive else 0
    rc = _libc.syscall(
        _SYS_MOUNT_SETATTR, _AT_FDCWD, _b(path), flags, ctypes.byref(attr), ctypes.sizeof(attr)
    )
    if rc != 0:
        raise _fail(f"mount_setattr {path}")


def unshare(flags: int) -> None:
    if _libc.unshare(flags) != 0:
        raise _fail("unshare(" + "+".join(n for f, n in NAMES.items() if flags & f) + ")")


def _write_file(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def map_own_ids(uid: int, gid: int) -> None:
    """Map ``uid``/``gid`` to themselves in the user namespace just entered."""
    _write_file("/proc/self/setgroups", "deny")
    _write_file("/proc/self/uid_map", f"{uid} {uid} 1")
    _write_file("/proc/self/gid_map", f"{gid} {gid} 1")


def set_dumpable(on: bool) -> None:
    """Not dumpable: processes of the same uid cannot ptrace it or open its ``/proc/PID``
    files (``fd/``, ``mem``, ``environ``); execve resets it for the program started."""
    _libc.prctl(_PR_SET_DUMPABLE, 1 if on else 0, 0, 0, 0)


def loopback_up() -> None:
    """Bring ``lo`` up in a new network namespace (it starts down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, _SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | _IFF_UP))


class View:
    """The mount plan of one sandbox: plain data, built by the kernel (``sandbox_build``).

    ``scratch``: an existing empty directory of ours where the view is assembled (a
    mount point only: nothing is written there on disk).  ``write``: paths bound back
    read-write.  ``hide``: directories and files replaced by empty read-only ones.
    ``pin``: paths bound onto themselves, read-write: a mount point cannot be renamed or
    removed, so a ``.git`` cannot be moved aside and replaced by one without its
    protections.  ``protect``: paths bound read-only again over any write grant.
    ``reveal``: paths inside hidden directories bound back as they are (read-write where
    they are in ``write`` too, else read-only).
    """

    __slots__ = ("scratch", "write", "hide", "protect", "reveal", "pin")

    def __init__(
        self,
        scratch: str,
        write: tuple[str, ...] = (),
        hide: tuple[str, ...] = (),
        protect: tuple[str, ...] = (),
        reveal: tuple[str, ...] = (),
        pin: tuple[str, ...] = (),
    ) -> None:
        self.scratch = scratch
        self.write, self.hide = tuple(write), tuple(hide)
        self.protect, self.reveal = tuple(protect), tuple(reveal)
        self.pin = tuple(pin)

    def to_dict(self) -> dict[str, object]:
        return {
            s: list(getattr(self, s)) if s != "scratch" else self.scratch for s in self.__slots__
        }

    @classmethod
    def from_dict(cls, data: dict) -> View:
        return cls(
            str(data["scratch"]), *(tuple(data.get(k, ())) for k in cls.__slots__[1:])
        )  # fmt: skip


def build_view(view: View) -> None:
    """Assemble the view and ``pivot_root`` into it (in a new user + mount namespace)."""
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    base = view.scratch
    _mount("tmpfs", base, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0700,size=64k")
    root = base + "/root"
    os.mkdir(root, 0o755)
    # A hidden file's stand-in: empty and mode 000, so reading it fails (Permission
    # denied) instead of quietly reading nothing, and the reply can say so.
    empty = base + "/empty"
    os.close(os.open(empty, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o000))

    _mount("/", root, None, _MS_BIND | _MS_REC)
    _setattr(root, _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV, recursive=True)
    for path in view.write:
        if os.path.lexists(path):
            _bind(path, root + path, writable=True)
    for path in view.pin:
        if os.path.lexists(path):
            _bind(path, root + path, writable=True)
    for path in view.hide:
        _hide(root + path, path, empty, view)
    for path in view.protect:
        if os.path.exists(path) and os.path.exists(root + path):
            _bind(path, root + path, writable=False)
    for path in view.reveal:
        if os.path.exists(path):
            _bind(path, root + path, writable=path in view.write)
    _make_dev(root)
    _mount("proc", root + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)

    os.chdir(root)
    if _libc.syscall(_SYS_PIVOT_ROOT[os.uname().machine], b".", b".") != 0:
        raise _fail("pivot_root")
    if _libc.umount2(b".", _MNT_DETACH) != 0:
        raise _fail("detach the old root")
    os.chdir("/")


def _bind(src: str, target: str, *, writable: bool) -> None:
    _mount(src, target, None, _MS_BIND | _MS_REC)
    if writable:
        try:
            _setattr(
                target, _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV, _MOUNT_ATTR_RDONLY, recursive=True
            )
        except NamespaceError as exc:
            if exc.errno != errno.EPERM:
                raise
            # A read-only mount below ``src`` (say a bind under /tmp) is locked read-only
            # in this user namespace, so the recursive change fails as a whole. It stays
            # read-only, as it is outside; only the granted mount itself is made writable.
            _setattr(target, _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV, recursive=True)
            _setattr(target, 0, _MOUNT_ATTR_RDONLY, recursive=False)
    else:
        _setattr(
            target, _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV, recursive=True
        )


def _hide(target: str, path: str, empty: str, view: View) -> None:
    """``target`` replaced by an empty read-only directory or file; mount points made
    inside for the ``reveal`` paths below it (a tmpfs, then made read-only)."""
    if not os.path.lexists(target) or os.path.islink(target):
        return
    if not os.path.isdir(target):
        _bind(empty, target, writable=False)
        return
    _mount("tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "mode=0755,size=64k")
    for inner in view.reveal:
        if inner.startswith(path + "/") and os.path.exists(inner):
            point = target + inner[len(path) :]
            if os.path.isdir(inner):
                os.makedirs(point, 0o755, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(point), 0o755, exist_ok=True)
                os.close(os.open(point, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o444))
    _setattr(target, _MOUNT_ATTR_RDONLY, recursive=False)


def _limit_user_namespace() -> None:
    """:data:`USER_NS_LIMITS` in this user namespace (after the view: its own /proc)."""
    for name, value in USER_NS_LIMITS.items():
        try:
            _write_file(f"/proc/sys/user/{name}", str(value))
        except FileNotFoundError:
            continue  # a kernel without that limit


def _make_dev(root: str) -> None:
    dev = root + "/dev"
    _mount("tmpfs", dev, "tmpfs", _MS_NOSUID | _MS_NOEXEC, "mode=0755,size=64k")
    for name in DEVICES:
        host = "/dev/" + name
        if os.path.exists(host):
            os.close(os.open(f"{dev}/{name}", os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o666))
            _mount(host, f"{dev}/{name}", None, _MS_BIND)
    for name, target in DEV_LINKS.items():
        os.symlink(target, f"{dev}/{name}")
    os.mkdir(dev + "/pts", 0o755)
    if os.path.isdir("/dev/pts"):
        _mount("/dev/pts", dev + "/pts", None, _MS_BIND | _MS_REC)
    os.mkdir(dev + "/shm", 0o1777)
    _mount("tmpfs", dev + "/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777,size=64m")
    _setattr(dev, _MOUNT_ATTR_RDONLY, recursive=False)


# --- entering: the relay, the namespace's init ---------------------------------------


def pids_cgroup(limit: int) -> tuple[str, int] | None:
    """A new cgroup of the pids controller with ``pids.max`` = ``limit``, this process in
    it, and a descriptor of the cgroup directory it was in (the new one's parent: the
    relay moves back and removes the new one through it, since the namespace's view,
    which the relay shares after ``pivot_root``, has /sys read-only); None where none can
    be made (not root; no pids controller).  For a root kernel: ``RLIMIT_NPROC`` does not bind uid 0, so a fork
    bomb would be bounded by nothing else.  (An unprivileged kernel's trees are bounded
    by ``RLIMIT_NPROC`` in their own user namespace.)"""
    if os.geteuid() != 0 or limit <= 0:
        return None
    try:
        with open("/proc/self/cgroup") as fh:
            lines = [ln.rstrip("\n").split(":", 2) for ln in fh]
    except OSError:
        return None
    here = None
    for _hid, controllers, path in lines:
        if "pids" in controllers.split(",") and os.path.isdir("/sys/fs/cgroup/pids"):
            here = "/sys/fs/cgroup/pids" + path.rstrip("/")  # cgroup v1
            break
    if here is None:
        root = "/sys/fs/cgroup"
        v2 = next((p for h, c, p in lines if h == "0" and c == ""), None)
        try:
            with open(f"{root}/cgroup.controllers") as fh:
                has_pids = "pids" in fh.read().split()
        except OSError:
            has_pids = False
        if v2 != "/" or not has_pids:
            return None  # v2 below the root: the no-internal-processes rule is in the way
        here = root
    name = f"shoal-{os.getpid()}"
    try:
        parent = os.open(here, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        os.mkdir(name, 0o755, dir_fd=parent)
        _write_at(parent, f"{name}/pids.max", str(limit))
        _write_at(parent, f"{name}/cgroup.procs", str(os.getpid()))
    except OSError:
        os.close(parent)
        return None
    return name, parent


def _write_at(dir_fd: int, rel: str, text: str) -> None:
    fd = os.open(rel, os.O_WRONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def enter(
    flags: int,
    view: View | None,
    *,
    init: bool,
    max_procs: int = 0,
    egress: str = "",
    raise_view_error: bool = False,
) -> None:
    """Move the calling (single-threaded) process's future into new namespaces.

    Returns in a new process inside them, with the view built when given; the calling
    process stays behind as the relay (:func:`_relay`, never returns).  ``init``: the
    process returned in is pid 2, below an init (pid 1) that reaps and ends like it;
    else the returned process is pid 1 itself (the exec zygote, which reaps its jobs).
    Raises :class:`NamespaceError` (in the caller, nothing forked) when the namespaces
    cannot be made; a view that cannot be built ends the child with status 125 and the
    reason on stderr, or (``raise_view_error``, only with ``init`` False) raises
    :class:`NamespaceError` in it: the exec zygote then reports the reason as every
    job's failure, and nothing runs in the half-built view.  ``egress`` (with a new network namespace): the egress proxy's
    channel socket, which the relay bridges a loopback port to (``net/bridge.py``).
    """
    uid, gid = os.geteuid(), os.getegid()
    cgroup = pids_cgroup(max_procs)  # joined here: the namespace's processes inherit it
    unshare(flags)
    if flags & CLONE_NEWUSER:
        map_own_ids(uid, gid)
    bridge: tuple[socket.socket, str] | None = None
    if flags & CLONE_NEWNET:
        loopback_up()  # here: the relay, which stays in this network namespace, bridges it
        if egress:
            from ..net import bridge as _bridge

            bridge = (_bridge.listen(), egress)
    pid = os.fork()
    if pid:
        if cgroup is not None:
            try:  # the relay itself counts for nothing there; it removes it at the end
                _write_at(cgroup[1], "cgroup.procs", str(os.getpid()))
            except OSError:
                cgroup = None
        _relay(pid, cgroup, bridge)  # never returns
    if cgroup is not None:
        os.close(cgroup[1])
    if bridge is not None:
        bridge[0].close()  # the relay's alone: the tree can neither accept nor close it
    try:
        # The relay gone (killed), this init goes too, and the namespace with it.  (Its
        # parent is outside the pid namespace: getppid() says 0, so no race check here;
        # the relay only exits after this process.)
        _libc.prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)
        if view is not None:
            build_view(view)
            _limit_user_namespace()
    except BaseException as e:  # noqa: BLE001 - a forked child must never return here
        if raise_view_error and not init and isinstance(e, OSError):
            raise
        os.write(2, f"shoal sandbox: {e}\n".encode(errors="replace"))
        os._exit(125)
    if init:
        child = os.fork()
        if child:
            _relay(child)


def _relay(
    child: int,
    cgroup: tuple[str, int] | None = None,
    bridge: tuple[socket.socket, str] | None = None,
) -> None:
    """Wait for ``child`` (reaping any other child on the way) and end like it: its exit
    code, or death by its signal; ``cgroup`` (name, parent descriptor), emptied with it,
    is removed; ``bridge`` (listening socket, channel path) is served meanwhile.  Never
    returns."""
    import _signal

    with contextlib.suppress(ValueError):  # the caller's wake-up pipe is closed below
        _signal.set_wakeup_fd(-1)
    # Only the child's ends of pipes and sockets count: a relay holding a copy would keep
    # an EOF (a spawn error pipe, the kernel's control socket) from ever arriving.
    keep = sorted(
        {cgroup[1] if cgroup else -1, bridge[0].fileno() if bridge else -1} - {-1}
    )  # fmt: skip
    start = 3
    for fd in [*keep, os.sysconf("SC_OPEN_MAX")]:
        os.closerange(start, fd)
        start = fd + 1
    for sig in (_signal.SIGINT, _signal.SIGQUIT, _signal.SIGTSTP, _signal.SIGHUP):
        _signal.signal(sig, _signal.SIG_IGN)  # a terminal's signals are the program's
    if bridge is not None:
        from ..net import bridge as _bridge

        _bridge.serve_until(bridge[0], bridge[1], child)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(125)
        except InterruptedError:
            continue
        if pid == child:
            break
    if cgroup is not None:
        _remove_cgroup(cgroup)
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        os._exit(code)
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _signal.signal(-code, _signal.SIG_DFL)
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, [-code])
    os.kill(os.getpid(), -code)
    os._exit(128 - code)


def _remove_cgroup(cgroup: tuple[str, int]) -> None:
    """Remove an emptied cgroup.  The pid namespace dies with its init, but its last
    processes are reaped a moment later: wait for that, briefly (a leftover empty cgroup
    is removed by the next kernel's start, ``remove_stale_cgroups``)."""
    import time

    name, parent = cgroup
    for _ in range(CGROUP_REMOVE_TRIES):
        try:
            os.rmdir(name, dir_fd=parent)
            return
        except OSError:
            time.sleep(0.01)


def remove_stale_cgroups() -> None:
    """Empty ``shoal-*`` pids cgroups of relays that could not remove their own."""
    for base in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup"):
        try:
            names = [n for n in os.listdir(base) if n.startswith("shoal-")]
        except OSError:
            continue
        for name in names:
            try:
                os.rmdir(f"{base}/{name}")
            except OSError:
                pass  # still in use, or not ours to remove


def supported_flags(private_net: bool) -> int:
    """The namespaces a sandboxed tree gets."""
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    return flags | (CLONE_NEWNET if private_net else 0)


def names(flags: int) -> list[str]:
    return [n for f, n in NAMES.items() if flags & f]
