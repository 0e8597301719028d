"""The seccomp allow-list (kernel/access/seccomp.py): the program, and live children.

Two halves.  The program is run through a small classic-BPF interpreter for *both*
architectures (every number in the table, unknown numbers, foreign arches, argument
cases), which also proves the shape claims: allowed syscalls never read an argument (so
the kernel's action cache keeps them off the filter) and the search is shallow.  Then
live: ``python -I -S`` children set no_new_privs, install the filter and try things --
real programs that must keep working (bash, coreutils, git, subprocess, threads) and
every denial, checked for its documented errno.  No Landlock is needed, so no marker;
on x86_64 and aarch64 nothing here skips.
"""

from __future__ import annotations

import ast
import errno
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal_mcp.kernel.access import seccomp, syscall_table

SRC = str(Path(seccomp.__file__).resolve().parents[3])
ROOT = Path(SRC).parent
ARCHES = sorted(seccomp.AUDIT_ARCH)
TABLES = {"x86_64": syscall_table.X86_64, "aarch64": syscall_table.AARCH64}
ALLOW = seccomp.RET_ALLOW
NOBODY = 65534


def errno_ret(code: int) -> int:
    return seccomp.RET_ERRNO | code


# --- a classic-BPF interpreter for seccomp programs ------------------------------------


def run_bpf(
    prog: list[tuple[int, int, int, int]], arch: int, nr: int, args: tuple[int, ...] = ()
) -> tuple[int, bool, int]:
    """(return value, whether an argument was read, instructions executed)."""
    full = (tuple(args) + (0,) * 6)[:6]
    data = struct.pack("<IIQ6Q", nr & 0xFFFFFFFF, arch, 0, *(a & (2**64 - 1) for a in full))
    acc, pc, read_arg, steps = 0, 0, False, 0
    while True:
        code, jt, jf, k = prog[pc]
        steps += 1
        if code == seccomp.LD_W_ABS:
            acc = struct.unpack_from("<I", data, k)[0]
            read_arg = read_arg or k >= 16
            pc += 1
        elif code == seccomp.AND_K:
            acc &= k
            pc += 1
        elif code == seccomp.JA:
            pc += 1 + k
        elif code in (seccomp.JEQ_K, seccomp.JGT_K, seccomp.JGE_K, seccomp.JSET_K):
            taken = {
                seccomp.JEQ_K: acc == k,
                seccomp.JGT_K: acc > k,
                seccomp.JGE_K: acc >= k,
                seccomp.JSET_K: bool(acc & k),
            }[code]
            pc += 1 + (jt if taken else jf)
        elif code == seccomp.RET_K:
            return k, read_arg, steps
        else:
            raise AssertionError(f"opcode {code:#x} at {pc}")


def verdict(arch: str, name: str, *args: int, allow_listen: bool = False) -> int:
    prog = seccomp._program(arch, allow_listen=allow_listen)
    return run_bpf(prog, seccomp.AUDIT_ARCH[arch], TABLES[arch][name], args)[0]


# --- the program, both arches ----------------------------------------------------------


def test_every_denied_name_is_a_real_syscall() -> None:
    known = set(syscall_table.X86_64) | set(syscall_table.AARCH64)
    assert not (seccomp.DENIED | seccomp.MISSING) - known
    assert not set(seccomp._checks()) - known


@pytest.mark.parametrize("arch", ARCHES)
def test_fits_and_every_jump_lands_inside(arch: str) -> None:
    for allow_listen in (False, True):
        prog = seccomp._program(arch, allow_listen=allow_listen)
        assert 0 < len(prog) <= seccomp.MAX_INSNS
        for i, (code, jt, jf, k) in enumerate(prog):
            assert jt < 256 and jf < 256
            reach = k if code == seccomp.JA else max(jt, jf)
            if code != seccomp.RET_K:
                assert i + 1 + reach < len(prog)
        assert prog[-1][0] == seccomp.RET_K


