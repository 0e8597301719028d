"""The seccomp allow-list every sandboxed process tree runs under.

What Landlock leaves open is what the kernel checks by uid, not by path; this filter
closes the syscalls a sandboxed command has no business making, whatever its uid.

**Architecture.**  Only the native ABI of x86_64 or aarch64 passes.  Any other
``seccomp_data.arch`` (i386 via ``int 0x80``, arm compat) and, on x86_64, every number
with bit 30 set (the x32 ABI) fail with ``ENOSYS``: to the program it is an ABI this
kernel does not offer, which is the truth for it, and a 32-bit program stops at its
first syscall instead of running unfiltered through a second syscall table.

**Allow-list.**  A syscall passes when its number is in the generated table of the
running architecture (:mod:`.syscall_table`) and not in :data:`DENIED`.  Numbers not in
the table (syscalls newer than the table) fail with ``ENOSYS``, so libc falls back to the
older call this filter knows.  :data:`DENIED` (ptrace, process_vm_*, pidfd_getfd, kcmp,
keyrings, perf/bpf/userfaultfd, modules and kexec, every mount call, unshare/setns,
clock setters, io_uring, file handles, iopl, ...) fails with ``EPERM``: a refusal, not a
missing call.  :data:`MISSING` (``clone3``, ``openat2``) fails with ``ENOSYS`` because
their flags sit behind a pointer seccomp cannot read; libc then uses ``clone`` and
``openat``, whose arguments are checked.

**Argument checks** (``seccomp_data.args`` are 64-bit; every argument checked here is
one the kernel reads as 32 bits -- int, unsigned int, umode_t, and ``clone()``'s flags,
which the kernel reads through ``lower_32_bits`` -- so the filter compares the low word
only, exactly what the kernel acts on, and junk in the high word changes nothing):

- ``clone`` with any ``CLONE_NEW*`` flag: ``EPERM`` (fork, vfork, threads pass).
- ``socket``: ``AF_UNIX`` -> ``EACCES`` (Landlock does not check ``connect()`` to a
  pathname socket; no unix socket, no connection).  ``AF_INET``/``AF_INET6`` with
  ``IPPROTO_MPTCP`` -> ``EACCES`` (Landlock's TCP port rules do not cover MPTCP).
  ``AF_NETLINK`` only for ``NETLINK_ROUTE`` and ``NETLINK_SOCK_DIAG`` (else
  ``EPROTONOSUPPORT``).  Every other family -> ``EAFNOSUPPORT`` (vsock, packet, alg,
  bluetooth, ...: what the kernel answers for a family it lacks, so programs fall back).
- ``socketpair``: ``AF_UNIX`` with type ``SOCK_STREAM`` or ``SOCK_SEQPACKET`` only;
  anything else -> ``EACCES``.  A datagram pair (and ``SOCK_RAW``, which unix sockets
  turn into datagrams) can ``connect(AF_UNSPEC)`` and ``sendto`` a pathname socket.
- ``listen`` -> ``EACCES`` unless ``allow_listen``.
- ``chmod``/``fchmod``/``fchmodat``/``fchmodat2`` with ``S_ISUID`` or ``S_ISGID`` in the
  mode; ``open``/``openat`` with ``O_CREAT`` or ``O_TMPFILE`` and such a mode;
  ``creat``/``mknod``/``mknodat`` with such a mode: ``EPERM``.  (``mkdir`` is not
  checked: the kernel keeps only the permission and sticky bits of its mode.)
- ``prlimit64`` on any pid but 0 (itself) -> ``EPERM``.
- ``ioctl`` ``TIOCSTI`` (type into a terminal) and ``TIOCLINUX`` -> ``EPERM``.
- ``personality`` other than the query (``0xffffffff``) or ``PER_LINUX`` -> ``EPERM``.

**Shape.**  The program loads the number once and decides by a binary search over the
ranges of equal verdict (``JGE`` tree, about eight jumps), then jumps to the argument
check of the few syscalls that have one.  Allowed syscalls never read an argument, so
the kernel's per-filter action cache (Linux 5.11+) marks them allowed once and skips
the program for them; only the checked ones (``openat``, ``ioctl``, ``socket``, ...) and
the denied ones run it.  Jumps too long for classic BPF's 8-bit offsets go through
``JA`` trampolines, inserted by the assembler.  :func:`compiled` hands the same program
out as raw ``sock_filter`` records, for a loader that installs it itself (bubblewrap's
``--seccomp FD``).

Standard library only (ctypes); the table is a generated module, no headers at runtime.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct

from . import syscall_table


class SeccompError(OSError):
    """The filter could not be installed."""


AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_TABLES = {"x86_64": syscall_table.X86_64, "aarch64": syscall_table.AARCH64}
MAX_INSNS = 4096  # BPF_MAXINSNS: the kernel refuses a longer program

DENIED = frozenset(
    {
        # other processes' memory, files and identity
        "ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "pidfd_getfd",
        "kcmp",
        # keyrings, the kernel's own attack surface
        "keyctl", "add_key", "request_key", "perf_event_open", "bpf", "userfaultfd",
        "io_uring_setup", "io_uring_enter", "io_uring_register", "lookup_dcookie",
        "fanotify_init", "uselib", "_sysctl", "nfsservctl",
        # the machine: modules, kexec, reboot, swap, time, accounting, log, quotas, ports
        "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
        "create_module", "get_kernel_syms", "query_module", "reboot", "swapon", "swapoff",
        "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "acct", "syslog",
        "quotactl", "quotactl_fd", "iopl", "ioperm", "vhangup", "sethostname",
        "setdomainname",
        # the view of the system the sandbox built: mounts and namespaces
        "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree",
        "open_tree_attr", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
        "unshare", "setns",
        # files by handle, past every path check
        "name_to_handle_at", "open_by_handle_at",
    }
)  # fmt: skip
MISSING = frozenset({"clone3", "openat2"})  # ENOSYS: libc falls back to clone / openat

CLONE_NEW_ANY = 0x7E020000  # NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
S_ISUID_ISGID = 0o6000
O_CREAT = 0o100  # the same on x86_64 and aarch64
O_TMPFILE_BIT = 0o20000000  # __O_TMPFILE: creates too
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
SOCK_STREAM, SOCK_SEQPACKET, SOCK_TYPE_MASK = 1, 5, 0xF
IPPROTO_MPTCP = 262
NETLINK_ROUTE, NETLINK_SOCK_DIAG = 0, 4
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
PER_LINUX, PER_QUERY = 0, 0xFFFFFFFF

# classic BPF opcodes
LD_W_ABS = 0x20
JA = 0x05
JEQ_K, JGT_K, JGE_K, JSET_K = 0x15, 0x25, 0x35, 0x45
AND_K = 0x54
RET_K = 0x06
OFF_NR, OFF_ARCH = 0, 4

RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000

# An instruction before assembly: (code, jt, jf, k); jt/jf are a label or None (the next
# instruction), k of JA is a label.  A bare str is a label.
_Insn = tuple[int, str | None, str | None, int | str]
_Item = _Insn | str

# Verdicts a range can end in: a return, or a jump to an argument check.
_RETURNS = {
    "allow": RET_ALLOW,
    "eperm": RET_ERRNO | errno.EPERM,
    "eacces": RET_ERRNO | errno.EACCES,
    "enosys": RET_ERRNO | errno.ENOSYS,
    "eafnosupport": RET_ERRNO | errno.EAFNOSUPPORT,
    "eprotonosupport": RET_ERRNO | errno.EPROTONOSUPPORT,
}


def _ld_arg(index: int) -> _Insn:
    """Load the low 32 bits of argument ``index`` (both arches are little-endian)."""
    return (LD_W_ABS, None, None, 16 + 8 * index)


def _mode_check(mode_arg: int) -> list[_Item]:
    return [_ld_arg(mode_arg), (JSET_K, "eperm", "allow", S_ISUID_ISGID)]


def _open_check(flags_arg: int, mode_arg: int) -> list[_Item]:
    return [
        _ld_arg(flags_arg),
        (JSET_K, None, "allow", O_CREAT | O_TMPFILE_BIT),
        *_mode_check(mode_arg),
    ]


def _checks() -> dict[str, list[_Item]]:
    """Syscall name -> its argument check (ends in a jump to a verdict)."""
    return {
        "clone": [_ld_arg(0), (JSET_K, "eperm", "allow", CLONE_NEW_ANY)],
        "socket": [
            _ld_arg(0),
            (JEQ_K, "eacces", None, AF_UNIX),
            (JEQ_K, "socket_inet", None, AF_INET),
            (JEQ_K, "socket_inet", None, AF_INET6),
            (JEQ_K, None, "eafnosupport", AF_NETLINK),
            _ld_arg(2),
            (JEQ_K, "allow", None, NETLINK_ROUTE),
            (JEQ_K, "allow", "eprotonosupport", NETLINK_SOCK_DIAG),
            "socket_inet",
            _ld_arg(2),
            (JEQ_K, "eacces", "allow", IPPROTO_MPTCP),
        ],
        "socketpair": [
            _ld_arg(0),
            (JEQ_K, None, "eacces", AF_UNIX),
            _ld_arg(1),
            (AND_K, None, None, SOCK_TYPE_MASK),
            (JEQ_K, "allow", None, SOCK_STREAM),
            (JEQ_K, "allow", "eacces", SOCK_SEQPACKET),
        ],
        "chmod": _mode_check(1),
        "fchmod": _mode_check(1),
        "fchmodat": _mode_check(2),
        "fchmodat2": _mode_check(2),
        "creat": _mode_check(1),
        "mknod": _mode_check(1),
        "mknodat": _mode_check(2),
        "open": _open_check(1, 2),
        "openat": _open_check(2, 3),
        "prlimit64": [_ld_arg(0), (JEQ_K, "allow", "eperm", 0)],
        "ioctl": [
            _ld_arg(1),
            (JEQ_K, "eperm", None, TIOCSTI),
            (JEQ_K, "eperm", "allow", TIOCLINUX),
        ],
        "personality": [
            _ld_arg(0),
            (JEQ_K, "allow", None, PER_QUERY),
            (JEQ_K, "allow", "eperm", PER_LINUX),
        ],
    }


def verdicts(arch: str, *, allow_listen: bool = False) -> dict[int, str]:
    """Syscall number -> verdict (a key of the returns, or ``check:NAME``) for every
    number in ``arch``'s table; numbers absent from it are ``enosys``."""
    checks = _checks()
    out: dict[int, str] = {}
    for name, nr in sorted(_TABLES[arch].items(), key=lambda item: item[1]):
        if name in DENIED:
            out[nr] = "eperm"
        elif name in MISSING:
            out[nr] = "enosys"
        elif name == "listen":
            out[nr] = "allow" if allow_listen else "eacces"
        elif name in checks:
            out[nr] = f"check:{name}"
        else:
            out[nr] = "allow"
    return out


