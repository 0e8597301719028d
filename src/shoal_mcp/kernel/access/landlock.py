"""A small ctypes binding to Linux Landlock (the three syscalls, no_new_privs).

Standard library only: the exec supervisor imports this from a fresh ``python -I -S``
process, where no site-packages exist.  Facts from the kernel's uapi header
(``include/uapi/linux/landlock.h``) and landlock(7):

* ``landlock_create_ruleset`` / ``landlock_add_rule`` / ``landlock_restrict_self`` use
  the generic syscall numbers 444 / 445 / 446 (the same on x86_64 and aarch64).
* ABI 1 (Linux 5.13): filesystem rights; 2: ``refer``; 3: ``truncate``; 4: TCP bind and
  connect; 5: ``ioctl_dev``; 6: ``scoped`` (abstract unix sockets, signals); 7: audit
  logging flags (nothing this module needs).
* A ruleset *handles* a set of rights (denied unless a rule allows them); rights it does
  not handle stay unrestricted.  Rules are hierarchical and allow-only: a path-beneath
  rule grants its rights on that file or directory and everything below it.

Only the thread that calls :meth:`Ruleset.restrict_self` (and children it starts later)
is restricted, so call it from a single-threaded process.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat

# Filesystem access rights, with the first ABI that has each one.
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5

NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1  # ABI 4

SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6

# Rights that make sense on a file (not only on a directory): a rule on a non-directory
# may carry only these, or the kernel answers EINVAL.
FS_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV

_FS_ABI1 = (1 << 13) - 1  # execute .. make_sym
_FS_BY_ABI = {1: _FS_ABI1, 2: FS_REFER, 3: FS_TRUNCATE, 5: FS_IOCTL_DEV}

_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_RULE_NET_PORT = 2
_PR_SET_NO_NEW_PRIVS = 38

_SYSCALLS = {  # machine -> (create_ruleset, add_rule, restrict_self)
    "x86_64": (444, 445, 446),
    "aarch64": (444, 445, 446),
}


class LandlockError(OSError):
    """A Landlock call failed; ``errno`` and the message say which and why."""


class LandlockUnavailable(LandlockError):
    """This kernel (or architecture) cannot enforce Landlock at all."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # the uapi struct is packed: 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPortAttr(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.prctl.restype = ctypes.c_int


def _numbers() -> tuple[int, int, int]:
    machine = os.uname().machine
    nums = _SYSCALLS.get(machine)
    if nums is None:
        raise LandlockUnavailable(
            errno.ENOSYS, f"no Landlock syscall numbers known for this architecture ({machine})"
        )
    return nums


def _fail(what: str) -> LandlockError:
    err = ctypes.get_errno()
    return LandlockError(err, f"{what}: {os.strerror(err)}")


def abi_version() -> int:
    """The kernel's Landlock ABI version (>= 1); raises :class:`LandlockUnavailable`."""
    create, _, _ = _numbers()
    res = _libc.syscall(
        ctypes.c_long(create), None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION)
    )
    if res >= 0:
        return int(res)
    err = ctypes.get_errno()
    if err == errno.ENOSYS:
        why = "this kernel has no Landlock (needs Linux >= 5.13 built with it)"
    elif err == errno.EOPNOTSUPP:
        why = "Landlock is built into this kernel but not enabled (add it to the lsm= list)"
    else:
        why = f"Landlock ABI query failed: {os.strerror(err)}"
    raise LandlockUnavailable(err, why)


def fs_rights(abi: int) -> int:
    """Every filesystem right the given ABI can handle."""
    return sum(bits for level, bits in _FS_BY_ABI.items() if abi >= level)


def net_rights(abi: int) -> int:
    """The network rights the given ABI can handle (TCP bind/connect from ABI 4)."""
    return NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0


def scopes(abi: int) -> int:
    """The IPC scopes the given ABI can handle (abstract unix sockets, signals: ABI 6)."""
    return SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0


def set_no_new_privs() -> None:
    """``prctl(PR_SET_NO_NEW_PRIVS, 1)``: exec can never gain privileges again (setuid)."""
    if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise _fail("prctl(PR_SET_NO_NEW_PRIVS)")


class Ruleset:
    """A Landlock ruleset being built; :meth:`restrict_self` enforces it.

    ``handled_fs``/``handled_net``/``scoped`` must be within what the ABI has (mask them
    with :func:`fs_rights`, :func:`net_rights`, :func:`scopes`).
    """

    def __init__(self, handled_fs: int, handled_net: int = 0, scoped: int = 0) -> None:
        create, self._add, self._restrict = _numbers()
        self.handled_fs = handled_fs
        self.handled_net = handled_net
        attr = _RulesetAttr(handled_fs, handled_net, scoped)
        # Older kernels take the shorter struct; pass only the fields in use.
        size = 24 if scoped else 16 if handled_net else 8
        fd = _libc.syscall(
            ctypes.c_long(create), ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0)
        )
        if fd < 0:
            raise _fail("landlock_create_ruleset")
        self.fd: int = int(fd)

    def __enter__(self) -> Ruleset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def add_path(self, path: str, access: int, *, expect: str | None = None) -> int:
        """Allow ``access`` on ``path`` and below it; returns the rights actually granted.

        The path is opened with ``O_PATH`` (symlinks followed, as the kernel resolves
        them).  On a non-directory only file rights are kept.  With ``expect`` the opened
        object's canonical path (``/proc/self/fd``) must equal it, so a symlink swapped in
        after the caller resolved the path makes this fail instead of granting its target.
        """
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        try:
            if expect is not None:
                actual = os.readlink(f"/proc/self/fd/{fd}")
                if actual != expect:
                    raise LandlockError(
                        errno.ELOOP, f"{path}: resolves to {actual}, expected {expect}"
                    )
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                access &= FS_FILE_RIGHTS
            access &= self.handled_fs
            if not access:
                return 0
            rule = _PathBeneathAttr(access, fd)
            if (
                _libc.syscall(
                    ctypes.c_long(self._add),
                    ctypes.c_int(self.fd),
                    ctypes.c_int(_RULE_PATH_BENEATH),
                    ctypes.byref(rule),
                    ctypes.c_uint32(0),
                )
                != 0
            ):
                raise _fail(f"landlock_add_rule({path})")
            return access
        finally:
            os.close(fd)

    def add_port(self, port: int, access: int) -> None:
        """Allow ``access`` (TCP bind/connect bits) on one TCP port."""
        rule = _NetPortAttr(access & self.handled_net, port)
        if (
            _libc.syscall(
                ctypes.c_long(self._add),
                ctypes.c_int(self.fd),
                ctypes.c_int(_RULE_NET_PORT),
                ctypes.byref(rule),
                ctypes.c_uint32(0),
            )
            != 0
        ):
            raise _fail(f"landlock_add_rule(port {port})")

    def restrict_self(self) -> None:
        """Enforce the ruleset on this thread and every child it starts from now on.

        Needs no_new_privs (or CAP_SYS_ADMIN); the ruleset fd is closed afterwards.
        """
        if (
            _libc.syscall(ctypes.c_long(self._restrict), ctypes.c_int(self.fd), ctypes.c_uint32(0))
            != 0
        ):
            raise _fail("landlock_restrict_self")
        self.close()
