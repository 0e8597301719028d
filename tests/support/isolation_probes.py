"""Attack probes run *inside* an exec by tests/test_security_isolation.py.

    python3 isolation_probes.py RESULT_JSON CASE[:ARG] ...

Standard library and ctypes only (it runs under whatever interpreter the sandbox
offers).  Each case tries one attack and records ``{"done": bool, "detail": str}``:
``done`` means the attack's action succeeded (an escape for a sandboxed principal, the
proof that the attack works for the unconfined human).  A probe never raises: an
exception is the attack failing, and its text is the detail.  Background cases (names
starting ``hold-``/``watch-``/``listen-``) write ``RESULT_JSON + ".ready"`` once set up
and run until ``RESULT_JSON + ".stop"`` exists (or their own deadline).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import shutil
import signal
import socket
import stat
import struct
import sys
import time

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
ARCH = os.uname().machine
# Syscall numbers: x86_64 first, aarch64 second (generic table).
NR = {
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "pidfd_open": (434, 434),
    "pidfd_getfd": (438, 438),
    "ioprio_get": (252, 31),
    "ioprio_set": (251, 30),
    "prlimit64": (302, 261),
    "add_key": (248, 217),
    "keyctl": (250, 219),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425),
    "fchmodat": (268, 53),
    "fchmodat2": (452, 452),
    "open_by_handle_at": (304, 265),
    "name_to_handle_at": (303, 264),
    "setns": (308, 268),
    "syslog": (103, 116),
}
DEADLINE_S = 40.0  # a background probe never outlives this, stop file or not


def sys_nr(name: str) -> int:
    return NR[name][0 if ARCH == "x86_64" else 1]


def syscall(name: str, *args: object) -> int:
    # Integers as longs: a variadic int leaves the upper half of its register undefined,
    # and the kernel reads every argument as a long.
    wide = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    rc = libc.syscall(ctypes.c_long(sys_nr(name)), *wide)
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")
    return rc


# --- metadata ---------------------------------------------------------------------------


def chmod(arg: str) -> str:
    path, _, mode = arg.rpartition("=")
    os.chmod(path, int(mode, 8))
    return f"{path} now {oct(os.stat(path).st_mode)}"


def chown(arg: str) -> str:
    path, _, uid = arg.rpartition("=")
    os.chown(path, int(uid), -1)
    return f"{path} owner {os.stat(path).st_uid}"


def utime(arg: str) -> str:
    os.utime(arg, (978307200, 978307200))
    return f"mtime {os.stat(arg).st_mtime}"


def xattr(arg: str) -> str:
    os.setxattr(arg, "user.shoal-planted", b"agent")
    return "user.shoal-planted set"


def truncate(arg: str) -> str:
    os.truncate(arg, 0)
    return "truncated"


def rename(arg: str) -> str:
    src, _, dst = arg.partition("=")
    os.rename(src, dst)
    return f"{src} -> {dst}"


def symlink(arg: str) -> str:
    os.symlink("/etc/hostname", arg)
    return "linked"


def mkfifo(arg: str) -> str:
    os.mkfifo(arg)
    return "fifo made"


def _needs_bits(path: str, bits: int) -> str:
    mode = os.stat(path).st_mode
    if not mode & bits:
        raise OSError(errno.EPERM, f"call returned but {oct(mode)} lacks the bits")
    return oct(mode)


def _fresh_copy(path: str) -> None:
    if os.path.lexists(path):
        os.unlink(path)
    shutil.copyfile("/usr/bin/id", path)
    os.chmod(path, 0o755)


def suid_chmod(arg: str) -> str:
    _fresh_copy(arg)
    os.chmod(arg, 0o4755)
    return _needs_bits(arg, stat.S_ISUID)


def sgid_chmod(arg: str) -> str:
    _fresh_copy(arg)
    os.chmod(arg, 0o2755)
    return _needs_bits(arg, stat.S_ISGID)


def suid_fchmod(arg: str) -> str:
    _fresh_copy(arg)
    fd = os.open(arg, os.O_RDONLY)
    try:
        os.fchmod(fd, 0o4755)
    finally:
        os.close(fd)
    return _needs_bits(arg, stat.S_ISUID)


def suid_fchmodat(arg: str) -> str:
    _fresh_copy(arg)
    syscall("fchmodat", -100, arg.encode(), 0o4755)
    return _needs_bits(arg, stat.S_ISUID)


def suid_fchmodat2(arg: str) -> str:
    _fresh_copy(arg)
    syscall("fchmodat2", -100, arg.encode(), 0o4755, 0)
    return _needs_bits(arg, stat.S_ISUID)


def suid_create(arg: str) -> str:
    if os.path.lexists(arg):
        os.unlink(arg)
    old = os.umask(0)
    try:
        os.close(os.open(arg, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o4755))
    finally:
        os.umask(old)
    return _needs_bits(arg, stat.S_ISUID)


def suid_mknod(arg: str) -> str:
    if os.path.lexists(arg):
        os.unlink(arg)
    old = os.umask(0)
    try:
        os.mknod(arg, stat.S_IFREG | 0o4755)
    finally:
        os.umask(old)
    return _needs_bits(arg, stat.S_ISUID)


def hardlink(arg: str) -> str:
    """Link a file the agent may only read into a tree it may write, then write it."""
    src, _, dst = arg.partition("=")
    os.link(src, dst)
    with open(dst, "ab") as fh:
        fh.write(b"written through a hard link\n")
    return "linked and written"


def file_caps(arg: str) -> str:
    """File capabilities, the setuid bit's modern twin: ``cap_net_raw+ep`` on a copy."""
    _fresh_copy(arg)
    v2 = struct.pack("<IIIII", 0x02000001, 1 << 13, 0, 0, 0)  # VFS_CAP_REVISION_2 | EFFECTIVE
    os.setxattr(arg, "security.capability", v2)
    return "security.capability set"