@pytest.mark.parametrize("arch", ARCHES)
def test_every_table_number_gets_its_verdict(arch: str) -> None:
    prog = seccomp._program(arch)
    audit = seccomp.AUDIT_ARCH[arch]
    arg_free = {"clone": ALLOW, "prlimit64": ALLOW, "personality": ALLOW}
    arg_free["socket"] = errno_ret(errno.EAFNOSUPPORT)  # AF_UNSPEC
    arg_free["socketpair"] = errno_ret(errno.EACCES)
    deepest = 0
    for name, nr in TABLES[arch].items():
        got, read_arg, steps = run_bpf(prog, audit, nr)
        if name in seccomp.DENIED:
            want = errno_ret(errno.EPERM)
        elif name in seccomp.MISSING:
            want = errno_ret(errno.ENOSYS)
        elif name == "listen":
            want = errno_ret(errno.EACCES)
        else:
            want = arg_free.get(name, ALLOW)
        assert got == want, name
        if name not in seccomp._checks():
            # Arg-free verdicts: the kernel's action cache can settle them once.
            assert not read_arg, name
            deepest = max(deepest, steps)
    assert deepest <= 12  # a binary search, not a chain of hundreds of compares
    assert run_bpf(prog, audit, TABLES[arch]["listen"])[0] == errno_ret(errno.EACCES)
    open_prog = seccomp._program(arch, allow_listen=True)
    assert run_bpf(open_prog, audit, TABLES[arch]["listen"])[0] == ALLOW


@pytest.mark.parametrize("arch", ARCHES)
def test_unknown_numbers_and_foreign_arches_get_enosys(arch: str) -> None:
    prog = seccomp._program(arch)
    audit = seccomp.AUDIT_ARCH[arch]
    known = set(TABLES[arch].values())
    enosys = errno_ret(errno.ENOSYS)
    for nr in [*range(0, 1100), 0x40000000, 0x40000000 | 39, 0x40000000 | 0x200, 2**31, 2**32 - 1]:
        if nr not in known:
            assert run_bpf(prog, audit, nr)[0] == enosys, nr
    getpid = TABLES[arch]["getpid"]
    for foreign in (0x40000003, 0x40000028, 0xC000003E, 0xC00000B7, 0xC000003E ^ 0x80000000):
        if foreign != audit:
            assert run_bpf(prog, foreign, getpid)[0] == enosys, hex(foreign)


CLONE_NEWUSER, CLONE_NEWNS, SIGCHLD = 0x10000000, 0x00020000, 17
HIGH = 1 << 32  # junk in the high word of a 64-bit argument slot


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize(
    ("name", "args", "want"),
    [
        ("clone", (SIGCHLD,), ALLOW),
        ("clone", (0x003D0F00,), ALLOW),  # pthread_create's flags
        ("clone", (CLONE_NEWUSER | SIGCHLD,), errno.EPERM),
        ("clone", (CLONE_NEWNS,), errno.EPERM),
        ("clone", (0x40000000,), errno.EPERM),  # CLONE_NEWNET
        ("clone", (HIGH | SIGCHLD,), ALLOW),  # the kernel reads the low word only
        ("socket", (2, 1, 0), ALLOW),
        ("socket", (10, 1, 6), ALLOW),
        ("socket", (2, 1, 262), errno.EACCES),
        ("socket", (10, 1, 262), errno.EACCES),
        ("socket", (2, 1, HIGH | 262), errno.EACCES),
        ("socket", (1, 1, 0), errno.EACCES),
        ("socket", (HIGH | 1, 1, 0), errno.EACCES),
        ("socket", (16, 3, 0), ALLOW),
        ("socket", (16, 3, 4), ALLOW),
        ("socket", (16, 3, 15), errno.EPROTONOSUPPORT),
        ("socket", (17, 3, 0), errno.EAFNOSUPPORT),  # AF_PACKET
        ("socket", (40, 1, 0), errno.EAFNOSUPPORT),  # AF_VSOCK
        ("socket", (38, 5, 0), errno.EAFNOSUPPORT),  # AF_ALG
        ("socketpair", (1, 1, 0), ALLOW),
        ("socketpair", (1, 5 | 0x80000, 0), ALLOW),
        ("socketpair", (1, 2, 0), errno.EACCES),
        ("socketpair", (1, 2 | 0x800 | 0x80000, 0), errno.EACCES),
        ("socketpair", (1, 3, 0), errno.EACCES),  # SOCK_RAW is a datagram unix socket
        ("socketpair", (2, 1, 0), errno.EACCES),
        ("fchmod", (3, 0o755), ALLOW),
        ("fchmod", (3, 0o4755), errno.EPERM),
        ("fchmod", (3, 0o2755), errno.EPERM),
        ("fchmodat", (-100, 0, 0o1777), ALLOW),
        ("fchmodat", (-100, 0, 0o6755), errno.EPERM),
        ("fchmodat2", (-100, 0, 0o4700, 0), errno.EPERM),
        ("openat", (-100, 0, 0o101, 0o644), ALLOW),
        ("openat", (-100, 0, 0o101, 0o4755), errno.EPERM),
        ("openat", (-100, 0, 0o20200002, 0o2755), errno.EPERM),  # O_TMPFILE
        ("openat", (-100, 0, 0, 0o4755), ALLOW),  # no O_CREAT: the mode is ignored
        ("mknodat", (-100, 0, 0o100644, 0), ALLOW),
        ("mknodat", (-100, 0, 0o104755, 0), errno.EPERM),
        ("prlimit64", (0, 7, 0, 0), ALLOW),
        ("prlimit64", (1, 7, 0, 0), errno.EPERM),
        ("prlimit64", (HIGH, 7, 0, 0), ALLOW),  # pid_t: the kernel sees 0
        ("ioctl", (0, 0x5413), ALLOW),  # TIOCGWINSZ
        ("ioctl", (0, 0x5412), errno.EPERM),
        ("ioctl", (0, HIGH | 0x5412), errno.EPERM),
        ("ioctl", (0, 0x541C), errno.EPERM),
        ("personality", (0xFFFFFFFF,), ALLOW),
        ("personality", (0,), ALLOW),
        ("personality", (0x0040000,), errno.EPERM),  # ADDR_NO_RANDOMIZE
    ],
)
def test_argument_checks(arch: str, name: str, args: tuple[int, ...], want: int) -> None:
    expected = want if want == ALLOW else errno_ret(want)
    assert verdict(arch, name, *args) == expected


