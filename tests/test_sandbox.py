"""The OS sandbox primitive (SPEC §4.7 rev 2): Landlock + netns + seccomp, live.

Specs are applied in child processes through the real runner (``sandbox_run.py``) and
checked with real programs; nothing is mocked.  Every test here is marked ``landlock``:
where Landlock exists a skip is turned into a failure (tests/conftest.py).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from shoal_mcp.kernel.access import landlock, sandbox, sandbox_build, sandbox_probe, seccomp
from shoal_mcp.kernel.access.sandbox import SandboxError, SandboxSpec
from shoal_mcp.kernel.access.sandbox_build import build_spec, grant_root
from tests.support.landlock import landlock_evidence

pytestmark = pytest.mark.landlock

BASH = shutil.which("bash") or "/bin/bash"
PATH = "/usr/local/bin:/usr/bin:/bin"
DENIED = "Permission denied"


def _abi() -> int:
    try:
        return landlock.abi_version()
    except landlock.LandlockUnavailable as e:
        pytest.skip(f"{e} (evidence of Landlock: {landlock_evidence()})")


@pytest.fixture
def abi() -> int:
    return _abi()


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    """tmp/{home, project, outside, state, sock, tmp}: state and sock are the kernel's."""
    paths = {
        name: tmp_path / name for name in ("home", "project", "outside", "state", "sock", "tmp")
    }
    for p in paths.values():
        p.mkdir()
    (paths["project"] / "a.txt").write_text("project file\n")
    (paths["outside"] / "secret").write_text("outside secret\n")
    (paths["state"] / "tokens.key").write_text("KERNEL-KEY\n")
    paths["root"] = tmp_path
    return paths


def spec_for(tree: dict[str, Path], **grants: object) -> SandboxSpec:
    kw: dict[str, object] = {"fs_read": [f"{tree['project']}/**"], "fs_write": []}
    kw.update(grants)
    return build_spec(
        home=str(tree["home"]),
        tmpdir=str(tree["tmp"]),
        forbidden=[str(tree["state"]), str(tree["sock"])],
        **kw,  # type: ignore[arg-type]
    )