def _ranges(verdict: dict[int, str]) -> list[tuple[int, str]]:
    """(first number, verdict) of each run of equal verdicts, from 0 to 2**32."""
    runs: list[tuple[int, str]] = []
    for nr in range(max(verdict) + 2):  # + the run of unknown numbers past the table
        v = verdict.get(nr, "enosys")
        if not runs or runs[-1][1] != v:
            runs.append((nr, v))
    return runs


def _search(runs: list[tuple[int, str]], labels: list[int]) -> list[_Item]:
    """A JGE tree over ``runs`` (the accumulator holds the number)."""
    if len(runs) == 1:
        verdict = runs[0][1]
        if verdict.startswith("check:"):
            return [(JA, None, None, verdict)]
        return [(RET_K, None, None, _RETURNS[verdict])]
    mid = len(runs) // 2
    labels[0] += 1
    right = f"ge{labels[0]}"
    left = _search(runs[:mid], labels)
    return [(JGE_K, right, None, runs[mid][0]), *left, right, *_search(runs[mid:], labels)]


def _source(arch: str, allow_listen: bool) -> list[_Item]:
    verdict = verdicts(arch, allow_listen=allow_listen)
    runs = _ranges(verdict)
    items: list[_Item] = [
        (LD_W_ABS, None, None, OFF_ARCH),
        (JEQ_K, None, "enosys", AUDIT_ARCH[arch]),
        (LD_W_ABS, None, None, OFF_NR),
        *_search(runs, [0]),
    ]
    checks = _checks()
    used = sorted({v for v in verdict.values() if v.startswith("check:")})
    for label in used:
        items += [label, *checks[label[len("check:") :]]]
    for name, ret in _RETURNS.items():
        items += [name, (RET_K, None, None, ret)]
    return items