def test_x86_64_only_calls_are_checked_too() -> None:
    assert verdict("x86_64", "chmod", 0, 0o4755) == errno_ret(errno.EPERM)
    assert verdict("x86_64", "chmod", 0, 0o755) == ALLOW
    assert verdict("x86_64", "open", 0, 0o1101, 0o6755) == errno_ret(errno.EPERM)
    assert verdict("x86_64", "creat", 0, 0o4755) == errno_ret(errno.EPERM)
    assert verdict("x86_64", "mknod", 0, 0o104755, 0) == errno_ret(errno.EPERM)
    assert verdict("x86_64", "vfork") == ALLOW


def test_far_jumps_go_through_trampolines() -> None:
    filler = [(seccomp.RET_K, None, None, 1)] * 300
    items = [
        (seccomp.LD_W_ABS, None, None, seccomp.OFF_NR),
        (seccomp.JEQ_K, "far", None, 5),  # far when taken, falls through otherwise
        (seccomp.JEQ_K, None, "far2", 6),  # far when not taken
        (seccomp.JGE_K, "far", "farther", 100),  # both far
        *filler,
        "far",
        (seccomp.RET_K, None, None, 2),
        *filler,
        "far2",
        (seccomp.RET_K, None, None, 3),
        *filler,
        "farther",
        (seccomp.RET_K, None, None, 4),
    ]
    prog = seccomp.assemble(items)
    assert any(code == seccomp.JA for code, *_ in prog)
    assert all(jt < 256 and jf < 256 for _c, jt, jf, _k in prog)
    assert run_bpf(prog, 0, 5)[0] == 2
    assert run_bpf(prog, 0, 7)[0] == 3
    assert run_bpf(prog, 0, 6)[0] == 4  # 6 < 100: "farther"
    with pytest.raises(ValueError, match="only forward"):
        seccomp.assemble(["x", (seccomp.JEQ_K, "x", None, 1)])
    with pytest.raises(ValueError, match="twice"):
        seccomp.assemble(["x", "x", (seccomp.RET_K, None, None, 0)])


def test_the_program_is_deterministic() -> None:
    code = (
        f"import sys; sys.path.insert(0, {SRC!r})\n"
        "from shoal_mcp.kernel.access import seccomp\n"
        "print([seccomp._program(a, allow_listen=l) for a in ('x86_64', 'aarch64')"
        " for l in (False, True)])"
    )
    outs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outs.append(done.stdout)
    assert outs[0] == outs[1]
    assert ast.literal_eval(outs[0])[0] == seccomp._program("x86_64")