def env_read(arg: str) -> str:
    value = os.environ.get(arg)
    if value is None:
        raise OSError(errno.ENOENT, f"{arg} not in this environment")
    return f"{arg}={value[:12]}..."


# --- files: read, write, create, list ----------------------------------------------------


def read(arg: str) -> str:
    with open(arg, "rb") as fh:
        data = fh.read(256)
    if not data:
        raise OSError(errno.ENODATA, "readable but empty")
    return repr(data[:60])


def listdir(arg: str) -> str:
    names = sorted(os.listdir(arg))
    if not names:
        raise OSError(errno.ENOENT, "listable but empty")
    return ",".join(names[:20])


def append(arg: str) -> str:
    with open(arg, "ab") as fh:
        fh.write(b"\n# planted by an agent\n")
    return "appended"


def create(arg: str) -> str:
    fd = os.open(arg, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    os.write(fd, b"planted by an agent\n")
    os.close(fd)
    return "created"


def replace(arg: str) -> str:
    tmp = arg + ".planted"
    with open(tmp, "wb") as fh:
        fh.write(b"# replaced by an agent\n")
    try:
        os.replace(tmp, arg)
    except OSError:
        os.unlink(tmp)
        raise
    return "replaced"


def git_swap(arg: str) -> str:
    """``arg`` is a work tree: move its ``.git`` aside and make a new one with a hook."""
    git = os.path.join(arg, ".git")
    os.rename(git, git + "-swapped")
    os.mkdir(git)
    os.mkdir(os.path.join(git, "hooks"))
    create(os.path.join(git, "hooks", "pre-commit"))
    return "swapped .git"


def open_rw(arg: str) -> str:
    fd = os.open(arg, os.O_RDWR | os.O_NOCTTY)
    os.close(fd)
    return "opened read-write"


def open_wo(arg: str) -> str:
    fd = os.open(arg, os.O_WRONLY)  # opened only, never written
    os.close(fd)
    return "opened for writing"


# --- signals, scheduling, /proc ---------------------------------------------------------


def _pid(arg: str) -> int:
    if arg == "ppid":
        return os.getppid()
    if arg == "child":
        return _sleeper()
    return int(arg)


_children: list[int] = []


def _sleeper() -> int:
    pid = os.fork()
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    _children.append(pid)
    return pid


def kill0(arg: str) -> str:
    os.kill(_pid(arg), 0)
    return "signal 0 delivered"


def sigcont(arg: str) -> str:
    os.kill(_pid(arg), signal.SIGCONT)
    return "SIGCONT delivered"


class _Rlimit(ctypes.Structure):
    _fields_ = [("cur", ctypes.c_uint64), ("max", ctypes.c_uint64)]


def prlimit(arg: str) -> str:
    pid, old = _pid(arg), _Rlimit()
    syscall("prlimit64", pid, resource.RLIMIT_NOFILE, None, ctypes.byref(old))
    syscall("prlimit64", pid, resource.RLIMIT_NOFILE, ctypes.byref(old), None)  # same values
    return f"RLIMIT_NOFILE {old.cur}/{old.max} of {pid} read and set"


def renice(arg: str) -> str:
    pid = _pid(arg)
    prio = os.getpriority(os.PRIO_PROCESS, pid)
    os.setpriority(os.PRIO_PROCESS, pid, prio)
    return f"nice {prio} set"


def ionice(arg: str) -> str:
    pid = _pid(arg)
    prio = syscall("ioprio_get", 1, pid)
    syscall("ioprio_set", 1, pid, prio)
    return f"ioprio {prio} set"


def taskset(arg: str) -> str:
    pid = _pid(arg)
    cpus = os.sched_getaffinity(pid)
    os.sched_setaffinity(pid, cpus)
    return f"affinity {sorted(cpus)} set"


def proc_files(arg: str) -> str:
    pid = _pid(arg)
    got = []
    for name in ("cmdline", "environ", "status", "fd", "root", "maps"):
        path = f"/proc/{pid}/{name}"
        try:
            if name in ("fd", "root"):
                os.listdir(path)
            else:
                with open(path, "rb") as fh:
                    fh.read(64)
            got.append(name)
        except OSError:
            pass
    if not got:
        raise OSError(errno.ENOENT, "nothing of it readable")
    return "read " + ",".join(got)


def proc_scan(arg: str) -> str:
    """Any process whose command line holds ``arg`` reversed (so that this probe's own
    command line, and its shell's, do not hold what it looks for)."""
    arg, found = arg[::-1], []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if arg.encode() in fh.read():
                    found.append(entry)
        except OSError:
            pass
    if not found:
        raise OSError(errno.ENOENT, "no such process visible")
    return "seen as pid " + ",".join(found)


def foreign_fds(arg: str) -> str:
    """Descriptors of this tree's processes (self, the shell, its init) that lead out of
    it: sockets, or files under ``arg`` (the kernel's state dir)."""
    found = []
    for pid in ("self", str(os.getppid()), "1"):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(("socket:", arg)):
                found.append(f"{pid}/{fd}->{target}")
    if not found:
        raise OSError(errno.ENOENT, "no descriptor leads out")
    return ",".join(found)


def kill_term(arg: str) -> str:
    os.kill(_pid(arg), signal.SIGTERM)
    return "SIGTERM sent"


def ptrace(arg: str) -> str:
    pid = _pid(arg)
    syscall("ptrace", 16, pid, None, None)  # PTRACE_ATTACH
    os.waitpid(pid, 0) if pid in _children else time.sleep(0.05)
    syscall("ptrace", 17, pid, None, None)  # PTRACE_DETACH
    return f"attached to {pid}"


def pidfd_getfd(arg: str) -> str:
    pid = _pid(arg)
    pidfd = syscall("pidfd_open", pid, 0)
    try:
        fd = syscall("pidfd_getfd", pidfd, 1, 0)
    finally:
        os.close(pidfd)
    target = os.readlink(f"/proc/self/fd/{fd}")
    os.close(fd)
    return f"took fd 1 of {pid}: {target}"


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def process_vm_readv(arg: str) -> str:
    pid = _pid(arg)
    with open(f"/proc/{pid}/maps") if pid in _children else open("/proc/self/maps") as fh:
        start = int(fh.readline().split("-")[0], 16)
    buf = ctypes.create_string_buffer(16)
    local, remote = _Iovec(ctypes.addressof(buf), 16), _Iovec(start, 16)
    syscall("process_vm_readv", pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    return f"read 16 bytes of {pid}"


# --- SysV and POSIX IPC ------------------------------------------------------------------

libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
IPC_CREAT, IPC_RMID = 0o1000, 0


def _sysv_create(key: int) -> str:
    shm = libc.shmget(key, 4096, IPC_CREAT | 0o600)
    msg = libc.msgget(key, IPC_CREAT | 0o600)
    sem = libc.semget(key, 1, IPC_CREAT | 0o600)
    if min(shm, msg, sem) < 0:
        raise OSError(ctypes.get_errno(), f"shm {shm} msg {msg} sem {sem}")
    addr = libc.shmat(shm, None, 0)
    ctypes.memmove(addr, b"SECRET-SHM", 10)
    libc.shmdt(ctypes.c_void_p(addr))
    text = b"SECRET-MSG"
    buf = struct.pack("l", 1) + text
    if libc.msgsnd(msg, buf, len(text), 0o4000) != 0:  # IPC_NOWAIT
        raise OSError(ctypes.get_errno(), "msgsnd")
    return f"shm {shm} msg {msg} sem {sem}"


def sysv_create(arg: str) -> str:
    return _sysv_create(int(arg))


def sysv_read(arg: str) -> str:
    key, found = int(arg), []
    shm = libc.shmget(key, 0, 0)
    if shm >= 0:
        addr = libc.shmat(shm, None, 0)
        if addr not in (None, ctypes.c_void_p(-1).value):
            found.append("shm:" + ctypes.string_at(addr, 10).decode(errors="replace"))
            libc.shmdt(ctypes.c_void_p(addr))
        else:
            found.append("shm (not attachable)")
    msg = libc.msgget(key, 0)
    if msg >= 0:
        buf = ctypes.create_string_buffer(64)
        n = libc.msgrcv(msg, buf, 56, 0, 0o4000)  # IPC_NOWAIT
        found.append(f"msg({n})")
    if libc.semget(key, 0, 0) >= 0:
        found.append("sem")
    if not found:
        raise OSError(errno.ENOENT, "no SysV object with that key")
    return ",".join(found)


def sysv_remove(arg: str) -> str:
    key = int(arg)
    for get, ctl in ((libc.shmget, libc.shmctl), (libc.msgget, libc.msgctl)):
        ident = get(key, 0, 0) if get is libc.shmget else get(key, 0)
        if ident >= 0:
            ctl(ident, IPC_RMID, None)
    sem = libc.semget(key, 0, 0)
    if sem >= 0:
        libc.semctl(sem, 0, IPC_RMID)
    return "removed"


def hold_sysv(arg: str) -> str:
    made = _sysv_create(int(arg))
    _ready()
    _wait_stop()
    return made


def posix_shm_create(arg: str) -> str:
    with open(f"/dev/shm/{arg}", "wb") as fh:
        fh.write(b"SECRET-POSIX-SHM")
    return "made"


def posix_shm_read(arg: str) -> str:
    return read(f"/dev/shm/{arg}")


def hold_posix_shm(arg: str) -> str:
    made = posix_shm_create(arg)
    _ready()
    _wait_stop()
    return made


libc.mq_open.restype = ctypes.c_int


def mq_create(arg: str) -> str:
    mq = libc.mq_open(("/" + arg).encode(), os.O_RDWR | os.O_CREAT, 0o600, None)
    if mq < 0:
        raise OSError(ctypes.get_errno(), "mq_open")
    if libc.mq_send(mq, b"SECRET-MQ", 9, 0) != 0:
        raise OSError(ctypes.get_errno(), "mq_send")
    return "made"


def mq_read(arg: str) -> str:
    mq = libc.mq_open(("/" + arg).encode(), os.O_RDONLY | os.O_NONBLOCK, 0, None)
    if mq < 0:
        raise OSError(ctypes.get_errno(), "mq_open")
    return "opened"


def mq_remove(arg: str) -> str:
    libc.mq_unlink(("/" + arg).encode())
    return "removed"


# --- unix sockets ------------------------------------------------------------------------


def unix_connect(arg: str) -> str:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(arg)  # connected is the escape: nothing sent (the listener may be gone)
    s.close()
    return "connected"


def abstract_connect(arg: str) -> str:
    return unix_connect("\0" + arg)


def socketpair_dgram(arg: str) -> str:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.close()
    b.close()
    return "made"


def dgram_pair_send(arg: str) -> str:
    """The issue's route to a pathname datagram socket: a socketpair end, disconnected,
    ``sendmsg`` with an address, carrying this process's stdout as SCM_RIGHTS."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        # Disconnect from the pair (connect to AF_UNSPEC), then name the target.
        libc.connect(a.fileno(), struct.pack("H14x", 0), 16)
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", 1))]
        a.sendmsg([b"INJECTED-BY-PROBE"], rights, 0, arg)
    finally:
        a.close()
        b.close()
    return "sent with stdout attached"


def dgram_send(arg: str) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(b"INJECTED-BY-PROBE", arg)
    return "sent"


# --- network -----------------------------------------------------------------------------


def tcp_connect(arg: str) -> str:
    socket.create_connection(("127.0.0.1", int(arg)), timeout=5).close()
    return "connected"


def mptcp_connect(arg: str) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262) as s:
        s.settimeout(5)
        s.connect(("127.0.0.1", int(arg)))
    return "connected over MPTCP"


def udp_send(arg: str) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"udp-from-probe", ("127.0.0.1", int(arg)))
    return "sent"


def raw_socket(arg: str) -> str:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close()
    return "raw socket made"


def packet_socket(arg: str) -> str:
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW).close()
    return "packet socket made"


def netlink_links(arg: str) -> str:
    """RTM_GETLINK dump: names of the interfaces this process can see besides ``lo``."""
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
    s.settimeout(5)
    s.bind((0, 0))
    req = struct.pack("=IHHII", 32, 18, 0x301, 1, 0) + struct.pack("=BxHiII", 0, 0, 0, 0, 0)
    s.send(req)
    names, done = [], False
    while not done:
        data = s.recv(65536)
        off = 0
        while off + 16 <= len(data):
            length, kind = struct.unpack_from("=IH", data, off)
            if kind == 3 or length < 16:  # NLMSG_DONE
                done = True
                break
            if kind == 16:  # RTM_NEWLINK: attributes after ifinfomsg (16 bytes)
                a = off + 32
                while a + 4 <= off + length:
                    alen, atype = struct.unpack_from("=HH", data, a)
                    if alen < 4:
                        break
                    if atype == 3:  # IFLA_IFNAME
                        names.append(data[a + 4 : a + alen].rstrip(b"\0").decode())
                    a += (alen + 3) & ~3
            off += (length + 3) & ~3
    s.close()
    others = [n for n in names if n != "lo"]
    if not others:
        raise OSError(errno.ENOENT, f"only {names}")
    return "sees " + ",".join(others)


def proc_net(arg: str) -> str:
    """The host's sockets through /proc/net: the kernel socket path or a TCP port."""
    needle, _, port = arg.partition("=")
    hits = []
    try:
        with open("/proc/net/unix") as fh:
            if needle in fh.read():
                hits.append("unix " + needle)
    except OSError:
        pass
    try:
        with open("/proc/net/tcp") as fh:
            if f":{int(port):04X} " in fh.read():
                hits.append("tcp port " + port)
    except OSError:
        pass
    if not hits:
        raise OSError(errno.ENOENT, "not visible")
    return ",".join(hits)


def listen_nobind(arg: str) -> str:
    """``listen()`` without ``bind()``: the kernel picks a port on 0.0.0.0.  The port is
    written to the ready file; the result says whether anything connected in."""
    s = socket.socket()
    try:
        s.listen(4)
    except OSError:
        _ready("")
        raise
    port = s.getsockname()[1]
    _ready(str(port))
    s.settimeout(0.2)
    accepted = 0
    while not _stopped():
        try:
            s.accept()[0].close()
            accepted += 1
        except OSError:
            pass
    if not accepted:
        raise OSError(errno.ECONNREFUSED, f"listened on {port}, nothing came in")
    return f"accepted {accepted} inbound on {port}"


# --- the kernel's own objects ------------------------------------------------------------


def watch_inotify(arg: str) -> str:
    """inotify watches on the kernel's dirs; counts events until stopped."""
    fd = libc.inotify_init1(os.O_NONBLOCK)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    watched = []
    for path in arg.split(","):
        if libc.inotify_add_watch(fd, path.encode(), 0xFFF) >= 0:
            watched.append(path)
    _ready()
    events = 0
    while not _stopped():
        try:
            data = os.read(fd, 65536)
            while data:
                events += 1
                (length,) = struct.unpack_from("I", data, 12)
                data = data[16 + length :]
        except BlockingIOError:
            time.sleep(0.05)
    if not events:
        raise OSError(errno.ENOENT, f"no events (watched {watched})")
    return f"{events} events on {watched}"


def shoal_out_rewrite(arg: str) -> str:
    """Rewrite the caller's own stored outputs through ``$SHOAL_OUT`` (a shared blob)."""
    base = os.environ.get("SHOAL_OUT", "")
    done = []
    for n in sorted(os.listdir(base)):
        path = os.path.join(base, n, "out")
        if not os.path.exists(path):
            continue
        st = os.stat(path)
        for how in ("chmod", "write", "utime", "unlink"):
            try:
                if how == "chmod":
                    os.chmod(path, 0o600)
                elif how == "write":
                    with open(path, "r+b") as fh:
                        fh.write(b"FAILED!!!!!!!!!!")
                elif how == "utime":
                    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
                else:
                    os.unlink(path)
                done.append(f"{n}:{how}")
            except OSError:
                pass
    if not done:
        raise OSError(errno.EROFS, f"nothing of {base} changed")
    return ",".join(done)


def orphan_writer(arg: str) -> str:
    """Leave a detached child holding this exec's stdout/stderr that keeps writing
    ``arg`` for a few seconds after the exec ended."""
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork():
            os._exit(0)
        end = time.monotonic() + 6
        while time.monotonic() < end:
            time.sleep(0.1)
            for fd in (1, 2):
                try:
                    os.write(fd, (arg + "\n").encode())
                except OSError:
                    pass
        os._exit(0)
    os.waitpid(pid, 0)
    return "orphan left behind"


# --- limits ------------------------------------------------------------------------------


def raise_limit(arg: str) -> str:
    which = getattr(resource, "RLIMIT_" + arg)
    soft, hard = resource.getrlimit(which)
    new = hard + 1 if hard != resource.RLIM_INFINITY else hard
    if hard == resource.RLIM_INFINITY:
        raise OSError(errno.EINVAL, "already unlimited")
    resource.setrlimit(which, (new, new))
    return f"{arg} hard {hard} -> {new}"


def nproc_limit(arg: str) -> str:
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    if hard != resource.RLIM_INFINITY and hard <= int(arg):
        raise OSError(errno.EAGAIN, f"bounded at {soft}/{hard}")
    return f"RLIMIT_NPROC {soft}/{hard}"


def fork_bomb(arg: str) -> str:
    """Fork children that wait on a pipe until ``arg`` exist or fork fails."""
    cap = int(arg)
    r, w = os.pipe()
    pids = []
    failure = ""
    try:
        while len(pids) < cap:
            try:
                pid = os.fork()
            except OSError as e:
                failure = str(e)
                break
            if pid == 0:
                os.close(w)
                os.read(r, 1)
                os._exit(0)
            pids.append(pid)
    finally:
        os.close(w)
        for pid in pids:
            os.waitpid(pid, 0)
    if len(pids) < cap:
        raise OSError(errno.EAGAIN, f"stopped at {len(pids)} children: {failure}")
    return f"{len(pids)} children"


def lower_nofile(arg: str) -> str:
    resource.setrlimit(resource.RLIMIT_NOFILE, (8, 8))
    return "RLIMIT_NOFILE of this process lowered to 8"


def hold_inotify(arg: str) -> str:
    """Take every inotify instance this tree can get (a per-uid limit the kernel and the
    human share, unless the tree's are its own), hold them until stopped."""
    fds = []
    try:
        while len(fds) < int(arg):
            fd = libc.inotify_init1(os.O_CLOEXEC)
            if fd < 0:
                break
            fds.append(fd)
        _ready(str(len(fds)))
        _wait_stop()
    finally:
        for fd in fds:
            os.close(fd)
    return f"held {len(fds)} inotify instances"


def inotify_init(arg: str) -> str:
    fd = libc.inotify_init1(os.O_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    os.close(fd)
    return "made an inotify instance"


# --- the kernel surface ------------------------------------------------------------------


def keyring(arg: str) -> str:
    kid = syscall("add_key", b"user", b"shoal-probe", b"secret", 6, -4)  # user keyring
    syscall("keyctl", 3, kid)  # KEYCTL_REVOKE
    return f"key {kid} added to the user keyring"


def bpf(arg: str) -> str:
    attr = ctypes.create_string_buffer(struct.pack("IIII", 2, 4, 4, 1), 128)  # ARRAY map
    fd = syscall("bpf", 0, attr, 128)
    os.close(fd)
    return "bpf map created"


def perf(arg: str) -> str:
    attr = bytearray(128)
    struct.pack_into("IIQ", attr, 0, 1, 128, 0)  # PERF_TYPE_SOFTWARE, CPU_CLOCK
    struct.pack_into("Q", attr, 40, 1 << 5 | 1 << 6)  # exclude_kernel | exclude_hv
    buf = ctypes.create_string_buffer(bytes(attr), 128)
    fd = syscall("perf_event_open", buf, 0, -1, -1, 0)
    os.close(fd)
    return "perf event opened"


def userfaultfd(arg: str) -> str:
    os.close(syscall("userfaultfd", 1))  # UFFD_USER_MODE_ONLY
    return "userfaultfd made"


def io_uring(arg: str) -> str:
    params = ctypes.create_string_buffer(120)
    os.close(syscall("io_uring_setup", 1, params))
    return "io_uring made"


def unshare_user(arg: str) -> str:
    if libc.unshare(0x10000000) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER)")
    return "new user namespace"


def mount_tmpfs(arg: str) -> str:
    if libc.mount(b"none", arg.encode(), b"tmpfs", 0, None) != 0:
        raise OSError(ctypes.get_errno(), "mount")
    libc.umount2(arg.encode(), 2)
    return "mounted"


def setns_host(arg: str) -> str:
    fd = os.open(f"/proc/{arg}/ns/mnt", os.O_RDONLY)
    syscall("setns", fd, 0)
    return "joined"


def open_by_handle(arg: str) -> str:
    """The "shocker" escape: a file handle from one path opened without path checks."""
    handle = ctypes.create_string_buffer(struct.pack("Ii", 128, 0), 8 + 128)
    mount_id = ctypes.c_int()
    syscall("name_to_handle_at", -100, arg.encode(), handle, ctypes.byref(mount_id), 0)
    fd = syscall("open_by_handle_at", os.open("/", os.O_RDONLY), handle, os.O_RDONLY)
    os.close(fd)
    return "opened by handle"


def dmesg(arg: str) -> str:
    buf = ctypes.create_string_buffer(256)
    syscall("syslog", 3, buf, 256)  # SYSLOG_ACTION_READ_ALL
    return "read the kernel log"


def sethostname(arg: str) -> str:
    name = socket.gethostname().encode()  # the same name: harmless if it works
    if libc.sethostname(name, len(name)) != 0:
        raise OSError(ctypes.get_errno(), "sethostname")
    return "hostname set"


def realtime(arg: str) -> str:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    return "ran SCHED_FIFO"


def nice_negative(arg: str) -> str:
    os.setpriority(os.PRIO_PROCESS, 0, -5)
    return "nice -5"


def tiocsti(arg: str) -> str:
    import fcntl
    import termios

    fcntl.ioctl(0, termios.TIOCSTI, b"#")
    return "injected a byte into the terminal"


# --- running -------------------------------------------------------------------------------

_result_path = ""


def _ready(text: str = "") -> None:
    with open(_result_path + ".ready", "w") as fh:
        fh.write(text)


_started = time.monotonic()


def _stopped() -> bool:
    return os.path.exists(_result_path + ".stop") or time.monotonic() - _started > DEADLINE_S


def _wait_stop() -> None:
    while not _stopped():
        time.sleep(0.05)


def main(argv: list[str]) -> int:
    global _result_path
    _result_path = argv[0]
    results = {}
    for case in argv[1:]:
        name, _, arg = case.partition(":")
        fn = globals()[name.replace("-", "_")]
        try:
            results[case] = {"done": True, "detail": str(fn(arg))}
        except BaseException as e:  # noqa: BLE001 - a failing attack is a result
            results[case] = {"done": False, "detail": f"{type(e).__name__}: {e}"}
    for pid in _children:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except OSError:
            pass
    tmp = _result_path + ".part"
    with open(tmp, "w") as fh:
        json.dump(results, fh)
    os.replace(tmp, _result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
