"""A seccomp filter for what Landlock (ABI <= 7) leaves open: unix-socket connections.

Landlock does not check ``connect()`` to a *pathname* unix socket, so a sandboxed
process could reach the shoal kernel's own socket (and connect as the local human),
a session bus (``systemd-run --user``) or a container runtime's socket.  This filter
makes ``socket(AF_UNIX, ...)`` fail with ``EACCES``; ``socketpair()`` (used by
ordinary programs for their own children) keeps working, and no pathname socket can be
reached without a socket to connect with.  ``io_uring_setup/enter/register`` are denied
too, because io_uring creates sockets without the ``socket`` syscall seccomp sees.

Per architecture: x86_64 (and its i386 compat and x32 entry points) and aarch64 (and
its arm compat entry).  x32 and unknown architectures are denied every syscall (a
32-bit or foreign binary fails at once instead of running unfiltered); i386 programs
lose ``socketcall(SYS_SOCKET)`` entirely, since its domain is behind a pointer.

Standard library only (ctypes), like :mod:`.landlock`.
"""

from __future__ import annotations

import ctypes
import errno
import os

_AF_UNIX = 1
_SYS_SOCKET = 1  # socketcall(2)'s "call" number for socket()
_IO_URING = (425, 426, 427)  # setup, enter, register: the same numbers on every arch

# AUDIT_ARCH_* -> (socket nr, socketcall nr or None, deny everything at or above this nr)
_ARCHES: dict[int, tuple[int, int | None, int | None]] = {
    0xC000003E: (41, None, 0x40000000),  # x86_64; x32 syscalls carry bit 30
    0x40000003: (359, 102, None),  # i386 on x86_64
    0xC00000B7: (198, None, None),  # aarch64
    0x40000028: (281, 102, None),  # arm on aarch64
}

_NATIVE = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}

# classic BPF
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_RET_K = 0x06
_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16  # struct seccomp_data (arg0 low word, LE)

_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2


class SeccompError(OSError):
    """The filter could not be installed."""


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _program() -> list[tuple[int, int | str, int | str, int]]:
    """The filter as (code, jt, jf, k) with jump targets given as label names."""
    deny = _RET_ERRNO | errno.EACCES
    prog: list[tuple[int, int | str, int | str, int] | str] = [(_LD_W_ABS, 0, 0, _OFF_ARCH)]
    for i, arch in enumerate(_ARCHES):
        prog.append((_JEQ_K, f"arch{i}", 0, arch))
    prog.append((_RET_K, 0, 0, deny))  # an unknown architecture
    for i, (sock, socketcall, deny_from) in enumerate(_ARCHES.values()):
        prog += [f"arch{i}", (_LD_W_ABS, 0, 0, _OFF_NR)]
        if deny_from is not None:
            prog.append((_JGE_K, "deny", 0, deny_from))
        prog += [(_JEQ_K, "deny", 0, nr) for nr in _IO_URING]
        prog.append((_JEQ_K, "domain", 0, sock))
        if socketcall is not None:
            prog.append((_JEQ_K, "socketcall", 0, socketcall))
        prog.append((_RET_K, 0, 0, _RET_ALLOW))
    prog += [
        "domain",  # socket(domain, ...): deny AF_UNIX
        (_LD_W_ABS, 0, 0, _OFF_ARG0),
        (_JEQ_K, "deny", 0, _AF_UNIX),
        (_RET_K, 0, 0, _RET_ALLOW),
        "socketcall",  # socketcall(call, args): deny SYS_SOCKET
        (_LD_W_ABS, 0, 0, _OFF_ARG0),
        (_JEQ_K, "deny", 0, _SYS_SOCKET),
        (_RET_K, 0, 0, _RET_ALLOW),
        "deny",
        (_RET_K, 0, 0, deny),
    ]
    labels: dict[str, int] = {}
    out: list[tuple[int, int | str, int | str, int]] = []
    for item in prog:
        if isinstance(item, str):
            labels[item] = len(out)
        else:
            out.append(item)

    def rel(target: int | str, at: int) -> int:
        if isinstance(target, int):
            return target
        offset = labels[target] - at - 1
        assert 0 <= offset < 256, "BPF jump out of range"
        return offset

    return [(c, rel(t, i), rel(f, i), k) for i, (c, t, f, k) in enumerate(out)]


def supported() -> bool:
    """Whether this module knows the running architecture."""
    return os.uname().machine in _NATIVE


def deny_unix_sockets() -> None:
    """Install the filter on this thread (inherited by children and across exec).

    Needs no_new_privs (or CAP_SYS_ADMIN).  Filters stack and cannot be removed.
    """
    if not supported():
        raise SeccompError(errno.ENOSYS, f"no seccomp filter for {os.uname().machine}")
    insns = _program()
    array = (_SockFilter * len(insns))(*(_SockFilter(*insn) for insn in insns))
    fprog = _SockFprog(len(insns), array)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise SeccompError(err, f"prctl(PR_SET_SECCOMP): {os.strerror(err)}")