def test_compiled_is_the_program_as_sock_filter_records() -> None:
    raw = seccomp.compiled(allow_listen=True)
    prog = seccomp._program(allow_listen=True)
    assert len(raw) == 8 * len(prog)
    assert list(struct.iter_unpack("=HBBI", raw)) == prog


def test_generated_table_matches_the_headers() -> None:
    if not (Path("/usr/include/asm-generic/unistd.h").exists() and shutil.which("cpp")):
        pytest.skip("no UAPI headers or cpp here to regenerate from")
    if not Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h").exists():
        pytest.skip("no x86_64 UAPI header here")
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_syscall_table.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_unsupported_arch_refuses_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seccomp.os, "uname", lambda: os.uname_result(("L", "h", "r", "v", "s390x")))
    assert not seccomp.supported()
    with pytest.raises(seccomp.SeccompError) as exc:
        seccomp.install_filter()
    assert exc.value.errno == errno.ENOSYS


# --- live: children under the filter ---------------------------------------------------

PRELUDE = """
import ctypes, errno, os, sys
sys.path.insert(0, {src!r})
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
from shoal_mcp.kernel.access import seccomp, syscall_table
import fcntl, resource, socket, stat, subprocess, termios, threading  # before a uid drop
UID = {uid!r}
if UID is not None:  # an unprivileged caller: only no_new_privs lets it install
    os.setgroups([])
    os.setgid(UID)
    os.setuid(UID)
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
seccomp.install_filter(allow_listen={allow_listen})
NR = getattr(syscall_table, os.uname().machine.upper())
OUT = {{"euid": os.geteuid()}}

def sc(nr, *args):
    conv = [ctypes.c_char_p(a) if isinstance(a, bytes) else ctypes.c_long(a) for a in args]
    ret = libc.syscall(ctypes.c_long(nr), *conv)
    return ctypes.get_errno() if ret == -1 else 0

def probe(key, fn):
    try:
        fn()
        OUT[key] = 0
    except OSError as e:
        OUT[key] = e.errno
"""


def run_filtered(body: str, *args: str, allow_listen: bool = False, uid: int | None = None) -> dict:
    if not seccomp.supported():
        pytest.skip(f"no seccomp filter for {os.uname().machine}")
    code = PRELUDE.format(src=SRC, allow_listen=allow_listen, uid=uid) + textwrap.dedent(body)
    code += "\nprint(repr(OUT))\n"
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,  # no controlling terminal: vhangup and TIOCSTI hit nothing
    )
    assert done.returncode == 0, done.stderr
    return ast.literal_eval(done.stdout.strip().splitlines()[-1])


def test_real_programs_work_under_the_filter(tmp_path: Path) -> None:
    script = r"""
        set -euo pipefail
        cd "$1"
        mkdir -p d/e && printf 'b\na\nb\n' > d/e/f && sort d/e/f | uniq -c | wc -l
        cp -r d d2 && mv d2 d3 && ln -s d3 d4 && ls d4/e && chmod 0750 d3 && rm -r d3 d4
        find . -name f | sed 's/f$/g/' | awk '{print length($0)}'
        tar -cf t.tar d && tar -tf t.tar | head -1 && date +%Y > /dev/null
        echo hi > /dev/null & wait
        git init -q repo && cd repo && echo one > a && git add a
        git -c user.name=t -c user.email=t@e commit -qm first && git log --format=%s
        git checkout -qb side && git -c user.name=t -c user.email=t@e commit -q --allow-empty -m two
        git rev-list --count HEAD
    """
    body = f"""
        import subprocess, threading
        res = subprocess.run(["bash", "-c", {script!r}, "bash", sys.argv[1]],
                             capture_output=True, text=True,
                             env={{"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": sys.argv[1]}})
        OUT["bash"] = (res.returncode, res.stdout.split(), res.stderr)
        seen = []
        threads = [threading.Thread(target=seen.append, args=(i,)) for i in range(8)]
        for t in threads: t.start()
        for t in threads: t.join()
        OUT["threads"] = sorted(seen)
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        OUT["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        OUT["python"] = subprocess.run([sys.executable, "-c", "print(6*7)"],
                                       capture_output=True, text=True).stdout.strip()
    """
    out = run_filtered(body, str(tmp_path))
    code, words, err = out["bash"]
    assert code == 0, err
    assert words == ["2", "f", "7", "d/", "first", "2"]
    assert out["threads"] == list(range(8))
    assert out["fork"] == 7
    assert out["python"] == "42"