def assemble(items: list[_Item]) -> list[tuple[int, int, int, int]]:
    """Resolve labels to relative jumps.  A conditional jump farther than 255
    instructions is rewritten to jump to an adjacent ``JA`` (32-bit offset) trampoline;
    the pass repeats until every jump fits, since each insertion lengthens others."""
    work = list(items)
    fresh = 0
    while True:
        at: dict[str, int] = {}
        n = 0
        for item in work:
            if isinstance(item, str):
                at[item] = n
            else:
                n += 1
        out: list[_Item] = []
        pc = 0
        grew = False
        for item in work:
            if isinstance(item, str) or item[0] in (JA, LD_W_ABS, RET_K, AND_K):
                out.append(item)
                pc += 0 if isinstance(item, str) else 1
                continue
            code, jt, jf, k = item
            far_t = jt is not None and at[jt] - pc - 1 > 255
            far_f = jf is not None and at[jf] - pc - 1 > 255
            pc += 1
            if not (far_t or far_f):
                out.append(item)
                continue
            grew = True
            tramps: list[_Item] = []
            if far_t:
                fresh += 1
                tramps += [f"tramp{fresh}", (JA, None, None, str(jt))]
                jt = f"tramp{fresh}"
            if far_f:
                fresh += 1
                tramps += [f"tramp{fresh}", (JA, None, None, str(jf))]
                jf = f"tramp{fresh}"
            if jt is None or jf is None:  # a fall-through now steps over the trampolines
                fresh += 1
                tramps.append(f"tramp{fresh}")
                jt = jt or f"tramp{fresh}"
                jf = jf or f"tramp{fresh}"
            out += [(code, jt, jf, k), *tramps]
        work = out
        if not grew:
            break
    return _resolve(work)