def run(
    spec: SandboxSpec,
    script: str,
    *,
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
    prefix: list[str] | None = None,
    python: str | None = None,
    runner: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``bash -c script`` through the sandbox runner, spec on a pipe."""
    r, w = os.pipe()
    os.write(w, spec.to_bytes())
    os.close(w)
    argv = sandbox.runner_argv(r, [BASH, "-c", script], python=python)
    if runner:
        argv[3] = runner
    try:
        return subprocess.run(
            [*(prefix or []), *argv],
            pass_fds=[r],
            cwd=cwd,
            env={"PATH": PATH, "LC_ALL": "C", **(env or {})},
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        os.close(r)


# --- the binding and the filter --------------------------------------------------------


def test_rights_follow_the_abi() -> None:
    assert landlock.fs_rights(1) == (1 << 13) - 1
    assert landlock.fs_rights(2) == landlock.fs_rights(1) | landlock.FS_REFER
    assert landlock.fs_rights(4) & landlock.FS_TRUNCATE
    assert not landlock.fs_rights(4) & landlock.FS_IOCTL_DEV
    assert landlock.fs_rights(7) & landlock.FS_IOCTL_DEV
    assert landlock.net_rights(3) == 0
    assert landlock.net_rights(4) == landlock.NET_BIND_TCP | landlock.NET_CONNECT_TCP
    assert landlock.scopes(5) == 0
    assert landlock.scopes(6) == landlock.SCOPE_SIGNAL | landlock.SCOPE_ABSTRACT_UNIX_SOCKET


def test_abi_query_answers(abi: int) -> None:
    assert abi >= 1
    # Errors carry errno and a readable reason.
    with pytest.raises(landlock.LandlockError) as exc:
        landlock.Ruleset(1 << 40)  # a right no ABI has
    assert exc.value.errno == errno.EINVAL


def test_seccomp_program_jumps_stay_in_range() -> None:
    prog = seccomp._program()  # the allow-list itself: tests/test_seccomp_filter.py
    assert len(prog) <= seccomp.MAX_INSNS
    for i, (code, jt, jf, k) in enumerate(prog):
        if code != seccomp.RET_K:  # every jump lands inside the program
            assert i + 1 + (k if code == seccomp.JA else max(jt, jf)) < len(prog)
    assert prog[-1][0] == seccomp.RET_K  # ends with a return


# --- building specs (no Landlock needed) -----------------------------------------------


@pytest.mark.parametrize(
    ("glob", "root"),
    [
        ("~/project/**", "/h/u/project"),
        ("~/project", "/h/u/project"),
        ("~/project/*.py", "/h/u/project"),
        ("~/project/src/**/*.py", "/h/u/project/src"),
        ("~/**", "/h/u"),
        ("/**", "/"),
        ("/etc/hosts", "/etc/hosts"),
        ("/tmp/*.tmp", "/tmp"),
        ("/h/**", "/h"),
        ("~/*.txt", None),
        ("/*/u/x", None),
        ("/h/*/project", None),
        ("~/{a,b}/x", None),
        ("/h/u/../../**", None),
    ],
)
def test_grant_root(glob: str, root: str | None) -> None:
    got, why = grant_root(glob, "/h/u")
    assert got == root
    assert (why is None) == (root is not None)
    if why:
        assert glob in why and "not enforced" in why


def test_literal_home_dir_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    assert grant_root("~", str(home))[0] is None  # would be the whole of $HOME


def test_state_dir_is_cut_out_of_a_granted_parent(tree: dict[str, Path]) -> None:
    spec = spec_for(tree, fs_read=[f"{tree['root']}/**"], fs_write=[f"{tree['root']}/**"])
    root = str(tree["root"])
    for cls in (spec.read, spec.write):
        assert root not in cls
        assert str(tree["project"]) in cls and str(tree["outside"]) in cls
        assert not any(p.startswith((str(tree["state"]), str(tree["sock"]))) for p in cls)
    assert any("holds a kernel directory" in n and root in n for n in spec.notes)


def test_nested_forbidden_path_splits_every_level(tmp_path: Path) -> None:
    (tmp_path / "a" / "b" / "state").mkdir(parents=True)
    (tmp_path / "a" / "b" / "keep").mkdir()
    (tmp_path / "a" / "other").mkdir()
    (tmp_path / "top.txt").write_text("x")
    (tmp_path / "link").symlink_to("/")
    grants, split = sandbox_build.subtract(str(tmp_path), [str(tmp_path / "a" / "b" / "state")])
    assert sorted(grants) == sorted(
        str(tmp_path / p) for p in ("top.txt", "a/other", "a/b/keep")
    )  # the symlink to / is not followed
    assert split == [str(tmp_path), str(tmp_path / "a"), str(tmp_path / "a" / "b")]
    assert sandbox_build.subtract(
        str(tmp_path / "a" / "b" / "state" / "x"), [str(tmp_path / "a")]
    ) == (
        [],
        [],
    )


def test_refused_and_missing_grants_are_noted(tree: dict[str, Path]) -> None:
    spec = spec_for(
        tree,
        fs_read=["~/*.txt", f"{tree['root']}/missing/**"],
        fs_write=[f"{tree['state']}/**"],
    )
    notes = "\n".join(spec.notes)
    assert "~/*.txt: would widen" in notes
    assert "missing: does not exist" in notes
    assert "inside a kernel directory" in notes
    assert str(tree["state"]) not in spec.write


def test_grant_through_a_planted_symlink_is_refused(tree: dict[str, Path]) -> None:
    # The principal may write the project, so a link inside it could redirect a grant.
    (tree["project"] / "build").symlink_to(tree["outside"])
    spec = spec_for(
        tree,
        fs_write=[f"{tree['project']}/**"],
        fs_read=[f"{tree['project']}/build/**"],
    )
    assert str(tree["outside"]) not in spec.read
    assert any("symlink inside writable" in n for n in spec.notes)


def test_net_modes() -> None:
    base = {"home": "/nonexistent", "tmpdir": tempfile.gettempdir()}
    closed = build_spec(**base)
    assert closed.private_net and closed.tcp_connect == ()
    ports = build_spec(net_connect=["github.com:443", "*.pypi.org:443", "h:22"], **base)
    assert not ports.private_net and ports.tcp_connect == (22, 443)
    assert any("advisory" in n for n in ports.notes)
    anyport = build_spec(net_connect=["h:22", "x:*"], **base)
    assert not anyport.private_net and anyport.tcp_connect is None


def test_also_write_and_tmpdir_rules(tree: dict[str, Path]) -> None:
    spool = tree["state"] / "spool.out"
    spool.write_text("")
    spec = spec_for(tree, also_write=[str(spool)])
    assert str(spool) in spec.write and str(spool) not in spec.read
    tmp = str(tree["tmp"])
    assert tmp in spec.read and tmp in spec.write and tmp in spec.delete
    assert spec.environ() == {"TMPDIR": tmp}
    with pytest.raises(SandboxError, match="contains a kernel directory"):
        spec_for(tree, also_write=[str(tree["root"])])


def test_spec_round_trips_and_rejects_bad_input(tree: dict[str, Path]) -> None:
    spec = spec_for(tree, net_connect=["h:443"])
    assert SandboxSpec.from_bytes(spec.to_bytes()) == spec
    text = json.dumps(spec.to_dict())
    assert SandboxSpec.from_bytes(text.encode()) == spec
    assert SandboxSpec.from_dict(json.loads(text)).tcp_connect == (443,)
    for bad in (
        b"",
        b"[1]",
        b'{"version": 1}',
        b'{"version": 3}',
        b'{"version": 2, "read": ["relative"]}',
        b'{"version": 2, "tcp_connect": [true]}',
        b'{"version": 2, "tcp_connect": [70000]}',
        b'{"version": 2, "private_net": "yes"}',
        b'{"version": 2, "raed": []}',
        b'{"version": 2, "view": {"write": []}}',
        b'{"version": 2, "view": "ro"}',
        b'{"version": 2, "max_procs": -1}',
        b'{"version": 2, "max_procs": true}',
    ):
        with pytest.raises(SandboxError):
            SandboxSpec.from_bytes(bad)


# --- live: the filesystem --------------------------------------------------------------


def test_writes_only_inside_fs_write(abi: int, tree: dict[str, Path]) -> None:
    project, outside = tree["project"], tree["outside"]
    spec = spec_for(tree, fs_write=[f"{project}/**"])
    res = run(
        spec,
        f"echo in > {project}/new.txt; mkdir {project}/d && echo ok > {project}/d/f;"
        f"mv {project}/new.txt {project}/moved.txt;"  # renames need REMOVE_FILE (write)
        f"echo out > {outside}/new.txt; echo over > {outside}/secret; : > {outside}/secret;"
        f"cat {outside}/secret; rmdir {project}/d 2>&1 | sed s/^/rmdir:/",
        cwd=project,
    )
    assert (project / "moved.txt").read_text() == "in\n"
    assert (project / "d" / "f").read_text() == "ok\n"
    assert not (outside / "new.txt").exists()
    assert (outside / "secret").read_text() == "outside secret\n"  # not truncated
    assert res.stderr.count(DENIED) >= 4
    assert (project / "d").is_dir() and "rmdir:" in res.stdout  # no fs.delete for dirs


def test_fs_delete_allows_removing_directories(abi: int, tree: dict[str, Path]) -> None:
    project = tree["project"]
    (project / "d").mkdir()
    spec = spec_for(tree, fs_delete=[f"{project}/**"])
    res = run(spec, f"rmdir {project}/d && rm {project}/a.txt && echo gone")
    assert res.stdout == "gone\n", res.stderr
    assert not (project / "d").exists() and not (project / "a.txt").exists()


def test_state_dir_unreadable_even_under_a_read_grant(abi: int, tree: dict[str, Path]) -> None:
    spec = spec_for(tree, fs_read=[f"{tree['root']}/**"])
    res = run(
        spec,
        f"cat {tree['state']}/tokens.key; ls {tree['state']}; cat {tree['project']}/a.txt;"
        f"cat {tree['outside']}/secret",
    )
    assert "KERNEL-KEY" not in res.stdout
    assert res.stdout == "project file\noutside secret\n"
    assert res.stderr.count(DENIED) == 2


def test_path_tricks_and_symlinks_cannot_widen(abi: int, tree: dict[str, Path]) -> None:
    project, outside = tree["project"], tree["outside"]
    (project / "out-link").symlink_to(outside / "secret")
    (project / "dir-link").symlink_to(outside)
    spec = spec_for(tree, fs_write=[f"{project}/**"])
    res = run(
        spec,
        f"echo p > /proc/self/fd/../../..{outside}/X;"
        f"echo p > {project}/../outside/Y;"
        f"cat {project}/out-link; echo w > {project}/out-link; echo z > {project}/dir-link/Z;"
        f"ln -s {tree['state']}/tokens.key {project}/k && cat {project}/k;"
        f"ln {outside}/secret {project}/hard",  # hard links need refer + make on both sides
        cwd=project,
    )
    for name in ("X", "Y", "Z"):
        assert not (outside / name).exists()
    assert "outside secret" not in res.stdout and "KERNEL-KEY" not in res.stdout
    assert (outside / "secret").read_text() == "outside secret\n"
    assert not (project / "hard").exists()
    assert res.stderr.count(DENIED) + res.stderr.count("Invalid cross-device link") >= 7


def test_symlink_swapped_in_after_the_spec_was_built(abi: int, tree: dict[str, Path]) -> None:
    grant = tree["root"] / "granted"
    grant.mkdir()
    spec = spec_for(tree, fs_write=[f"{grant}/**"])
    grant.rmdir()
    grant.symlink_to(tree["outside"])  # a race between build and apply
    res = run(spec, f"echo x > {grant}/planted; cat {grant}/secret")
    assert not (tree["outside"] / "planted").exists()
    assert "outside secret" not in res.stdout


def test_system_secrets_are_cut_out_for_root(abi: int, tree: dict[str, Path]) -> None:
    shadow = "/etc/shadow" if os.path.exists("/etc/shadow") else "/etc/passwd"
    plain = "/etc/hostname" if shadow != "/etc/hostname" else "/etc/hosts"
    spec = spec_for(tree, system_secrets=(shadow, "/etc/ssh/ssh_host_*_key"))
    assert "/etc" not in spec.read and shadow not in spec.read
    assert any(p.startswith("/etc/") for p in spec.read)
    assert not any("kernel directory" in n for n in spec.notes)  # secrets are not noted
    res = run(spec, f"cat {shadow} >/dev/null; cat {plain} >/dev/null && echo plain-ok")
    assert res.stdout == "plain-ok\n" and DENIED in res.stderr
    default = spec_for(tree)
    assert ("/etc" in default.read) == (os.geteuid() != 0)  # the default applies to root


def test_own_spool_file_is_writable_by_path(abi: int, tree: dict[str, Path]) -> None:
    # The exec's stdout is a file in the kernel's state dir; `> /dev/stdout` reopens it.
    spool = tree["state"] / "spool.out"
    spool.write_text("")
    spec = spec_for(tree, also_write=[str(spool)])
    with open(spool, "w") as out:
        r, w = os.pipe()
        os.write(w, spec.to_bytes())
        os.close(w)
        done = subprocess.run(
            sandbox.runner_argv(
                r,
                [
                    BASH,
                    "-c",
                    f"echo a; echo b > /dev/stdout; cat {spool}; echo x > {tree['state']}/tokens.key",
                ],
            ),
            pass_fds=[r],
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            env={"PATH": PATH},
        )
        os.close(r)
    assert spool.read_text() == "b\n"  # reopened with O_TRUNC, as outside a sandbox
    assert done.stderr.count(DENIED) == 2  # the spool is writable, not readable
    assert (tree["state"] / "tokens.key").read_text() == "KERNEL-KEY\n"


def test_tmpdir_dev_null_and_ordinary_programs(abi: int, tree: dict[str, Path]) -> None:
    home = tree["home"]
    (home / ".gitconfig").write_text("[user]\n\tname = Sandbox Tester\n")
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id").write_text("PRIVATE")
    spec = spec_for(tree, fs_write=[f"{tree['project']}/**"])
    res = run(
        spec,
        'echo "$TMPDIR"; t=$(mktemp) && echo tmp > "$t" && cat "$t";'
        "echo n > /dev/null && cat /dev/null && head -c 4 /dev/urandom | wc -c;"
        "ls; cat a.txt; grep -c project a.txt; printf 'a\\nb\\n' | sort -r | tr -d '\\n'; echo;"
        "python3 -c 'import json, sys; print(json.dumps(sys.version_info[:1]))';"
        "git --version | cut -d' ' -f1-2; git config --global user.name;"
        "git init -q repo && git -C repo status --short && echo git-ok;"
        f"cat {home}/.ssh/id",
        cwd=tree["project"],
        env={"HOME": str(home)},
    )
    lines = res.stdout.splitlines()
    assert lines[:3] == [str(tree["tmp"]), "tmp", "4"], res.stderr
    assert lines[3:] == [
        "a.txt",
        "project file",
        "1",
        "ba",
        "[3]",
        "git version",
        "Sandbox Tester",
        "git-ok",
    ], res.stderr
    assert "PRIVATE" not in res.stdout and DENIED in res.stderr


def test_no_privileges_left(abi: int, tree: dict[str, Path]) -> None:
    res = run(
        spec_for(tree), "grep -E '^(CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status"
    )
    fields = dict(line.split(":\t") for line in res.stdout.splitlines())
    assert int(fields["CapEff"], 16) == int(fields["CapBnd"], 16) == int(fields["CapAmb"], 16) == 0
    assert fields["NoNewPrivs"] == "1" and fields["Seccomp"] == "2"


# --- live: other processes -------------------------------------------------------------


def test_other_processes_are_out_of_reach(abi: int, tree: dict[str, Path]) -> None:
    victim = subprocess.Popen(
        ["sleep", "60"], env={"PATH": PATH, "SHOAL_TEST_SECRET": "env-secret"}
    )
    try:
        res = run(
            spec_for(tree),
            f"cat /proc/{victim.pid}/environ /proc/{victim.pid}/mem /proc/{victim.pid}/maps;"
            f"ls /proc/{victim.pid}/cwd/; readlink /proc/{victim.pid}/exe || echo no-exe;"
            "cat /proc/self/environ | tr '\\0' '\\n' | grep -c ^PATH=;"
            f"kill -0 {victim.pid} 2>&1 && echo signal-sent",
        )
        assert "env-secret" not in res.stdout
        assert res.stderr.count(DENIED) == 4
        assert res.stdout.splitlines()[:2] == ["no-exe", "1"]  # its own /proc entries work
        # Landlock ABI 6 scopes signals to the sandbox's own domain.
        assert ("signal-sent" in res.stdout) == (abi < 6)
        assert victim.poll() is None
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()


# --- live: the network and unix sockets ------------------------------------------------

_NET_PROBE = """
import socket, sys
port, uport, sock = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def attempt(name, fn):
    try:
        fn()
        print(name, "ok")
    except OSError as e:
        print(name, e.errno)
attempt("tcp", lambda: socket.create_connection(("127.0.0.1", port), timeout=5).close())
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", uport)))
attempt("unix", lambda: socket.socket(socket.AF_UNIX).connect(sock))
attempt("pair", lambda: socket.socketpair())
attempt("listen", lambda: socket.create_server(("127.0.0.1", 0)))
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
res = libc.syscall(425, 4, params)  # io_uring_setup
print("io_uring", "ok" if res >= 0 else ctypes.get_errno())
"""


@pytest.fixture
def listeners(tree: dict[str, Path]):
    tcp = socket.create_server(("127.0.0.1", 0))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(0.5)
    unix_path = str(tree["sock"] / "kernel.sock")
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(unix_path)
    unix.listen()
    yield tcp.getsockname()[1], udp, unix_path
    for s in (tcp, udp, unix):
        s.close()


def _net_run(tree: dict[str, Path], listeners, net_connect: list[str]) -> tuple[dict, bool]:
    port, udp, unix_path = listeners
    script = tree["tmp"] / "net.py"
    script.write_text(_NET_PROBE)
    spec = spec_for(tree, net_connect=[g.replace("PORT", str(port)) for g in net_connect])
    res = run(spec, f"python3 {script} {port} {udp.getsockname()[1]} {unix_path}")
    got = dict(line.split(" ", 1) for line in res.stdout.splitlines())
    try:
        udp.recv(16)
        received = True
    except TimeoutError:
        received = False
    return got, received


def test_no_net_grant_cuts_tcp_udp_and_unix(abi: int, tree, listeners) -> None:
    got, udp_received = _net_run(tree, listeners, [])
    eacces, unreach = str(errno.EACCES), str(errno.ENETUNREACH)
    assert got["tcp"] in (eacces, unreach)  # Landlock where ABI >= 4, else the netns
    assert got["udp"] == unreach and not udp_received
    assert got["unix"] == eacces  # the kernel's socket cannot be reached
    assert got["pair"] == "ok"
    assert got["listen"] in (eacces, unreach, str(errno.EADDRNOTAVAIL))
    assert got["io_uring"] == str(errno.EPERM)  # in the seccomp deny set
    if abi >= 4:
        assert got["tcp"] == eacces


def test_port_grant_allows_only_that_port(abi: int, tree, listeners) -> None:
    other, _ = _net_run(tree, listeners, ["localhost:1"])
    granted, udp_received = _net_run(tree, listeners, ["localhost:PORT"])
    assert granted["tcp"] == "ok"
    if abi >= 4:
        assert other["tcp"] == str(errno.EACCES)
        assert granted["listen"] == str(errno.EACCES)  # binding TCP is never granted
    # With a grant the host network stays: UDP is not filtered (documented as such).
    assert granted["udp"] == "ok" and udp_received
    assert granted["unix"] == str(errno.EACCES)


# --- live: runner, probe and the non-root path ----------------------------------------


def test_runner_reports_failures(abi: int, tree: dict[str, Path]) -> None:
    r, w = os.pipe()
    os.write(w, b'{"version": 99}')
    os.close(w)
    bad = subprocess.run(
        sandbox.runner_argv(r, ["true"]), pass_fds=[r], capture_output=True, text=True
    )
    os.close(r)
    assert bad.returncode == 125 and "shoal sandbox: " in bad.stderr
    r, w = os.pipe()
    os.write(w, spec_for(tree).to_bytes())
    os.close(w)
    missing = subprocess.run(
        sandbox.runner_argv(r, ["no-such-program-xyz"]),
        pass_fds=[r],
        capture_output=True,
        text=True,
        env={"PATH": PATH},
    )
    os.close(r)
    assert missing.returncode == 127 and "no-such-program-xyz" in missing.stderr


def test_probe_runs_in_a_child(abi: int) -> None:
    support = sandbox_probe.probe(refresh=True)
    assert support.abi == abi and support.fs and support.unix, support.reason
    enforced = support.enforced()
    # This machine makes user namespaces (CI's kind too): every layer is there.
    assert support.ns == ["user", "mnt", "pid", "ipc", "uts", "net"], support.reason
    assert enforced == {
        "fs": f"ro-root+landlock-v{abi}",
        "ns": ["user", "mnt", "pid", "ipc", "uts", "net"],
        "net": "none",
        "seccomp": sandbox.SECCOMP_LEVEL,
    }
    # A principal with a network grant keeps the host's network, TCP by port.
    granted = support.enforced(private_net=False)
    assert granted["net"] == ("landlock-tcp" if abi >= 4 else False)
    assert "net" not in granted["ns"]  # type: ignore[index]
    assert support.netns in ("netns", "userns+netns")
    assert sandbox_probe.probe() is support  # once per kernel
    status = Path("/proc/self/status").read_text()
    assert "NoNewPrivs:\t0" in status  # the calling process stayed unconfined


def _copy_package(dest: Path) -> str:
    """The runner and its imports alone: proves the supervisor needs nothing else."""
    src = Path(sandbox.__file__).parent
    pkg = dest / "shoal_mcp"
    (pkg / "kernel" / "access").mkdir(parents=True)
    for init in ("__init__.py", "kernel/__init__.py", "kernel/access/__init__.py"):
        shutil.copy(src.parent.parent / init, pkg / init)
    modules = ("landlock.py", "namespaces.py", "seccomp.py", "syscall_table.py", "sandbox.py")
    for mod in (*modules, "sandbox_run.py"):
        shutil.copy(src / mod, pkg / "kernel" / "access" / mod)
    return str(pkg / "kernel" / "access" / "sandbox_run.py")


def test_runs_standalone_and_as_an_unprivileged_user(abi: int) -> None:
    base = Path(tempfile.mkdtemp(prefix="shoal-sbx-"))
    try:
        base.chmod(0o755)
        runner = _copy_package(base / "lib")
        work = base / "work"
        (work / "tmp").mkdir(parents=True)
        (base / "elsewhere").mkdir()
        prefix: list[str] = []
        python = sys.executable
        if os.geteuid() == 0:  # as root: become nobody, with a python nobody can run
            nobody = 65534
            for p in (work, work / "tmp"):
                os.chown(p, nobody, nobody)
            prefix = ["setpriv", f"--reuid={nobody}", f"--regid={nobody}", "--clear-groups"]
            candidates = [sys.executable, sys._base_executable, "/usr/bin/python3"]
            python = next(
                (
                    c
                    for c in candidates
                    if subprocess.run([*prefix, c, "-I", "-S", "-c", "pass"]).returncode == 0
                ),
                "",
            )
            assert python, "no python interpreter runnable by another user"
        spec = build_spec(
            fs_write=[f"{work}/**"],
            fs_read=[f"{work}/**"],
            home=str(work),
            tmpdir=str(work / "tmp"),
        )
        res = run(
            spec,
            f"echo ok > {work}/f && cat {work}/f; echo no > {base}/elsewhere/f;"
            "readlink /proc/self/ns/user; exec 3<>/dev/tcp/127.0.0.1/9",
            prefix=prefix,
            python=python,
            runner=runner,
        )
        assert res.stdout.splitlines()[0] == "ok", res.stderr
        assert not (base / "elsewhere" / "f").exists()
        assert res.stderr.count(DENIED) >= 2
        own_userns = os.readlink("/proc/self/ns/user")
        # Without root, the private network namespace comes with a user namespace.
        assert (res.stdout.splitlines()[1] != own_userns) == (prefix != [] or os.geteuid() != 0)
    finally:
        shutil.rmtree(base, ignore_errors=True)