@pytest.fixture(params=["caller", "nobody"])
def as_uid(request: pytest.FixtureRequest) -> int | None:
    """Run the child as the caller, and as nobody (when the caller is root; otherwise
    the caller already is unprivileged and both runs are the same)."""
    return NOBODY if request.param == "nobody" and os.geteuid() == 0 else None


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A directory both the caller and nobody can write (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="shoal-seccomp-"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_every_denied_syscall_fails_with_eperm(as_uid: int | None) -> None:
    body = """
        for name in sorted(seccomp.DENIED | seccomp.MISSING):
            if name in NR:
                OUT[name] = sc(NR[name], -1, -1, -1, -1, -1, -1)
    """
    out = run_filtered(body, uid=as_uid)
    assert out.pop("euid") == (os.geteuid() if as_uid is None else as_uid)
    table = TABLES[os.uname().machine]
    assert set(out) == {n for n in seccomp.DENIED | seccomp.MISSING if n in table}
    wrong = {
        name: errno.errorcode.get(got, got)
        for name, got in out.items()
        if got != (errno.ENOSYS if name in seccomp.MISSING else errno.EPERM)
    }
    assert not wrong


def test_argument_filters_both_ways(workdir: Path, as_uid: int | None) -> None:
    body = """
        import fcntl, resource, socket, stat, termios, threading
        d = sys.argv[1]
        f = os.path.join(d, "f")
        open(f, "w").close()
        probe("chmod 0755", lambda: os.chmod(f, 0o755))
        probe("chmod 04755", lambda: os.chmod(f, 0o4755))
        probe("chmod 02755", lambda: os.chmod(f, 0o2755))
        fd = os.open(f, os.O_RDONLY)
        probe("fchmod 04755", lambda: os.fchmod(fd, 0o4755))
        OUT["fchmodat2 0755"] = sc(452, -100, f.encode(), 0o755, 0)
        OUT["fchmodat2 04755"] = sc(452, -100, f.encode(), 0o4755, 0)
        OUT["chmod high word"] = sc(NR["fchmodat"], -100, f.encode(), (1 << 32) | 0o755)
        OUT["mode after"] = oct(os.stat(f).st_mode & 0o7777)
        probe("open O_CREAT 0644", lambda: os.close(os.open(f + "1", os.O_CREAT | os.O_WRONLY, 0o644)))
        probe("open O_CREAT 04755", lambda: os.open(f + "2", os.O_CREAT | os.O_WRONLY, 0o4755))
        probe("open O_TMPFILE 04755", lambda: os.open(d, os.O_TMPFILE | os.O_WRONLY, 0o4755))
        probe("open existing", lambda: os.close(os.open(f, os.O_RDONLY)))
        probe("mknod 0644", lambda: os.mknod(f + "3", stat.S_IFREG | 0o644))
        probe("mknod 02755", lambda: os.mknod(f + "4", stat.S_IFREG | 0o2755))
        OUT["exists 2,4"] = [os.path.exists(f + s) for s in ("2", "4")]
        probe("socket unix", lambda: socket.socket(socket.AF_UNIX).close())
        probe("socket tcp", lambda: socket.socket().close())
        probe("socket mptcp", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262))
        probe("socket netlink route", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close())
        probe("socket vsock", lambda: socket.socket(40, socket.SOCK_STREAM))
        OUT["socket unix high word"] = sc(NR["socket"], (1 << 32) | 1, 1, 0)
        probe("pair stream", lambda: [s.close() for s in socket.socketpair()])
        probe("pair seqpacket", lambda: [s.close() for s in socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)])
        probe("pair dgram", lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM))
        probe("pair raw", lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_RAW))
        def listen():
            with socket.socket() as s:
                s.listen(1)
        probe("listen", listen)
        probe("prlimit 0", lambda: resource.prlimit(0, resource.RLIMIT_NOFILE))
        probe("prlimit 1", lambda: resource.prlimit(1, resource.RLIMIT_NOFILE))
        probe("setrlimit", lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, 0)))
        OUT["unshare newuser"] = sc(NR["unshare"], 0x10000000)
        rc = libc.syscall(ctypes.c_long(NR["clone"]), ctypes.c_long(0x10000000 | 17), ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0))
        if rc == 0:
            os._exit(0)  # the filter failed and this is a child in a new namespace
        OUT["clone newuser"] = ctypes.get_errno() if rc == -1 else 0
        OUT["clone3"] = sc(NR["clone3"], 0, 0)
        OUT["openat2"] = sc(NR["openat2"], -100, f.encode(), 0, 0)
        pid = os.fork()
        if pid == 0:
            os._exit(3)
        OUT["fork after clone3"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        master, slave = os.openpty()
        probe("TIOCSTI", lambda: fcntl.ioctl(slave, termios.TIOCSTI, b"x"))
        probe("TIOCGWINSZ", lambda: fcntl.ioctl(slave, termios.TIOCGWINSZ, b"\\0" * 8))
        OUT["personality query"] = sc(NR["personality"], 0xFFFFFFFF)
        OUT["personality norandom"] = sc(NR["personality"], 0x0040000)
        OUT["x32 getpid"] = sc(0x40000000 | 39) if "x86_64" == os.uname().machine else errno.ENOSYS
        OUT["unknown 1000"] = sc(1000)
    """
    out = run_filtered(body, str(workdir), uid=as_uid)
    assert out.pop("euid") == (os.geteuid() if as_uid is None else as_uid)
    assert out == {
        "chmod 0755": 0,
        "chmod 04755": errno.EPERM,
        "chmod 02755": errno.EPERM,
        "fchmod 04755": errno.EPERM,
        "fchmodat2 0755": 0,
        "fchmodat2 04755": errno.EPERM,
        "chmod high word": 0,
        "mode after": "0o755",
        "open O_CREAT 0644": 0,
        "open O_CREAT 04755": errno.EPERM,
        "open O_TMPFILE 04755": errno.EPERM,
        "open existing": 0,
        "mknod 0644": 0,
        "mknod 02755": errno.EPERM,
        "exists 2,4": [False, False],
        "socket unix": errno.EACCES,
        "socket tcp": 0,
        "socket mptcp": errno.EACCES,
        "socket netlink route": 0,
        "socket vsock": errno.EAFNOSUPPORT,
        "socket unix high word": errno.EACCES,
        "pair stream": 0,
        "pair seqpacket": 0,
        "pair dgram": errno.EACCES,
        "pair raw": errno.EACCES,
        "listen": errno.EACCES,
        "prlimit 0": 0,
        "prlimit 1": errno.EPERM,
        "setrlimit": 0,
        "unshare newuser": errno.EPERM,
        "clone newuser": errno.EPERM,
        "clone3": errno.ENOSYS,
        "openat2": errno.ENOSYS,
        "fork after clone3": 3,
        "TIOCSTI": errno.EPERM,
        "TIOCGWINSZ": 0,
        "personality query": 0,
        "personality norandom": errno.EPERM,
        "x32 getpid": errno.ENOSYS,
        "unknown 1000": errno.ENOSYS,
    }


def test_listen_only_when_allowed() -> None:
    body = """
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            probe("listen", lambda: s.listen(1))
        probe("socket unix", lambda: socket.socket(socket.AF_UNIX))
    """
    out = run_filtered(body, allow_listen=True)
    assert out == {"euid": os.geteuid(), "listen": 0, "socket unix": errno.EACCES}


def test_deny_unix_sockets_is_the_default_filter() -> None:
    body = """
        import socket
        seccomp.deny_unix_sockets()  # stacks a second copy: the old call sites still work
        probe("socket unix", lambda: socket.socket(socket.AF_UNIX))
        probe("ptrace", lambda: (_ for _ in ()).throw(OSError(sc(NR["ptrace"], 0, 0, 0, 0), "")))
        OUT["filters"] = [l for l in open("/proc/self/status") if l.startswith("Seccomp_filters")]
    """
    out = run_filtered(body)
    assert out["socket unix"] == errno.EACCES
    assert out["ptrace"] == errno.EPERM
    assert out["filters"] == ["Seccomp_filters:\t2\n"]