def _resolve(work: list[_Item]) -> list[tuple[int, int, int, int]]:
    at: dict[str, int] = {}
    insns: list[_Insn] = []
    for item in work:
        if isinstance(item, str):
            if item in at:
                raise ValueError(f"label {item} defined twice")
            at[item] = len(insns)
        else:
            insns.append(item)

    def offset(target: str | None, pc: int) -> int:
        if target is None:
            return 0
        rel = at[target] - pc - 1
        if rel < 0:
            raise ValueError(f"BPF jumps only forward ({target})")
        return rel

    prog = []
    for pc, (code, jt, jf, k) in enumerate(insns):
        if code == JA:
            assert isinstance(k, str)
            prog.append((code, 0, 0, offset(k, pc)))
        else:
            assert isinstance(k, int)
            jt_off, jf_off = offset(jt, pc), offset(jf, pc)
            if jt_off > 255 or jf_off > 255:
                raise ValueError("BPF jump out of range")
            prog.append((code, jt_off, jf_off, k))
    return prog


_BUILT: dict[tuple[str, bool], list[tuple[int, int, int, int]]] = {}


def _program(
    arch: str | None = None, *, allow_listen: bool = False
) -> list[tuple[int, int, int, int]]:
    """The filter for ``arch`` (default: the running one) as (code, jt, jf, k)."""
    arch = arch or os.uname().machine
    key = (arch, allow_listen)
    if key not in _BUILT:
        prog = assemble(_source(arch, allow_listen))
        if len(prog) > MAX_INSNS:
            raise SeccompError(errno.E2BIG, f"seccomp program of {len(prog)} instructions")
        _BUILT[key] = prog
    return _BUILT[key]


def compiled(*, allow_listen: bool = False) -> bytes:
    """The running arch's program as raw ``struct sock_filter`` records (native byte
    order), for a loader that installs it itself (``bwrap --seccomp FD``)."""
    return b"".join(struct.pack("=HBBI", *insn) for insn in _program(allow_listen=allow_listen))


def supported() -> bool:
    """Whether this module knows the running architecture."""
    return os.uname().machine in AUDIT_ARCH


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2


def install_filter(*, allow_listen: bool = False) -> None:
    """Install the allow-list on this thread; children and exec'd programs inherit it.

    Needs no_new_privs (or CAP_SYS_ADMIN).  Filters stack and cannot be removed.
    ``allow_listen`` lets ``listen()`` through (a principal granted a listening port).
    """
    if not supported():
        raise SeccompError(errno.ENOSYS, f"no seccomp filter for {os.uname().machine}")
    _install(_loaded(allow_listen))


_LOADED: dict[bool, tuple[ctypes.Array, _SockFprog]] = {}


def _loaded(allow_listen: bool) -> tuple[ctypes.Array, _SockFprog]:
    """The program as the kernel takes it, built once per process: an exec zygote builds
    it before it forks, and each job only installs it (about 1 ms less per job)."""
    if allow_listen not in _LOADED:
        _LOADED[allow_listen] = _load(_program(allow_listen=allow_listen))
    return _LOADED[allow_listen]


def _load(insns: list[tuple[int, int, int, int]]) -> tuple[ctypes.Array, _SockFprog]:
    """A program as the kernel takes it (the array must live as long as the struct)."""
    array = (_SockFilter * len(insns))(*(_SockFilter(*insn) for insn in insns))
    return array, _SockFprog(len(insns), array)


def prepare_filter(*, allow_listen: bool = False) -> None:
    """Build the program now (in a process that forks the ones that install it)."""
    _loaded(allow_listen)


def _install(loaded: tuple[ctypes.Array, _SockFprog]) -> None:
    fprog = loaded[1]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise SeccompError(err, f"prctl(PR_SET_SECCOMP): {os.strerror(err)}")


def deny_unix_sockets() -> None:
    """The allow-list with its defaults (the name older call sites use)."""
    install_filter()
